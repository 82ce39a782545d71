// SPDX-License-Identifier: GPL-2.0
/*
 * shadow.c - the argument blocks the real driver reads, in pages of the
 * caller's address space that the caller cannot write.
 *
 * The real driver reads its arguments from user memory after gpuslice has
 * checked its own copy: nvidia_ioctl() copies the top-level block at entry
 * and RM copies the nested parameters later (kernel-open/nvidia/nv.c
 * nvidia_ioctl(); src/nvidia/src/libraries/resserv/src/rs_server.c
 * serverAllocApiCopyIn(), serverControlApiCopyIn()). A kernel module cannot
 * hand copy_from_user() a kernel pointer, and the call has to run in the
 * caller's context (RM records the calling process). So the checked copies
 * are placed in user pages that only the calling thread can write, and the
 * driver is given their address:
 *
 *  - Each process that calls through a gpuslice node gets one mapping, made
 *    by the module at its first call: GS_SHADOW_PAGES pages at
 *    GS_SHADOW_BASE, below vm.mmap_min_addr (65536 by default on Debian and
 *    Ubuntu), so without CAP_SYS_RAWIO in the initial user namespace the
 *    process cannot map anything of its own there (cap_mmap_addr()). The
 *    module maps it with init's credentials.
 *  - VM_PFNMAP | VM_IO: get_user_pages() refuses it, so /proc/<pid>/mem,
 *    process_vm_writev(), ptrace, O_DIRECT and io_uring cannot pin or write
 *    the pages behind the mapping's back.
 *  - A shared writable mapping with pfn_mkwrite: every PTE starts read-only
 *    and the first write through it faults into gs_shadow_pfn_mkwrite(),
 *    which lets only the thread that owns the page for a call make it
 *    writable (the driver copying its reply out, in that thread). Any other
 *    write, from user space or from the kernel on another thread's behalf
 *    (read(2) into the page), gets SIGBUS or -EFAULT.
 *  - When a call gives its pages back, their PTEs are zapped (zap_vma_ptes()
 *    flushes the TLBs) before another call can own them: a PTE is writable
 *    only while the call that made it writable is in flight, and a page no
 *    call owns cannot be written at all.
 *  - Nothing in the driver writes before it has read everything: the block
 *    and the nested parameters are copied in before RM works and out after
 *    (serverControlApiCopyOut(), serverAllocApiCopyOut(), then nvidia_ioctl()'s
 *    copy_to_user()). So once the owner's first write makes a PTE writable,
 *    every read the call makes is done.
 *  - Split, move (mremap) and mprotect are refused; fork does not copy it.
 *    A process that unmaps it while one of its calls is in flight is killed
 *    (gs_shadow_vm_close()) and the call fails with -EFAULT: the driver could
 *    otherwise read another mapping there (a privileged process can map below
 *    mmap_min_addr) or a new shadow's pages. Unmapped while idle, it is made
 *    again at the next call.
 *
 * The pages belong to the shadow until the last vma and the last call are
 * gone. The mapping's file pins the module (fops .owner): a process that has
 * called through a gpuslice node keeps the module loaded until it exits or
 * unmaps its shadow.
 */
#include <linux/anon_inodes.h>
#include <linux/bitmap.h>
#include <linux/cred.h>
#include <linux/err.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/mman.h>
#include <linux/module.h>
#include <linux/refcount.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/sched/task.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/vmalloc.h>
#include <linux/wait.h>

#include "compat.h"
#include "inject.h"
#include "shadow.h"

struct gs_shadow {
	refcount_t ref;		/* one per vma, one per slot taken */
	spinlock_t lock;	/* busy, owner */
	wait_queue_head_t wq;
	unsigned long busy;	/* a bit per page taken by a call */
	struct task_struct *owner[GS_SHADOW_PAGES];
	atomic_t closes;	/* vmas of this shadow that went away */
	atomic_t mappable;	/* gs_shadow_mmap() takes one mapping: ours */
	void *pages;		/* GS_SHADOW_PAGES pages, vmalloc_user() */
};

static const struct cred *gs_kcred;	/* init's, to map below mmap_min_addr */
static const struct vm_operations_struct gs_shadow_vm_ops;

static void gs_shadow_unref(struct gs_shadow *sh)
{
	if (refcount_dec_and_test(&sh->ref)) {
		vfree(sh->pages);
		kfree(sh);
	}
}

static bool gs_shadow_may_write(struct gs_shadow *sh, unsigned long idx)
{
	bool ok;

	spin_lock(&sh->lock);
	ok = idx < GS_SHADOW_PAGES && sh->owner[idx] == current;
	spin_unlock(&sh->lock);
	return ok;
}

static unsigned long gs_shadow_index(const struct vm_fault *vmf)
{
	return (vmf->address - vmf->vma->vm_start) >> PAGE_SHIFT;
}

