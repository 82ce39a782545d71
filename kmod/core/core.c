// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * core.c - the instance and the dispatch of one ioctl: gs_pre() decodes the
 * argument block and decides (filter.c, quota.c), gs_post() records what RM
 * did (registry.c, quota.c) and rewrites replies (virt.c).
 *
 * Every escape the core does not decode is refused unless filter.c lists it
 * as safe without decoding. Every block is checked for its size before it is
 * read: a short block fails the ioctl with -EINVAL (GS_FAIL), since it has no
 * status field to answer in. A parameter pointer that cannot be read is
 * answered with NV_ERR_INVALID_POINTER, as RM would.
 */
#include "core_int.h"

/* ---- instance ---- */

/*
 * The registry forgot ob, or RM invalidated it and the record stays (lost):
 * what the core attached to it goes, under in->lock: its memory's charge,
 * the memory its client held without a handle, and a channel nvidia-uvm
 * retains is counted as UVM's from now on.
 */
static void gs_obj_released(struct gs_inst *in, struct gs_obj *ob)
{
	if (ob->mem) {
		gs_mem_put(in, ob->mem);
		ob->mem = NULL;
	}
	gs_orphan_put(in, ob);
	if (ob->o.obj_kind == GPUSLICE_OBJ_CHANNEL && ob->uvm_registered)
		gs_uvm_channel_freed(in, ob);
}

static const struct gs_reg_ops gs_reg_ops = {
	.release = gs_obj_released,
};

struct gs_inst *gs_inst_new(nv_u64 mem_limit, const struct gs_inst_ops *ops)
{
	struct gs_inst *in = gs_zalloc(sizeof(*in));

	if (!in)
		return NULL;
	gs_mutex_init(&in->lock);
	gs_hash_key_init(&in->hash_key);
	in->reg = &gs_reg_ops;
	in->limit = mem_limit;
	in->gpus = ~0u;
	in->caps = GS_CAPS_ALL;
	if (ops)
		in->ops = *ops;
	return in;
}

void gs_inst_free(struct gs_inst *in)
{
	if (!in)
		return;
	while (in->exports)
		gs_export_free_file(in, in->exports->file_id);
	gs_uvm_free_all(in);
	gs_obj_free_all(in);
	gs_osev_gone(in, 0, 0);
	gs_mutex_destroy(&in->lock);
	gs_free(in);
}

void gs_inst_set_limit(struct gs_inst *in, nv_u64 mem_limit)
{
	gs_lock(&in->lock);
	in->limit = mem_limit;
	gs_unlock(&in->lock);
}

void gs_inst_set_gpu_ids(struct gs_inst *in, const nv_u32 *ids)
{
	gs_lock(&in->lock);
	memcpy(in->gpu_ids, ids, sizeof(in->gpu_ids));
	in->gpu_ids_set = 1;
	gs_unlock(&in->lock);
}

void gs_inst_set_gpus(struct gs_inst *in, nv_u32 mask)
{
	gs_lock(&in->lock);
	in->gpus = mask;
	gs_unlock(&in->lock);
}

/* limits[GPUSLICE_MAX_GPUS] bytes per GPU, 0 for the instance's limit; NULL: all 0 */
void gs_inst_set_gpu_limits(struct gs_inst *in, const nv_u64 *limits)
{
	int i;

	gs_lock(&in->lock);
	for (i = 0; i < GPUSLICE_MAX_GPUS; i++)
		in->gpu_limit[i] = limits ? limits[i] : 0;
	gs_unlock(&in->lock);
}

void gs_inst_gpu_mem(struct gs_inst *in, nv_u64 *limit, nv_u64 *used, nv_u64 *peak)
{
	int i;

	gs_lock(&in->lock);
	for (i = 0; i < GPUSLICE_MAX_GPUS; i++) {
		limit[i] = gs_gpu_limit(in, i);
		used[i] = in->gpu_used[i];
		peak[i] = in->gpu_peak[i];
	}
	gs_unlock(&in->lock);
}

void gs_inst_set_flags(struct gs_inst *in, nv_u32 flags)
{
	gs_lock(&in->lock);
	in->flags = flags;
	gs_unlock(&in->lock);
}

void gs_inst_set_caps(struct gs_inst *in, nv_u32 caps)
{
	gs_lock(&in->lock);
	in->caps = caps & GS_CAPS_ALL;
	gs_unlock(&in->lock);
}

nv_u32 gs_inst_caps(struct gs_inst *in)
{
	nv_u32 caps;

	gs_lock(&in->lock);
	caps = in->caps;
	gs_unlock(&in->lock);
	return caps;
}

void gs_inst_stats(struct gs_inst *in, struct gs_stats *st)
{
	gs_lock(&in->lock);
	st->mem_limit = in->limit;
	st->mem_used = in->used;
	st->mem_peak = in->peak;
	st->nr_ioctls = in->nr_ioctls;
	st->nr_refused_quota = in->nr_refused_quota;
	st->nr_refused_filter = in->nr_refused_filter;
	st->nr_objects = in->nr_objects;
	st->hash_max_chain = gs_hash_max_chain(in);
	gs_mutex_stats(&in->lock, &st->lock);
	gs_unlock(&in->lock);
}

int gs_inst_pids(struct gs_inst *in, nv_u32 *pids, int max)
{
	struct gs_obj *ob;
	int i, j, n = 0;

	gs_lock(&in->lock);
	for (i = 0; i < GS_HASH_SIZE; i++) {
		for (ob = in->hash[i]; ob; ob = ob->next) {
			int seen = 0;

			if (ob->o.obj_kind != GPUSLICE_OBJ_CLIENT)
				continue;
			for (j = 0; j < n && j < max; j++)
				if (pids[j] == ob->o.pid)
					seen = 1;
			if (seen)
				continue;
			/* past max the count may include repeats: callers retry bigger */
			if (n < max)
				pids[n] = ob->o.pid;
			n++;
		}
	}
	gs_unlock(&in->lock);
	return n;
}

int gs_for_each_object(struct gs_inst *in,
		       int (*cb)(void *ctx, const struct gs_object *o), void *ctx)
{
	struct gs_obj *ob;
	int i, ret = 0;

	gs_lock(&in->lock);
	for (i = 0; i < GS_HASH_SIZE && !ret; i++) {
		for (ob = in->hash[i]; ob && !ret; ob = ob->next)
			ret = cb(ctx, &ob->o);
	}
	gs_unlock(&in->lock);
	return ret;
}

void gs_file_closed(struct gs_inst *in, nv_u64 file_id)
{
	struct gs_evq q;

	gs_evq_init(&q);
	gs_lock(&in->lock);
	gs_obj_free_file(in, file_id, &q);
	gs_osev_gone(in, 0, file_id);
	gs_export_free_file(in, file_id);
	gs_uvm_free_file(in, file_id);
	gs_unlock(&in->lock);
	gs_evq_flush(in, &q);
}

/* ---- gs_pre ---- */

void gs_put_status(struct gs_call *c, nv_u32 off, nv_u32 status)
{
	memcpy((char *)c->arg + off, &status, sizeof(status));
	c->status = status;
}

/* a refusal answered with status in the block (filter.c's rows say which) */
enum gs_verdict gs_refuse_as(struct gs_call *c, enum gs_refusal r, nv_u32 status_off,
				    nv_u32 status)
{
	c->refusal = r;
	gs_put_status(c, status_off, status);
	return GS_REPLY;
}

enum gs_verdict gs_refuse(struct gs_call *c, enum gs_refusal r, nv_u32 status_off)
{
	return gs_refuse_as(c, r, status_off, NV_ERR_INSUFFICIENT_PERMISSIONS);
}

enum gs_verdict gs_fail(struct gs_call *c, enum gs_refusal r, int err)
{
	c->refusal = r;
	c->err = err;
	return GS_FAIL;
}

/*
 * The capability rule, gVisor nvproxy's (pkg/sentry/devices/nvproxy/
 * handlers.go, frontendIoctlHandler.handle() and its likes for controls,
 * classes and nvidia-uvm: "if h.capSet&fi.fd.dev.nvp.capsEnabled == 0"):
 * a row whose caps hold none of the instance's is answered as RM answers
 * what it does not have. status_off and status: where and what RM writes
 * for a class (NV_ERR_INVALID_CLASS, rmapi/alloc_free.c) or a control
 * (NV_ERR_NOT_SUPPORTED, rs_resource.c resControlLookup_IMPL); GS_ST_NONE:
 * an escape or an nvidia-uvm ioctl, failed with EINVAL as nv.c
 * nv_validate_ioctls() fails an escape it has no entry for ("unknown NVRM
 * ioctl command"), nvidia-uvm's uvm_ioctl() an ioctl it does not route,
 * and nvproxy a missing capability (frontend.go, uvm.go: linuxerr.EINVAL).
 * GS_PASS when the instance has one of caps.
 */
enum gs_verdict gs_pre_caps(struct gs_inst *in, struct gs_call *c, nv_u32 caps,
			    nv_u32 status_off, nv_u32 status)
{
	if (caps & in->caps)
		return GS_PASS;
	if (status_off == GS_ST_NONE)
		return gs_fail(c, GS_REFUSE_CAPS, EINVAL);
	return gs_refuse_as(c, GS_REFUSE_CAPS, status_off, status);
}

/* the later of two calls in flight that must not meet on a handle (gs_busy_conflict()) */
enum gs_verdict gs_busy_refuse(struct gs_call *c, nv_u32 status_off)
{
	c->refusal = GS_REFUSE_MALFORMED;
	gs_put_status(c, status_off, NV_ERR_STATE_IN_USE);
	return GS_REPLY;
}

int gs_short(const struct gs_call *c, nv_u32 need)
{
	return !c->arg || c->arg_size < need;
}

static int gs_read_u32(const struct gs_io *io, nv_u64 uaddr, nv_u32 *v)
{
	*v = 0;
	return io->read(io->ctx, uaddr, v, sizeof(*v));
}

