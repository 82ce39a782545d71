// SPDX-License-Identifier: GPL-2.0
/*
 * ioctl.c - one interposed ioctl on a gpuslice node.
 *
 *   copy the argument block (and its nested block) in -> gs_call_run()
 *   (core/call.c: gs_pre(), and for GS_PASS the ops below: stage the block
 *   in a shadow slot, swap in the private fd table, call the real driver,
 *   swap back, read the reply back -> gs_post() -> copy the block out)
 *   -> tracepoints.
 *
 * GS_REPLY: the core's block (status set) is the reply and the ioctl returns
 * 0, as RM does for a refused call. GS_FAIL: the ioctl fails with -c.err.
 * nvidia-uvm ioctls carry no size in the request word: the core names the
 * size of the ones it decides on by their block (gs_uvm_arg_size(): what
 * makes UVM hold memory, channels or page tables, and what lets go of them,
 * core/uvm.c); those run one at a time per file (gs_file.uvm_lock), staged
 * like an RM call, except the releases (gs_uvm_releases()), made from a page
 * no process can write (uvmcall.c). The others pass on their number. All get
 * fd translation.
 *
 * Timeslice (docs/h100-findings.md): RM accepts NVA06C_CTRL_CMD_SET_TIMESLICE only from
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
#include "inject.h"
#include "instance.h"
#include "ioctl.h"
#include "shadow.h"
#include "uscratch.h"
#include "uvmcall.h"

#define CREATE_TRACE_POINTS
#include "trace.h"

#define GS_STACK_ARG	128
#define GS_TS_BATCH	64

/*
 * The core's view of user memory during one call: the nested parameter block
 * the glue copied before gs_pre() (gs_nested()), and nothing else. The core
 * never reads user memory itself, so nothing it decides on can change after
 * it read it, and it makes no user copy under its lock.
 */
struct gs_uio {
	struct gs_nested n;
	void *buf;		/* n.size bytes copied from n.uaddr, or NULL */
	bool dirty;		/* the core or the driver wrote to buf: it goes back */
};

static void *gs_uio_at(struct gs_uio *u, nv_u64 uaddr, nv_u32 len)
{
	if (!u->buf || uaddr < u->n.uaddr || len > u->n.size ||
	    uaddr - u->n.uaddr > u->n.size - len)
		return NULL;
	return u->buf + (uaddr - u->n.uaddr);
}

static int gs_io_read(void *ctx, nv_u64 uaddr, void *dst, nv_u32 len)
{
	void *src = gs_uio_at(ctx, uaddr, len);

	if (!src)
		return -EFAULT;
	memcpy(dst, src, len);
	return 0;
}

static int gs_io_write(void *ctx, nv_u64 uaddr, const void *src, nv_u32 len)
{
	struct gs_uio *u = ctx;
	void *dst = gs_uio_at(u, uaddr, len);

	if (!dst)
		return -EFAULT;
	memcpy(dst, src, len);
	u->dirty = true;
	return 0;
}

/* Copies the nested block in once; without it the core's reads fail. */
static int gs_uio_fill(struct gs_uio *u, const struct gs_call *c)
{
	if (!gs_nested(c, &u->n))
		return 0;
	u->buf = gs_kvmalloc(u->n.size, GFP_KERNEL);
	if (!u->buf)
		return -ENOMEM;
	if (copy_from_user(u->buf, u64_to_user_ptr(u->n.uaddr), u->n.size)) {
		/* the driver gets the caller's pointer and fails on it itself */
		kvfree(u->buf);
		u->buf = NULL;
		u->n.stage = 0;
	}
	return 0;
}

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

/* Runs with the private fd table in place, inside the instance's gate. */
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
	tc = gs_kzalloc(sizeof(*tc), GFP_KERNEL);
	if (!tc)
		return;
	tc->file_id = gf->id;
	gs_for_each_object(inst->core, gs_ts_collect_one, tc);
	for (i = 0; i < tc->nr; i++)
		gs_ts_set(gf, tc->client[i], tc->handle[i], us);
	kfree(tc);
}

