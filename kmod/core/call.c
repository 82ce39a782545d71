// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * call.c - one ioctl from the glue's copy of its block to its return: the
 * call protocol the kernel module (kmod/ioctl.c) and the user-space build
 * (preload/preload.c) share.
 *
 *   gs_pre() -> GS_FAIL: -c->err
 *            -> GS_REPLY: the block, status set, back to the caller; 0
 *            -> GS_PASS: ops->driver -> gs_post() -> ops->done ->
 *               ops->after -> the nested reply and the block back to the
 *               caller
 *
 * What touches the caller's memory, the real driver or the glue's own state
 * is the glue's (struct gs_call_ops); the order, and that every call the
 * core passed is followed by exactly one gs_post(), is this file's. Nothing
 * here holds the instance lock: gs_pre() and gs_post() take it and drop it
 * themselves, so the glue's copies run without it.
 */
#include "core_int.h"

/*
 * RM answers NV_ERR_INVALID_ADDRESS, its work done, when it cannot copy its
 * reply out (rs_server.c serverAllocApiCopyOut(), serverControlApiCopyOut()):
 * so does a call whose nested reply the caller's memory cannot take. The
 * status reached the block, not c->status: the core heard RM's.
 */
static void gs_call_nested_lost(struct gs_call *c)
{
	nv_u32 off = c->escape == NV_ESC_RM_ALLOC ? GS_ST_NVOS64 : GS_ST_NVOS54;
	nv_u32 st;

	if (!c->arg || c->arg_size < off + sizeof(st))
		return;
	memcpy(&st, (char *)c->arg + off, sizeof(st));
	if (st != NV_OK)
		return;
	st = NV_ERR_INVALID_ADDRESS;
	memcpy((char *)c->arg + off, &st, sizeof(st));
}

/* the reply (the core's or the driver's) back to the caller; ret: the ioctl's so far */
static long gs_call_reply(struct gs_call *c, const struct gs_call_ops *ops, void *ctx,
			  long ret)
{
	if (ops->nested_out && ops->nested_out(ctx, c))
		gs_call_nested_lost(c);
	if (ops->copy_out(ctx, c, ret))
		return -EFAULT;
	return ret;
}

long gs_call_run(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
		 const struct gs_call_ops *ops, void *ctx)
{
	enum gs_verdict v = in ? gs_pre(in, c, io) : GS_PASS;
	int unread = 0;
	long ret;

	if (v != GS_PASS) {
		if (ops->done)
			ops->done(ctx);
		if (ops->answered)
			ops->answered(ctx, c);
		if (v == GS_FAIL)
			return -c->err;
		return gs_call_reply(c, ops, ctx, 0);
	}

	ret = ops->driver(ctx, c, &unread);
	/*
	 * A positive return is the driver's success. A reply the glue lost
	 * after the driver ran counts as one too: what the core charged
	 * stays, never less than RM holds.
	 */
	if (in)
		gs_post(in, c, io, c->reply_lost || ret > 0 ? 0 : (int)ret);
	if (ops->done)
		ops->done(ctx);
	if (unread)
		return -EFAULT;
	if (ops->after)
		ops->after(ctx, c, ret);
	return gs_call_reply(c, ops, ctx, ret);
}