/*
 * A channel's NV_CHANNEL_ALLOC_PARAMS (nvrm_abi.h nv_channel_alloc_params_head):
 * engineType, gpFifoEntries and where its USERD is (activity.c): in the
 * memory object hUserdMemory[0] at userdOffset[0], or RM's own, mapped
 * through the channel at offset 0 when hUserdMemory[0] is 0.
 */
#define GS_CH_OFF(f)	((nv_u32)offsetof(struct nv_channel_alloc_params_head, f))
#define GS_TSG_OFF(f)	((nv_u32)offsetof(struct nv_channel_group_alloc_params, f))
#define GS_MAPPER_OFF(f)	((nv_u32)offsetof(struct nv_memory_mapper_alloc_params, f))

static void gs_post_channel_params(const struct gs_io *io, nv_u64 p, struct gs_object *o)
{
	gs_read_u32(io, p + GS_CH_OFF(engine_type), &o->engine);
	gs_read_u32(io, p + GS_CH_OFF(gp_fifo_entries), &o->gp_entries);
	gs_read_u32(io, p + GS_CH_OFF(h_userd_memory), &o->userd_mem);
	if (o->userd_mem) {
		if (io->read(io->ctx, p + GS_CH_OFF(userd_offset), &o->userd_off, sizeof(o->userd_off)))
			o->userd_off = 0;
	} else {
		o->userd_mem = o->handle;
	}
}

/*
 * Allocation parameters that name other clients, which RM resolves without
 * checking that the caller owns them; each must be 0 or one of the instance's:
 *  - NV0080_ALLOC_PARAMETERS.hClientShare: the device attaches to that
 *    client's device-default VA space (gpu/device_share.c
 *    deviceInitClientShare(), serverGetClientUnderLock(): a lookup), so
 *    channels on the implicit VA space run in the victim's address space;
 *    hTargetClient is stored and forwarded to GSP unchecked;
 *  - NV0005_ALLOC_PARAMETERS.hParentClient: an OS event on another client's
 *    object (its notifications);
 *  - NV83DE_ALLOC_PARAMETERS.hAppClient: a debugger session on another
 *    client's contexts (memory and registers).
 */
/*
 * A device's GPU (NV0080_ALLOC_PARAMETERS.deviceId, 0 without parameters) is
 * decided here, on the copy RM reads: after RM's reply the block is the
 * caller's to rewrite (shadow.c), so gs_post_alloc() takes it from c->device_gpu.
 * A GPU that is not the instance's is refused, although RM would refuse it
 * too (device.c, osIsGpuAccessible()): a call whose answer is lost is taken
 * as made.
 */
static enum gs_verdict gs_pre_device_gpu(struct gs_inst *in, struct gs_call *c, nv_u32 gpu)
{
	if (gpu >= GPUSLICE_MAX_GPUS || !(in->gpus >> gpu & 1))
		return gs_refuse(c, GS_REFUSE_FOREIGN, GS_ST_NVOS64);
	c->device_gpu = gpu;
	return GS_PASS;
}

enum gs_verdict gs_pre_other_clients(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				     struct nvos64_params *p, struct gs_evq *q)
{
	union {
		struct nv0080_alloc_params dev;
		struct nv0005_alloc_params ev;
		struct nv83de_alloc_params dbg;
	} u;
	nv_handle named[2] = { 0, 0 };
	nv_u32 size = p->h_class == NV01_DEVICE_0 ? sizeof(u.dev) :
		      p->h_class == NV01_EVENT_OS_EVENT ? sizeof(u.ev) : sizeof(u.dbg);
	unsigned int i;

	if (!p->p_alloc_parms)
		return GS_PASS;	/* names no other client */
	if (!io || io->read(io->ctx, p->p_alloc_parms, &u, size))
		return gs_refuse_as(c, GS_REFUSE_MALFORMED, GS_ST_NVOS64, NV_ERR_INVALID_POINTER);
	if (p->h_class == NV01_DEVICE_0) {
		if (gs_pre_device_gpu(in, c, u.dev.device_id) != GS_PASS)
			return GS_REPLY;
		named[0] = u.dev.h_client_share;
		named[1] = u.dev.h_target_client;
	} else if (p->h_class == NV01_EVENT_OS_EVENT) {
		named[0] = u.ev.h_parent_client;
	} else {
		named[0] = u.dbg.h_app_client;
	}
	for (i = 0; i < 2; i++)
		if (named[i] && !gs_is_client(in, named[i]))
			return gs_refuse(c, GS_REFUSE_FOREIGN, GS_ST_NVOS64);
	return GS_PASS;
}

/* a device without parameters is device 0 (RM: externalClassId - NV01_DEVICE_0) */
enum gs_verdict gs_pre_device(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			      struct nvos64_params *p, struct gs_evq *q)
{
	if (!p->p_alloc_parms)
		return gs_pre_device_gpu(in, c, 0);
	return gs_pre_other_clients(in, c, io, p, q);
}

/*
 * NV_MEMORY_FABRIC maps video memory of the caller's client (map.hVidMem; RM
 * looks it up in the calling client: mem_fabric.c _memoryfabricValidatePhysMem)
 * into the fabric address space, and holds a reference to it until the fabric
 * object is freed. CUDA makes one for every cuMemCreate allocation on GPUs
 * whose NVLink fabric is up (measured on the H100 and H200: JAX's and NCCL's
 * allocations), and fails the allocation if it is refused. It allocates no
 * video memory itself, so it is charged nothing of its own: it takes a
 * reference on hVidMem's charge, as a duplicate does, so that freeing
 * hVidMem first uncharges nothing RM still holds. A flexible object (no
 * memory until NV00F8_CTRL_CMD_ATTACH_MEM, a control not listed) is answered
 * as RM answers flexible objects it cannot make, NV_ERR_NOT_SUPPORTED.
 * Reaching the memory from elsewhere needs an IMEX channel, which instances
 * do not have (filter.c).
 */
/* the staged allocation parameters of an RM_ALLOC whose class reads them: 1, or 0 (none, unreadable) */
static int gs_alloc_params(const struct gs_io *io, const struct nvos64_params *p, void *buf, nv_u32 size)
{
	return p->p_alloc_parms && io && !io->read(io->ctx, p->p_alloc_parms, buf, size);
}

/*
 * The new object keeps the caller's memory h_mem alive in RM (a reference or a
 * duplicate RM holds): it takes a reference on h_mem's charge until it goes
 * (gs_post_holder()), so a free of h_mem cannot uncharge memory RM still holds.
 */
static enum gs_verdict gs_pre_holds(struct gs_inst *in, struct gs_call *c, nv_handle client,
				    nv_handle h_mem)
{
	const struct gs_obj *vid;

	if (gs_busy_conflict(in, GS_BUSY_SOURCE, client, h_mem, 0))
		return gs_busy_refuse(c, GS_ST_NVOS64);
	gs_busy_add(in, c, GS_BUSY_SOURCE, client, h_mem, 0);
	vid = gs_obj_find(in, client, h_mem);
	if (vid && vid->mem) {
		c->src_found = 1;
		c->src_mem = vid->mem;
		c->src_mem->refs++;
	}
	return GS_PASS;
}

enum gs_verdict gs_pre_fabric(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			      struct nvos64_params *p, struct gs_evq *q)
{
	struct nv00f8_alloc_params fp;

	if (!gs_alloc_params(io, p, &fp, sizeof(fp)))
		return gs_refuse_as(c, GS_REFUSE_MALFORMED, GS_ST_NVOS64, NV_ERR_INVALID_POINTER);
	if (fp.alloc_flags & NV00F8_ALLOC_FLAGS_FLEXIBLE_FLA)
		return gs_refuse_as(c, GS_REFUSE_CLASS, GS_ST_NVOS64, NV_ERR_NOT_SUPPORTED);
	return gs_pre_holds(in, c, p->h_root, fp.map_h_vid_mem);
}

/*
 * NV_SEMAPHORE_SURFACE duplicates hSemaphoreMem (and hMaxSubmittedMem) into
 * RM's own client (gpu/mem_mgr/sem_surf.c _semsurfDupMemory): the memory
 * outlives the caller's free of it. The surface holds its charge; a second,
 * different memory (32-bit semaphores only) is refused as RM refuses it for
 * 64-bit ones, the kind the H100's drivers use.
 */
enum gs_verdict gs_pre_semaphore_surface(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
					 struct nvos64_params *p, struct gs_evq *q)
{
	struct nv_semaphore_surface_alloc_params sp;

	if (!gs_alloc_params(io, p, &sp, sizeof(sp)))
		return gs_refuse_as(c, GS_REFUSE_MALFORMED, GS_ST_NVOS64, NV_ERR_INVALID_POINTER);
	if (sp.h_max_submitted_mem && sp.h_max_submitted_mem != sp.h_semaphore_mem)
		return gs_refuse_as(c, GS_REFUSE_CLASS, GS_ST_NVOS64, NV_ERR_INVALID_PARAMETER);
	return gs_pre_holds(in, c, p->h_root, sp.h_semaphore_mem);
}

/*
 * A new object under a handle the caller chose. RM refuses a handle that is
 * live in the client (NV_ERR_INSERT_DUPLICATE_NAME); the core refuses a
 * handle it has registered, whether RM still has that object or freed it
 * without the core seeing it (a free whose reply a sibling thread rewrote to
 * a failure): a registered record never gets a second object behind it,
 * uncounted or ungated. Then a free in flight of the handle or of an
 * ancestor of its parent (gs_busy_conflict()). Returns the status to answer,
 * NV_OK to go on.
 */
nv_u32 gs_create_conflict(struct gs_inst *in, nv_handle client, nv_handle handle,
			  nv_handle parent)
{
	if (!handle)
		return NV_OK;
	/* RM looks the parent up before it makes the object: none is itself */
	if (handle == parent)
		return NV_ERR_INVALID_OBJECT_PARENT;
	if (gs_obj_find(in, client, handle))
		return NV_ERR_INSERT_DUPLICATE_NAME;
	if (gs_busy_conflict(in, GS_BUSY_CREATE, client, handle, parent))
		return NV_ERR_STATE_IN_USE;
	return NV_OK;
}

