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
 * UVM_REGISTER_CHANNEL is the same pattern for a channel: UVM retains it
 * (nvGpuOpsRetainChannel() duplicates its TSG and subcontext and keeps its
 * channel id and instance block), with the GR context buffers RM allocated
 * for it, after the caller frees it, until UVM_UNREGISTER_CHANNEL,
 * UVM_UNREGISTER_GPU(_VASPACE) or the file's release. RM's framebuffer of a
 * channel is not counted per process; the instance's channel cap
 * (GS_MAX_CHANNELS) is what bounds it, so a channel UVM retains after its free
 * stays counted against that cap. UVM_MAP_DYNAMIC_PARALLELISM_REGION and
 * UVM_ALLOC_SEMAPHORE_POOL make UVM allocate page tables in video memory, pinned
 * (uvm_pmm_gpu.c, UVM_PMA_ALLOCATE_PINNED), for as long as the range lives:
 * their number is capped (GS_MAX_UVM_REGIONS; CUDA makes one or two per
 * context). Their release is UVM_FREE's, the same as for mappings.
 *
 * Page tables: UVM maps with the largest page size that the range's base,
 * length and offset and the memory's pages allow (uvm_map_external.c), and
 * allocates the tables pinned in video memory, counted by no one; with 4 KiB
 * pages they take 4 KiB per 2 MiB mapped (measured on the H100: 1030 MiB for
 * 512 maps of one 1 GiB allocation at 4 KiB alignment). The first mapping of
 * an allocation is not charged for them (at most 1/512 of what is charged
 * already, per GPU); every further mapping of the same memory, and every
 * page-table-only range, is charged an upper bound (gs_uvm_pt_bound()) on the
 * GPU of the memory (the instance's first GPU for system memory and ranges),
 * so remapping one allocation over and over cannot multiply the limit.
 *
 * What may be mapped or registered: an object the instance registered, of one
 * of its own clients. RM lets UVM duplicate an object of any client whose share policy
 * allows it (client_resource.c, RS_SHARE_TYPE_PID for the calling process,
 * or a policy RM_SHARE set): another instance's shared object is answered as
 * RM answers a client that does not exist.
 */
#include "core_int.h"

/* the GPU uuids of a record, after it */
static struct nv_processor_uuid *gs_uvm_gpus(struct gs_uvm_rec *r)
{
	return (struct nv_processor_uuid *)(r + 1);
}

/*
 * What follows the per-GPU array of a UVM_MAP_EXTERNAL_ALLOCATION block, whose
 * length is the driver's (nvrm_abi.h struct nvrm_table); the glue copied in
 * gs_uvm_arg_size() bytes.
 */
static const struct uvm_map_external_allocation_tail *gs_uvm_map_tail(const struct gs_call *c)
{
	return (const void *)((const char *)c->arg + gs_abi()->uvm_map_external_tail);
}

/* could the object RM has under ob's handle be memory, by the core's record? */
static int gs_uvm_may_be_memory(const struct gs_obj *ob)
{
	if (ob->o.flags & GS_OBJ_LOST)
		return 0;
	switch (ob->o.obj_kind) {
	case GPUSLICE_OBJ_CLIENT:
	case GPUSLICE_OBJ_TSG:
	case GPUSLICE_OBJ_CHANNEL:
		return 0;
	}
	switch (ob->o.klass) {
	case NV01_DEVICE_0:
	case NV20_SUBDEVICE_0:
	case FERMI_VASPACE_A:
	case FERMI_CONTEXT_SHARE_A:
		return 0;
	}
	return 1;
}

static nv_u32 gs_uvm_map_count(const struct gs_call *c)
{
	const struct uvm_map_external_allocation_tail *t = gs_uvm_map_tail(c);

	if (!c->arg || c->arg_size < gs_abi()->uvm_map_external_size || !t->gpu_attributes_count ||
	    t->gpu_attributes_count > gs_abi()->uvm_gpus)
		return 0;
	return (nv_u32)t->gpu_attributes_count;
}

/* the blocks of the commands decided on here: their size and where their status is */
static const struct {
	nv_u32 cmd;
	nv_u32 size;
	nv_u32 status;
} gs_uvm_blocks[] = {
	{ UVM_REGISTER_CHANNEL, sizeof(struct uvm_register_channel_params),
	  __builtin_offsetof(struct uvm_register_channel_params, rm_status) },
	{ UVM_UNREGISTER_CHANNEL, sizeof(struct uvm_unregister_channel_params),
	  __builtin_offsetof(struct uvm_unregister_channel_params, rm_status) },
	{ UVM_FREE, sizeof(struct uvm_range_params),
	  __builtin_offsetof(struct uvm_range_params, rm_status) },
	{ UVM_MAP_DYNAMIC_PARALLELISM_REGION, sizeof(struct uvm_map_dynamic_parallelism_region_params),
	  __builtin_offsetof(struct uvm_map_dynamic_parallelism_region_params, rm_status) },
	{ UVM_UNMAP_EXTERNAL, sizeof(struct uvm_unmap_external_params),
	  __builtin_offsetof(struct uvm_unmap_external_params, rm_status) },
};

nv_u32 gs_uvm_arg_size(nv_u32 cmd)
{
	unsigned int i;

	/* the two with a per-GPU array: the driver's length (struct nvrm_table) */
	if (cmd == UVM_MAP_EXTERNAL_ALLOCATION)
		return gs_abi()->uvm_map_external_size;
	if (cmd == UVM_ALLOC_SEMAPHORE_POOL)
		return gs_abi()->uvm_semaphore_pool_size;

	for (i = 0; i < ARRAY_SIZE(gs_uvm_blocks); i++)
		if (gs_uvm_blocks[i].cmd == cmd)
			return gs_uvm_blocks[i].size;
	return 0;
}

nv_u32 gs_uvm_status_off(nv_u32 cmd)
{
	unsigned int i;

	if (cmd == UVM_MAP_EXTERNAL_ALLOCATION)
		return gs_abi()->uvm_map_external_tail +
		       __builtin_offsetof(struct uvm_map_external_allocation_tail, rm_status);
	if (cmd == UVM_ALLOC_SEMAPHORE_POOL)
		return gs_abi()->uvm_semaphore_pool_tail +
		       __builtin_offsetof(struct uvm_alloc_semaphore_pool_tail, rm_status);

	for (i = 0; i < ARRAY_SIZE(gs_uvm_blocks); i++)
		if (gs_uvm_blocks[i].cmd == cmd)
			return gs_uvm_blocks[i].status;
	return 0;
}

int gs_uvm_releases(nv_u32 cmd)
{
	return cmd == UVM_FREE || cmd == UVM_UNMAP_EXTERNAL || cmd == UVM_UNREGISTER_CHANNEL;
}

/*
 * An upper bound of the page tables UVM allocates to map [base, base + length)
 * on one GPU: 4 KiB pages, one 4 KiB table of 512 entries per 2 MiB and one
 * per 1 GiB above it (580 uvm_mmu.c; Hopper's tables, the 64 KiB-page ones
 * smaller). length is not 0 and base + length does not wrap (checked).
 */
static nv_u64 gs_uvm_pt_bound(nv_u64 base, nv_u64 length)
{
	nv_u64 last = base + length - 1;

	return ((last >> 21) - (base >> 21) + 1 + (last >> 30) - (base >> 30) + 1) * 4096;
}

int gs_uvm_spares_alloc(struct gs_call *c)
{
	nv_u32 n = 1;

	if (!c->arg || c->arg_size < gs_uvm_arg_size(c->escape))
		return 0;	/* not decoded */
	switch (c->escape) {
	case UVM_MAP_EXTERNAL_ALLOCATION:
		n = gs_uvm_map_count(c);
		if (!n)
			return 0;	/* UVM refuses it before duplicating anything */
		break;
	case UVM_REGISTER_CHANNEL:
	case UVM_MAP_DYNAMIC_PARALLELISM_REGION:
	case UVM_ALLOC_SEMAPHORE_POOL:
		break;
	default:
		return 0;
	}
	c->spare_uvm = gs_zalloc(sizeof(*c->spare_uvm) + n * sizeof(struct nv_processor_uuid));
	if (!c->spare_uvm)
		return -1;
	if (c->escape == UVM_REGISTER_CHANNEL)
		return 0;
	c->spare_uvm->pt = gs_zalloc(sizeof(*c->spare_uvm->pt));
	if (c->spare_uvm->pt)
		return 0;
	gs_free(c->spare_uvm);
	c->spare_uvm = NULL;
	return -1;
}

static enum gs_verdict gs_uvm_refuse(struct gs_call *c, enum gs_refusal r, nv_u32 status);

/*
 * A range UVM refuses itself, so nothing to charge: kernel-open/nvidia-uvm/uvm_api.h
 * uvm_api_range_invalid_aligned(), 4 KiB for UVM_MAP_EXTERNAL_ALLOCATION
 * (uvm_map_external.c) and the dynamic-parallelism region (uvm_va_range.c
 * uvm_map_sked_reflected_range()), PAGE_SIZE for the semaphore pool (4 KiB on x86-64;
 * a larger PAGE_SIZE refuses more, and a refused range charged here is given back at
 * the UVM file's release).
 */
static int gs_uvm_range_bad(nv_u64 base, nv_u64 length)
{
	return (base & 0xfff) || (length & 0xfff) || !base || !length || base + length < base;
}

/*
 * The page tables of r on gpu, for n GPUs: charged to r->pt, or the call
 * answered as UVM answers when it cannot allocate them.
 */
static int gs_uvm_charge_pt(struct gs_inst *in, struct gs_call *c, struct gs_uvm_rec *r,
			    nv_u32 gpu, nv_u32 n)
{
	if (!gs_charge_extra(in, r->pt, gpu, n * gs_uvm_pt_bound(r->start, r->end - r->start + 1)))
		return 0;
	in->nr_refused_quota++;
	gs_uvm_refuse(c, GS_REFUSE_QUOTA, NV_ERR_NO_MEMORY);
	return -1;
}

static enum gs_verdict gs_uvm_refuse(struct gs_call *c, enum gs_refusal r, nv_u32 status)
{
	c->refusal = r;
	c->status = status;
	*(nv_u32 *)((char *)c->arg + gs_uvm_status_off(c->escape)) = status;
	return GS_REPLY;
}

/* an object of one of the instance's clients, or the call answered as RM answers */
static struct gs_obj *gs_uvm_object(struct gs_inst *in, struct gs_call *c, nv_handle client,
				    nv_handle handle)
{
	struct gs_obj *ob;

	if (!gs_is_client(in, client)) {
		gs_uvm_refuse(c, GS_REFUSE_FOREIGN, NV_ERR_INVALID_CLIENT);
		return NULL;
	}
	ob = gs_obj_find(in, client, handle);
	if (!ob)
		gs_uvm_refuse(c, GS_REFUSE_FOREIGN, NV_ERR_OBJECT_NOT_FOUND);
	return ob;
}

static int gs_uvm_full(struct gs_inst *in, struct gs_call *c, enum gs_uvm_kind kind)
{
	if (in->nr_uvm_recs < GS_MAX_UVM_RECS &&
	    (kind != GS_UVM_REGION || in->nr_uvm_regions < GS_MAX_UVM_REGIONS))
		return 0;
	gs_uvm_refuse(c, GS_REFUSE_LIMIT, NV_ERR_INSUFFICIENT_RESOURCES);
	return 1;
}

static void gs_uvm_add(struct gs_inst *in, struct gs_call *c, struct gs_uvm_rec *r)
{
	c->spare_uvm = NULL;
	c->uvm_added = r;
	r->file_id = c->file_id;
	r->next = in->uvm_recs;
	in->uvm_recs = r;
	in->nr_uvm_recs++;
	if (r->kind == GS_UVM_REGION)
		in->nr_uvm_regions++;
}

/*
 * UVM_MAP_EXTERNAL_ALLOCATION: the block is staged (the driver reads what
 * was checked here). The memory's charge is referenced now, so that a free
 * of the object from here on uncharges nothing UVM may hold; a creation in
 * flight on the handle waits, as for a duplicate.
 */
static enum gs_verdict gs_uvm_pre_map(struct gs_inst *in, struct gs_call *c)
{
	const struct uvm_map_external_allocation_params *p = c->arg;	/* head and array */
	const struct uvm_map_external_allocation_tail *t = gs_uvm_map_tail(c);
	struct gs_uvm_rec *r = c->spare_uvm;
	const struct gs_obj *ob;
	nv_u32 i;

	if (!r)
		return GS_PASS;		/* no GPU, or too many: UVM answers */
	ob = gs_uvm_object(in, c, t->h_client, t->h_memory);
	if (!ob || gs_uvm_full(in, c, GS_UVM_MAP))
		return GS_REPLY;
	/*
	 * RM duplicates only a Memory object for UVM, and answers anything else,
	 * and an object it invalidated, NV_ERR_INVALID_OBJECT_HANDLE
	 * (kernel/mem_mgr/mem.c memGetByHandle_IMPL: dynamicCast of the
	 * resource, NULL once invalidated; rmapi/nv_gpu_ops.c dupMemory). The
	 * core answers so for what its record says cannot be memory: should RM
	 * have put memory there without the core (a handle RM chose again once
	 * its counter wrapped), UVM must not hold it uncounted.
	 */
	if (!ob->mem && !gs_uvm_may_be_memory(ob))
		return gs_uvm_refuse(c, GS_REFUSE_MALFORMED, NV_ERR_INVALID_OBJECT_HANDLE);
	if (gs_busy_conflict(in, GS_BUSY_SOURCE, t->h_client, t->h_memory, 0))
		return gs_uvm_refuse(c, GS_REFUSE_MALFORMED, NV_ERR_STATE_IN_USE);
	if (!ob->mem || gs_uvm_range_bad(p->base, p->length))
		return GS_PASS;		/* nothing counted, or UVM refuses it: nothing to hold */
	r->kind = GS_UVM_MAP;
	r->start = p->base;
	r->end = p->base + p->length - 1;
	r->nr_gpus = gs_uvm_map_count(c);
	if (ob->mem->uvm_maps &&
	    gs_uvm_charge_pt(in, c, r, ob->mem->sys ? gs_first_gpu(in) : ob->mem->gpu, r->nr_gpus))
		return GS_REPLY;
	gs_busy_add(in, c, GS_BUSY_SOURCE, t->h_client, t->h_memory, 0);
	r->mem = ob->mem;
	r->mem->refs++;
	r->mem->uvm_maps++;
	for (i = 0; i < r->nr_gpus; i++)
		gs_uvm_gpus(r)[i] = p->per_gpu_attributes[i].gpu_uuid;
	return GS_PASS;
}

/*
 * UVM_REGISTER_CHANNEL: recorded at the check, so that a free of the channel
 * from here on finds the record (gs_uvm_channel_freed()).
 */
static enum gs_verdict gs_uvm_pre_channel(struct gs_inst *in, struct gs_call *c)
{
	const struct uvm_register_channel_params *p = c->arg;
	struct gs_uvm_rec *r = c->spare_uvm;
	struct gs_obj *ob;

	ob = gs_uvm_object(in, c, p->h_client, p->h_channel);
	if (!ob || gs_uvm_full(in, c, GS_UVM_CHANNEL))
		return GS_REPLY;
	if (ob->o.obj_kind != GPUSLICE_OBJ_CHANNEL)
		return GS_PASS;		/* UVM retains channels only */
	r->kind = GS_UVM_CHANNEL;
	r->client = p->h_client;
	r->handle = p->h_channel;
	r->nr_gpus = 1;
	gs_uvm_gpus(r)[0] = p->gpu_uuid;
	ob->uvm_registered = 1;
	gs_uvm_add(in, c, r);
	return GS_PASS;
}

static enum gs_verdict gs_uvm_pre_region(struct gs_inst *in, struct gs_call *c, nv_u64 base,
					 nv_u64 length)
{
	struct gs_uvm_rec *r = c->spare_uvm;

	if (gs_uvm_range_bad(base, length))
		return GS_PASS;		/* UVM refuses it */
	if (gs_uvm_full(in, c, GS_UVM_REGION))
		return GS_REPLY;
	r->kind = GS_UVM_REGION;
	r->start = base;
	r->end = base + length - 1;
	if (gs_uvm_charge_pt(in, c, r, gs_first_gpu(in), 1))
		return GS_REPLY;
	gs_uvm_add(in, c, r);
	return GS_PASS;
}

enum gs_verdict gs_uvm_pre(struct gs_inst *in, struct gs_call *c)
{
	if (!c->spare_uvm)
		return GS_PASS;
	switch (c->escape) {
	case UVM_MAP_EXTERNAL_ALLOCATION:
		return gs_uvm_pre_map(in, c);
	case UVM_REGISTER_CHANNEL:
		return gs_uvm_pre_channel(in, c);
	case UVM_MAP_DYNAMIC_PARALLELISM_REGION: {
		const struct uvm_map_dynamic_parallelism_region_params *p = c->arg;

		return gs_uvm_pre_region(in, c, p->base, p->length);
	}
	case UVM_ALLOC_SEMAPHORE_POOL: {
		const struct uvm_alloc_semaphore_pool_params *p = c->arg;

		return gs_uvm_pre_region(in, c, p->base, p->length);
	}
	}
	return GS_PASS;
}

static void gs_uvm_drop(struct gs_inst *in, struct gs_uvm_rec **pp)
{
	struct gs_uvm_rec *r = *pp;

	*pp = r->next;
	if (r->mem) {
		r->mem->uvm_maps--;
		gs_mem_put(in, r->mem);
	}
	if (r->pt && r->pt->refs)
		gs_mem_put(in, r->pt);
	else
		gs_free(r->pt);
	if (r->orphan)
		in->nr_uvm_channels--;
	if (r->kind == GS_UVM_REGION)
		in->nr_uvm_regions--;
	in->nr_uvm_recs--;
	gs_free(r);
}

static int gs_uuid_eq(const struct nv_processor_uuid *a, const struct nv_processor_uuid *b)
{
	nv_u32 i;

	for (i = 0; i < sizeof(a->uuid); i++)
		if (a->uuid[i] != b->uuid[i])
			return 0;
	return 1;
}

/* UVM let go of the record on one GPU: that uuid is done with */
static void gs_uvm_drop_gpu(struct gs_uvm_rec *r, const struct nv_processor_uuid *gpu)
{
	struct nv_processor_uuid *g = gs_uvm_gpus(r);
	nv_u32 i = 0;

	while (i < r->nr_gpus) {
		if (gs_uuid_eq(&g[i], gpu))
			g[i] = g[--r->nr_gpus];
		else
			i++;
	}
}

/*
 * A successful UVM_FREE (gpu NULL) or UVM_UNMAP_EXTERNAL (mappings only, on
 * gpu) of [base, base + length): the file's mappings and regions entirely
 * inside it are gone (on that GPU). One partly outside stays whole: UVM keeps
 * the duplicate while any piece of the mapping is left (uvm_ext_gpu_map_split()
 * shares it).
 */
static void gs_uvm_release(struct gs_inst *in, nv_u64 file_id, nv_u64 base, nv_u64 length,
			   const struct nv_processor_uuid *gpu)
{
	struct gs_uvm_rec **pp = &in->uvm_recs;
	nv_u64 end = base + length - 1;

	if (!length || end < base)
		return;
	while (*pp) {
		struct gs_uvm_rec *r = *pp;

		if (r->file_id == file_id && r->kind != GS_UVM_CHANNEL &&
		    (!gpu || r->kind == GS_UVM_MAP) && r->start >= base && r->end <= end) {
			if (gpu)
				gs_uvm_drop_gpu(r, gpu);
			if (!gpu || !r->nr_gpus) {
				gs_uvm_drop(in, pp);
				continue;
			}
		}
		pp = &r->next;
	}
}

/*
 * A successful UVM_UNREGISTER_CHANNEL: UVM let go of the channel (it finds it
 * by client and handle alone, uvm_user_channel.c uvm_unregister_channel()).
 */
static void gs_uvm_release_channel(struct gs_inst *in, nv_u64 file_id,
				   const struct uvm_unregister_channel_params *p)
{
	struct gs_uvm_rec **pp = &in->uvm_recs;

	while (*pp) {
		struct gs_uvm_rec *r = *pp;

		if (r->file_id == file_id && r->kind == GS_UVM_CHANNEL && r->client == p->h_client &&
		    r->handle == p->h_channel) {
			gs_uvm_drop(in, pp);
			return;
		}
		pp = &r->next;
	}
}

/* The caller freed a channel UVM_REGISTER_CHANNEL named: UVM may retain it. */
void gs_uvm_channel_freed(struct gs_inst *in, const struct gs_obj *ob)
{
	struct gs_uvm_rec *r;

	for (r = in->uvm_recs; r; r = r->next) {
		if (r->kind == GS_UVM_CHANNEL && !r->orphan && r->client == ob->o.client &&
		    r->handle == ob->o.handle) {
			r->orphan = 1;
			in->nr_uvm_channels++;
		}
	}
}

void gs_uvm_post(struct gs_inst *in, struct gs_call *c, int ret)
{
	const void *req = c->checked;
	struct gs_uvm_rec *r = c->spare_uvm;
	int released;

	if (!c->arg || c->arg_size < gs_uvm_arg_size(c->escape))
		return;		/* not decoded (the glue passed no block) */
	c->status = *(const nv_u32 *)((const char *)c->arg + gs_uvm_status_off(c->escape));
	/* UVM let go only if it says so where the caller could not write */
	released = !ret && c->reply_trusted && c->status == NV_OK;
	switch (c->escape) {
	case UVM_MAP_EXTERNAL_ALLOCATION:
		/*
		 * Whatever the reply says: UVM may hold the memory. A record
		 * kept for a call that failed goes with the range or the file.
		 */
		if (r && r->mem)
			gs_uvm_add(in, c, r);
		break;
	case UVM_FREE:
		if (released)
			gs_uvm_release(in, c->file_id, ((const struct uvm_range_params *)req)->base,
				       ((const struct uvm_range_params *)req)->length, NULL);
		break;
	case UVM_UNMAP_EXTERNAL: {
		const struct uvm_unmap_external_params *p = req;

		if (released)
			gs_uvm_release(in, c->file_id, p->base, p->length, &p->gpu_uuid);
		break;
	}
	case UVM_UNREGISTER_CHANNEL:
		if (released)
			gs_uvm_release_channel(in, c->file_id, req);
		break;
	}
}

/*
 * The driver did not run c: the reference a mapping took goes, and so does
 * what a channel or region recorded at the check (gs_uvm_add()).
 */
void gs_uvm_abort(struct gs_inst *in, struct gs_call *c)
{
	struct gs_uvm_rec **pp = &in->uvm_recs;
	struct gs_uvm_rec *r = c->spare_uvm;

	if (r && r->mem) {
		r->mem->uvm_maps--;
		gs_mem_put(in, r->mem);
		r->mem = NULL;
	}
	if (r && r->pt && r->pt->refs) {
		gs_mem_put(in, r->pt);	/* frees it */
		r->pt = NULL;
	}
	while (c->uvm_added && *pp) {
		if (*pp == c->uvm_added) {
			gs_uvm_drop(in, pp);
			break;
		}
		pp = &(*pp)->next;
	}
	c->uvm_added = NULL;
}

void gs_uvm_spares_free(struct gs_call *c)
{
	if (c->spare_uvm)
		gs_free(c->spare_uvm->pt);	/* never charged: charged ones are in a record */
	gs_free(c->spare_uvm);
	c->spare_uvm = NULL;
}

/* the UVM file's VA space is destroyed: UVM let go of everything it held */
void gs_uvm_free_file(struct gs_inst *in, nv_u64 file_id)
{
	struct gs_uvm_rec **pp = &in->uvm_recs;

	while (*pp) {
		if ((*pp)->file_id == file_id)
			gs_uvm_drop(in, pp);
		else
			pp = &(*pp)->next;
	}
}

void gs_uvm_free_all(struct gs_inst *in)
{
	while (in->uvm_recs)
		gs_uvm_drop(in, &in->uvm_recs);
}
