// SPDX-License-Identifier: GPL-2.0
/*
 * nvstub_mem.c - the video memory pool, CPU mappings and mmap of the nvstub
 * TEST DOUBLE.
 *
 * Each simulated GPU has a pool of fb_mib MiB that exists only as a counter:
 * video memory allocations are charged to it and refused with
 * NV_ERR_NO_MEMORY when it is exhausted. RM_MAP_MEMORY leaves a mapping
 * context on the file named by its fd, as nv-usermap.c
 * nv_add_mapping_context_to_file() does; mmap() of that file (offset 0, the
 * mapped length) then maps it. Every mapping is backed by the same few real
 * pages (NVSTUB_BACKING_PAGES), so contents are not preserved: enough for a
 * driver stand-in, never for data.
 */
#include <linux/file.h>
#include <linux/gfp.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/slab.h>

#include "nvstub.h"

#define NVSTUB_BACKING_PAGES	16
#define NVSTUB_MAP_ADDR_BASE	0x100000000000ULL	/* like a BAR1 address */

static u64 nvstub_pool_used[NVSTUB_MAX_GPUS];
static struct page *nvstub_backing[NVSTUB_BACKING_PAGES];
static u64 nvstub_next_map_addr = NVSTUB_MAP_ADDR_BASE;

u64 nvstub_mem_total(void)
{
	return (u64)nvstub_fb_mib << 20;
}

u64 nvstub_mem_free(unsigned int gpu)
{
	return nvstub_mem_total() - nvstub_pool_used[gpu];
}

u32 nvstub_mem_charge(unsigned int gpu, u64 size)
{
	if (size > nvstub_mem_free(gpu))
		return NV_ERR_NO_MEMORY;
	nvstub_pool_used[gpu] += size;
	return NV_OK;
}

/* /proc/nvstub/pool: one line per GPU, "gpu=N total=BYTES used=BYTES". */
void nvstub_mem_report(struct seq_file *m)
{
	int i;

	for (i = 0; i < nvstub_num_gpus; i++)
		seq_printf(m, "gpu=%d total=%llu used=%llu\n", i, nvstub_mem_total(),
			   nvstub_pool_used[i]);
}

void nvstub_mem_uncharge(unsigned int gpu, u64 size)
{
	if (WARN_ON(size > nvstub_pool_used[gpu]))
		size = nvstub_pool_used[gpu];
	nvstub_pool_used[gpu] -= size;
}

/* Memory that lives behind a GPU BAR: the context goes on an nvidiaN file. */
static bool nvstub_is_bar_memory(u32 cls)
{
	return cls == NV01_MEMORY_LOCAL_USER || cls == NV01_MEMORY_LOCAL_PHYSICAL ||
	       cls == HOPPER_USERMODE_A || cls == NV01_MEMORY_LOCAL_PRIVILEGED;
}

static u64 nvstub_map_limit(const struct nvstub_obj *mem)
{
	if (mem->mem_size)
		return mem->mem_size;
	return 1 << 20;	/* register windows and other small objects */
}

/*
 * RM_MAP_MEMORY of a channel maps its USERD (kernel_channel.c
 * kchannelMap_IMPL, 580): only RM's own (NV_ERR_INVALID_REQUEST when the
 * client allocated it), within userdLength (kfifoGetUserdSizeAlign_HAL:
 * NVSTUB_USERD_SIZE). It lives behind a BAR, so the context goes on the
 * channel's GPU node.
 */
static u32 nvstub_userd_map_check(struct nvstub_chan *chan, u64 offset, u64 length)
{
	u32 off;

	if (!nvstub_chan_userd(chan, &off))
		return NV_ERR_INVALID_REQUEST;
	if (offset >= NVSTUB_USERD_SIZE)
		return NV_ERR_INVALID_BASE;
	if (length == 0 || length > NVSTUB_USERD_SIZE - offset)
		return NV_ERR_INVALID_LIMIT;
	return NV_OK;
}

