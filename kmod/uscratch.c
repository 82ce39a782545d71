// SPDX-License-Identifier: GPL-2.0
/*
 * uscratch.c - gpuslice's own calls into the real driver.
 *
 * nvidia_ioctl() (kernel-open/nvidia/nv.c) copies its argument block from a
 * user address, and RM copies control parameters from the user address in
 * NVOS54_PARAMETERS.params. So a call gpuslice makes itself on a caller's
 * objects (SET_TIMESLICE on a caller's TSG) is staged in the caller's shadow
 * pages (shadow.c), which the caller cannot write; the version query at load
 * runs in insmod's context, in an anonymous page mapped for the call.
 * It must run in the context of the process that owns the RM client: RM ties
 * clients to the calling file and process (docs/h100-findings.md: SET_TIMESLICE on a
 * foreign client is refused with NV_ERR_INVALID_CLIENT).
 *
 * Another thread of the process can read the shadow page, not rewrite it.
 */
#include <linux/err.h>
#include <linux/mm.h>
#include <linux/mman.h>
#include <linux/sched.h>
#include <linux/uaccess.h>

#include "core.h"
#include "shadow.h"
#include "uscratch.h"

#define GS_SCRATCH_SIZE		PAGE_SIZE
#define GS_SCRATCH_PARAMS	64	/* params follow the 32-byte NVOS54 block */

static long gs_scratch_map(void)
{
	if (!current->mm)
		return -EINVAL;
	return (long)vm_mmap(NULL, 0, GS_SCRATCH_SIZE, PROT_READ | PROT_WRITE,
			     MAP_PRIVATE | MAP_ANONYMOUS, 0);
}

static long gs_real_ioctl(struct file *real, unsigned int cmd, unsigned long arg)
{
	if (!real->f_op->unlocked_ioctl)
		return -ENOTTY;
	return real->f_op->unlocked_ioctl(real, cmd, arg);
}

int gs_scratch_control(struct file *real, u32 h_client, u32 h_object, u32 cmd,
		       void *params, u32 params_size, u32 *status)
{
	struct nvos54_params p = {
		.h_client = h_client,
		.h_object = h_object,
		.cmd = cmd,
		.params_size = params_size,
	};
	struct gs_shadow_slot slot;
	long ret;

	if (params_size > PAGE_SIZE - GS_SCRATCH_PARAMS)
		return -EINVAL;
	ret = gs_shadow_get(&slot, GS_SCRATCH_PARAMS + params_size);
	if (ret)
		return ret;
	p.params = slot.uaddr + GS_SCRATCH_PARAMS;
	memcpy(slot.kaddr, &p, sizeof(p));
	memcpy(slot.kaddr + GS_SCRATCH_PARAMS, params, params_size);
	ret = gs_real_ioctl(real, _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_CONTROL, struct nvos54_params),
			    slot.uaddr);
	memcpy(&p, slot.kaddr, sizeof(p));
	memcpy(params, slot.kaddr + GS_SCRATCH_PARAMS, params_size);
	if (gs_shadow_put(&slot) && !ret)
		ret = -EFAULT;
	if (!ret)
		*status = p.status;
	return ret;
}

int gs_scratch_card_info(struct file *real, struct nv_ioctl_card_info *ci)
{
	const size_t size = sizeof(*ci) * NV_MAX_DEVICES;
	unsigned long uaddr;
	long ret;

	BUILD_BUG_ON(sizeof(*ci) * NV_MAX_DEVICES != 2304 || 2304 > GS_SCRATCH_SIZE);
	ret = gs_scratch_map();
	if (IS_ERR_VALUE(ret))
		return ret;
	uaddr = ret;
	ret = gs_real_ioctl(real, _IOC(_IOC_READ | _IOC_WRITE, NV_IOCTL_MAGIC, NV_ESC_CARD_INFO, size),
			    uaddr);
	if (!ret && copy_from_user(ci, (void __user *)uaddr, size))
		ret = -EFAULT;
	vm_munmap(uaddr, GS_SCRATCH_SIZE);
	return ret;
}

int gs_scratch_query_version(struct file *real, char *out, size_t len)
{
	struct nv_ioctl_rm_api_version v = { .cmd = NV_RM_API_VERSION_CMD_QUERY };
	unsigned long uaddr;
	long ret;

	ret = gs_scratch_map();
	if (IS_ERR_VALUE(ret))
		return ret;
	uaddr = ret;
	ret = -EFAULT;
	if (copy_to_user((void __user *)uaddr, &v, sizeof(v)))
		goto out;
	ret = gs_real_ioctl(real, _IOWR(NV_IOCTL_MAGIC, NV_ESC_CHECK_VERSION_STR,
					struct nv_ioctl_rm_api_version), uaddr);
	if (ret)
		goto out;
	ret = -EFAULT;
	if (copy_from_user(&v, (void __user *)uaddr, sizeof(v)))
		goto out;
	ret = -EPROTO;
	if (v.reply != NV_RM_API_VERSION_REPLY_RECOGNIZED)
		goto out;
	v.version_string[sizeof(v.version_string) - 1] = '\0';
	strscpy(out, v.version_string, len);
	ret = 0;
out:
	vm_munmap(uaddr, GS_SCRATCH_SIZE);
	return ret;
}
