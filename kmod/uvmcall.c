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
 * Loaded from a context without an mm (never, through finit_module()), there
 * is no such page: gs_uvmcall() says so and the calls run in the caller's
 * context with their reply untrusted; the core then keeps those charges
 * until the nvidia-uvm file goes.
 */
#include <linux/completion.h>
#include <linux/err.h>
#include <linux/kthread.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/mman.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "uvmcall.h"

struct gs_uvmcall_req {
	struct list_head node;
	struct file *real;
	unsigned int cmd;
	void *block;
	size_t size;
	long ret;
	struct completion done;
};

static struct mm_struct *gs_uc_mm;
static struct task_struct *gs_uc_thread;
static DEFINE_SPINLOCK(gs_uc_lock);
static LIST_HEAD(gs_uc_queue);
static DECLARE_WAIT_QUEUE_HEAD(gs_uc_wq);

static long gs_uc_run(struct gs_uvmcall_req *req, unsigned long page)
{
	void __user *p = (void __user *)page;
	long ret;

	if (IS_ERR_VALUE(page))
		return (long)page;
	if (!req->real->f_op->unlocked_ioctl)
		return -ENOTTY;
	if (copy_to_user(p, req->block, req->size))
		return -EFAULT;
	ret = req->real->f_op->unlocked_ioctl(req->real, req->cmd, page);
	if (copy_from_user(req->block, p, req->size))
		return -EFAULT;
	return ret;
}

static struct gs_uvmcall_req *gs_uc_next(void)
{
	struct gs_uvmcall_req *req;

	spin_lock(&gs_uc_lock);
	req = list_first_entry_or_null(&gs_uc_queue, struct gs_uvmcall_req, node);
	if (req)
		list_del(&req->node);
	spin_unlock(&gs_uc_lock);
	return req;
}

static int gs_uc_fn(void *data)
{
	struct gs_uvmcall_req *req;
	unsigned long page;

	kthread_use_mm(gs_uc_mm);
	page = vm_mmap(NULL, 0, PAGE_SIZE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, 0);
	for (;;) {
		wait_event_idle(gs_uc_wq, !list_empty(&gs_uc_queue) || kthread_should_stop());
		req = gs_uc_next();
		if (!req) {
			if (kthread_should_stop())
				break;
			continue;
		}
		req->ret = gs_uc_run(req, page);
		complete(&req->done);
	}
	if (!IS_ERR_VALUE(page))
		vm_munmap(page, PAGE_SIZE);
	kthread_unuse_mm(gs_uc_mm);
	return 0;
}

int gs_uvmcall_init(void)
{
	struct task_struct *t;

	if (!current->mm) {
		pr_warn("gpuslice: loaded without an mm: nvidia-uvm frees are not trusted, their charges stay until the file goes\n");
		return 0;
	}
	mmget(current->mm);
	gs_uc_mm = current->mm;
	t = kthread_run(gs_uc_fn, NULL, "gpuslice-uvm");
	if (IS_ERR(t)) {
		mmput(gs_uc_mm);
		gs_uc_mm = NULL;
		return PTR_ERR(t);
	}
	gs_uc_thread = t;
	return 0;
}

void gs_uvmcall_exit(void)
{
	if (!gs_uc_thread)
		return;
	kthread_stop(gs_uc_thread);
	gs_uc_thread = NULL;
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

	if (!gs_uc_thread)
		return -ENODEV;
	if (size > PAGE_SIZE)
		return -EINVAL;
	init_completion(&req.done);
	spin_lock(&gs_uc_lock);
	list_add_tail(&req.node, &gs_uc_queue);
	spin_unlock(&gs_uc_lock);
	wake_up(&gs_uc_wq);
	/* not killable: the thread uses req until it completes it */
	wait_for_completion(&req.done);
	return req.ret;
}