/* After a real RM_ALLOC, with the private fd table still in place; c->arg is the reply. */
static void gs_ts_after_alloc(struct gs_file *gf, const struct gs_call *c)
{
	u64 us = READ_ONCE(gf->node->inst->timeslice_us);
	const struct nvos64_params *req = (const void *)c->checked;
	const struct nvos64_params *rep = c->arg;

	if (!us || c->arg_size != sizeof(*rep))
		return;
	if (req->h_class == KEPLER_CHANNEL_GROUP_A && rep->status == NV_OK)
		gs_ts_set(gf, req->h_root, req->h_object_new ? req->h_object_new : rep->h_object_new, us);
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

/* Where the nested block goes in a shadow slot: after the argument block. */
static size_t gs_nested_off(const struct gs_call *c)
{
	return ALIGN(c->arg_size, 64);
}

/*
 * Puts the checked argument block (and the staged nested block, its pointer
 * rewritten to the copy) in a shadow slot (shadow.c) for the driver to read.
 */
static int gs_stage(struct gs_shadow_slot *slot, const struct gs_call *c,
		    const struct gs_uio *u)
{
	size_t off = gs_nested_off(c);
	bool nested = u->buf && u->n.stage;
	int err;

	err = gs_shadow_get(slot, off + (nested ? u->n.size : 0));
	if (err)
		return err;
	memcpy(slot->kaddr, c->arg, c->arg_size);
	if (nested) {
		u64 p = slot->uaddr + off;

		memcpy(slot->kaddr + off, u->buf, u->n.size);
		memcpy(slot->kaddr + u->n.ptr_off, &p, sizeof(p));
	}
	return 0;
}

/*
 * The driver's replies, back from the slot; the caller's pointer restored in
 * the copy. The reply is what RM wrote, unless another thread of the mm wrote
 * over it after the driver's first write made the page writable: the core
 * trusts no reply field beyond what RM's answer can be (quota.c).
 */
static int gs_unstage(struct gs_shadow_slot *slot, struct gs_call *c, struct gs_uio *u)
{
	if (u->buf && u->n.stage)
		memcpy(u->buf, slot->kaddr + gs_nested_off(c), u->n.size);
	memcpy(c->arg, slot->kaddr, c->arg_size);
	if (u->buf && u->n.stage)
		memcpy(c->arg + u->n.ptr_off, &u->n.uaddr, sizeof(u->n.uaddr));
	return gs_shadow_put(slot);
}

/*
 * Returns the driver's return. *fault: the reply could not be read back
 * (the caller unmapped its block, or the shadow, mid-call); the core still
 * learns the driver ran. stage: the driver reads the checked copies from a
 * shadow slot; otherwise (no decoding, UVM) the caller's memory.
 */
static long gs_call_real(struct gs_file *gf, struct gs_call *c, struct gs_uio *u,
			 unsigned int cmd, void __user *arg, bool compat, bool stage,
			 int pin_fd, struct file *pin, u64 *drv_ns, bool *fault)
{
	struct gs_shadow_slot slot;
	struct gs_fdswap_moved moved;
	struct gs_fdswap *swap;
	void __user *uarg = arg;
	long ret;
	u64 t;

	*fault = false;
	/* the slot first: its wait must not hold the fd swap's exec_update_lock */
	if (stage) {
		ret = gs_stage(&slot, c, u);
		if (ret)
			return ret;
		uarg = (void __user *)slot.uaddr;
	}
	ret = gs_fdswap_enter(&swap, pin_fd, pin ? gs_fops_real(pin) : NULL);
	if (ret) {
		if (stage)
			gs_shadow_put(&slot);
		return ret;
	}
	/* our own SET_TIMESLICE calls take one more page each, one at a time */
	if (!gs_passthrough_only && c->kind != GS_FILE_UVM)
		gs_ts_apply_lazy(gf);
	t = ktime_get_ns();
	ret = gs_real_ioctl(gf->real, cmd, uarg, compat);
	*drv_ns = ktime_get_ns() - t;
	if (stage)
		*fault = gs_unstage(&slot, c, u) != 0;
	else
		*fault = c->arg_size && copy_from_user(c->arg, arg, c->arg_size);
	if (!ret && !*fault && !gs_passthrough_only && c->kind != GS_FILE_UVM &&
	    c->escape == NV_ESC_RM_ALLOC)
		gs_ts_after_alloc(gf, c);
	gs_fdswap_exit(swap, &moved);

	if (moved.nr && !*fault)
		gs_fix_moved_fd(c, &moved);
	return ret;
}

/*
 * UVM_FREE and UVM_UNMAP_EXTERNAL, whose success lets the core uncharge what
 * UVM held: made from a page no process can write (uvmcall.c), so the reply
 * is UVM's. -ENODEV: no such page; the caller makes the call, untrusted.
 */
static long gs_call_uvm_trusted(struct gs_file *gf, struct gs_call *c, u64 *drv_ns)
{
	u64 t = ktime_get_ns();
	long ret;

	ret = gs_uvmcall(gf->real, c->req, c->arg, c->arg_size);
	*drv_ns = ktime_get_ns() - t;
	c->reply_trusted = ret != -ENODEV && ret != -EFAULT;
	return ret;
}

/*
 * The nested reply (RM's, as the core rewrote it) to the caller, if the core
 * or the driver wrote to the copy: -EFAULT when the caller's parameters
 * cannot take it (gs_call_run() then answers as RM does).
 */
static int gs_nested_out(const struct gs_uio *u)
{
	if (!u->buf || !u->n.stage || !u->dirty)
		return 0;
	return copy_to_user(u64_to_user_ptr(u->n.uaddr), u->buf, u->n.size) ? -EFAULT : 0;
}

/*
 * The file an export or import control's fd names (gs_call_fd()), if it is a
 * nvidiactl node of inst: referenced, its id in *id, and the driver finds its
 * real file at that fd for the call (gs_fdswap_enter()). Another instance's
 * file, any other file or none: NULL and *id 0, which the core refuses.
 */
static struct file *gs_fd_file(struct gs_instance *inst, int fd, u64 *id)
{
	struct file *f = fget(fd);
	struct gs_file *pf;

	*id = 0;
	if (!f)
		return NULL;
	if (f->f_op == &gs_fops) {
		pf = f->private_data;
		if (pf->node->inst == inst && pf->node->kind == GS_FILE_CTL) {
			*id = pf->id;
			return f;
		}
	}
	fput(f);
	return NULL;
}

static void gs_check_version_reply(const struct gs_call *c)
{
	const struct nv_ioctl_rm_api_version *v = c->arg;

	if (c->kind == GS_FILE_CTL && c->escape == NV_ESC_CHECK_VERSION_STR &&
	    c->arg_size == sizeof(*v))
		gs_driver_seen_version(v->version_string, sizeof(v->version_string));
}

/*
 * An RM mapping's mmap() may hold a channel's USERD (activity.c). What RM
 * mapped is the block the core checked (and the driver read); the reply
 * gives only its status and the address.
 */
static void gs_map_memory_reply(struct gs_instance *inst, const struct gs_call *c)
{
	const struct nvos33_params_with_fd *req = (const void *)c->checked;
	const struct nvos33_params_with_fd *rep = c->arg;
	struct gs_act_note note = { };

	if (c->kind != GS_FILE_CTL || c->escape != NV_ESC_RM_MAP_MEMORY ||
	    c->arg_size != sizeof(*rep) || rep->params.status != NV_OK)
		return;
	note.client = req->params.h_client;
	note.mem = req->params.h_memory;
	note.offset = req->params.offset;
	note.length = req->params.length;
	note.inpage = offset_in_page(rep->params.p_linear_address);
	gs_activity_map_memory(inst, req->fd, &note);
}

/* one call through gs_call_run(): what the module's ops need of it */
struct gs_ioctl_call {
	struct gs_file *gf;
	struct gs_uio u;
	unsigned int cmd;
	void __user *arg;
	bool compat;
	bool decode;		/* !gs_passthrough_only */
	bool uvm_locked;	/* a UVM call decided on by its block, under gf->uvm_lock */
	bool gated;		/* inside the instance's gate (gate.h) */
	nv_s32 fd;		/* the fd an export or import control names, or -1 */
	struct file *fd_file;	/* its file, if one of the instance's nvidiactl nodes */
	u64 drv_ns;
};

/*
 * The driver reads the block the core decided on, from a page the caller
 * cannot write (shadow.c); UVM ioctls and the plain escapes are decided on
 * their number alone and read where the caller put them.
 */
static long gs_op_driver(void *ctx, struct gs_call *c, int *unread)
{
	struct gs_ioctl_call *ic = ctx;
	bool fault = false;
	long ret = -ENODEV;

	/* the driver's nested reply, read back into the copy, goes to the caller */
	ic->u.dirty = true;
	if (ic->uvm_locked && gs_uvm_releases(c->escape))
		ret = gs_call_uvm_trusted(ic->gf, c, &ic->drv_ns);
	if (ret == -ENODEV)
		ret = gs_call_real(ic->gf, c, &ic->u, ic->cmd, ic->arg, ic->compat,
				   ic->decode && c->arg_size &&
				   (gs_block_decided(c) || c->kind == GS_FILE_UVM),
				   ic->fd, ic->fd_file, &ic->drv_ns, &fault);
	/*
	 * The driver ran but its reply is gone: it could not write it
	 * (-EFAULT: another thread unmapped the block mid-call, after RM
	 * acted) or we cannot read it. The core then assumes the call
	 * succeeded: what it charged stays.
	 */
	c->reply_lost = (!ret && fault) || ret == -EFAULT;
	*unread = fault;
	return ret;
}

static void gs_op_after(void *ctx, struct gs_call *c, long ret)
{
	struct gs_ioctl_call *ic = ctx;

	if (ret)
		return;
	gs_check_version_reply(c);
	if (ic->decode)
		gs_map_memory_reply(ic->gf->node->inst, c);
}

static int gs_op_nested_out(void *ctx, const struct gs_call *c)
{
	struct gs_ioctl_call *ic = ctx;

	return gs_nested_out(&ic->u);
}

static int gs_op_copy_out(void *ctx, const struct gs_call *c, long ret)
{
	struct gs_ioctl_call *ic = ctx;

	if (c->arg_size && copy_to_user(ic->arg, c->arg, c->arg_size))
		return -EFAULT;
	return 0;
}

/* the core is done with the call: the copies out run outside the gate */
static void gs_op_done(void *ctx)
{
	struct gs_ioctl_call *ic = ctx;

	if (ic->gated) {
		gs_gate_leave(&ic->gf->node->inst->gate);
		ic->gated = false;
	}
}

static const struct gs_call_ops gs_ioctl_ops = {
	.driver = gs_op_driver,
	.after = gs_op_after,
	.nested_out = gs_op_nested_out,
	.copy_out = gs_op_copy_out,
	.done = gs_op_done,
};

long gs_ioctl(struct file *file, unsigned int cmd, void __user *arg, bool compat)
{
	struct gs_file *gf = file->private_data;
	struct gs_instance *inst = gf->node->inst;
	struct gs_ioctl_call ic = {
		.gf = gf,
		.cmd = cmd,
		.arg = arg,
		.compat = compat,
		.decode = !gs_passthrough_only,
		.fd = -1,
	};
	u64 t0 = ktime_get_ns();
	u8 stack_arg[GS_STACK_ARG];
	struct gs_io io = {
		.read = gs_io_read,
		.write = gs_io_write,
		.ctx = &ic.u,
	};
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
		/* the nvidia-uvm commands decided on by their block (core/uvm.c) */
		c.arg_size = ic.decode ? gs_uvm_arg_size(cmd) : 0;
	} else {
		c.arg_size = _IOC_SIZE(cmd);
		c.arg = stack_arg;
	}
	if (c.arg_size) {
		if (c.arg_size > sizeof(stack_arg)) {
			c.arg = gs_kmalloc(c.arg_size, GFP_KERNEL);
			if (!c.arg)
				return -ENOMEM;
		} else {
			c.arg = stack_arg;
		}
		if (copy_from_user(c.arg, arg, c.arg_size)) {
			ret = -EFAULT;
			goto out_free;
		}
	}
	if (ic.decode && c.kind != GS_FILE_UVM) {
		ret = gs_uio_fill(&ic.u, &c);
		if (ret)
			goto out_free;
		if (gs_call_fd(&c, &io, &ic.fd)) {
			ic.fd_file = gs_fd_file(inst, ic.fd, &c.fd_file_id);
			gs_inject_fd_delay();	/* the test build's race window */
		}
	}
	ic.uvm_locked = c.kind == GS_FILE_UVM && c.arg_size;
	if (ic.uvm_locked && mutex_lock_killable(&gf->uvm_lock)) {
		ret = -EINTR;
		goto out_free;
	}

	/*
	 * From gs_pre() to gs_post() the call uses inst->core, which a handover
	 * swaps with the gate closed: the core is read inside it.
	 */
	if (ic.decode) {
		ret = gs_gate_enter(&inst->gate);
		if (ret)
			goto out_unlock;
		ic.gated = true;
	}
	ret = gs_call_run(ic.decode ? inst->core : NULL, &c, &io, &gs_ioctl_ops, &ic);
	gs_op_done(&ic);	/* a no-op: gs_call_run() left the gate through .done */

	if (ic.uvm_locked)
		mutex_unlock(&gf->uvm_lock);
	trace_gpuslice_ioctl(inst->id, inst->name, c.pid, c.kind, c.escape, c.what,
			     c.status, c.refusal, ic.drv_ns, ktime_get_ns() - t0);
	if (c.refusal != GS_REFUSE_NONE)
		trace_gpuslice_refusal(inst->id, inst->name, c.pid, c.kind, c.escape,
				       c.what, c.refusal, c.status,
				       gs_refused_size(inst));
	goto out_free;

out_unlock:
	if (ic.uvm_locked)
		mutex_unlock(&gf->uvm_lock);
out_free:
	if (ic.fd_file)
		fput(ic.fd_file);
	kvfree(ic.u.buf);
	if (c.arg != stack_arg)
		kfree(c.arg);
	return ret;
}
