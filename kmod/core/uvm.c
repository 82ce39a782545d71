// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * uvm.c - video memory that nvidia-uvm keeps alive.
 *
 * UVM_MAP_EXTERNAL_ALLOCATION maps an RM memory object into the caller's UVM
 * VA space. For each GPU it names, UVM duplicates the object into its own RM
 * client (580 kernel-open/nvidia-uvm/uvm_map_external.c
 * uvm_map_external_allocation_on_gpu() -> nvUvmInterfaceDupMemory(); RM:
 * src/nvidia/src/kernel/rmapi/nv_gpu_ops.c dupMemory()). That duplicate holds
 * the memory after the caller frees its own handle, and RM's per-process
 * count of video memory does not see it (it is UVM's client's, not the
 * caller's). UVM lets it go (uvm_release_rm_handle(), when the last piece of
 * the mapping is destroyed) on:
 *  - UVM_FREE of the external range that holds the mapping
 *    (uvm_va_range.c uvm_free());
 *  - UVM_UNMAP_EXTERNAL covering it on that GPU (uvm_unmap_external());
 *  - a later UVM_MAP_EXTERNAL_ALLOCATION over it on that GPU, which unmaps
 *    what it overlaps first;
 *  - UVM_UNREGISTER_GPU / UVM_UNREGISTER_GPU_VASPACE / UVM_DISABLE_PEER_ACCESS
 *    of that GPU;
 *  - the destruction of the VA space, when the last reference to the UVM
 *    file goes (a vma of it, and UVM_MM_INITIALIZE's fget(), hold one: the
 *    module's reaper waits for the real file, reaper.c).
 * munmap and UVM_DEINITIALIZE let nothing go.
 *
 * So a mapping holds its memory's charge from the check of the call that
 * makes it (as a duplicate does, core.c gs_pre_dup()) until one of those is
 * known to have happened. What "known" means is the point: a reply in the
 * caller's memory can be rewritten by another thread of the caller once the
 * driver has written it (docs/isolation.md), so a release is never taken
 * from it. The charge goes only:
 *  - on UVM_FREE and UVM_UNMAP_EXTERNAL whose reply the glue says the caller
 *    could not rewrite (gs_call.reply_trusted; the module runs those two
 *    calls from a page no process can write, kmod/uvmcall.c): a successful
 *    UVM_FREE lets go of every mapping inside [base, base + length), a
 *    successful UVM_UNMAP_EXTERNAL of every GPU of a mapping it covers;
 *  - when the UVM file is released (gs_file_closed()).
 * The rest (an overlapping map, unregistering a GPU, a partial unmap) keeps
 * the charge until the range is freed or the file goes: too much charged for
 * a while, never too little. CUDA frees each range it maps (cuMemFree,
 * cuMemUnmap: UVM_FREE or UVM_UNMAP_EXTERNAL of exactly what it mapped), so
 * its charges come back at once.
 *
 * What may be mapped: an object the instance registered, of one of its own
 * clients. RM lets UVM duplicate an object of any client whose share policy
 * allows it (client_resource.c, RS_SHARE_TYPE_PID for the calling process,
 * or a policy RM_SHARE set): another instance's shared object is answered as
 * RM answers a client that does not exist.
 */
#include "core_int.h"

/* the mapping's GPU uuids, after the record */
static struct nv_processor_uuid *gs_uvm_gpus(struct gs_uvm_map *m)
{
	return (struct nv_processor_uuid *)(m + 1);
}

static nv_u32 gs_uvm_map_count(const struct gs_call *c)
{
	const struct uvm_map_external_allocation_params *p = c->arg;

	if (!p || c->arg_size < sizeof(*p) || !p->gpu_attributes_count ||
	    p->gpu_attributes_count > UVM_MAX_GPUS)
		return 0;
	return (nv_u32)p->gpu_attributes_count;
}

nv_u32 gs_uvm_arg_size(nv_u32 cmd)
{
	switch (cmd) {
	case UVM_MAP_EXTERNAL_ALLOCATION:
		return sizeof(struct uvm_map_external_allocation_params);
	case UVM_FREE:
		return sizeof(struct uvm_range_params);
	case UVM_UNMAP_EXTERNAL:
		return sizeof(struct uvm_unmap_external_params);
	}
	return 0;
}

int gs_uvm_spares_alloc(struct gs_call *c)
{
	nv_u32 n;

	if (c->escape != UVM_MAP_EXTERNAL_ALLOCATION)
		return 0;
	n = gs_uvm_map_count(c);
	if (!n)
		return 0;	/* UVM refuses it before duplicating anything */
	c->spare_uvm = gs_zalloc(sizeof(*c->spare_uvm) + n * sizeof(struct nv_processor_uuid));
	return c->spare_uvm ? 0 : -1;
}

static void gs_uvm_reply(struct gs_call *c, enum gs_refusal r, nv_u32 status)
{
	struct uvm_map_external_allocation_params *p = c->arg;

	c->refusal = r;
	c->status = status;
	p->rm_status = status;
}

/*
 * UVM_MAP_EXTERNAL_ALLOCATION: the block is staged (the driver reads what
 * was checked here). The memory's charge is referenced now, so that a free
 * of the object from here on uncharges nothing UVM may hold; a free or a
 * creation in flight on the handle waits, as for a duplicate.
 */
static enum gs_verdict gs_uvm_pre_map(struct gs_inst *in, struct gs_call *c)
{
	struct uvm_map_external_allocation_params *p = c->arg;
	struct gs_uvm_map *m = c->spare_uvm;
	const struct gs_obj *ob;
	nv_u32 i;

	if (!m)
		return GS_PASS;		/* no block, no GPU or too many: UVM answers */
	if (!gs_is_client(in, p->h_client)) {
		gs_uvm_reply(c, GS_REFUSE_FOREIGN, NV_ERR_INVALID_CLIENT);
		return GS_REPLY;
	}
	ob = gs_obj_find(in, p->h_client, p->h_memory);
	if (!ob) {
		gs_uvm_reply(c, GS_REFUSE_FOREIGN, NV_ERR_OBJECT_NOT_FOUND);
		return GS_REPLY;
	}
	if (in->nr_uvm_maps >= GS_MAX_UVM_MAPS) {
		gs_uvm_reply(c, GS_REFUSE_QUOTA, NV_ERR_INSUFFICIENT_RESOURCES);
		return GS_REPLY;
	}
	if (gs_busy_conflict(in, GS_BUSY_SOURCE, p->h_client, p->h_memory)) {
		gs_uvm_reply(c, GS_REFUSE_MALFORMED, NV_ERR_STATE_IN_USE);
		return GS_REPLY;
	}
	gs_busy_add(in, c, GS_BUSY_SOURCE, p->h_client, p->h_memory);
	if (!ob->mem)
		return GS_PASS;		/* nothing counted: nothing to hold */
	m->file_id = c->file_id;
	m->start = p->base;
	m->end = p->base + p->length - 1;
	m->mem = ob->mem;
	m->mem->refs++;
	m->nr_gpus = gs_uvm_map_count(c);
	for (i = 0; i < m->nr_gpus; i++)
		gs_uvm_gpus(m)[i] = p->per_gpu_attributes[i].gpu_uuid;
	return GS_PASS;
}

enum gs_verdict gs_uvm_pre(struct gs_inst *in, struct gs_call *c)
{
	switch (c->escape) {
	case UVM_MAP_EXTERNAL_ALLOCATION:
		return gs_uvm_pre_map(in, c);
	}
	return GS_PASS;
}

static void gs_uvm_drop(struct gs_inst *in, struct gs_uvm_map **pp)
{
	struct gs_uvm_map *m = *pp;

	*pp = m->next;
	gs_mem_put(in, m->mem);
	in->nr_uvm_maps--;
	gs_free(m);
}

static int gs_uuid_eq(const struct nv_processor_uuid *a, const struct nv_processor_uuid *b)
{
	nv_u32 i;

	for (i = 0; i < sizeof(a->uuid); i++)
		if (a->uuid[i] != b->uuid[i])
			return 0;
	return 1;
}

/* UVM_UNMAP_EXTERNAL took the mapping off one GPU: the uuid is done with */
static void gs_uvm_unmap_gpu(struct gs_uvm_map *m, const struct nv_processor_uuid *gpu)
{
	struct nv_processor_uuid *g = gs_uvm_gpus(m);
	nv_u32 i = 0;

	while (i < m->nr_gpus) {
		if (gs_uuid_eq(&g[i], gpu))
			g[i] = g[--m->nr_gpus];
		else
			i++;
	}
}

/*
 * A successful UVM_FREE or UVM_UNMAP_EXTERNAL (gpu: its GPU) of
 * [base, base + length): the mappings of the file entirely inside it are
 * gone (on that GPU). One that is partly outside stays whole: UVM keeps the
 * duplicate while any piece of the mapping is left (uvm_ext_gpu_map_split()
 * shares it).
 */
static void gs_uvm_release(struct gs_inst *in, nv_u64 file_id, nv_u64 base, nv_u64 length,
			   const struct nv_processor_uuid *gpu)
{
	struct gs_uvm_map **pp = &in->uvm_maps;
	nv_u64 end = base + length - 1;

	if (!length || end < base)
		return;
	while (*pp) {
		struct gs_uvm_map *m = *pp;

		if (m->file_id == file_id && m->start >= base && m->end <= end) {
			if (gpu)
				gs_uvm_unmap_gpu(m, gpu);
			if (!gpu || !m->nr_gpus) {
				gs_uvm_drop(in, pp);
				continue;
			}
		}
		pp = &m->next;
	}
}

void gs_uvm_post(struct gs_inst *in, struct gs_call *c, int ret)
{
	const struct uvm_range_params *fp = (const void *)c->checked;
	const struct uvm_unmap_external_params *up = (const void *)c->checked;
	struct gs_uvm_map *m = c->spare_uvm;

	if (!c->arg || c->arg_size < gs_uvm_arg_size(c->escape))
		return;		/* not decoded (the glue passed no block) */
	switch (c->escape) {
	case UVM_MAP_EXTERNAL_ALLOCATION:
		/*
		 * Whatever the reply says: UVM may hold the memory. A record
		 * kept for a call that failed goes with the range or the file.
		 */
		if (m && m->mem) {
			c->spare_uvm = NULL;
			m->next = in->uvm_maps;
			in->uvm_maps = m;
			in->nr_uvm_maps++;
		}
		break;
	case UVM_FREE:
		c->status = ((const struct uvm_range_params *)c->arg)->rm_status;
		if (!ret && c->reply_trusted && c->status == NV_OK)
			gs_uvm_release(in, c->file_id, fp->base, fp->length, NULL);
		break;
	case UVM_UNMAP_EXTERNAL:
		c->status = ((const struct uvm_unmap_external_params *)c->arg)->rm_status;
		if (!ret && c->reply_trusted && c->status == NV_OK)
			gs_uvm_release(in, c->file_id, up->base, up->length, &up->gpu_uuid);
		break;
	}
}

/* the driver did not run c: the reference it took goes */
void gs_uvm_abort(struct gs_inst *in, struct gs_call *c)
{
	if (c->spare_uvm && c->spare_uvm->mem)
		gs_mem_put(in, c->spare_uvm->mem);
	if (c->spare_uvm)
		c->spare_uvm->mem = NULL;
}

void gs_uvm_spares_free(struct gs_call *c)
{
	gs_free(c->spare_uvm);
	c->spare_uvm = NULL;
}

/* the UVM file's VA space is destroyed: UVM let go of everything it held */
void gs_uvm_free_file(struct gs_inst *in, nv_u64 file_id)
{
	struct gs_uvm_map **pp = &in->uvm_maps;

	while (*pp) {
		if ((*pp)->file_id == file_id)
			gs_uvm_drop(in, pp);
		else
			pp = &(*pp)->next;
	}
}

void gs_uvm_free_all(struct gs_inst *in)
{
	while (in->uvm_maps)
		gs_uvm_drop(in, &in->uvm_maps);
}
