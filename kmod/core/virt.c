// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * virt.c - replies rewritten so that an instance sees its own memory and
 * its own processes.
 *
 * cuMemGetInfo / cudaMemGetInfo / torch.cuda.mem_get_info read total and free
 * from NV2080_CTRL_CMD_FB_GET_INFO_V2 (ctrl2080fb.h): in the traces CUDA asks
 * for HEAP_FREE (0x16), HEAP_SIZE (0x9) and FB_TAX (0x10) right before and
 * after its allocations, and nvidia-smi for HEAP_FREE, TOTAL_RAM_SIZE (0x8)
 * and HEAP_SIZE. The values are KiB. Sizes become min(real, limit); free
 * becomes min(real free, limit - used), never more than the GPU really has.
 * limit and used are those of the subdevice's GPU (quota.c: per GPU).
 */
#include "core_int.h"

/*
 * Processes: NV2080_CTRL_CMD_GPU_GET_PIDS lists every process with a client on
 * the GPU and NV2080_CTRL_CMD_GPU_GET_PID_INFO gives any pid's video memory
 * (NVML's running-processes calls; PyTorch's out-of-memory message asks for
 * its own pid). An instance sees only its own processes: GET_PIDS keeps the
 * pids of the instance's live clients and the caller's own; GET_PID_INFO
 * answers for any other pid as RM does for a pid without clients
 * (gpuFindClientInfoWithPidIterator(): result NV_OK, data zero, both
 * partition ids invalid).
 *
 * RM writes pids as the caller's pid namespace sees them (pid_vnr(), and
 * leaves out processes that namespace cannot see), so what is compared is
 * gs_call.ns_pid of the caller against the ns_pid each client was made with:
 * right as long as an instance's processes share one pid namespace (a
 * container). A glue that leaves ns_pid 0 compares gs_call.pid, which is
 * right only in the initial pid namespace (the preload passes getpid()).
 */
static int gs_virt_pid_mine(struct gs_inst *in, const struct gs_call *c, nv_u32 pid)
{
	if (pid == (c->ns_pid ? c->ns_pid : c->pid))
		return 1;
	return gs_ns_pid_has_client(in, pid);
}

/*
 * The caller's control params, at most size bytes, in a zeroed buffer; NULL if
 * the block is shorter than head, memory is short or the block is unreadable.
 */
static void *gs_virt_read(const struct gs_io *io, const struct nvos54_params *p,
			  nv_u32 size, nv_u32 head, nv_u32 *len)
{
	void *buf;

	if (p->params_size < head)
		return NULL;
	buf = gs_zalloc(size);
	if (!buf)
		return NULL;
	*len = p->params_size < size ? p->params_size : size;
	if (io->read(io->ctx, p->params, buf, *len)) {
		gs_free(buf);
		return NULL;
	}
	return buf;
}

static void gs_virt_get_pids(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			     const struct nvos54_params *p)
{
	struct nv2080_ctrl_gpu_get_pids_params *gp;
	nv_u32 i, n, kept = 0, len, head = 3 * sizeof(nv_u32);

	gp = gs_virt_read(io, p, sizeof(*gp), head, &len);
	if (!gp)
		return;
	n = gp->pid_tbl_count;
	if (n > (len - head) / sizeof(nv_u32))
		n = (len - head) / sizeof(nv_u32);
	for (i = 0; i < n; i++)
		if (gs_virt_pid_mine(in, c, gp->pid_tbl[i]))
			gp->pid_tbl[kept++] = gp->pid_tbl[i];
	if (kept == gp->pid_tbl_count)
		goto out;
	for (i = kept; i < n; i++)
		gp->pid_tbl[i] = 0;
	gp->pid_tbl_count = kept;
	io->write(io->ctx, p->params, gp, len);
	c->rewritten = 1;
out:
	gs_free(gp);
}

static void gs_virt_get_pid_info(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				 const struct nvos54_params *p)
{
	struct nv2080_ctrl_gpu_get_pid_info_params *gp;
	const nv_u32 head = 8;	/* offsetof(pid_info_list) */
	nv_u32 i, n, len, hidden = 0;

	gp = gs_virt_read(io, p, sizeof(*gp), head, &len);
	if (!gp)
		return;
	n = gp->pid_info_list_count;
	if (n > (len - head) / sizeof(gp->pid_info_list[0]))
		n = (len - head) / sizeof(gp->pid_info_list[0]);
	for (i = 0; i < n; i++) {
		struct nv2080_ctrl_gpu_pid_info *e = &gp->pid_info_list[i];

		if (e->index != NV2080_CTRL_GPU_PID_INFO_INDEX_VIDEO_MEMORY_USAGE || !e->pid ||
		    gs_virt_pid_mine(in, c, e->pid))
			continue;
		e->result = NV_OK;
		memset(e->data, 0, sizeof(e->data));
		e->compute_instance_id = NV2080_CTRL_GPU_PARTITION_ID_INVALID;
		e->gpu_instance_id = NV2080_CTRL_GPU_PARTITION_ID_INVALID;
		hidden++;
	}
	if (!hidden)
		goto out;
	io->write(io->ctx, p->params, gp, len);
	c->rewritten = 1;
out:
	gs_free(gp);
}

