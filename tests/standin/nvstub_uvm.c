// SPDX-License-Identifier: GPL-2.0
/*
 * nvstub_uvm.c - /dev/nvidia-uvm of the nvstub TEST DOUBLE.
 *
 * Answers the UVM commands CUDA issues at start-up (see the traces) with the
 * checks of kernel-open/nvidia-uvm/uvm.c that matter to an interposer: the
 * file must be initialized (UVM_INITIALIZE) first, and every fd argument
 * (rmCtrlFd: an nvidiactl file, uvmFd: an nvidia-uvm file) is resolved with
 * fget() and checked to be a file of this driver. No memory is managed:
 * mmap() creates a "managed" mapping with uvm_mmap()'s checks, backed by
 * zeroed pages of system memory (nvstub_uvm_mmap()).
 */
#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/xarray.h>

#include "nvstub.h"

struct nvstub_uvm_file {
	bool initialized;		/* UVM_FD_VA_SPACE */
	bool mm_initialized;		/* UVM_FD_MM */
	u64 flags;
	struct mm_struct *mm;		/* va_space_mm.mm, held with mmgrab() */
	struct xarray range_groups;
	u32 next_range_group;
};

struct nvstub_uvm_cmd {
	u32 cmd;
	u32 size;
	u32 status_off;
};

#define UVM_CMD(c, t) { c, sizeof(struct t), offsetof(struct t, rm_status) }

static const struct nvstub_uvm_cmd nvstub_uvm_cmds[] = {
	UVM_CMD(UVM_INITIALIZE, uvm_initialize_params),
	{ UVM_DEINITIALIZE, 0, 0 },
	UVM_CMD(UVM_CREATE_RANGE_GROUP, uvm_range_group_params),
	UVM_CMD(UVM_DESTROY_RANGE_GROUP, uvm_range_group_params),
	UVM_CMD(UVM_REGISTER_GPU_VASPACE, uvm_register_gpu_vaspace_params),
	UVM_CMD(UVM_REGISTER_CHANNEL, uvm_register_channel_params),
	UVM_CMD(UVM_MAP_EXTERNAL_ALLOCATION, uvm_map_external_allocation_params),
	UVM_CMD(UVM_FREE, uvm_range_params),
	UVM_CMD(UVM_REGISTER_GPU, uvm_register_gpu_params),
	UVM_CMD(UVM_PAGEABLE_MEM_ACCESS, uvm_pageable_mem_access_params),
	UVM_CMD(UVM_MAP_DYNAMIC_PARALLELISM_REGION,
		uvm_map_dynamic_parallelism_region_params),
	UVM_CMD(UVM_ALLOC_SEMAPHORE_POOL, uvm_alloc_semaphore_pool_params),
	UVM_CMD(UVM_VALIDATE_VA_RANGE, uvm_range_params),
	UVM_CMD(UVM_CREATE_EXTERNAL_RANGE, uvm_range_params),
	UVM_CMD(UVM_MM_INITIALIZE, uvm_mm_initialize_params),
};

const unsigned int nvstub_uvm_count = ARRAY_SIZE(nvstub_uvm_cmds);

u32 nvstub_uvm_cmd(unsigned int i)
{
	return nvstub_uvm_cmds[i].cmd;
}

static dev_t nvstub_uvm_devt;
static struct cdev nvstub_uvm_cdev;
static const struct file_operations nvstub_uvm_fops;

static int nvstub_uvm_open(struct inode *inode, struct file *filp)
{
	struct nvstub_uvm_file *uf = kzalloc(sizeof(*uf), GFP_KERNEL);

	if (!uf)
		return -ENOMEM;
	xa_init(&uf->range_groups);
	filp->private_data = uf;
	return 0;
}

static int nvstub_uvm_release(struct inode *inode, struct file *filp)
{
	struct nvstub_uvm_file *uf = filp->private_data;

	if (uf->mm)
		mmdrop(uf->mm);
	xa_destroy(&uf->range_groups);
	kfree(uf);
	return 0;
}