/*
 * The allocation parameters that make the new object a dependant of another
 * object of its client (besides its parent): RM frees it with that object
 * (registry.c struct gs_dep). Offsets in the class's parameters, which are
 * staged (RM reads the copy checked here); a field past what the running
 * driver's parameters have is not there.
 */
struct gs_dep_fields {
	nv_u32 klass;
	nv_u32 off[GS_CALL_DEPS];	/* 0 after the last; offset 0 is GS_DEP_AT0 */
};
#define GS_DEP_AT0	0xffffffffu

/*
 * Only the dependencies that take a TSG or a channel off the GPU, and only
 * where the core can check that the object depended on is where RM requires
 * it (gs_dep_placed()). Not followed, so that a record a forged reply put
 * under a handle cannot make the core drop a channel RM keeps (the
 * scheduler drops a channel RM answers as gone, sched/stale.py): a channel's
 * OS-descriptor USERD memory (kernel_channel_gv100.c:246-254, from 570 on)
 * and a memory mapper's notification memory (mem_mapper.c:386-391), whose
 * place RM does not fix; and virtual memory, context DMAs and P2P objects
 * (virtual_mem.c, context_dma.c, p2p_api.c), which hold nothing counted.
 * Lines of the 580.142 tag.
 */
#define GS_CH_DEPS	{ GS_CH_OFF(h_context_share), GS_CH_OFF(h_va_space) }

static const struct gs_dep_fields gs_dep_fields[] = {
	/* NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS.hVASpace: kernel_channel_group_api.c:281-288 */
	{ KEPLER_CHANNEL_GROUP_A, { GS_TSG_OFF(h_va_space) } },
	/* NV_CTXSHARE_ALLOCATION_PARAMETERS.hVASpace: kernel_ctxshare.c:151-159 */
	{ FERMI_CONTEXT_SHARE_A, { GS_DEP_AT0 } },
	/*
	 * NV_CHANNEL_ALLOC_PARAMS hContextShare (kernel_channel.c:1008-1014) and
	 * hVASpace (:988-1001; RM refuses it unless the parent is a device).
	 */
	{ AMPERE_CHANNEL_GPFIFO_A, GS_CH_DEPS },
	{ HOPPER_CHANNEL_GPFIFO_A, GS_CH_DEPS },
	{ BLACKWELL_CHANNEL_GPFIFO_A, GS_CH_DEPS },
	{ BLACKWELL_CHANNEL_GPFIFO_B, GS_CH_DEPS },
};

/* read the handles p's new object will depend on into c->deps (0: none) */
static void gs_pre_deps(const struct gs_class_row *row, struct gs_call *c, const struct gs_io *io,
			const struct nvos64_params *p)
{
	nv_u32 size = gs_class_params_size(row);
	unsigned int i, k;

	memset(c->deps, 0, sizeof(c->deps));
	if (!p->p_alloc_parms || !io)
		return;
	for (i = 0; i < ARRAY_SIZE(gs_dep_fields); i++) {
		if (gs_dep_fields[i].klass != p->h_class)
			continue;
		for (k = 0; k < GS_CALL_DEPS && gs_dep_fields[i].off[k]; k++) {
			nv_u32 off = gs_dep_fields[i].off[k];

			if (off == GS_DEP_AT0)
				off = 0;
			if (off + sizeof(nv_handle) <= size)
				gs_read_u32(io, p->p_alloc_parms + off, &c->deps[k]);
		}
	}
}

/* what the registry and the events call an object of class klass */
nv_u32 gs_obj_kind(nv_u32 klass)
{
	switch (klass) {
	case NV01_ROOT:
	case NV01_ROOT_NON_PRIV:
	case NV01_ROOT_CLIENT:
		return GPUSLICE_OBJ_CLIENT;
	case KEPLER_CHANNEL_GROUP_A:
		return GPUSLICE_OBJ_TSG;
	case AMPERE_CHANNEL_GPFIFO_A:
	case HOPPER_CHANNEL_GPFIFO_A:
	case BLACKWELL_CHANNEL_GPFIFO_A:
	case BLACKWELL_CHANNEL_GPFIFO_B:
		return GPUSLICE_OBJ_CHANNEL;
	}
	if (gs_counted_class(klass))
		return GPUSLICE_OBJ_MEMORY;
	return GPUSLICE_OBJ_OTHER;
}

/*
 * RM_ALLOC: the class's row (filter.c) says whether it is allowed and what RM
 * answers when it is not (a class on no row: NV_ERR_INVALID_CLASS, as RM
 * answers a class it does not have, rmapi/alloc_free.c); then the checks every
 * allocation gets; then the class's own decision (its row's pre).
 */
static enum gs_verdict gs_pre_alloc(struct gs_inst *in, struct gs_call *c,
				    const struct gs_io *io, struct gs_evq *q)
{
	struct nvos64_params *p = c->arg;
	const nv_u32 st = GS_ST_NVOS64;
	const struct gs_class_row *row;
	enum gs_verdict v;
	unsigned int i;
	nv_u32 status;

	if (gs_short(c, sizeof(*p)))
		return gs_fail(c, GS_REFUSE_MALFORMED, EINVAL);
	c->what = p->h_class;
	row = gs_class_row(p->h_class);
	if (!row)
		return gs_refuse_as(c, GS_REFUSE_UNLISTED, st, NV_ERR_INVALID_CLASS);
	/* a class for none of the instance's capabilities: as one on no row */
	v = gs_pre_caps(in, c, row->caps, st, NV_ERR_INVALID_CLASS);
	if (v != GS_PASS)
		return v;
	if (row->refusal != GS_REFUSE_NONE)
		return gs_refuse_as(c, row->refusal, st, row->status);
	if (in->nr_objects >= GS_MAX_OBJECTS ||
	    (gs_obj_kind(p->h_class) == GPUSLICE_OBJ_CHANNEL &&
	     in->nr_channels + in->nr_uvm_channels >= GS_MAX_CHANNELS) ||
	    (gs_obj_kind(p->h_class) == GPUSLICE_OBJ_TSG && in->nr_tsgs >= GS_MAX_TSGS))
		return gs_refuse_as(c, GS_REFUSE_LIMIT, st, NV_ERR_INSUFFICIENT_RESOURCES);
	if (gs_obj_kind(p->h_class) == GPUSLICE_OBJ_CLIENT)
		return GS_PASS;
	if (!gs_is_client(in, p->h_root))
		return gs_refuse(c, GS_REFUSE_FOREIGN, st);
	status = gs_create_conflict(in, p->h_root, p->h_object_new, p->h_object_parent);
	if (status != NV_OK)
		return gs_refuse_as(c, GS_REFUSE_MALFORMED, st, status);
	gs_pre_deps(row, c, io, p);
	for (i = 0; i < GS_CALL_DEPS; i++)
		if (c->deps[i] && gs_busy_conflict(in, GS_BUSY_DEP, p->h_root, c->deps[i], 0))
			return gs_busy_refuse(c, st);
	/*
	 * Devices, TSGs and channels carry a handle the caller chose (CUDA
	 * always names them: the traces). An RM-chosen one arrives in the reply,
	 * which another thread can rewrite before we read it: such an object
	 * would go unregistered, and so ungated (a TSG or channel) or its
	 * memory on no GPU we know (a device).
	 */
	if (!p->h_object_new && (p->h_class == NV01_DEVICE_0 ||
				 gs_obj_kind(p->h_class) == GPUSLICE_OBJ_TSG ||
				 gs_obj_kind(p->h_class) == GPUSLICE_OBJ_CHANNEL))
		return gs_refuse_as(c, GS_REFUSE_MALFORMED, st, NV_ERR_INVALID_ARGUMENT);
	if (row->pre)
		return row->pre(in, c, io, p, q);
	return GS_PASS;
}

/*
 * RM_CONTROL: the control's row (filter.c) says whether it is allowed, what
 * RM answers when it is not (a control on no row: NV_ERR_NOT_SUPPORTED, as RM
 * answers a control the object does not have, resserv/src/rs_resource.c
 * resControlLookup_IMPL), and what the core does with it (its handler).
 */
static enum gs_verdict gs_pre_control(struct gs_inst *in, struct gs_call *c,
				      const struct gs_io *io)
{
	struct nvos54_params *p = c->arg;
	const nv_u32 st = GS_ST_NVOS54;
	const struct gs_control_row *row;
	nv_u32 status = NV_OK;
	enum gs_verdict v;

	if (gs_short(c, sizeof(*p)))
		return gs_fail(c, GS_REFUSE_MALFORMED, EINVAL);
	c->what = p->cmd;
	if (!gs_is_client(in, p->h_client))
		return gs_refuse(c, GS_REFUSE_FOREIGN, st);
	row = gs_control_row(p->cmd);
	if (!row)
		return gs_refuse_as(c, GS_REFUSE_UNLISTED, st, NV_ERR_NOT_SUPPORTED);
	/* likewise a control for none of them: RM's answer for one it does not have */
	v = gs_pre_caps(in, c, row->caps, st, NV_ERR_NOT_SUPPORTED);
	if (v != GS_PASS)
		return v;
	if (row->handler && row->handler->pre) {
		if (row->handler->pre(in, c, io, p, &status) == GS_PASS)
			return GS_PASS;
		gs_put_status(c, st, status);
		return GS_REPLY;
	}
	if (row->refusal != GS_REFUSE_NONE)
		return gs_refuse_as(c, row->refusal, st, row->status);
	return GS_PASS;
}

/*
 * FIFO_DISABLE_CHANNELS: gating belongs to the scheduler. Naming only the
 * caller's own clients: GLOBAL (a container re-enabling its own channels
 * would undo it); naming another's: FOREIGN. Never passed.
 */