static nv_u32 gs_min_kib(nv_u32 real, nv_u64 bytes)
{
	nv_u64 kib = bytes >> 10;

	return kib < real ? (nv_u32)kib : real;
}

/*
 * The controls whose replies gs_virt_control_post() rewrites. Their
 * parameters must be readable before the call (the glue's staged copy): a
 * reply it cannot rewrite would go to the caller as RM wrote it (other
 * processes' pids and memory, the whole GPU's size).
 */
static int gs_virt_control_readable(const struct gs_io *io, const struct nvos54_params *p)
{
	nv_u32 head;

	if (p->cmd != NV2080_CTRL_CMD_GPU_GET_PIDS && p->cmd != NV2080_CTRL_CMD_GPU_GET_PID_INFO &&
	    p->cmd != NV2080_CTRL_CMD_FB_GET_INFO_V2)
		return 1;
	if (!p->params)
		return 1;	/* RM refuses it */
	return io && p->params_size >= sizeof(head) && !io->read(io->ctx, p->params, &head, sizeof(head));
}

/* called with in->lock held */
static void gs_virt_control_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				 const struct nvos54_params *p)
{
	struct nv2080_ctrl_fb_get_info_v2_params *fp;
	nv_u32 gpu = gs_obj_gpu(in, p->h_client, p->h_object, GS_GPU_UNKNOWN);
	/* a subdevice of no GPU we know: the instance's limit, all its memory in use */
	nv_u64 limit = gpu < GPUSLICE_MAX_GPUS ? gs_gpu_limit(in, gpu) : in->limit;
	nv_u64 used = gpu < GPUSLICE_MAX_GPUS ? in->gpu_used[gpu] : in->used;
	nv_u64 room = used < limit ? limit - used : 0;
	nv_u32 i, n, len;

	/* p is the request as checked; RM's status is c->status */
	if (!io || c->status != NV_OK || !p->params)
		return;
	if (p->cmd == NV2080_CTRL_CMD_GPU_GET_PIDS) {
		gs_virt_get_pids(in, c, io, p);
		return;
	}
	if (p->cmd == NV2080_CTRL_CMD_GPU_GET_PID_INFO) {
		gs_virt_get_pid_info(in, c, io, p);
		return;
	}
	if (p->cmd != NV2080_CTRL_CMD_FB_GET_INFO_V2)
		return;
	fp = gs_virt_read(io, p, sizeof(*fp), sizeof(nv_u32), &len);
	if (!fp)
		return;
	n = fp->fb_info_list_size;
	if (n > (len - sizeof(nv_u32)) / sizeof(fp->fb_info_list[0]))
		n = (len - sizeof(nv_u32)) / sizeof(fp->fb_info_list[0]);
	for (i = 0; i < n; i++) {
		struct nv2080_ctrl_fb_info *e = &fp->fb_info_list[i];

		switch (e->index) {
		case NV2080_CTRL_FB_INFO_INDEX_RAM_SIZE:
		case NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE:
		case NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE:
		case NV2080_CTRL_FB_INFO_INDEX_USABLE_RAM_SIZE:
		case NV2080_CTRL_FB_INFO_INDEX_MAPPABLE_HEAP_SIZE:
			e->data = gs_min_kib(e->data, limit);
			break;
		case NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE:
		case NV2080_CTRL_FB_INFO_INDEX_LARGEST_FREE_REGION_SIZE_KB:
			e->data = gs_min_kib(e->data, room);
			break;
		}
	}
	io->write(io->ctx, p->params, fp, len);
	c->rewritten = 1;
	gs_free(fp);
}

/* a reply this file rewrites must be readable: its head is read before RM runs */
static enum gs_verdict gs_virt_pre(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				   const struct nvos54_params *p, nv_u32 *status)
{
	if (gs_virt_control_readable(io, p))
		return GS_PASS;
	c->refusal = GS_REFUSE_MALFORMED;
	*status = NV_ERR_INVALID_POINTER;
	return GS_REPLY;
}

static void gs_virt_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			 const struct nvos54_params *p, struct gs_evq *q)
{
	if (!c->reply_lost)
		gs_virt_control_post(in, c, io, p);
}

const struct gs_control_handler gs_virt_handler = {
	.pre = gs_virt_pre,
	.post = gs_virt_post,
};
