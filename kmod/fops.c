// SPDX-License-Identifier: GPL-2.0
/*
 * fops.c - file operations of the gpuslice nodes.
 *
 * open() opens the real node (driver.c) in the caller's context and keeps it
 * in private_data; every other operation reaches that real file. ioctls go
 * through ioctl.c (the decision core and fd translation). release() hands
 * the file to the reaper (reaper.c): the real file can outlive it. mmap() hands the
 * vma to the real file: vma->vm_file becomes the real file (vma_set_file()),
 * so faults, munmap and the driver's own vma checks see the driver's file.
 */
#include <linux/atomic.h>
#include <linux/compat.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/poll.h>
#include <linux/sched.h>
#include <linux/slab.h>

#include "driver.h"
#include "fops.h"
#include "inject.h"
#include "instance.h"
#include "ioctl.h"
#include "reaper.h"

static atomic64_t gs_next_file_id = ATOMIC64_INIT(0);

static int gs_open(struct inode *inode, struct file *file)
{
	struct gs_node *node;
	struct gs_file *gf;
	struct file *real;
	int err;

	node = gs_node_open(iminor(inode));
	if (IS_ERR(node))
		return PTR_ERR(node);
	gf = gs_kzalloc(sizeof(*gf), GFP_KERNEL);
	if (!gf) {
		err = -ENOMEM;
		goto err_close;
	}
	real = gs_driver_open(node->kind, node->gpu, file->f_flags);
	if (IS_ERR(real)) {
		err = PTR_ERR(real);
		goto err_free;
	}
	gf->node = node;
	gf->real = real;
	mutex_init(&gf->uvm_lock);
	gf->id = atomic64_inc_return(&gs_next_file_id);
	gf->tgid = current->tgid;
	gf->timeslice_gen = atomic_read(&node->inst->timeslice_gen);
	file->private_data = gf;
	gs_proc_attach(node->inst, gf->tgid);
	return 0;

err_free:
	kfree(gf);
err_close:
	gs_node_close(node);
	return err;
}

static int gs_release(struct inode *inode, struct file *file)
{
	struct gs_file *gf = file->private_data;

	gs_proc_detach(gf->node->inst, gf->tgid);
	/* the accounting ends when the real file goes (reaper.c) */
	gs_reaper_add(gf);
	return 0;
}

static long gs_unlocked_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	return gs_ioctl(file, cmd, (void __user *)arg, false);
}

#ifdef CONFIG_COMPAT
static long gs_compat_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	return gs_ioctl(file, cmd, compat_ptr(arg), true);
}
#endif

static int gs_mmap(struct file *file, struct vm_area_struct *vma)
{
	struct gs_file *gf = file->private_data;
	struct file *real = gf->real;
	int err;

	if (!real->f_op->mmap)
		return -ENODEV;
	vma_set_file(vma, real);
	err = real->f_op->mmap(real, vma);
	if (!err)
		gs_activity_mmap(gf, vma);
	return err;
}

static __poll_t gs_poll(struct file *file, struct poll_table_struct *wait)
{
	struct gs_file *gf = file->private_data;
	struct file *real = gf->real;

	if (!real->f_op->poll)
		return DEFAULT_POLLMASK;
	return real->f_op->poll(real, wait);
}

static ssize_t gs_read(struct file *file, char __user *buf, size_t len, loff_t *pos)
{
	struct gs_file *gf = file->private_data;
	struct file *real = gf->real;

	if (!real->f_op->read)
		return -EINVAL;
	return real->f_op->read(real, buf, len, pos);
}

static ssize_t gs_write(struct file *file, const char __user *buf, size_t len,
			loff_t *pos)
{
	struct gs_file *gf = file->private_data;
	struct file *real = gf->real;

	if (!real->f_op->write)
		return -EINVAL;
	return real->f_op->write(real, buf, len, pos);
}

const struct file_operations gs_fops = {
	.owner = THIS_MODULE,
	.open = gs_open,
	.release = gs_release,
	.unlocked_ioctl = gs_unlocked_ioctl,
#ifdef CONFIG_COMPAT
	.compat_ioctl = gs_compat_ioctl,
#endif
	.mmap = gs_mmap,
	.poll = gs_poll,
	.read = gs_read,
	.write = gs_write,
	.llseek = noop_llseek,
};