static enum gs_verdict gs_disable_pre(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				      const struct nvos54_params *p, nv_u32 *status)
{
	c->refusal = gs_filter_disable_channels(in, io, p);
	*status = c->refusal == GS_REFUSE_MALFORMED ? NV_ERR_INVALID_POINTER :
		  NV_ERR_INSUFFICIENT_PERMISSIONS;
	return GS_REPLY;
}

const struct gs_control_handler gs_disable_handler = {
	.pre = gs_disable_pre,
};

/*
 * A TSG's timeslice is the operator's (the instance's TIMESLICE_US, which
 * the glue applies itself): CUDA's own (2048 us at every context, seen in
 * the traces) and a tenant raising its share of the runlist are answered
 * NV_OK and not passed.
 */
static enum gs_verdict gs_timeslice_pre(struct gs_inst *in, struct gs_call *c,
					const struct gs_io *io, const struct nvos54_params *p,
					nv_u32 *status)
{
	*status = NV_OK;
	return GS_REPLY;
}

const struct gs_control_handler gs_timeslice_handler = {
	.pre = gs_timeslice_pre,
};

/*
 * NV_ESC_ATTACH_GPUS_TO_FD: an array of RM gpuIds; nv.c nvidia_dev_get() opens
 * and holds each GPU named, with no permission check, until the file is
 * released. CUDA does it on the nvidiactl file that holds a shareable
 * handle's export (cuMemExportToShareableHandle, measured on the H100), so
 * that the exported memory's GPU stays up. Each id must be one of the
 * instance's GPUs (or 0, which RM skips): another GPU of the host is not
 * opened from a container. The driver reads the checked array (staged).
 */
static enum gs_verdict gs_pre_attach_gpus(struct gs_inst *in, struct gs_call *c)
{
	nv_u32 i, j, id;

	if (!c->arg || !c->arg_size || c->arg_size % 4 || c->arg_size > 4 * NV_MAX_DEVICES)
		return gs_fail(c, GS_REFUSE_MALFORMED, EINVAL);
	if (!in->gpu_ids_set)
		return GS_PASS;
	for (i = 0; i < c->arg_size / 4; i++) {
		memcpy(&id, (const char *)c->arg + 4 * i, sizeof(id));
		if (!id)
			continue;
		for (j = 0; j < GPUSLICE_MAX_GPUS; j++)
			if (in->gpu_ids[j] == id)
				break;
		if (j == GPUSLICE_MAX_GPUS)
			return gs_fail(c, GS_REFUSE_FOREIGN, EPERM);
	}
	return GS_PASS;
}

/* escapes whose block starts with the client handle: size and status offset */
enum gs_verdict gs_pre_client_first(struct gs_inst *in, struct gs_call *c,
					   nv_u32 size, nv_u32 st)
{
	nv_handle client;

	if (gs_short(c, size))
		return gs_fail(c, GS_REFUSE_MALFORMED, EINVAL);
	memcpy(&client, c->arg, sizeof(client));
	if (!gs_is_client(in, client))
		return gs_refuse(c, GS_REFUSE_FOREIGN, st);
	return GS_PASS;
}

/*
 * An RM_FREE is on the list of calls in flight until its gs_post().
 *
 * A free of a client's objects through another open file than the one that
 * holds the client is answered here as RM answers it, NV_ERR_INVALID_CLIENT
 * (src/nvidia/src/kernel/rmapi/client.c rmclientValidate_IMPL, strict by
 * default; docs/h100-findings.md: status 35), and not passed: gs_post() takes a free's
 * outcome from the reply, which a sibling thread can rewrite once the
 * driver's copy-out has made the page writable (docs/isolation.md), and a
 * failed free forged to NV_OK made the core forget channels and memory that
 * RM still held.
 */
enum gs_verdict gs_pre_free_handle(struct gs_inst *in, struct gs_call *c, nv_handle client,
				   nv_handle handle, nv_u32 st)
{
	const struct gs_obj *cl = gs_obj_find(in, client, client);

	if (cl && cl->o.file_id != c->file_id) {
		c->refusal = GS_REFUSE_FOREIGN;
		gs_put_status(c, st, NV_ERR_INVALID_CLIENT);
		return GS_REPLY;
	}
	if (gs_busy_conflict(in, GS_BUSY_FREE, client, handle, 0))
		return gs_busy_refuse(c, st);
	gs_busy_add(in, c, GS_BUSY_FREE, client, handle, 0);
	return GS_PASS;
}

static enum gs_verdict gs_pre_free(struct gs_inst *in, struct gs_call *c)
{
	const struct nvos00_params *p = c->arg;

	return gs_pre_free_handle(in, c, p->h_root, p->h_object_old, GS_ST_NVOS00);
}

/*
 * RM_DUP_OBJECT: both clients the instance's. What it duplicates is looked up
 * here and its charge referenced until gs_post(): a free of the source after
 * this check cannot uncharge memory RM has duplicated by then; and a free or
 * a creation in flight on its handles, which RM may run first (the handle
 * then naming whatever is made under it next), is waited for.
 *
 * The duplicate is an object of the source's class (resserv/src/rs_server.c
 * serverCopyResource(): a new resource of the source's external class), so
 * the class's row gates it as it gates RM_ALLOC of the class: an object made
 * before INSTANCE_SET narrowed the capability set is not copied past it.
 */
static enum gs_verdict gs_pre_dup(struct gs_inst *in, struct gs_call *c)
{
	const struct nvos55_params *p = c->arg;
	const struct gs_class_row *row;
	const struct gs_obj *src;
	enum gs_verdict v;
	nv_u32 status;

	if (gs_short(c, sizeof(*p)))
		return gs_fail(c, GS_REFUSE_MALFORMED, EINVAL);
	if (!gs_is_client(in, p->h_client) ||
	    (!gs_is_client(in, p->h_client_src) && !c->src_sibling))
		return gs_refuse(c, GS_REFUSE_FOREIGN, GS_ST_NVOS55);
	src = gs_obj_find(in, p->h_client_src, p->h_object_src);
	/*
	 * A source of the instance's own clients whose class the core does not
	 * know (never registered: a handle RM chose that the core missed; or
	 * registered as a duplicate of such a one, class 0) cannot be gated:
	 * with a narrowed capability set it is answered as RM answers a handle
	 * it does not know, rather than copied past the gate. A sibling's
	 * source (src_sibling: legacy CUDA IPC through the preload) was gated
	 * by the sibling's own core when it was made.
	 */
	if ((!src || !src->o.klass) && in->caps != GS_CAPS_ALL && gs_is_client(in, p->h_client_src))
		return gs_refuse_as(c, GS_REFUSE_CAPS, GS_ST_NVOS55, NV_ERR_INVALID_OBJECT_HANDLE);
	row = src ? gs_class_row(src->o.klass) : NULL;
	if (row) {
		c->what = src->o.klass;
		v = gs_pre_caps(in, c, row->caps, GS_ST_NVOS55, NV_ERR_INVALID_CLASS);
		if (v != GS_PASS)
			return v;
	}
	status = gs_create_conflict(in, p->h_client, p->h_object, p->h_parent);
	if (status != NV_OK)
		return gs_refuse_as(c, GS_REFUSE_MALFORMED, GS_ST_NVOS55, status);
	if (gs_busy_conflict(in, GS_BUSY_SOURCE, p->h_client_src, p->h_object_src, 0))
		return gs_busy_refuse(c, GS_ST_NVOS55);
	gs_busy_add(in, c, GS_BUSY_SOURCE, p->h_client_src, p->h_object_src, 0);
	gs_busy_add(in, c, GS_BUSY_CREATE, p->h_client, p->h_object, p->h_parent);
	if (!src)
		return GS_PASS;
	c->src_found = 1;
	c->src_kind = src->o.obj_kind;
	c->src_klass = src->o.klass;
	c->src_gpu = src->o.gpu;
	c->src_engine = src->o.engine;
	c->src_flags = src->o.flags;
	c->src_mem = src->mem;
	if (c->src_mem)
		c->src_mem->refs++;
	return GS_PASS;
}

/*
 * RM_ALLOC_MEMORY of NV01_MEMORY_SYSTEM pins limit + 1 bytes of host memory
 * (interface/deprecated/rmapi_deprecated_allocmemory.c _rmAllocMemorySystem:
 * an RmAlloc of NV01_MEMORY_SYSTEM of that size): counted as RM_ALLOC of the
 * class is (quota.c). A limit of 2^64 - 1 is a size of 0, over any limit.
 */
static struct gs_mem_req gs_alloc_memory_req(const struct nvos02_params *p)
{
	struct gs_mem_req r;

	memset(&r, 0, sizeof(r));
	r.root = p->h_root;
	r.parent = p->h_object_parent;
	r.handle = p->h_object_new;
	r.klass = NV01_MEMORY_SYSTEM;
	r.mp.size = p->limit + 1;
	return r;
}

static enum gs_verdict gs_pre_alloc_memory_system(struct gs_inst *in, struct gs_call *c,
						  struct nvos02_params *p, struct gs_evq *q)
{
	struct gs_mem_req r = gs_alloc_memory_req(p);
	enum gs_verdict v = gs_quota_check(in, c, &r, q);

	if (v != GS_PASS)
		gs_put_status(c, GS_ST_NVOS02, c->status);
	return v;
}

/*
 * NV01_MEMORY_LOCAL_PRIVILEGED is RM's "register memory": a descriptor of the
 * GPU's BAR0 (mem_mgr/reg_mem.c), which any client may allocate (OpenGL and
 * Vulkan do, through RM_ALLOC_MEMORY) and only an administrator may map
 * (rmapi/mapping_cpu.c: NV_ERR_PROTECTION_FAULT otherwise). A container's
 * root may pass RM's test; BAR0 is the whole GPU's registers, so its
 * mapping is answered here as RM answers everyone else.
 */
static enum gs_verdict gs_pre_map_memory(struct gs_inst *in, struct gs_call *c)
{
	const struct nvos33_params *p = c->arg;
	const struct gs_obj *ob;
	enum gs_verdict v;