/*
 * An rmCtrlFd argument: an nvidiactl file of this driver (RM resolves it
 * with nv_get_file_private(fd, NV_TRUE, ...)) whose clients include hClient.
 */
static u32 nvstub_uvm_check_rm(int fd, u32 h_client, u32 h_object, u32 cls)
{
	struct nvstub_client *cl;
	struct nvstub_file *ctl;
	struct nvstub_obj *obj;
	struct file *f;
	u32 st;

	ctl = nvstub_get_file(fd, true, &f);
	if (!ctl)
		return NV_ERR_INVALID_ARGUMENT;
	mutex_lock(&nvstub_lock);
	cl = nvstub_client_validate(ctl, h_client, &st);
	if (cl && h_object) {
		obj = nvstub_obj_get(cl, h_object);
		if (!obj || (cls && obj->cls != cls))
			st = NV_ERR_INVALID_OBJECT_HANDLE;
	}
	mutex_unlock(&nvstub_lock);
	fput(f);
	return st;
}

static u32 nvstub_uvm_check_range(u64 base, u64 length)
{
	if (!length || !PAGE_ALIGNED(base) || !PAGE_ALIGNED(length) ||
	    base + length < base)
		return NV_ERR_INVALID_ADDRESS;
	return NV_OK;
}

static u32 nvstub_uvm_do(struct nvstub_uvm_file *uf, u32 cmd, void *p)
{
	switch (cmd) {
	case UVM_INITIALIZE: {
		struct uvm_initialize_params *ip = p;

		if (ip->flags & ~UVM_INIT_FLAGS_MASK)
			return NV_ERR_INVALID_ARGUMENT;
		if (uf->initialized && uf->flags != ip->flags)
			return NV_ERR_INVALID_ARGUMENT;
		if (uf->mm_initialized)		/* UVM_FD_MM: uvm.c uvm_api_initialize */
			return NV_ERR_INVALID_ARGUMENT;
		if (uf->initialized)
			return NV_OK;
		/*
		 * uvm_va_space.c uvm_va_space_create -> uvm_va_space_mm.c
		 * uvm_va_space_mm_register: the va_space is tied to the
		 * caller's mm unless it shares across processes
		 * (uvm_va_space_mm_enabled; uvm_enable_va_space_mm is 1).
		 */
		if (!(ip->flags & UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE) && current->mm) {
			uf->mm = current->mm;
			mmgrab(uf->mm);
		}
		uf->initialized = true;
		uf->flags = ip->flags;
		return NV_OK;
	}
	case UVM_MM_INITIALIZE: {
		struct uvm_mm_initialize_params *mp = p;
		struct nvstub_uvm_file *other;
		struct file *f = fget(mp->uvm_fd);
		u32 st = NV_OK;

		if (!f)
			return NV_ERR_INVALID_ARGUMENT;
		other = f->private_data;
		if (f->f_op != &nvstub_uvm_fops || !other->initialized)
			st = NV_ERR_INVALID_ARGUMENT;
		else if (uf->initialized || uf->mm_initialized)
			st = NV_ERR_INVALID_STATE;
		else
			uf->mm_initialized = true;
		fput(f);
		return st;
	}
	}
	/* uvm.c: every other command needs an initialized va_space */
	if (!uf->initialized)
		return NV_ERR_ILLEGAL_ACTION;
	switch (cmd) {
	case UVM_CREATE_RANGE_GROUP: {
		struct uvm_range_group_params *rp = p;
		u32 id = ++uf->next_range_group;

		if (xa_err(xa_store(&uf->range_groups, id, xa_mk_value(1), GFP_KERNEL)))
			return NV_ERR_NO_MEMORY;
		rp->range_group_id = id;
		return NV_OK;
	}
	case UVM_DESTROY_RANGE_GROUP: {
		struct uvm_range_group_params *rp = p;

		if (rp->range_group_id > U32_MAX ||
		    !xa_erase(&uf->range_groups, rp->range_group_id))
			return NV_ERR_OBJECT_NOT_FOUND;
		return NV_OK;
	}
	case UVM_REGISTER_GPU: {
		struct uvm_register_gpu_params *gp = p;

		gp->numa_enabled = 0;
		gp->numa_node_id = -1;
		return nvstub_uvm_check_rm(gp->rm_ctrl_fd, gp->h_client, 0, 0);
	}
	case UVM_REGISTER_GPU_VASPACE: {
		struct uvm_register_gpu_vaspace_params *vp = p;

		return nvstub_uvm_check_rm(vp->rm_ctrl_fd, vp->h_client,
					   vp->h_va_space, FERMI_VASPACE_A);
	}
	case UVM_REGISTER_CHANNEL: {
		struct uvm_register_channel_params *cp = p;

		return nvstub_uvm_check_rm(cp->rm_ctrl_fd, cp->h_client,
					   cp->h_channel, HOPPER_CHANNEL_GPFIFO_A);
	}
	case UVM_MAP_EXTERNAL_ALLOCATION: {
		struct uvm_map_external_allocation_params *ep = p;

		if (ep->gpu_attributes_count > UVM_MAX_GPUS)
			return NV_ERR_INVALID_ARGUMENT;
		if (nvstub_uvm_check_range(ep->base, ep->length))
			return NV_ERR_INVALID_ADDRESS;
		return nvstub_uvm_check_rm(ep->rm_ctrl_fd, ep->h_client,
					   ep->h_memory, 0);
	}
	case UVM_PAGEABLE_MEM_ACCESS: {
		struct uvm_pageable_mem_access_params *ap = p;

		ap->pageable_mem_access = 0;
		return NV_OK;
	}
	case UVM_ALLOC_SEMAPHORE_POOL: {
		struct uvm_alloc_semaphore_pool_params *sp = p;

		if (sp->gpu_attributes_count > UVM_MAX_GPUS)
			return NV_ERR_INVALID_ARGUMENT;
		return nvstub_uvm_check_range(sp->base, sp->length);
	}
	case UVM_MAP_DYNAMIC_PARALLELISM_REGION: {
		struct uvm_map_dynamic_parallelism_region_params *dp = p;

		return nvstub_uvm_check_range(dp->base, dp->length);
	}
	case UVM_FREE:
	case UVM_VALIDATE_VA_RANGE:
	case UVM_CREATE_EXTERNAL_RANGE: {
		struct uvm_range_params *rp = p;

		return nvstub_uvm_check_range(rp->base, rp->length);
	}
	}
	return NV_ERR_NOT_SUPPORTED;
}

