// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * engines.c - the objects and controls that put a tenant's work on an engine
 * other than compute: the 3D engine (OpenGL, Vulkan) and the video engines
 * (NVDEC, NVJPG, OFA), each on the caller's own channels.
 *
 * On the H100 (580; the engine list in the recorded traces) the 3D, 2D and
 * inline-to-memory classes run on GR0, the runlist compute shares; NVDEC0-6,
 * NVJPG0-6 and OFA0 each have their own. The video libraries allocate a
 * channel with no engine and bind it to one (NVA06F_CTRL_CMD_BIND), then
 * schedule it (NVA06F_CTRL_CMD_GPFIFO_SCHEDULE): the registry records the
 * bound engine, which the controller shows per instance (gpuctl status) and
 * gates like any other channel (docs/policies.md, "Engines").
 */
#include "core_int.h"

/*
 * A video engine object (NVB8B0_VIDEO_DECODER, NVB8D1_VIDEO_NVJPG,
 * NVB8FA_VIDEO_OFA) whose prohibitMultipleInstances is set asks that no other
 * client get that engine while it lives (nvos.h): one tenant could shut every
 * other out of a decoder. Refused as RM refuses a client the right to a
 * resource; without parameters RM takes the default, shared.
 */
enum gs_verdict gs_pre_video_engine(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				    struct nvos64_params *p, struct gs_evq *q)
{
	struct nv_video_engine_alloc_params vp;

	if (!p->p_alloc_parms)
		return GS_PASS;
	if (!io || io->read(io->ctx, p->p_alloc_parms, &vp, sizeof(vp))) {
		c->refusal = GS_REFUSE_MALFORMED;
		c->status = NV_ERR_INVALID_POINTER;
		p->status = c->status;
		return GS_REPLY;
	}
	if (vp.prohibit_multiple_instances) {
		c->refusal = GS_REFUSE_GLOBAL;
		c->status = NV_ERR_INSUFFICIENT_PERMISSIONS;
		p->status = c->status;
		return GS_REPLY;
	}
	return GS_PASS;
}

/*
 * NV2080_CTRL_CMD_GR_CTXSW_ZCULL_BIND names a channel by a client of its own
 * (hClient, hChannel) besides the control's: for a user client it must be
 * the caller's (ctrl2080gr.h). GSP checks it too; this keeps the decision on
 * the staged copy here, whatever GSP does.
 */
static enum gs_verdict gs_zcull_pre(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				    const struct nvos54_params *p, nv_u32 *status)
{
	struct nv2080_ctrl_gr_ctxsw_zcull_bind_head head;

	if (!p->params || p->params_size < sizeof(head))
		return GS_PASS;		/* RM refuses the size */
	if (!io || io->read(io->ctx, p->params, &head, sizeof(head))) {
		c->refusal = GS_REFUSE_MALFORMED;
		*status = NV_ERR_INVALID_POINTER;
		return GS_REPLY;
	}
	if (head.h_client != p->h_client) {
		c->refusal = GS_REFUSE_FOREIGN;
		*status = NV_ERR_INSUFFICIENT_PERMISSIONS;
		return GS_REPLY;
	}
	return GS_PASS;
}

const struct gs_control_handler gs_zcull_handler = {
	.pre = gs_zcull_pre,
};

/*
 * The engines whose channels the controller leaves running (a runlist each,
 * no compute on them): NVDEC0-7, NVENC0-3, NVJPG0-7, OFA0-1
 * (cl2080_notification.h; pyctl/gpuslice/sched/scheduler.py GATED_ENGINE_GROUPS
 * is the controller's side of the same rule).
 */
int gs_engine_video(nv_u32 engine)
{
	return (engine >= NV2080_ENGINE_TYPE_NVDEC0 && engine <= NV2080_ENGINE_TYPE_NVENC2) ||
	       (engine >= NV2080_ENGINE_TYPE_NVJPEG0 && engine <= NV2080_ENGINE_TYPE_OFA0) ||
	       engine == NV2080_ENGINE_TYPE_OFA1 || engine == NV2080_ENGINE_TYPE_NVENC3;
}