	v = gs_pre_client_first(in, c, sizeof(struct nvos33_params_with_fd), GS_ST_NVOS33);
	if (v != GS_PASS)
		return v;
	ob = gs_obj_find(in, p->h_client, p->h_memory);
	if (ob && ob->o.klass == NV01_MEMORY_LOCAL_PRIVILEGED)
		return gs_refuse_as(c, GS_REFUSE_GLOBAL, GS_ST_NVOS33, NV_ERR_PROTECTION_FAULT);
	return GS_PASS;
}

/*
 * NV_MEMORY_MAPPER (Vulkan's and OpenGL's paging-operations queue): RM
 * allocates its queue in kernel memory, maxQueueSize x 56 bytes with no bound
 * (gpu/mem_mgr/mem_mapper.c), outside the container's memory cgroup, and
 * duplicates the semaphore surface it names. Each instance may hold
 * GS_MAPPERS_MAX of them, of at most GS_MAPPER_QUEUE_MAX entries (what
 * OpenGL and Vulkan ask on the H100: 8192, 448 KiB; 28 MiB of kernel memory
 * in all), refused past that as RM refuses what it has no resources for; the
 * mapper holds its surface's charge.
 */
#define GS_MAPPER_QUEUE_MAX	8192
#define GS_MAPPERS_MAX		64

enum gs_verdict gs_pre_memory_mapper(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				     struct nvos64_params *p, struct gs_evq *q)
{
	struct nv_memory_mapper_alloc_params mp = { 0 };
	nv_u32 size = gs_abi()->memory_mapper_alloc_size;

	/* before 580 the parameters end early (550: no notification memory;
	 * 535: a placeholder byte): what the driver has not, reads as 0 */
	if (!gs_alloc_params(io, p, &mp, size < sizeof(mp) ? size : sizeof(mp)))
		return gs_refuse_as(c, GS_REFUSE_MALFORMED, GS_ST_NVOS64, NV_ERR_INVALID_POINTER);
	if (mp.max_queue_size > GS_MAPPER_QUEUE_MAX || in->nr_mappers >= GS_MAPPERS_MAX)
		return gs_refuse_as(c, GS_REFUSE_LIMIT, GS_ST_NVOS64, NV_ERR_INSUFFICIENT_RESOURCES);
	/* 535's placeholder byte names no semaphore surface: RM holds none (cl00fe.h) */
	if (size < sizeof(mp.h_semaphore_surface))
		return GS_PASS;
	return gs_pre_holds(in, c, p->h_root, mp.h_semaphore_surface);
}

/*
 * RM_ALLOC_MEMORY (NVOS02): the class's answer, then its row's capabilities
 * (RM makes an RmAlloc of the class, interface/deprecated/
 * rmapi_deprecated_allocmemory.c: gated as RM_ALLOC of it is; the OS
 * descriptor has no row and only the escape's), then the common checks;
 * the heap-size question of NV01_MEMORY_LOCAL_USER is asked as the
 * unprivileged object (gs_post_heap_size()); register memory by a handle
 * the core knows, whatever RM answers.
 */
static enum gs_verdict gs_pre_alloc_memory(struct gs_inst *in, struct gs_call *c,
					   const struct gs_io *io, struct gs_evq *q)
{
	struct nvos02_params *p = c->arg;
	const nv_u32 st = GS_ST_NVOS02;
	const struct gs_class_row *row;
	enum gs_refusal r;
	enum gs_verdict v;
	nv_u32 status;

	c->what = p->h_class;
	r = gs_filter_alloc_memory_class(p->h_class, &status);
	if (r != GS_REFUSE_NONE)
		return gs_refuse_as(c, r, st, status);
	row = gs_class_row(p->h_class);
	if (row) {
		v = gs_pre_caps(in, c, row->caps, st, NV_ERR_INVALID_CLASS);
		if (v != GS_PASS)
			return v;
	}
	v = gs_pre_client_first(in, c, sizeof(struct nvos02_params_with_fd), st);
	if (v != GS_PASS)
		return v;
	status = gs_create_conflict(in, p->h_root, p->h_object_new, p->h_object_parent);
	if (status != NV_OK)
		return gs_refuse_as(c, GS_REFUSE_MALFORMED, st, status);
	if (p->h_class == NV01_MEMORY_SYSTEM) {
		v = gs_pre_alloc_memory_system(in, c, p, q);
		if (v != GS_PASS)
			return v;
	}
	if (p->h_class == NV01_MEMORY_LOCAL_USER)
		p->h_class = NV01_MEMORY_SYSTEM_DYNAMIC;	/* gs_post_heap_size() */
	if (p->h_class == NV01_MEMORY_LOCAL_PRIVILEGED &&
	    (!p->h_object_new || gs_obj_find(in, p->h_root, p->h_object_new)))
		return gs_refuse_as(c, GS_REFUSE_MALFORMED, st, NV_ERR_INVALID_ARGUMENT);
	gs_busy_add(in, c, GS_BUSY_CREATE, p->h_root, p->h_object_new, p->h_object_parent);
	return GS_PASS;
}

/*
 * NV_ESC_REGISTER_FD: on a GPU file it names the nvidiactl file the GPU file
 * acts for (what CUDA does). On an nvidiactl file it links that file to
 * another (escape.c: "valid for both actual devices and ctrl devices"), and
 * RM then checks every client named through it against the other file
 * (rmclientValidate_IMPL compares nvfp->ctl_nvfp): the core's file of a
 * client would no longer be RM's, and gs_pre_free() would let through a
 * free RM refuses, whose reply a sibling thread can forge. Not from a
 * container.
 */
static enum gs_verdict gs_pre_register_fd(struct gs_inst *in, struct gs_call *c,
					  const struct gs_io *io, struct gs_evq *q)
{
	if (c->kind == GS_FILE_CTL)
		return gs_fail(c, GS_REFUSE_ESCAPE, EPERM);
	return GS_PASS;
}

/*
 * NV_ESC_SYS_PARAMS: the first caller on the host sets the NUMA memory block
 * size for everyone (nv.c, nv_ctl_device.numa_memblock_size); libcuda sends
 * it on every nvidiactl. From a container: 0, not passed.
 */
static enum gs_verdict gs_pre_sys_params(struct gs_inst *in, struct gs_call *c,
					 const struct gs_io *io, struct gs_evq *q)
{
	return GS_REPLY;
}

static enum gs_verdict gs_pre_os_event(struct gs_inst *in, struct gs_call *c,
					     const struct gs_io *io, struct gs_evq *q)
{
	return gs_osev_pre(in, c);
}

/* gs_post()'s steps, below */
static void gs_post_alloc(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			  struct gs_evq *q);
static void gs_post_dup(struct gs_inst *in, struct gs_call *c, struct gs_evq *q);
static void gs_post_alloc_memory(struct gs_inst *in, struct gs_call *c, struct gs_evq *q);

/* the escapes' own steps, in the signature of struct gs_escape_row */
static enum gs_verdict gs_pre_control_row(struct gs_inst *in, struct gs_call *c,
					  const struct gs_io *io, struct gs_evq *q)
{
	return gs_pre_control(in, c, io);
}

static enum gs_verdict gs_pre_free_row(struct gs_inst *in, struct gs_call *c,
				       const struct gs_io *io, struct gs_evq *q)
{
	return gs_pre_free(in, c);
}

static enum gs_verdict gs_pre_dup_row(struct gs_inst *in, struct gs_call *c,
				      const struct gs_io *io, struct gs_evq *q)
{
	return gs_pre_dup(in, c);
}

static enum gs_verdict gs_pre_map_memory_row(struct gs_inst *in, struct gs_call *c,
					     const struct gs_io *io, struct gs_evq *q)
{
	return gs_pre_map_memory(in, c);
}

static enum gs_verdict gs_pre_attach_gpus_row(struct gs_inst *in, struct gs_call *c,
					      const struct gs_io *io, struct gs_evq *q)
{
	return gs_pre_attach_gpus(in, c);
}

static void gs_post_control(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			    struct gs_evq *q)
{
	const struct nvos54_params *p = (const void *)c->checked;
	const struct gs_control_row *row = gs_control_row(p->cmd);

	if (row && row->handler && row->handler->post)
		row->handler->post(in, c, io, p, q);
}

static void gs_post_free(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			 struct gs_evq *q)
{
	const struct nvos00_params *p = (const void *)c->checked;

	/* a lost reply frees nothing: what stays charged is never too little */
	if (c->reply_lost || c->status != NV_OK)
		return;
	gs_obj_free_tree(in, p->h_root, p->h_object_old, q);
	if (p->h_object_old == p->h_root)
		gs_osev_gone(in, p->h_root, 0);
}

static void gs_post_dup_row(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			    struct gs_evq *q)
{
	gs_post_dup(in, c, q);
}

static void gs_post_alloc_memory_row(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				     struct gs_evq *q)
{
	gs_post_alloc_memory(in, c, q);
}

static void gs_post_os_event(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			     struct gs_evq *q)
{
	gs_osev_post(in, c);
}

/*
 * The escapes the core decides on, one row each, as nv.c's ioctl switch and
 * DRM's ioctl table keep them: the block the core reads (a shorter one
 * fails with EINVAL, as RM's size check fails it), where RM writes its
 * status (GS_ST_NONE: nowhere), what the call may make, the step before RM
 * and the step after it. GS_ESC_CLIENT_FIRST: the block starts with a
 * client that must be the instance's. The legacy escapes OpenGL, Vulkan
 * and the video libraries use before RM_ALLOC have their table in legacy.c;
 * any other escape is the filter's (filter.c gs_filter_escape()). caps: the
 * capabilities gVisor's nvproxy gives the escape (pkg/sentry/devices/nvproxy/
 * version.go Init(), the frontendIoctl map of 535.104.05, which no later ABI
 * up to 580 changes for these: compUtil, RM_ALLOC_MEMORY
 * compUtil|CapGraphics); an instance with none of them is refused the
 * escape, as RM refuses one it does not have (gs_pre_caps()).
 */