static long nvstub_uvm_ioctl(struct file *filp, unsigned int cmd, unsigned long uarg)
{
	struct nvstub_uvm_file *uf = filp->private_data;
	void __user *uptr = (void __user *)uarg;
	const struct nvstub_uvm_cmd *c = NULL;
	unsigned int i;
	void *p;
	u32 st;

	for (i = 0; i < ARRAY_SIZE(nvstub_uvm_cmds); i++)
		if (nvstub_uvm_cmds[i].cmd == cmd)
			c = &nvstub_uvm_cmds[i];
	if (!c)
		return -EINVAL;
	if (cmd == UVM_DEINITIALIZE)
		return 0;
	p = kmalloc(c->size, GFP_KERNEL);
	if (!p)
		return -ENOMEM;
	if (copy_from_user(p, uptr, c->size)) {
		kfree(p);
		return -EFAULT;
	}
	st = nvstub_uvm_do(uf, cmd, p);
	memcpy(p + c->status_off, &st, sizeof(st));
	if (copy_to_user(uptr, p, c->size)) {
		kfree(p);
		return -EFAULT;
	}
	kfree(p);
	return 0;
}

/*
 * A managed range's CPU fault: a fresh zeroed page (uvm_vm_fault would
 * populate the range's CPU pages, zero-filled). The page belongs to the PTE
 * and goes when the range is unmapped; no GPU memory is involved.
 */