/* Maps the page read-only (vm_page_prot has no write: writenotify). */
static vm_fault_t gs_shadow_fault(struct vm_fault *vmf)
{
	struct gs_shadow *sh = vmf->vma->vm_private_data;
	unsigned long idx = gs_shadow_index(vmf);

	if (idx >= GS_SHADOW_PAGES)
		return VM_FAULT_SIGBUS;
	if ((vmf->flags & FAULT_FLAG_WRITE) && !gs_shadow_may_write(sh, idx))
		return VM_FAULT_SIGBUS;
	return vmf_insert_pfn(vmf->vma, vmf->address & PAGE_MASK,
			      vmalloc_to_pfn(sh->pages + idx * PAGE_SIZE));
}

static vm_fault_t gs_shadow_pfn_mkwrite(struct vm_fault *vmf)
{
	struct gs_shadow *sh = vmf->vma->vm_private_data;

	return gs_shadow_may_write(sh, gs_shadow_index(vmf)) ? 0 : VM_FAULT_SIGBUS;
}

static void gs_shadow_vm_open(struct vm_area_struct *vma)
{
	struct gs_shadow *sh = vma->vm_private_data;

	refcount_inc(&sh->ref);
}

static void gs_shadow_vm_close(struct vm_area_struct *vma)
{
	struct gs_shadow *sh = vma->vm_private_data;

	unsigned int i;

	spin_lock(&sh->lock);
	atomic_inc(&sh->closes);
	/*
	 * Unmapped by a task of the mm itself (exit and exec drop the mm with
	 * current->mm pointing elsewhere) while calls are in flight: their
	 * driver may read whatever is mapped there next, a new shadow made by
	 * another task of the mm included. The unmapper and every task with a
	 * call in flight (other thread groups can share the mm: CLONE_VM) die.
	 */
	if (vma->vm_mm == current->mm && sh->busy) {
		pr_warn_ratelimited("gpuslice: pid %d unmapped its parameter pages mid-call: killed\n",
				    task_tgid_nr(current));
		send_sig(SIGKILL, current, 1);
		for (i = 0; i < GS_SHADOW_PAGES; i++)
			if (sh->owner[i])
				send_sig(SIGKILL, sh->owner[i], 1);
	}
	spin_unlock(&sh->lock);
	wake_up_all(&sh->wq);
	gs_shadow_unref(sh);
}

static int gs_shadow_may_split(struct vm_area_struct *vma, unsigned long addr)
{
	return -EINVAL;
}

static int gs_shadow_mremap(struct vm_area_struct *vma)
{
	return -EINVAL;
}

static int gs_shadow_mprotect(struct vm_area_struct *vma, unsigned long start,
			      unsigned long end, unsigned long newflags)
{
	return -EACCES;
}

static const struct vm_operations_struct gs_shadow_vm_ops = {
	.open = gs_shadow_vm_open,
	.close = gs_shadow_vm_close,
	.may_split = gs_shadow_may_split,
	.mremap = gs_shadow_mremap,
	.mprotect = gs_shadow_mprotect,
	.fault = gs_shadow_fault,
	.pfn_mkwrite = gs_shadow_pfn_mkwrite,
};

static int gs_shadow_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct gs_shadow *sh = file->private_data;

	if (vma->vm_pgoff || vma->vm_end - vma->vm_start != GS_SHADOW_PAGES * PAGE_SIZE ||
	    !(vma->vm_flags & VM_SHARED) || !atomic_xchg(&sh->mappable, 0))
		return -EINVAL;
	gs_vm_flags_mod(vma, VM_PFNMAP | VM_IO | VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP,
			VM_MAYEXEC);
	vma->vm_ops = &gs_shadow_vm_ops;
	vma->vm_private_data = sh;
	refcount_inc(&sh->ref);
	return 0;
}

static const struct file_operations gs_shadow_fops = {
	.owner = THIS_MODULE,
	.mmap = gs_shadow_mmap,
};

/*
 * The caller's shadow with a reference, NULL if it has none, ERR_PTR(-EEXIST)
 * if something else is mapped where it goes.
 */
static struct gs_shadow *gs_shadow_find(struct mm_struct *mm, int *closes)
{
	struct vm_area_struct *vma;
	struct gs_shadow *sh = NULL;

	mmap_read_lock(mm);
	vma = find_vma_intersection(mm, GS_SHADOW_BASE, GS_SHADOW_END);
	if (vma) {
		sh = ERR_PTR(-EEXIST);
		if (vma->vm_ops == &gs_shadow_vm_ops && vma->vm_start == GS_SHADOW_BASE) {
			sh = vma->vm_private_data;
			refcount_inc(&sh->ref);
			/* mapped now: a close from here on changes it */
			*closes = atomic_read(&sh->closes);
		}
	}
	mmap_read_unlock(mm);
	return sh;
}