/* the layouts NVIDIA's headers give every supported release (abi/layouts) */
_Static_assert(GS_ST_NVOS64 == 40 && GS_ST_NVOS54 == 28 && GS_ST_NVOS00 == 12 &&
	       GS_ST_NVOS55 == 24 && GS_ST_NVOS57 == 20 && GS_ST_NVOS02 == 40 &&
	       GS_ST_NVOS34 == 24 && GS_ST_NVOS56 == 32 && GS_ST_OS_EVENT == 12,
	       "escape status offsets");
_Static_assert(GS_CH_OFF(h_context_share) == 24 && GS_CH_OFF(h_va_space) == 28 &&
	       GS_CH_OFF(h_userd_memory) == 32 && GS_CH_OFF(userd_offset) == 64 &&
	       GS_CH_OFF(engine_type) == 128 && GS_TSG_OFF(h_va_space) == 8 &&
	       GS_TSG_OFF(engine_type) == 12 && GS_MAPPER_OFF(h_notification_memory) == 8,
	       "allocation parameter offsets");

static const struct gs_escape_row gs_escapes[] = {
	{ NV_ESC_RM_ALLOC, sizeof(struct nvos64_params), GS_ST_NVOS64,
	  GS_ESC_CREATES | GS_ESC_CHARGES, GS_CAPS_COMPUTE_UTILITY, gs_pre_alloc, gs_post_alloc },
	{ NV_ESC_RM_CONTROL, sizeof(struct nvos54_params), GS_ST_NVOS54,
	  0, GS_CAPS_COMPUTE_UTILITY, gs_pre_control_row, gs_post_control },
	{ NV_ESC_RM_FREE, sizeof(struct nvos00_params), GS_ST_NVOS00,
	  GS_ESC_CLIENT_FIRST, GS_CAPS_COMPUTE_UTILITY, gs_pre_free_row, gs_post_free },
	{ NV_ESC_RM_DUP_OBJECT, sizeof(struct nvos55_params), GS_ST_NVOS55,
	  GS_ESC_CREATES, GS_CAPS_COMPUTE_UTILITY, gs_pre_dup_row, gs_post_dup_row },
	/*
	 * A share policy on one of the instance's own objects (what
	 * cudaIpcGetMemHandle sets before another process duplicates the
	 * memory): it lets other clients RM_DUP_OBJECT it, and every dup through
	 * an instance must name the instance's clients on both sides, so
	 * another instance still cannot take it.
	 */
	{ NV_ESC_RM_SHARE, sizeof(struct nvos57_params), GS_ST_NVOS57,
	  GS_ESC_CLIENT_FIRST, GS_CAPS_COMPUTE_UTILITY, NULL, NULL },
	{ NV_ESC_RM_ALLOC_MEMORY, sizeof(struct nvos02_params_with_fd), GS_ST_NVOS02,
	  GS_ESC_CREATES | GS_ESC_CHARGES, GS_CAPS_COMPUTE_UTILITY | GS_CAP_GRAPHICS,
	  gs_pre_alloc_memory, gs_post_alloc_memory_row },
	{ NV_ESC_RM_MAP_MEMORY, sizeof(struct nvos33_params_with_fd), GS_ST_NVOS33,
	  0, GS_CAPS_COMPUTE_UTILITY, gs_pre_map_memory_row, NULL },
	{ NV_ESC_RM_UNMAP_MEMORY, sizeof(struct nvos34_params), GS_ST_NVOS34,
	  GS_ESC_CLIENT_FIRST, GS_CAPS_COMPUTE_UTILITY, NULL, NULL },
	{ NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO, sizeof(struct nvos56_params), GS_ST_NVOS56,
	  GS_ESC_CLIENT_FIRST, GS_CAPS_COMPUTE_UTILITY, NULL, NULL },
	{ NV_ESC_ALLOC_OS_EVENT, sizeof(struct nv_ioctl_alloc_os_event), GS_ST_OS_EVENT,
	  GS_ESC_CLIENT_FIRST, GS_CAPS_COMPUTE_UTILITY, gs_pre_os_event, gs_post_os_event },
	{ NV_ESC_FREE_OS_EVENT, sizeof(struct nv_ioctl_alloc_os_event), GS_ST_OS_EVENT,
	  GS_ESC_CLIENT_FIRST, GS_CAPS_COMPUTE_UTILITY, gs_pre_os_event, gs_post_os_event },
	/* an array of gpuIds: its size is the call's (gs_pre_attach_gpus()) */
	{ NV_ESC_ATTACH_GPUS_TO_FD, 0, GS_ST_NONE,
	  0, GS_CAPS_COMPUTE_UTILITY, gs_pre_attach_gpus_row, NULL },
	{ NV_ESC_REGISTER_FD, 0, GS_ST_NONE,
	  0, GS_CAPS_COMPUTE_UTILITY, gs_pre_register_fd, NULL },
	{ NV_ESC_SYS_PARAMS, 0, GS_ST_NONE,
	  0, GS_CAPS_COMPUTE_UTILITY, gs_pre_sys_params, NULL },
};

static const struct gs_escape_row *gs_escape_row(const struct gs_call *c)
{
	unsigned int i;

	if (c->kind == GS_FILE_UVM || NV_IOC_TYPE(c->req) != NV_IOCTL_MAGIC)
		return NULL;
	for (i = 0; i < ARRAY_SIZE(gs_escapes); i++)
		if (gs_escapes[i].escape == NV_IOC_NR(c->req))
			return &gs_escapes[i];
	return NULL;
}

static enum gs_verdict gs_pre_locked(struct gs_inst *in, struct gs_call *c,
				     const struct gs_io *io, struct gs_evq *q)
{
	const struct gs_escape_row *row;
	enum gs_verdict v;

	if (c->kind == GS_FILE_UVM) {
		v = gs_filter_uvm(in, c);
		if (v != GS_PASS)
			return v;
		return gs_uvm_pre(in, c);
	}
	if (NV_IOC_TYPE(c->req) != NV_IOCTL_MAGIC)
		return gs_fail(c, GS_REFUSE_ESCAPE, ENOTTY);
	row = gs_escape_row(c);
	if (row) {
		v = gs_pre_caps(in, c, row->caps, GS_ST_NONE, 0);
		if (v != GS_PASS)
			return v;
		if (row->size && gs_short(c, row->size))
			return gs_fail(c, GS_REFUSE_MALFORMED, EINVAL);
		if (row->flags & GS_ESC_CLIENT_FIRST) {
			v = gs_pre_client_first(in, c, row->size, row->status_off);
			if (v != GS_PASS)
				return v;
		}
		return row->pre ? row->pre(in, c, io, q) : GS_PASS;
	}
	if (gs_legacy_escape(c->escape))
		return gs_legacy_pre(in, c, q);
	return gs_filter_escape(in, c);
}

int gs_block_decided(const struct gs_call *c)
{
	if (c->kind == GS_FILE_UVM || NV_IOC_TYPE(c->req) != NV_IOCTL_MAGIC)
		return 0;
	if (gs_escape_row(c))
		return NV_IOC_NR(c->req) != NV_ESC_REGISTER_FD && NV_IOC_NR(c->req) != NV_ESC_SYS_PARAMS;
	return gs_legacy_escape(NV_IOC_NR(c->req));
}

int gs_nested(const struct gs_call *c, struct gs_nested *n)
{
	memset(n, 0, sizeof(*n));
	if (c->kind == GS_FILE_UVM || !c->arg || NV_IOC_TYPE(c->req) != NV_IOCTL_MAGIC)
		return 0;
	switch (NV_IOC_NR(c->req)) {
	case NV_ESC_RM_ALLOC: {
		const struct nvos64_params *p = c->arg;
		const struct gs_class_row *row;

		if (c->arg_size < sizeof(*p) || !p->p_alloc_parms)
			return 0;
		n->uaddr = p->p_alloc_parms;
		n->ptr_off = 16;	/* pAllocParms */
		/* RM copies the class's parameter size (rmapiGetClassAllocParamSize) */
		row = gs_class_row(p->h_class);
		if (!row || !row->params_size)
			return 0;
		n->size = gs_class_params_size(row);
		n->stage = row->stage;
		return 1;
	}
	case NV_ESC_RM_CONTROL: {
		const struct nvos54_params *p = c->arg;

		if (c->arg_size < sizeof(*p) || !p->params || !p->params_size ||
		    p->params_size > GS_NESTED_MAX)
			return 0;
		n->uaddr = p->params;
		n->ptr_off = 16;	/* params */
		n->size = p->params_size;
		n->stage = 1;
		return 1;
	}
	}
	return 0;
}

/* the client and object a refused RM call named, for the event */
static void gs_refusal_names(const struct gs_call *c, struct gs_event *ev)
{
	const nv_u32 *w = c->arg;

	if (!c->arg || c->kind == GS_FILE_UVM || c->refusal == GS_REFUSE_MALFORMED)
		return;
	switch (c->escape) {
	case NV_ESC_RM_ALLOC:
	case NV_ESC_RM_ALLOC_MEMORY:
		/* hRoot, hObjectParent, hObjectNew */
		ev->client = w[0];
		ev->parent = w[1];
		ev->handle = w[2];
		break;
	case NV_ESC_RM_CONTROL:
	case NV_ESC_RM_FREE:
	case NV_ESC_RM_DUP_OBJECT:
	case NV_ESC_RM_SHARE:
	case NV_ESC_RM_MAP_MEMORY:
	case NV_ESC_RM_UNMAP_MEMORY:
	case NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO:
	case NV_ESC_ALLOC_OS_EVENT:
	case NV_ESC_FREE_OS_EVENT:
	case NV_ESC_RM_VID_HEAP_CONTROL:
	case NV_ESC_RM_IDLE_CHANNELS:
	case NV_ESC_RM_ALLOC_CONTEXT_DMA2:
	case NV_ESC_RM_MAP_MEMORY_DMA:
	case NV_ESC_RM_UNMAP_MEMORY_DMA:
		/* hClient, then the object (FREE: hObjectOld is third) */
		ev->client = w[0];
		ev->handle = c->escape == NV_ESC_RM_FREE ? w[2] : w[1];
		break;
	}
}

