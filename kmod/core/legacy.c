// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * legacy.c - the RM escapes older than RM_ALLOC and RM_CONTROL that OpenGL,
 * Vulkan and the video libraries still use on 580 (tests/traces/
 * render-video-h100.jsonl): each is RM's own call in a legacy wrapper
 * (src/nvidia/interface/deprecated/), and each names the client first.
 *
 *  - NV_ESC_RM_VID_HEAP_CONTROL (NVOS32): the heap interface OpenGL and Vulkan
 *    allocate every surface through. Its allocations are an RmAlloc of
 *    NV50_MEMORY_VIRTUAL (flag VIRTUAL), NV_MEMORY_EXTENDED_USER (attr2
 *    USE_EGM), NV01_MEMORY_LOCAL_USER (attr LOCATION_VIDMEM) or
 *    NV01_MEMORY_SYSTEM (rmapi_deprecated_vidheapctrl.c
 *    _rmVidHeapControlAllocCommon): counted here as that class is counted
 *    through RM_ALLOC (quota.c), and registered under the handle RM made so
 *    that its RM_FREE returns the charge. FREE is an RmFree. INFO reports the
 *    whole GPU's heap: answered here with the instance's. GET_MEM_ALIGNMENT
 *    computes an alignment. The rest (compression tags, hardware resources,
 *    OS descriptors) allocate what the core does not count: refused as RM
 *    answers a function the heap does not have.
 *  - NV_ESC_RM_IDLE_CHANNELS (NVOS30): waits until the caller's channels are
 *    idle (RM refuses another client's: kernel_idle_channels.c), holding the
 *    GPU lock: the wait is capped, so that it cannot hold RM, and with it the
 *    scheduler's calls and every other tenant's, for long.
 *  - NV_ESC_RM_ALLOC_CONTEXT_DMA2 (NVOS39), NV_ESC_RM_MAP_MEMORY_DMA (NVOS46),
 *    NV_ESC_RM_UNMAP_MEMORY_DMA (NVOS47): a context DMA over, and mappings of,
 *    the caller's own memory in its own VA space; RM looks every handle up in
 *    the client, which must be the instance's.
 */
#include "core_int.h"


/*
 * The legacy escapes and the capabilities each is for: gVisor nvproxy's
 * (pkg/sentry/devices/nvproxy/version.go Init(), frontendIoctl, unchanged
 * to 580 but for the parameters' layout): VID_HEAP_CONTROL compUtil,
 * IDLE_CHANNELS and ALLOC_CONTEXT_DMA2 CapGraphics, MAP_MEMORY_DMA and
 * UNMAP_MEMORY_DMA CapGraphics|CapVideo. An instance with none of them is
 * refused the escape as RM refuses one it does not have (core.c
 * gs_pre_caps()). NV_ESC_RM_BIND_CONTEXT_DMA is in neither table: the
 * filter refuses it (filter.c gs_filter_escape()).
 */
static const struct {
	nv_u32 escape;
	nv_u32 caps;
} gs_legacy_escapes[] = {
	{ NV_ESC_RM_VID_HEAP_CONTROL, GS_CAPS_COMPUTE_UTILITY },
	{ NV_ESC_RM_IDLE_CHANNELS, GS_CAP_GRAPHICS },
	{ NV_ESC_RM_ALLOC_CONTEXT_DMA2, GS_CAP_GRAPHICS },
	{ NV_ESC_RM_MAP_MEMORY_DMA, GS_CAP_GRAPHICS | GS_CAP_VIDEO },
	{ NV_ESC_RM_UNMAP_MEMORY_DMA, GS_CAP_GRAPHICS | GS_CAP_VIDEO },
};

/* the escape's capabilities; 0: not a legacy escape */
static nv_u32 gs_legacy_caps(nv_u32 escape)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(gs_legacy_escapes); i++)
		if (gs_legacy_escapes[i].escape == escape)
			return gs_legacy_escapes[i].caps;
	return 0;
}

int gs_legacy_escape(nv_u32 escape)
{
	return gs_legacy_caps(escape) != 0;
}

static nv_u32 gs_u32_at(const void *blk, nv_u32 off)
{
	nv_u32 v;

	memcpy(&v, (const char *)blk + off, sizeof(v));
	return v;
}