/* NV_ESC_RM_MAP_MEMORY (escape.c; osapi.c RmCreateMmapContextLocked). */
int nvstub_esc_map(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvos33_params_with_fd *pa = arg;
	struct nvos33_params *p = &pa->params;
	struct nvstub_client *cl;
	struct nvstub_obj *dev, *mem;
	struct nvstub_file *target;
	struct page *userd = NULL;
	u32 userd_off = 0;
	struct file *tfilp;
	bool bar;

	if (size != sizeof(*pa) || !nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, p->h_client, &p->status);
	if (!cl)
		return 0;
	if (cl->pid != task_tgid_nr(current)) {
		p->status = NV_ERR_INVALID_CLIENT;
		return 0;
	}
	dev = nvstub_obj_get(cl, p->h_device);
	mem = nvstub_obj_get(cl, p->h_memory);
	if (!dev || (dev->cls != NV01_DEVICE_0 && dev->cls != NV20_SUBDEVICE_0 &&
		     dev != &cl->root)) {
		p->status = NV_ERR_INVALID_OBJECT_HANDLE;
		return 0;
	}
	if (!mem || mem == &cl->root || mem->cls == NV01_DEVICE_0 ||
	    mem->cls == NV20_SUBDEVICE_0) {
		p->status = NV_ERR_INVALID_OBJECT_HANDLE;
		return 0;
	}
	if (mem->chan) {
		p->status = nvstub_userd_map_check(mem->chan, p->offset, p->length);
		if (p->status != NV_OK)
			return 0;
		userd = nvstub_chan_userd(mem->chan, &userd_off);
		bar = true;
	} else if (mem->cls == NV01_MEMORY_LOCAL_PRIVILEGED && !cl->admin) {
		/*
		 * rmapi/mapping_cpu.c memMap_IMPL, ADDR_REGMEM: register memory
		 * (BAR0) maps only for an administrator client
		 * (rmclientIsAdmin of the cached privilege)
		 */
		p->status = NV_ERR_PROTECTION_FAULT;
		return 0;
	} else if (p->length == 0 || p->offset > nvstub_map_limit(mem) ||
		   p->length > nvstub_map_limit(mem) - p->offset) {
		p->status = NV_ERR_INVALID_LIMIT;
		return 0;
	} else {
		bar = nvstub_is_bar_memory(mem->cls);
	}
	/* nv-usermap.c: nv_get_file_private(fd, NV_IS_CTL_DEVICE(nv), ...) */
	target = nvstub_get_file(pa->fd, !bar, &tfilp);
	if (!target) {
		p->status = NV_ERR_INVALID_ARGUMENT;
		return 0;
	}
	spin_lock(&target->map_lock);
	if (target->map_valid) {
		p->status = NV_ERR_STATE_IN_USE;
	} else if (bar && target->minor != mem->gpu) {
		p->status = NV_ERR_INVALID_ARGUMENT;
	} else {
		target->map_valid = true;
		target->map_vid = bar;
		target->map_userd = userd;
		/*
		 * The address RM returns keeps the in-page part of where the
		 * mapping starts (osMapPciMemoryAreaUser: aligned start plus
		 * the difference); user space adds it to what mmap() returns.
		 */
		target->map_size = PAGE_ALIGN(p->length + offset_in_page(userd_off + p->offset));
		p->p_linear_address = nvstub_next_map_addr + offset_in_page(userd_off + p->offset);
		nvstub_next_map_addr += target->map_size;
		p->status = NV_OK;
	}
	spin_unlock(&target->map_lock);
	fput(tfilp);
	return 0;
}

/* NV_ESC_RM_UNMAP_MEMORY (NVOS34). */
int nvstub_esc_unmap(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvos34_params *p = arg;
	struct nvstub_client *cl;

	if (size != sizeof(*p) || !nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, p->h_client, &p->status);
	if (!cl)
		return 0;
	if (!nvstub_obj_get(cl, p->h_device) || !nvstub_obj_get(cl, p->h_memory))
		p->status = NV_ERR_INVALID_OBJECT_HANDLE;
	return 0;
}

/* NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO (NVOS56). */
int nvstub_esc_update_mapping(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvos56_params *p = arg;
	struct nvstub_client *cl;

	if (size != sizeof(*p) || !nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, p->h_client, &p->status);
	if (!cl)
		return 0;
	if (!nvstub_obj_get(cl, p->h_device) || !nvstub_obj_get(cl, p->h_memory))
		p->status = NV_ERR_INVALID_OBJECT_HANDLE;
	return 0;
}

static vm_fault_t nvstub_vm_fault(struct vm_fault *vmf)
{
	struct page *page = nvstub_backing[vmf->pgoff % NVSTUB_BACKING_PAGES];

	get_page(page);
	vmf->page = page;
	return 0;
}

static const struct vm_operations_struct nvstub_vm_ops = {
	.fault = nvstub_vm_fault,
};

/* nv-mmap.c nvidia_mmap_helper(): needs a valid context, offset 0. */
int nvstub_mmap(struct file *filp, struct vm_area_struct *vma)
{
	static atomic_t count = ATOMIC_INIT(0);
	struct nvstub_file *nf = filp->private_data;
	struct page *userd = NULL;
	int ret = 0;

	nvstub_race_delay_entry();	/* TEST ONLY, nvstub_main.c */
	if (nvstub_should_fail(READ_ONCE(nvstub_fail_mmap_every), &count))
		return -ENOMEM;	/* TEST ONLY, nvstub_main.c */
	spin_lock(&nf->map_lock);
	if (!nf->map_valid || vma->vm_pgoff != 0)
		ret = -EINVAL;
	else if (nf->map_vid && vma->vm_end - vma->vm_start != nf->map_size)
		ret = -EINVAL;
	else
		userd = nf->map_userd;
	spin_unlock(&nf->map_lock);
	if (ret)
		return ret;
	vma->vm_flags |= VM_DONTEXPAND | VM_DONTDUMP;
	/*
	 * nv-mmap.c maps BAR memory at mmap() time, VM_IO | VM_PFNMAP
	 * (nv_io_remap_page_range): a USERD is there without a fault. The
	 * page outlives the mapping (nvstub_userd_exit()).
	 */
	if (userd)
		return remap_pfn_range(vma, vma->vm_start, page_to_pfn(userd), PAGE_SIZE,
				       vma->vm_page_prot);
	vma->vm_ops = &nvstub_vm_ops;
	return 0;
}

int nvstub_mem_init(void)
{
	int i;

	for (i = 0; i < NVSTUB_BACKING_PAGES; i++) {
		nvstub_backing[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!nvstub_backing[i])
			goto fail;
	}
	return 0;
fail:
	while (i--)
		__free_page(nvstub_backing[i]);
	return -ENOMEM;
}

void nvstub_mem_exit(void)
{
	int i;

	for (i = 0; i < NVSTUB_BACKING_PAGES; i++)
		__free_page(nvstub_backing[i]);
}