/* calls after which gs_post() registers an object (gs_call.spare_obj) */
static int gs_creates_object(const struct gs_call *c)
{
	const struct gs_escape_row *row = gs_escape_row(c);

	if (row)
		return !!(row->flags & GS_ESC_CREATES);
	return c->kind != GS_FILE_UVM && c->escape == NV_ESC_RM_VID_HEAP_CONTROL;
}

/* calls that may charge memory (gs_call.spare_mem) */
static int gs_may_charge(const struct gs_call *c)
{
	const struct gs_escape_row *row = gs_escape_row(c);

	if (row)
		return !!(row->flags & GS_ESC_CHARGES);
	return c->kind != GS_FILE_UVM && c->escape == NV_ESC_RM_VID_HEAP_CONTROL;
}

static void gs_spares_free(struct gs_call *c)
{
	gs_export_spares_free(c);	/* and the list of spare_obj */
	gs_free(c->spare_mem);
	c->spare_mem = NULL;
	gs_free(c->spare_ref);
	c->spare_ref = NULL;
	gs_uvm_spares_free(c);
	gs_osev_spare_free(c);
}

/*
 * Records for what the call may create, taken before the lock and before
 * the driver runs: a call whose records cannot be had fails here, cleanly,
 * instead of RM creating something the core then cannot account for.
 */
static int gs_spares_alloc(struct gs_call *c, const struct gs_io *io)
{
	c->spare_obj = NULL;
	c->spare_mem = NULL;
	c->spare_exp = NULL;
	c->spare_ref = NULL;
	c->spare_uvm = NULL;
	c->uvm_added = NULL;
	c->spare_osev = NULL;
	if (c->kind == GS_FILE_UVM)
		return gs_uvm_spares_alloc(c);
	if (!gs_creates_object(c))
		return gs_export_spares_alloc(c, io) || gs_osev_spare_alloc(c) ? -1 : 0;
	c->spare_obj = gs_zalloc(sizeof(*c->spare_obj));
	if (gs_may_charge(c))
		c->spare_mem = gs_zalloc(sizeof(*c->spare_mem));
	if (c->escape == NV_ESC_RM_ALLOC || c->escape == NV_ESC_RM_DUP_OBJECT)
		c->spare_ref = gs_zalloc(sizeof(*c->spare_ref));
	if (!c->spare_obj || (gs_may_charge(c) && !c->spare_mem) ||
	    ((c->escape == NV_ESC_RM_ALLOC || c->escape == NV_ESC_RM_DUP_OBJECT) && !c->spare_ref)) {
		gs_spares_free(c);
		return -1;
	}
	return 0;
}

enum gs_verdict gs_pre(struct gs_inst *in, struct gs_call *c, const struct gs_io *io)
{
	enum gs_verdict v;
	struct gs_evq q;

	/* UVM ioctls are plain numbers (no _IOC encoding): keep the whole word */
	c->escape = c->kind == GS_FILE_UVM ? c->req : NV_IOC_NR(c->req);
	c->what = 0;
	c->status = NV_OK;
	c->err = 0;
	c->refusal = GS_REFUSE_NONE;
	c->reserved = 0;
	memset(&c->quota, 0, sizeof(c->quota));
	c->device_gpu = 0;
	c->rewritten = 0;
	memset(c->deps, 0, sizeof(c->deps));
	c->src_mem = NULL;
	c->src_found = 0;
	c->nr_busy = 0;
	if (gs_spares_alloc(c, io)) {
		c->err = ENOMEM;
		return GS_FAIL;
	}

	gs_evq_init(&q);
	gs_lock(&in->lock);
	in->nr_ioctls++;
	v = gs_pre_locked(in, c, io, &q);
	/* every passed call is followed by exactly one gs_post() (call.c) */
	if (v == GS_PASS)
		in->nr_inflight++;
	if (v == GS_PASS && c->escape == NV_ESC_RM_ALLOC && c->kind != GS_FILE_UVM) {
		const struct nvos64_params *a = c->arg;

		unsigned int i;

		if (gs_obj_kind(a->h_class) != GPUSLICE_OBJ_CLIENT) {
			gs_busy_add(in, c, GS_BUSY_CREATE, a->h_root, a->h_object_new,
				    a->h_object_parent);
			for (i = 0; i < GS_CALL_DEPS; i++)
				gs_busy_add(in, c, GS_BUSY_DEP, a->h_root, c->deps[i], 0);
		}
	}
	if (v != GS_PASS)
		gs_spares_free(c);
	if (c->refusal != GS_REFUSE_NONE && c->refusal != GS_REFUSE_QUOTA) {
		struct gs_event ev;

		in->nr_refused_filter++;
		memset(&ev, 0, sizeof(ev));
		ev.type = GPUSLICE_EV_FILTER_REFUSED;
		ev.obj_kind = GPUSLICE_OBJ_OTHER;
		ev.pid = c->pid;
		ev.gpu = c->gpu_minor;
		ev.status = v == GS_FAIL ? 0 : c->status;
		ev.cmd = c->what ? c->what : c->escape;
		if (c->escape == NV_ESC_RM_ALLOC || c->escape == NV_ESC_RM_ALLOC_MEMORY)
			ev.klass = c->what;
		gs_refusal_names(c, &ev);
		gs_evq_push(&q, &ev);
	}
	gs_unlock(&in->lock);
	gs_evq_flush(in, &q);
	memset(c->checked, 0, sizeof(c->checked));
	if (c->arg)
		memcpy(c->checked, c->arg,
		       c->arg_size < sizeof(c->checked) ? c->arg_size : sizeof(c->checked));
	return v;
}

/* ---- gs_post ---- */

/*
 * The handle of the object a call created: the one the caller asked for
 * (checked), or, when it left that 0 for RM to choose, the one the reply
 * names. An RM-chosen handle that is already registered is a reply another
 * thread rewrote (RM never reuses a live handle): 0, so nothing registered
 * is replaced by it.
 */
static nv_handle gs_new_handle(struct gs_inst *in, nv_handle client, nv_handle asked,
			       nv_handle replied)
{
	if (asked)
		return asked;
	if (!replied || gs_obj_find(in, client ? client : replied, replied))
		return 0;
	return replied;
}

/* RM's status for a call whose reply may be lost (c->reply_lost: assume OK) */
static nv_u32 gs_reply_status(const struct gs_call *c, nv_u32 replied)
{
	return c->reply_lost ? NV_OK : replied;
}

/*
 * Is to, which ob names as what it depends on, where RM requires it: a VA
 * space of ob's own device (a TSG's or a device's channel's parent, a
 * subcontext's TSG's parent), a subcontext of the channel's own TSG? A
 * record elsewhere under that handle is one whose creation's reply was
 * forged (RM made the real object elsewhere, or refused it): following it
 * would take out of the scheduler a TSG or channel RM keeps.
 */
static int gs_dep_placed(const struct gs_obj *ob, const struct gs_obj *to)
{
	const struct gs_obj *dev = ob->up;

	if (!to || to->stray || ob->stray || !dev || (to->o.flags & GS_OBJ_LOST))
		return 0;
	switch (to->o.klass) {
	case FERMI_VASPACE_A:
		if (ob->o.klass == FERMI_CONTEXT_SHARE_A)
			dev = dev->o.obj_kind == GPUSLICE_OBJ_TSG ? dev->up : NULL;
		return dev && dev->o.klass == NV01_DEVICE_0 && to->up == dev;
	case FERMI_CONTEXT_SHARE_A:
		return ob->o.obj_kind == GPUSLICE_OBJ_CHANNEL && dev->o.obj_kind == GPUSLICE_OBJ_TSG &&
		       to->up == dev;
	}
	return 0;
}

/* what RM made the new object ob depend on (gs_pre_deps()), where it is placed as RM requires */
static void gs_post_deps(struct gs_inst *in, const struct gs_call *c, struct gs_obj *ob)
{
	unsigned int i;

	for (i = 0; i < GS_CALL_DEPS; i++)
		if (gs_dep_placed(ob, gs_obj_find(in, ob->o.client, c->deps[i])))
			gs_obj_depend(in, ob, c->deps[i]);
}

/*
 * NV_MEMORY_FABRIC, NV_SEMAPHORE_SURFACE and NV_MEMORY_MAPPER: the object
 * holds its memory's charge (gs_pre_holds()). Whatever the reply says, the reference is kept:
 * RM's own count of the process's memory does not see what such an object holds (the guard would
 * not catch it), so a reply rewritten to a failure, or to no handle, must not
 * uncharge memory RM may hold. Where it cannot go to a registered object, the
 * client holds it (gs_park()).
 */
static void gs_post_holder(struct gs_inst *in, struct gs_call *c, const struct nvos64_params *req,
			   const struct nvos64_params *rep, nv_u32 status, struct gs_evq *q)
{
	struct gs_mem *mem = c->src_mem;
	struct gs_object o;
	nv_handle h = 0;

	c->src_mem = NULL;	/* the reference goes to the new object, or the client */
	if (status == NV_OK)
		h = gs_new_handle(in, req->h_root, req->h_object_new,
				  c->reply_lost ? 0 : rep->h_object_new);
	if (h) {
		struct gs_obj *ob;

		gs_obj_init(&o, in, c, mem ? GPUSLICE_OBJ_MEMORY : GPUSLICE_OBJ_OTHER, req->h_root,
			    req->h_object_parent, h, req->h_class);
		ob = gs_obj_add(in, c, &o, mem, q);
		if (ob) {
			gs_post_deps(in, c, ob);
			return;
		}
	}
	if (mem)
		gs_park(in, c, req->h_root, mem);
}