/*
 * NVA06F_CTRL_CMD_BIND: which engine the caller's channel runs on, which
 * decides whether the controller gates it. The status is the reply's, which
 * another thread of the caller can rewrite (kmod/shadow.c): so a bind moves
 * a channel towards gating whatever the status says (a failed one leaves
 * the channel on no runlist, or where it was), and away from it only from
 * no engine at all, on success. A channel that holds a GR or copy engine
 * never becomes a video one: a forged success cannot take it out of the
 * slots, and a forged failure cannot keep it out of them.
 */
static void gs_bind_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			 const struct nvos54_params *p, struct gs_evq *q)
{
	struct nva06f_ctrl_bind_params bp;
	const struct gs_obj *ob;

	if (!io || !p->params || p->params_size < sizeof(bp) ||
	    io->read(io->ctx, p->params, &bp, sizeof(bp)))
		return;
	ob = gs_obj_find(in, p->h_client, p->h_object);
	if (!ob)
		return;
	if (gs_engine_video(bp.engine_type) &&
	    (ob->o.engine || c->reply_lost || c->status != NV_OK))
		return;
	gs_obj_engine_set(in, p->h_client, p->h_object, bp.engine_type, q);
}

const struct gs_control_handler gs_bind_handler = {
	.post = gs_bind_post,
};

/*
 * An engine object allocated on a channel binds the channel to that
 * object's engine (RM binds a channel with no engine at its first engine
 * object; a channel bound elsewhere refuses the class): a compute, 3D, 2D or
 * inline-to-memory object puts it on GR, a copy object on a copy engine. A
 * channel the core took for a video one after a bind whose success another
 * thread forged moves back to gating here, whatever the allocation's reply
 * says; nothing here moves a channel towards video.
 */
void gs_engine_object_made(struct gs_inst *in, nv_handle client, nv_handle channel,
			   nv_u32 klass, struct gs_evq *q)
{
	const struct gs_obj *ch = gs_obj_find(in, client, channel);
	nv_u32 engine;

	if (!ch || ch->o.obj_kind != GPUSLICE_OBJ_CHANNEL || !gs_engine_video(ch->o.engine))
		return;
	switch (klass) {
	case HOPPER_COMPUTE_A:
	case HOPPER_A:
	case FERMI_TWOD_A:
	case KEPLER_INLINE_TO_MEMORY_B:
		engine = NV2080_ENGINE_TYPE_GR0;
		break;
	case HOPPER_DMA_COPY_A:
		engine = NV2080_ENGINE_TYPE_COPY0;
		break;
	default:
		return;
	}
	gs_obj_engine_set(in, client, channel, engine, q);
}

/*
 * NVA06C_CTRL_CMD_PREEMPT of the caller's own TSG may wait for the
 * preemption, up to 1 s (ctrla06c.h), in GSP, holding what RM holds for a
 * control: the wait is capped at GS_WAIT_MAX_US, as IDLE_CHANNELS' (legacy.c),
 * on the staged copy RM reads. A TSG the controller disabled still preempts
 * at once; a wait past the cap is answered by RM as a timeout.
 */
static enum gs_verdict gs_preempt_pre(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				      const struct nvos54_params *p, nv_u32 *status)
{
	struct nva06c_ctrl_preempt_params pp;

	if (!p->params || p->params_size < sizeof(pp))
		return GS_PASS;		/* RM refuses the size */
	if (!io || io->read(io->ctx, p->params, &pp, sizeof(pp))) {
		c->refusal = GS_REFUSE_MALFORMED;
		*status = NV_ERR_INVALID_POINTER;
		return GS_REPLY;
	}
	if (!pp.b_wait || (pp.b_manual_timeout && pp.timeout_us <= GS_WAIT_MAX_US))
		return GS_PASS;
	pp.b_manual_timeout = 1;
	pp.timeout_us = GS_WAIT_MAX_US;
	if (io->write(io->ctx, p->params, &pp, sizeof(pp))) {
		c->refusal = GS_REFUSE_MALFORMED;
		*status = NV_ERR_INVALID_POINTER;
		return GS_REPLY;
	}
	return GS_PASS;
}

const struct gs_control_handler gs_preempt_handler = {
	.pre = gs_preempt_pre,
};
