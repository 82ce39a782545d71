// SPDX-License-Identifier: GPL-2.0
/*
 * ioctl.c - one interposed ioctl on a gpuslice node.
 *
 *   copy the argument block in -> gs_pre() -> (GS_PASS) copy the block back,
 *   swap in the private fd table, call the real driver, swap back ->
 *   copy the reply in -> gs_post() -> copy the block out -> tracepoints.
 *
 * GS_REPLY: the core's block (status set) is the reply and the ioctl returns
 * 0, as RM does for a refused call. GS_FAIL: the ioctl fails with -c.err.
 * nvidia-uvm ioctls carry no size in the request word; the core passes them
 * (and may decode them through gs_io); they get fd translation too.
 *
 * Timeslice (FINDINGS.md): RM accepts NVA06C_CTRL_CMD_SET_TIMESLICE only from
 * the process that owns the TSG. So when an instance has TIMESLICE_US set, the
 * call that allocates a TSG (RM_ALLOC of KEPLER_CHANNEL_GROUP_A) is followed,
 * in the same context and the same swapped fd table, by a SET_TIMESLICE on
 * it; and when TIMESLICE_US changes, each file applies the new value to its
 * TSGs at its next ioctl. TIMESLICE_US 0 ("driver default") is not pushed to
 * existing TSGs: they keep the last value until they are freed.
 */
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/ktime.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "driver.h"
#include "fdswap.h"
#include "fops.h"
#include "instance.h"
#include "ioctl.h"
#include "uscratch.h"

#define CREATE_TRACE_POINTS
#include "trace.h"

#define GS_STACK_ARG	128
#define GS_TS_BATCH	64

static int gs_io_read(void *ctx, nv_u64 uaddr, void *dst, nv_u32 len)
{
	return copy_from_user(dst, u64_to_user_ptr(uaddr), len) ? -EFAULT : 0;
}

static int gs_io_write(void *ctx, nv_u64 uaddr, const void *src, nv_u32 len)
{
	return copy_to_user(u64_to_user_ptr(uaddr), src, len) ? -EFAULT : 0;
}

static const struct gs_io gs_user_io = {
	.read = gs_io_read,
	.write = gs_io_write,
};

struct gs_ts_collect {
	u64 file_id;
	unsigned int nr;
	u32 client[GS_TS_BATCH];
	u32 handle[GS_TS_BATCH];
};

static int gs_ts_collect_one(void *ctx, const struct gs_object *o)
{
	struct gs_ts_collect *tc = ctx;

	if (o->obj_kind != GPUSLICE_OBJ_TSG || o->file_id != tc->file_id)
		return 0;
	if (tc->nr == GS_TS_BATCH)
		return 1;
	tc->client[tc->nr] = o->client;
	tc->handle[tc->nr] = o->handle;
	tc->nr++;
	return 0;
}

static void gs_ts_set(struct gs_file *gf, u32 client, u32 handle, u64 us)
{
	struct nva06c_ctrl_timeslice_params p = { .timeslice_us = us };
	u32 status = 0;
	int err;

	err = gs_scratch_control(gf->real, client, handle, NVA06C_CTRL_CMD_SET_TIMESLICE,
				 &p, sizeof(p), &status);
	if (err || status)
		pr_warn_ratelimited("gpuslice: %s: SET_TIMESLICE on 0x%x/0x%x: err %d status 0x%x\n",
				    gf->node->inst->name, client, handle, err, status);
}

/* Runs with the private fd table in place. */
static void gs_ts_apply_lazy(struct gs_file *gf)
{
	struct gs_instance *inst = gf->node->inst;
	int gen = atomic_read(&inst->timeslice_gen);
	u64 us = READ_ONCE(inst->timeslice_us);
	struct gs_ts_collect *tc;
	unsigned int i;

	if (gf->timeslice_gen == gen)
		return;
	gf->timeslice_gen = gen;
	if (!us)
		return;
	tc = kzalloc(sizeof(*tc), GFP_KERNEL);
	if (!tc)
		return;
	tc->file_id = gf->id;
	gs_for_each_object(inst->core, gs_ts_collect_one, tc);
	for (i = 0; i < tc->nr; i++)
		gs_ts_set(gf, tc->client[i], tc->handle[i], us);
	kfree(tc);
}

/* After a real RM_ALLOC, with the private fd table still in place. */
static void gs_ts_after_alloc(struct gs_file *gf, void __user *arg, unsigned int size)
{
	u64 us = READ_ONCE(gf->node->inst->timeslice_us);
	struct nvos64_params p;

	if (!us || size != sizeof(p) || copy_from_user(&p, arg, sizeof(p)))
		return;
	if (p.h_class == KEPLER_CHANNEL_GROUP_A && p.status == NV_OK)
		gs_ts_set(gf, p.h_root, p.h_object_new, us);
}

static long gs_real_ioctl(struct file *real, unsigned int cmd, void __user *arg,
			  bool compat)
{
	if (compat) {
		if (!real->f_op->compat_ioctl)
			return -ENOTTY;
		return real->f_op->compat_ioctl(real, cmd, (unsigned long)arg);
	}
	if (!real->f_op->unlocked_ioctl)
		return -ENOTTY;
	return real->f_op->unlocked_ioctl(real, cmd, (unsigned long)arg);
}

