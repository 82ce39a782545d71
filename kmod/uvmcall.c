// SPDX-License-Identifier: GPL-2.0
/*
 * uvmcall.c - nvidia-uvm calls whose reply no process can rewrite.
 *
 * The core lets go of a charge that nvidia-uvm held (core/uvm.c) only when
 * it knows UVM let go of the memory: a successful UVM_FREE or
 * UVM_UNMAP_EXTERNAL (or, for a retained channel, UVM_UNREGISTER_CHANNEL). UVM answers in the caller's argument block
 * (kernel-open/nvidia-uvm/uvm_api.h __UVM_ROUTE_CMD_STACK: copy_from_user,
 * the call, copy_to_user, return 0), and any user page the driver can write
 * to, another thread of the same process can write to as well once the
 * driver's copy-out has made it writable (the shadow pages included,
 * shadow.c). A tenant could fail a free on purpose, rewrite its status to
 * NV_OK and be uncharged for memory UVM still holds.
 *
 * So those calls (and UVM_UNREGISTER_CHANNEL, the release of a retained
 * channel) are made by a kernel thread of the module, on the caller's real
 * nvidia-uvm file, from a page of an address space in which no process runs:
 * the one of the process that loaded the module, kept (mmget()) after that
 * process exits. They work on the file's VA space alone (uvm_va_range.c
 * uvm_free(), uvm_map_external.c uvm_unmap_external(), uvm_user_channel.c
 * uvm_api_unregister_channel()): neither the calling process nor its mm is
 * looked at. The calls that make UVM hold something stay in the caller's
 * context: RM allows UVM's duplicates for the calling process's clients only
 * (client_resource.c, RS_SHARE_TYPE_PID), and a semaphore pool's pages are
 * charged to the caller's memory cgroup.
 *
 * Each call runs in a work item of its own on an unbound workqueue, which
 * adopts that address space for the call and maps a page there for it: one
 * container's slow free does not wait behind another's, or hold anything
 * another needs. The caller waits for its call as it waits in the driver
 * (uninterruptibly: the work item uses the caller's block until it is done).
 *
 * Loaded from a context without an mm (never, through finit_module()), there
 * is no such address space: gs_uvmcall() says so and the calls run in the
 * caller's context with their reply untrusted; the core then keeps those
 * charges until the nvidia-uvm file goes.
 */
#include <linux/completion.h>
#include <linux/err.h>
#include <linux/kthread.h>
#include <linux/mm.h>
#include <linux/mman.h>
#include <linux/sched/mm.h>
#include <linux/uaccess.h>
#include <linux/workqueue.h>

#include "uvmcall.h"

struct gs_uvmcall_req {
	struct work_struct work;
	struct file *real;
	unsigned int cmd;
	void *block;
	size_t size;
	long ret;
	struct completion done;
};

/* the loading process's address space, kept after it exits; NULL: none */
static struct mm_struct *gs_uc_mm;

static long gs_uc_run(struct gs_uvmcall_req *req)
{
	unsigned long page;
	void __user *p;
	long ret;

	if (!req->real->f_op->unlocked_ioctl)
		return -ENOTTY;
	page = vm_mmap(NULL, 0, PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, 0);
	if (IS_ERR_VALUE(page))
		return (long)page;
	p = (void __user *)page;
	ret = -EFAULT;
	if (!copy_to_user(p, req->block, req->size)) {
		ret = req->real->f_op->unlocked_ioctl(req->real, req->cmd, page);
		if (copy_from_user(req->block, p, req->size))
			ret = -EFAULT;
	}
	vm_munmap(page, PAGE_SIZE);
	return ret;
}

static void gs_uc_fn(struct work_struct *work)
{
	struct gs_uvmcall_req *req = container_of(work, struct gs_uvmcall_req, work);

	kthread_use_mm(gs_uc_mm);
	req->ret = gs_uc_run(req);
	kthread_unuse_mm(gs_uc_mm);
	complete(&req->done);
}

int gs_uvmcall_init(void)
{
	if (!current->mm) {
		pr_warn("gpuslice: loaded without an mm: nvidia-uvm frees are not trusted, their charges stay until the file goes\n");
		return 0;
	}
	mmget(current->mm);
	gs_uc_mm = current->mm;
	return 0;
}

/* after every file is gone: no call is in flight */
void gs_uvmcall_exit(void)
{
	if (!gs_uc_mm)
		return;
	mmput(gs_uc_mm);
	gs_uc_mm = NULL;
}

long gs_uvmcall(struct file *real, unsigned int cmd, void *block, size_t size)
{
	struct gs_uvmcall_req req = {
		.real = real,
		.cmd = cmd,
		.block = block,
		.size = size,
	};

	if (!gs_uc_mm)
		return -ENODEV;
	if (size > PAGE_SIZE)
		return -EINVAL;
	init_completion(&req.done);
	INIT_WORK_ONSTACK(&req.work, gs_uc_fn);
	queue_work(system_unbound_wq, &req.work);
	/* not killable: the work item uses req and block until it completes */
	wait_for_completion(&req.done);
	destroy_work_on_stack(&req.work);
	return req.ret;
}