static vm_fault_t nvstub_uvm_fault(struct vm_fault *vmf)
{
	struct page *page = alloc_page(GFP_HIGHUSER | __GFP_ZERO);

	if (!page)
		return VM_FAULT_OOM;
	vmf->page = page;
	return 0;
}

static const struct vm_operations_struct nvstub_uvm_vm_ops_managed = {
	.fault = nvstub_uvm_fault,
};

/*
 * kernel-open/nvidia-uvm/uvm.c uvm_mmap(): the only way user space creates a
 * managed VA range (uvm_va_range.c uvm_va_range_create_mmap; cudaMallocManaged
 * on the non-HMM path). Its checks, in order: the file must hold a va_space
 * (UVM_INITIALIZE; an uninitialized or UVM_MM_INITIALIZE'd file: -EBADFD); a
 * va_space tied to an mm accepts only that mm (-EOPNOTSUPP); the offset must
 * equal the address (vm_start == vm_pgoff << PAGE_SHIFT, else -EINVAL); the
 * mapping must be MAP_SHARED, readable and writable (-EINVAL). Then
 * VM_MIXEDMAP | VM_DONTEXPAND | VM_DONTCOPY. Not modelled: the range tree
 * (no -EADDRINUSE for collisions with ranges made by ioctls), the PM lock,
 * GPU residency (see README).
 */
static int nvstub_uvm_mmap(struct file *filp, struct vm_area_struct *vma)
{
	struct nvstub_uvm_file *uf = filp->private_data;

	if (!uf->initialized)
		return -EBADFD;
	if (uf->mm && uf->mm != current->mm)
		return -EOPNOTSUPP;
	if (vma->vm_start != (vma->vm_pgoff << PAGE_SHIFT))
		return -EINVAL;
	if ((vma->vm_flags & (VM_SHARED | VM_READ | VM_WRITE)) !=
	    (VM_SHARED | VM_READ | VM_WRITE))
		return -EINVAL;
	vma->vm_flags |= VM_MIXEDMAP | VM_DONTEXPAND | VM_DONTCOPY;
	vma->vm_ops = &nvstub_uvm_vm_ops_managed;
	return 0;
}

static const struct file_operations nvstub_uvm_fops = {
	.owner = THIS_MODULE,
	.open = nvstub_uvm_open,
	.release = nvstub_uvm_release,
	.unlocked_ioctl = nvstub_uvm_ioctl,
	.compat_ioctl = nvstub_uvm_ioctl,
	.mmap = nvstub_uvm_mmap,
	.llseek = noop_llseek,
};

int nvstub_uvm_init(void)
{
	struct device *d;
	int ret;

	ret = alloc_chrdev_region(&nvstub_uvm_devt, 0, 1, "nvidia-uvm");
	if (ret)
		return ret;
	cdev_init(&nvstub_uvm_cdev, &nvstub_uvm_fops);
	nvstub_uvm_cdev.owner = THIS_MODULE;
	ret = cdev_add(&nvstub_uvm_cdev, nvstub_uvm_devt, 1);
	if (ret)
		goto err_region;
	d = device_create(nvstub_class, NULL, nvstub_uvm_devt, NULL, "nvidia-uvm");
	if (IS_ERR(d)) {
		ret = PTR_ERR(d);
		goto err_cdev;
	}
	return 0;

err_cdev:
	cdev_del(&nvstub_uvm_cdev);
err_region:
	unregister_chrdev_region(nvstub_uvm_devt, 1);
	return ret;
}

void nvstub_uvm_exit(void)
{
	device_destroy(nvstub_class, nvstub_uvm_devt);
	cdev_del(&nvstub_uvm_cdev);
	unregister_chrdev_region(nvstub_uvm_devt, 1);
}