static nv_u64 gs_u64_at(const void *blk, nv_u32 off)
{
	nv_u64 v;

	memcpy(&v, (const char *)blk + off, sizeof(v));
	return v;
}

static void gs_put_u32(void *blk, nv_u32 off, nv_u32 v)
{
	memcpy((char *)blk + off, &v, sizeof(v));
}

static void gs_put_u64(void *blk, nv_u32 off, nv_u64 v)
{
	memcpy((char *)blk + off, &v, sizeof(v));
}

static int gs_vidheap_alloc(nv_u32 function)
{
	return function == NVOS32_FUNCTION_ALLOC_SIZE ||
	       function == NVOS32_FUNCTION_ALLOC_SIZE_RANGE ||
	       function == NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT;
}

/* where the size RM allocated comes back, per allocation function */
static nv_u32 gs_vidheap_size_off(nv_u32 function)
{
	return function == NVOS32_FUNCTION_ALLOC_SIZE_RANGE ? NVOS32_OFF_RANGE_SIZE :
							      NVOS32_OFF_SIZE_SIZE;
}

/*
 * What an allocation function allocates, as RM turns it into an RmAlloc
 * (r->klass, the class whose row gates it): 1 with r filled in for counted
 * memory, 0 for a virtual range (nothing to count), -1 for EGM (not
 * allowed: a class on no row of filter.c).
 */
static int gs_vidheap_req(const void *blk, struct gs_mem_req *r)
{
	nv_u32 function = gs_u32_at(blk, NVOS32_OFF_FUNCTION);
	nv_u32 flags = gs_u32_at(blk, NVOS32_OFF_FLAGS);
	nv_u32 attr, attr2;

	memset(r, 0, sizeof(*r));
	r->root = gs_u32_at(blk, 0);
	r->parent = gs_u32_at(blk, 4);
	if (flags & NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED)
		r->handle = gs_u32_at(blk, NVOS32_OFF_HMEMORY);
	switch (function) {
	case NVOS32_FUNCTION_ALLOC_SIZE_RANGE:
		attr = gs_u32_at(blk, NVOS32_OFF_RANGE_ATTR);
		attr2 = gs_u32_at(blk, NVOS32_OFF_RANGE_ATTR2);
		r->mp.size = gs_u64_at(blk, NVOS32_OFF_RANGE_SIZE);
		r->mp.alignment = gs_u64_at(blk, NVOS32_OFF_RANGE_ALIGNMENT);
		break;
	case NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT:
		attr = gs_u32_at(blk, NVOS32_OFF_TILED_ATTR);
		attr2 = gs_u32_at(blk, NVOS32_OFF_SIZE_ATTR2);
		/*
		 * RM allocates height x pitch, whatever the size says; pitch is
		 * an NvS32, widened as RM widens it (a negative one is a size
		 * past any limit)
		 */
		r->mp.size = (nv_u64)gs_u32_at(blk, NVOS32_OFF_TILED_HEIGHT) *
			     (nv_u64)(long long)(nv_s32)gs_u32_at(blk, NVOS32_OFF_TILED_PITCH);
		r->mp.alignment = gs_u64_at(blk, NVOS32_OFF_SIZE_ALIGNMENT);
		break;
	default:
		attr = gs_u32_at(blk, NVOS32_OFF_SIZE_ATTR);
		attr2 = gs_u32_at(blk, NVOS32_OFF_SIZE_ATTR2);
		r->mp.size = gs_u64_at(blk, NVOS32_OFF_SIZE_SIZE);
		r->mp.alignment = gs_u64_at(blk, NVOS32_OFF_SIZE_ALIGNMENT);
		break;
	}
	/*
	 * RM passes these on to the class's allocation as they are
	 * (rmapi_deprecated_vidheapctrl.c: flags, alignment, attr, attr2 _IN):
	 * what PMA takes for them is charged as RM_ALLOC's is (quota.c
	 * gs_pma_size()).
	 */
	r->mp.flags = flags;
	r->mp.attr = attr;
	r->mp.attr2 = attr2;
	if (flags & NVOS32_ALLOC_FLAGS_VIRTUAL) {
		r->klass = NV50_MEMORY_VIRTUAL;
		return 0;
	}
	if ((attr2 >> NVOS32_ATTR2_USE_EGM_SHIFT) & 1)
		return -1;
	r->klass = ((attr >> NVOS32_ATTR_LOCATION_SHIFT) & 3) == NVOS32_ATTR_LOCATION_VIDMEM ?
		   NV01_MEMORY_LOCAL_USER : NV01_MEMORY_SYSTEM;
	return 1;
}