static void gs_post_alloc(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			  struct gs_evq *q)
{
	const struct nvos64_params *req = (const void *)c->checked;
	const struct nvos64_params *rep = c->arg;
	nv_u32 status = gs_reply_status(c, rep->status);
	int is_client = gs_obj_kind(req->h_class) == GPUSLICE_OBJ_CLIENT;
	struct gs_object o;
	struct gs_obj *ob;
	nv_handle h;

	/*
	 * RM allocated, then could not write the parameters back (another
	 * thread made them read-only or unmapped them): the object lives, and
	 * the status says NV_ERR_INVALID_ADDRESS (resserv/src/rs_server.c
	 * serverAllocApiCopyOut keeps the copy-out error; os-interface.c
	 * os_memcpy_to_user). It may also be a copy-in that failed, in which
	 * case the caller is charged for nothing until it frees the handle or
	 * its client: never too little.
	 */
	if (status == NV_ERR_INVALID_ADDRESS && !is_client && req->h_object_new) {
		c->reply_lost = 1;
		status = NV_OK;
	}

	if (!is_client)
		gs_engine_object_made(in, req->h_root, req->h_object_parent, req->h_class, q);
	if (c->quota.held) {
		gs_quota_post(in, c, io, req, status, q);
		return;
	}
	if (req->h_class == NV_MEMORY_FABRIC || req->h_class == NV_SEMAPHORE_SURFACE ||
	    req->h_class == NV_MEMORY_MAPPER) {
		gs_post_holder(in, c, req, rep, status, q);
		return;
	}
	if (status != NV_OK)
		return;
	h = gs_new_handle(in, is_client ? 0 : req->h_root, req->h_object_new,
			  c->reply_lost ? 0 : rep->h_object_new);
	if (!h)
		return;
	if (is_client)
		gs_obj_init(&o, in, c, GPUSLICE_OBJ_CLIENT, h, 0, h, req->h_class);
	else
		gs_obj_init(&o, in, c, gs_obj_kind(req->h_class), req->h_root,
			    req->h_object_parent, h, req->h_class);
	/*
	 * A device names its GPU: NV0080_ALLOC_PARAMETERS.deviceId, 0 without
	 * parameters (RM: externalClassId - NV01_DEVICE_0). This is RM's device
	 * instance, not the /dev/nvidia<N> minor: both are 0 on a one-GPU host, but
	 * on several GPUs instances follow RM's attach order and minors the PCI
	 * probe order (NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2 maps one to the other).
	 */
	if (o.klass == NV01_DEVICE_0)
		o.gpu = c->device_gpu;	/* gs_pre_device_gpu() */
	/* engine type from the allocation parameters (nvrm_abi.h) */
	if (o.obj_kind == GPUSLICE_OBJ_TSG && req->p_alloc_parms && io)
		gs_read_u32(io, req->p_alloc_parms + GS_TSG_OFF(engine_type), &o.engine);
	else if (o.obj_kind == GPUSLICE_OBJ_CHANNEL && req->p_alloc_parms && io)
		gs_post_channel_params(io, req->p_alloc_parms, &o);
	/* CUDA leaves a channel's engineType 0: it runs on its TSG's engine */
	if (o.obj_kind == GPUSLICE_OBJ_CHANNEL && !o.engine) {
		const struct gs_obj *tsg = gs_obj_find(in, o.client, o.parent);

		if (tsg && tsg->o.obj_kind == GPUSLICE_OBJ_TSG)
			o.engine = tsg->o.engine;
	}
	ob = gs_obj_add(in, c, &o, NULL, q);
	if (ob && o.obj_kind == GPUSLICE_OBJ_CLIENT)
		gs_client_set_ns_pid(in, ob, c->ns_pid ? c->ns_pid : c->pid);
	else if (ob)
		gs_post_deps(in, c, ob);
}

static void gs_post_dup(struct gs_inst *in, struct gs_call *c, struct gs_evq *q)
{
	const struct nvos55_params *p = (const void *)c->checked;
	const struct nvos55_params *rep = c->arg;
	struct gs_mem *mem = c->src_mem;
	struct gs_object o;
	nv_handle h = 0;

	c->src_mem = NULL;	/* the reference goes to the new object, or back */
	if (gs_reply_status(c, rep->status) == NV_OK)
		h = gs_new_handle(in, p->h_client, p->h_object, c->reply_lost ? 0 : rep->h_object);
	if (!h) {
		if (mem)
			gs_mem_put(in, mem);
		return;
	}
	memset(&o, 0, sizeof(o));
	o.obj_kind = GPUSLICE_OBJ_OTHER;
	if (c->src_found) {
		o.klass = c->src_klass;
		o.gpu = c->src_gpu;
		/* a TSG duplicated is a TSG: channels made under it are gated too */
		if (c->src_kind == GPUSLICE_OBJ_TSG) {
			o.obj_kind = GPUSLICE_OBJ_TSG;
			o.engine = c->src_engine;
			o.flags = c->src_flags & GS_OBJ_SCHEDULED;
		}
	}
	o.file_id = c->file_id;
	o.pid = c->pid;
	o.client = p->h_client;
	o.handle = h;
	o.parent = p->h_parent;
	/* the same memory under another handle: freed when the last goes */
	if (mem)
		o.obj_kind = GPUSLICE_OBJ_MEMORY;
	/* a success under a registered handle: the client holds the reference */
	if (!gs_obj_add(in, c, &o, mem, q) && mem)
		gs_park(in, c, p->h_client, mem);
}

/*
 * RM_ALLOC_MEMORY of NV01_MEMORY_LOCAL_USER, OpenGL's and Vulkan's question
 * for the heap size: for an administrator RM makes an object of the whole
 * framebuffer, physical and mappable (NV01_MEMORY_LOCAL_PHYSICAL); for anyone
 * else an object that holds nothing (NV01_MEMORY_SYSTEM_DYNAMIC) and the
 * heap size in limit (interface/deprecated/rmapi_deprecated_allocmemory.c
 * _rmAllocMemoryLocalUser). gs_pre_locked() asked RM for the latter whoever
 * the caller is; the heap it reports is the instance's.
 */
static void gs_post_heap_size(struct gs_inst *in, struct gs_call *c, const struct nvos02_params *p,
			      struct nvos02_params *rep)
{
	nv_u32 gpu = gs_obj_gpu(in, p->h_root, p->h_object_parent, GS_GPU_UNKNOWN);
	nv_u64 limit = gpu < GPUSLICE_MAX_GPUS ? gs_gpu_limit(in, gpu) : 0;

	rep->h_class = NV01_MEMORY_LOCAL_USER;
	if (!c->reply_lost && rep->status == NV_OK)
		rep->limit = limit ? limit - 1 : 0;
}

static void gs_post_alloc_memory(struct gs_inst *in, struct gs_call *c, struct gs_evq *q)
{
	const struct nvos02_params *p = (const void *)c->checked;
	struct nvos02_params *rep = c->arg;
	struct gs_object o;
	nv_handle h;

	if (c->what == NV01_MEMORY_LOCAL_USER && p->h_class == NV01_MEMORY_SYSTEM_DYNAMIC)
		gs_post_heap_size(in, c, p, rep);
	/*
	 * Register memory is recorded whatever the (rewritable) status says, so
	 * that no forged failure leaves a live one out of gs_pre_map_memory()'s
	 * sight; a record RM has no object for only refuses mapping that handle.
	 */
	if (p->h_class == NV01_MEMORY_LOCAL_PRIVILEGED) {
		gs_obj_init(&o, in, c, GPUSLICE_OBJ_OTHER, p->h_root, p->h_object_parent,
			    p->h_object_new, p->h_class);
		gs_obj_add(in, c, &o, NULL, q);
		return;
	}

	if (c->quota.held) {	/* counted (gs_pre_alloc_memory_system()) */
		struct gs_mem_req r = gs_alloc_memory_req(p);

		gs_quota_charge(in, c, &r, rep->h_object_new,
				c->reply_lost ? 0 : rep->limit + 1, gs_reply_status(c, rep->status), q);
		return;
	}
	if (gs_reply_status(c, rep->status) != NV_OK)
		return;
	h = gs_new_handle(in, p->h_root, p->h_object_new, c->reply_lost ? 0 : rep->h_object_new);
	if (!h)
		return;
	gs_obj_init(&o, in, c, GPUSLICE_OBJ_OTHER, p->h_root, p->h_object_parent, h, p->h_class);
	gs_obj_add(in, c, &o, NULL, q);
}

/*
 * A TSG or channel RM scheduled (GS_OBJ_SCHEDULED). A lost reply counts as
 * success: a channel the controller then gates too early costs one refused
 * disable, one it never hears of would run ungated.
 */
static void gs_schedule_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			     const struct nvos54_params *p, struct gs_evq *q)
{
	if (gs_reply_status(c, c->status) == NV_OK)
		gs_obj_scheduled(in, p->h_client, p->h_object, q);
}

const struct gs_control_handler gs_schedule_handler = {
	.post = gs_schedule_post,
};

void gs_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io, int ret)
{
	const struct gs_escape_row *row;
	struct gs_evq q;

	gs_evq_init(&q);
	gs_lock(&in->lock);
	if (in->nr_inflight)
		in->nr_inflight--;
	gs_busy_done(in, c);
	if (c->kind == GS_FILE_UVM) {
		if (ret != 0)
			gs_uvm_abort(in, c);
		else
			gs_uvm_post(in, c, ret);
		goto out;
	}
	if (ret != 0) {
		/* the driver did not run the call: only reservations to drop */
		gs_quota_release(in, c);
		gs_export_abort(in, c);
		if (c->src_mem)
			gs_mem_put(in, c->src_mem);
		c->src_mem = NULL;
		goto out;
	}
	row = gs_escape_row(c);
	if (row) {
		if (row->status_off != GS_ST_NONE)
			memcpy(&c->status, (const char *)c->arg + row->status_off, sizeof(c->status));
		if (row->post)
			row->post(in, c, io, &q);
	} else if (gs_legacy_escape(c->escape)) {
		gs_legacy_post(in, c, &q);
	}
out:
	gs_unlock(&in->lock);
	gs_spares_free(c);
	gs_evq_flush(in, &q);
}