/* Rewrites the fd a dma-buf export returned if it had to move (fdswap.c). */
static void gs_fix_moved_fd(struct gs_call *c, const struct gs_fdswap_moved *moved)
{
	unsigned int i;
	int fd;

	if (c->kind == GS_FILE_UVM || c->escape != NV_ESC_EXPORT_TO_DMABUF_FD ||
	    c->arg_size < sizeof(int))
		return;
	memcpy(&fd, c->arg, sizeof(fd));
	for (i = 0; i < moved->nr; i++) {
		if (moved->old_fd[i] == fd) {
			memcpy(c->arg, &moved->new_fd[i], sizeof(int));
			return;
		}
	}
}

/*
 * Returns the driver's return. *fault: the reply could not be read back (a
 * racing thread unmapped the block); the core still learns the driver ran.
 */
static long gs_call_real(struct gs_file *gf, struct gs_call *c, unsigned int cmd,
			 void __user *arg, bool compat, u64 *drv_ns, bool *fault)
{
	struct gs_fdswap_moved moved;
	struct gs_fdswap *swap;
	long ret;
	u64 t;

	ret = gs_fdswap_enter(&swap);
	if (ret)
		return ret;
	if (!gs_passthrough_only && c->kind != GS_FILE_UVM)
		gs_ts_apply_lazy(gf);
	t = ktime_get_ns();
	ret = gs_real_ioctl(gf->real, cmd, arg, compat);
	*drv_ns = ktime_get_ns() - t;
	if (!ret && !gs_passthrough_only && c->kind != GS_FILE_UVM &&
	    c->escape == NV_ESC_RM_ALLOC)
		gs_ts_after_alloc(gf, arg, c->arg_size);
	gs_fdswap_exit(swap, &moved);

	*fault = c->arg_size && copy_from_user(c->arg, arg, c->arg_size);
	if (moved.nr && !*fault)
		gs_fix_moved_fd(c, &moved);
	return ret;
}

static void gs_check_version_reply(const struct gs_call *c)
{
	const struct nv_ioctl_rm_api_version *v = c->arg;

	if (c->kind == GS_FILE_CTL && c->escape == NV_ESC_CHECK_VERSION_STR &&
	    c->arg_size == sizeof(*v))
		gs_driver_seen_version(v->version_string, sizeof(v->version_string));
}

long gs_ioctl(struct file *file, unsigned int cmd, void __user *arg, bool compat)
{
	struct gs_file *gf = file->private_data;
	struct gs_instance *inst = gf->node->inst;
	bool decode = !gs_passthrough_only;
	u64 t0 = ktime_get_ns(), drv_ns = 0;
	u8 stack_arg[GS_STACK_ARG];
	enum gs_verdict verdict;
	bool fault = false;
	struct gs_call c = {
		.kind = gf->node->kind,
		.gpu_minor = gf->node->gpu,
		.req = cmd,
		.file_id = gf->id,
		.pid = current->tgid,
		/* pids as the caller's pid namespace sees them: what RM reports */
		.ns_pid = task_tgid_vnr(current),
		.escape = _IOC_NR(cmd),
	};
	long ret;

	if (c.kind == GS_FILE_UVM) {
		c.escape = cmd;
	} else {
		c.arg_size = _IOC_SIZE(cmd);
		c.arg = stack_arg;
		if (c.arg_size > sizeof(stack_arg)) {
			c.arg = kmalloc(c.arg_size, GFP_KERNEL);
			if (!c.arg)
				return -ENOMEM;
		}
		if (copy_from_user(c.arg, arg, c.arg_size)) {
			ret = -EFAULT;
			goto out_free;
		}
	}

	verdict = decode ? gs_pre(inst->core, &c, &gs_user_io) : GS_PASS;
	switch (verdict) {
	case GS_FAIL:
		ret = -c.err;
		break;
	case GS_REPLY:
		ret = 0;
		if (copy_to_user(arg, c.arg, c.arg_size))
			ret = -EFAULT;
		break;
	default:
		/* the driver reads the block from user memory: give it the
		 * block the core decided on */
		if (c.arg_size && copy_to_user(arg, c.arg, c.arg_size)) {
			ret = -EFAULT;
			if (decode)
				gs_post(inst->core, &c, &gs_user_io, ret);
			break;
		}
		ret = gs_call_real(gf, &c, cmd, arg, compat, &drv_ns, &fault);
		/*
		 * The driver ran but its reply is gone: it could not write it
		 * (-EFAULT: another thread made the block read-only or unmapped
		 * it mid-call, after RM acted) or we cannot read it. The core
		 * then assumes the call succeeded: what it charged stays.
		 */
		c.reply_lost = (!ret && fault) || ret == -EFAULT;
		if (decode)
			gs_post(inst->core, &c, &gs_user_io, c.reply_lost ? 0 : ret);
		if (!ret && !fault)
			gs_check_version_reply(&c);
		if (fault || (c.arg_size && copy_to_user(arg, c.arg, c.arg_size)))
			ret = -EFAULT;
		break;
	}

	trace_gpuslice_ioctl(inst->id, inst->name, c.pid, c.kind, c.escape, c.what,
			     c.status, c.refusal, drv_ns, ktime_get_ns() - t0);
	if (c.refusal != GS_REFUSE_NONE)
		trace_gpuslice_refusal(inst->id, inst->name, c.pid, c.kind, c.escape,
				       c.what, c.refusal, c.status,
				       gs_refused_size(inst));
out_free:
	if (c.arg != stack_arg)
		kfree(c.arg);
	return ret;
}