/*
 * INFO, answered for the instance: the heap is the GPU's limit for it, free
 * what it has not used, and that free space one region at offset 0.
 */
static enum gs_verdict gs_vidheap_info(struct gs_inst *in, struct gs_call *c)
{
	nv_u32 gpu = gs_obj_gpu(in, gs_u32_at(c->arg, 0), gs_u32_at(c->arg, 4), GS_GPU_UNKNOWN);
	nv_u64 limit = gpu < GPUSLICE_MAX_GPUS ? gs_gpu_limit(in, gpu) : 0;
	nv_u64 used = gpu < GPUSLICE_MAX_GPUS ? in->gpu_used[gpu] : 0;
	nv_u64 room = used < limit ? limit - used : 0;

	gs_put_u64(c->arg, NVOS32_OFF_TOTAL, limit);
	gs_put_u64(c->arg, NVOS32_OFF_FREE, room);
	gs_put_u64(c->arg, NVOS32_OFF_INFO_BASE, 0);
	gs_put_u64(c->arg, NVOS32_OFF_INFO_SIZE, room);
	gs_put_u64(c->arg, NVOS32_OFF_INFO_OFFSET, 0);
	gs_put_status(c, NVOS32_OFF_STATUS, NV_OK);
	return GS_REPLY;
}

static enum gs_verdict gs_vidheap_pre(struct gs_inst *in, struct gs_call *c, struct gs_evq *q)
{
	nv_u32 function, status, st = NVOS32_OFF_STATUS;
	const struct gs_class_row *row;
	struct gs_mem_req r;
	enum gs_verdict v;
	int kind;

	v = gs_pre_client_first(in, c, NVOS32_PARAMS_SIZE, st);
	if (v != GS_PASS)
		return v;
	function = gs_u32_at(c->arg, NVOS32_OFF_FUNCTION);
	c->what = function;
	switch (function) {
	case NVOS32_FUNCTION_ALLOC_SIZE:
	case NVOS32_FUNCTION_ALLOC_SIZE_RANGE:
	case NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT:
		break;
	case NVOS32_FUNCTION_FREE:
		if (!(gs_u32_at(c->arg, NVOS32_OFF_FREE_FLAGS) & NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED))
			return GS_PASS;		/* RM refuses it: NV_ERR_INVALID_ARGUMENT */
		return gs_pre_free_handle(in, c, gs_u32_at(c->arg, 0),
					  gs_u32_at(c->arg, NVOS32_OFF_HMEMORY), st);
	case NVOS32_FUNCTION_INFO:
		return gs_vidheap_info(in, c);
	case NVOS32_FUNCTION_GET_MEM_ALIGNMENT:
		return GS_PASS;
	case NVOS32_FUNCTION_REACQUIRE_COMPR:
	case NVOS32_FUNCTION_RELEASE_COMPR:
	case NVOS32_FUNCTION_HW_ALLOC:
	case NVOS32_FUNCTION_HW_FREE:
	case NVOS32_FUNCTION_ALLOC_OS_DESCRIPTOR:
		return gs_refuse_as(c, GS_REFUSE_UNLISTED, st, NV_ERR_NOT_SUPPORTED);
	default:
		/* RM's answer to a function it has no handler for */
		return gs_refuse_as(c, GS_REFUSE_UNLISTED, st, NV_ERR_INVALID_ARGUMENT);
	}

