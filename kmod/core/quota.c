// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * quota.c - the video memory limit.
 *
 * RM_ALLOC of a video memory class reserves the requested size in gs_pre()
 * and is refused the way RM itself refuses (ioctl 0, status NV_ERR_NO_MEMORY)
 * when used + reserved + size would pass the limit. gs_post() turns the
 * reservation into the size RM actually allocated (RM pads some requests:
 * 4 MiB came back as 6 MiB in the traces) or drops it if RM failed. The
 * reservation is what keeps concurrent callers under the limit; the padding
 * RM adds is charged after the fact, so used can pass the limit by at most
 * that padding (2 MiB per allocation seen), and no further allocation passes.
 *
 * Which classes hold video memory on 580 (src/nvidia/src/kernel/mem_mgr/):
 * NV01_MEMORY_LOCAL_USER (0x40) is what cuMemAlloc and cuMemCreate use
 * (vidmem.c, NV_MEMORY_ALLOCATION_PARAMS, size at offset 64 in and out).
 * NV01_MEMORY_LOCAL_PRIVILEGED (0x3f) is privileged; NV01_MEMORY_LOCAL_PHYSICAL
 * (0xc2, phys_mem.c) reports its size only on the way out; NV_MEMORY_FABRIC
 * (0xf8) and NV_MEMORY_MULTICAST_FABRIC (0xfd) allocate for other nodes too;
 * NV01_MEMORY_LIST_FBMEM (0x82) names existing framebuffer pages. None of them
 * appears in the traces: all are refused (gs_vidmem_class() < 0) rather than
 * left uncounted. NV_ESC_RM_VID_HEAP_CONTROL is refused by the escape filter.
 */
#include "core_int.h"

int gs_vidmem_class(nv_u32 klass)
{
	switch (klass) {
	case NV01_MEMORY_LOCAL_USER:
		return 1;
	case NV01_MEMORY_LOCAL_PRIVILEGED:
	case NV01_MEMORY_LOCAL_PHYSICAL:
	case NV01_MEMORY_LIST_FBMEM:
	case NV_MEMORY_FABRIC:
	case NV_MEMORY_MULTICAST_FABRIC:
		return -1;
	}
	return 0;
}

#define GS_SIZE_OFF	64	/* offsetof(struct nv_memory_allocation_params, size) */

static void gs_refused_event(struct gs_inst *in, struct gs_call *c,
			     const struct nvos64_params *p, nv_u64 size, struct gs_evq *q)
{
	struct gs_event ev;

	memset(&ev, 0, sizeof(ev));
	ev.type = GPUSLICE_EV_ALLOC_REFUSED;
	ev.obj_kind = GPUSLICE_OBJ_MEMORY;
	ev.pid = c->pid;
	ev.gpu = gs_obj_gpu(in, p->h_root, p->h_object_parent, c->gpu_minor);
	ev.client = p->h_root;
	ev.handle = p->h_object_new;
	ev.parent = p->h_object_parent;
	ev.klass = p->h_class;
	ev.size = size;
	ev.status = NV_ERR_NO_MEMORY;
	ev.cmd = c->escape;
	gs_evq_push(q, &ev);
}

/* called with in->lock held; p is the glue's copy of the argument block */
enum gs_verdict gs_quota_pre(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			     struct nvos64_params *p, struct gs_evq *q)
{
	struct nv_memory_allocation_params mp;
	nv_u64 size;

	if (!io || io->read(io->ctx, p->p_alloc_parms, &mp, sizeof(mp))) {
		c->refusal = GS_REFUSE_MALFORMED;
		c->status = NV_ERR_INVALID_POINTER;
		p->status = c->status;
		return GS_REPLY;
	}
	size = mp.size;
	if (size > in->limit || in->used + in->reserved > in->limit - size) {
		c->refusal = GS_REFUSE_QUOTA;
		c->status = NV_ERR_NO_MEMORY;
		p->status = c->status;
		in->nr_refused_quota++;
		gs_refused_event(in, c, p, size, q);
		return GS_REPLY;
	}
	in->reserved += size;
	c->reserved = size;
	c->priv[0] = 1;		/* a reservation is held */
	return GS_PASS;
}

void gs_quota_release(struct gs_inst *in, struct gs_call *c)
{
	if (c->priv[0]) {
		in->reserved -= c->reserved;
		c->reserved = 0;
		c->priv[0] = 0;
	}
}

/* called with in->lock held, after RM answered */
void gs_quota_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
		   struct nvos64_params *p, struct gs_evq *q)
{
	struct gs_object o;
	struct gs_mem *mem;
	nv_u64 reserved = c->reserved;
	nv_u64 size = reserved;

	gs_quota_release(in, c);
	if (p->status != NV_OK)
		return;
	/* RM writes back the size it allocated */
	if (!io || io->read(io->ctx, p->p_alloc_parms + GS_SIZE_OFF, &size, sizeof(size)))
		size = reserved;
	mem = gs_zalloc(sizeof(*mem));
	if (!mem)
		return;
	mem->size = size;
	mem->refs = 1;
	gs_obj_init(&o, in, c, GPUSLICE_OBJ_MEMORY, p->h_root, p->h_object_parent,
		    p->h_object_new, p->h_class);
	if (!gs_obj_add(in, &o, mem, q)) {
		gs_free(mem);
		return;
	}
	in->used += size;
	if (in->used > in->peak)
		in->peak = in->used;
}