static int gs_shadow_create(void)
{
	const struct cred *old;
	struct gs_shadow *sh;
	struct file *file;
	unsigned long addr;
	int err;

	sh = gs_kzalloc(sizeof(*sh), GFP_KERNEL);
	if (!sh)
		return -ENOMEM;
	sh->pages = vmalloc_user(GS_SHADOW_PAGES * PAGE_SIZE);
	if (!sh->pages) {
		kfree(sh);
		return -ENOMEM;
	}
	refcount_set(&sh->ref, 1);
	spin_lock_init(&sh->lock);
	init_waitqueue_head(&sh->wq);
	atomic_set(&sh->mappable, 1);

	file = anon_inode_getfile("[gpuslice-params]", &gs_shadow_fops, sh, O_RDWR);
	if (IS_ERR(file)) {
		err = PTR_ERR(file);
		goto out;
	}
	old = override_creds(gs_kcred);
	addr = vm_mmap(file, GS_SHADOW_BASE, GS_SHADOW_PAGES * PAGE_SIZE,
		       PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED_NOREPLACE, 0);
	revert_creds(old);
	fput(file);
	err = IS_ERR_VALUE(addr) ? (int)addr : 0;
	if (!err && addr != GS_SHADOW_BASE) {
		vm_munmap(addr, GS_SHADOW_PAGES * PAGE_SIZE);
		err = -EFAULT;
	}
out:
	gs_shadow_unref(sh);
	return err;
}

static bool gs_shadow_take(struct gs_shadow *sh, unsigned int nr, unsigned int *first)
{
	unsigned long i;
	bool ok = false;

	spin_lock(&sh->lock);
	i = bitmap_find_next_zero_area(&sh->busy, GS_SHADOW_PAGES, 0, nr, 0);
	if (i < GS_SHADOW_PAGES) {
		bitmap_set(&sh->busy, i, nr);
		*first = i;
		for (; i < *first + nr; i++)
			sh->owner[i] = current;
		ok = true;
	}
	spin_unlock(&sh->lock);
	return ok;
}

static void gs_shadow_give(struct gs_shadow *sh, unsigned int first, unsigned int nr)
{
	unsigned int i;

	spin_lock(&sh->lock);
	for (i = first; i < first + nr; i++)
		sh->owner[i] = NULL;
	bitmap_clear(&sh->busy, first, nr);
	spin_unlock(&sh->lock);
	wake_up_all(&sh->wq);
}

/*
 * Checks, under the mmap lock, that the slot's shadow is still the one mapped
 * at GS_SHADOW_BASE and was not unmapped since the slot was looked up, and
 * drops the user mappings of the slot's pages if zap. -EFAULT if not.
 */
static int gs_shadow_check(struct gs_shadow_slot *s, bool zap)
{
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	int err = -EFAULT;

	mmap_read_lock(mm);
	vma = find_vma(mm, GS_SHADOW_BASE);
	if (vma && vma->vm_ops == &gs_shadow_vm_ops && vma->vm_private_data == s->sh &&
	    vma->vm_start == GS_SHADOW_BASE) {
		if (zap)
			zap_vma_ptes(vma, s->uaddr, s->nr * PAGE_SIZE);
		err = atomic_read(&s->sh->closes) == s->closes ? 0 : -EFAULT;
	}
	mmap_read_unlock(mm);
	return err;
}

int gs_shadow_get(struct gs_shadow_slot *s, size_t len)
{
	unsigned int nr = DIV_ROUND_UP(len, PAGE_SIZE), first = 0, tries;
	struct gs_shadow *sh = NULL;
	bool taken = false;
	int err;

	if (!current->mm || !nr || nr > GS_SHADOW_PAGES)
		return -EINVAL;
	for (tries = 0; !sh; tries++) {
		if (fatal_signal_pending(current) || tries == 3)
			return -EINTR;
		sh = gs_shadow_find(current->mm, &s->closes);
		if (IS_ERR(sh))
			return PTR_ERR(sh);
		if (!sh) {
			err = gs_shadow_create();
			if (err && err != -EEXIST)
				return err;
		}
	}
	s->sh = sh;
	err = wait_event_killable(sh->wq, atomic_read(&sh->closes) != s->closes ||
				  (taken = gs_shadow_take(sh, nr, &first)));
	if (!err && !taken)
		err = -EFAULT;
	if (err)
		goto err_unref;
	s->first = first;
	s->nr = nr;
	s->kaddr = sh->pages + first * PAGE_SIZE;
	s->uaddr = GS_SHADOW_BASE + first * PAGE_SIZE;
	err = gs_shadow_check(s, false);
	if (err)
		goto err_give;
	return 0;

err_give:
	gs_shadow_give(sh, first, nr);
err_unref:
	gs_shadow_unref(sh);
	return err;
}

int gs_shadow_put(struct gs_shadow_slot *s)
{
	struct gs_shadow *sh = s->sh;
	int err = atomic_read(&sh->closes) != s->closes ? -EFAULT : 0;

	/*
	 * Before another call can own them: no PTE stays writable while idle,
	 * and nothing of this call is left for another to read.
	 */
	gs_shadow_check(s, true);
	memset(s->kaddr, 0, s->nr * PAGE_SIZE);
	gs_shadow_give(sh, s->first, s->nr);
	gs_shadow_unref(sh);
	return err;
}

int gs_shadow_init(void)
{
	gs_kcred = prepare_kernel_cred(&init_task);
	return gs_kcred ? 0 : -ENOMEM;
}

void gs_shadow_exit(void)
{
	put_cred(gs_kcred);
}