	kind = gs_vidheap_req(c->arg, &r);
	if (kind < 0)
		return gs_refuse_as(c, GS_REFUSE_CLASS, st, NV_ERR_NOT_SUPPORTED);
	/*
	 * the class RM allocates (_rmVidHeapControlAllocCommon: pRmApi->Alloc
	 * of it, its status the call's) is gated by its row as RM_ALLOC of it
	 */
	row = gs_class_row(r.klass);
	v = gs_pre_caps(in, c, row ? row->caps : 0, st, NV_ERR_INVALID_CLASS);
	if (v != GS_PASS)
		return v;
	if (in->nr_objects >= GS_MAX_OBJECTS)
		return gs_refuse_as(c, GS_REFUSE_LIMIT, st, NV_ERR_INSUFFICIENT_RESOURCES);
	status = gs_create_conflict(in, r.root, r.handle, r.parent);
	if (status != NV_OK)
		return gs_refuse_as(c, GS_REFUSE_MALFORMED, st, status);
	if (kind > 0) {
		v = gs_quota_check(in, c, &r, q);
		if (v != GS_PASS) {
			gs_put_status(c, st, c->status);
			return v;
		}
	}
	gs_busy_add(in, c, GS_BUSY_CREATE, r.root, r.handle, r.parent);
	return GS_PASS;
}

static void gs_vidheap_post(struct gs_inst *in, struct gs_call *c, struct gs_evq *q)
{
	const void *req = c->checked, *rep = c->arg;
	nv_u32 function = gs_u32_at(req, NVOS32_OFF_FUNCTION);
	nv_u32 status = c->reply_lost ? NV_OK : gs_u32_at(rep, NVOS32_OFF_STATUS);
	struct gs_mem_req r;

	c->status = status;
	if (function == NVOS32_FUNCTION_FREE) {
		/* a lost reply frees nothing: what stays charged is never too little */
		if (!c->reply_lost && status == NV_OK)
			gs_obj_free_tree(in, gs_u32_at(req, 0), gs_u32_at(req, NVOS32_OFF_HMEMORY), q);
		return;
	}
	if (!gs_vidheap_alloc(function) || !c->quota.held)
		return;		/* nothing counted: a virtual range */
	gs_vidheap_req(req, &r);
	/*
	 * A handle RM chose comes back in the reply, checked as RM_ALLOC's is
	 * (quota.c gs_quota_charge()); OpenGL lets RM choose for one 4 KiB
	 * allocation of host memory, which it then exports.
	 */
	gs_quota_charge(in, c, &r, gs_u32_at(rep, NVOS32_OFF_HMEMORY),
			c->reply_lost ? 0 : gs_u64_at(rep, gs_vidheap_size_off(function)), status, q);
}

enum gs_verdict gs_legacy_pre(struct gs_inst *in, struct gs_call *c, struct gs_evq *q)
{
	enum gs_verdict v;

	v = gs_pre_caps(in, c, gs_legacy_caps(c->escape), GS_ST_NONE, 0);
	if (v != GS_PASS)
		return v;
	switch (c->escape) {
	case NV_ESC_RM_VID_HEAP_CONTROL:
		return gs_vidheap_pre(in, c, q);
	case NV_ESC_RM_IDLE_CHANNELS:
		v = gs_pre_client_first(in, c, NVOS30_PARAMS_SIZE, NVOS30_OFF_STATUS);
		if (v == GS_PASS && (!gs_u32_at(c->arg, NVOS30_OFF_TIMEOUT) ||
				     gs_u32_at(c->arg, NVOS30_OFF_TIMEOUT) > GS_WAIT_MAX_US))
			gs_put_u32(c->arg, NVOS30_OFF_TIMEOUT, GS_WAIT_MAX_US);
		return v;
	case NV_ESC_RM_ALLOC_CONTEXT_DMA2:
		return gs_pre_client_first(in, c, NVOS39_PARAMS_SIZE, NVOS39_OFF_STATUS);
	case NV_ESC_RM_MAP_MEMORY_DMA:
		return gs_pre_client_first(in, c, gs_abi()->nvos46_size, gs_abi()->nvos46_status);
	case NV_ESC_RM_UNMAP_MEMORY_DMA:
		return gs_pre_client_first(in, c, gs_abi()->nvos47_size, gs_abi()->nvos47_status);
	}
	return gs_fail(c, GS_REFUSE_ESCAPE, EPERM);
}

void gs_legacy_post(struct gs_inst *in, struct gs_call *c, struct gs_evq *q)
{
	if (c->escape == NV_ESC_RM_VID_HEAP_CONTROL)
		gs_vidheap_post(in, c, q);
}
