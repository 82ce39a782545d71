// SPDX-License-Identifier: GPL-2.0
/*
 * nvstub_uvm.c - /dev/nvidia-uvm of the nvstub TEST DOUBLE.
 *
 * Answers the UVM commands CUDA issues at start-up (see the traces) with the
 * checks of kernel-open/nvidia-uvm/uvm.c that matter to an interposer: the
 * file must be initialized (UVM_INITIALIZE) first, and the fd arguments the
 * stand-in checks (rmCtrlFd of the GPU, GPU VA space and channel
 * registrations: an nvidiactl file; uvmFd: an nvidia-uvm file) are resolved
 * with fget() and checked to be files of this driver. mmap() creates a
 * "managed" mapping with uvm_mmap()'s checks, backed by zeroed pages of
 * system memory (nvstub_uvm_mmap()).
 *
 * The VA space (580 uvm_va_space.c) is modelled as far as external
 * allocations need it:
 *  - the GPUs registered in it (UVM_REGISTER_GPU) and those with a GPU VA
 *    space (UVM_REGISTER_GPU_VASPACE), by the stand-in's GPU UUIDs;
 *  - its external VA ranges (UVM_CREATE_EXTERNAL_RANGE, UVM_FREE) and, per
 *    GPU, the mappings in them (UVM_MAP_EXTERNAL_ALLOCATION,
 *    UVM_UNMAP_EXTERNAL), each holding UVM's RM duplicate of the memory
 *    (nvstub_rm_uvm_dup_memory()): video memory stays in the pool while a
 *    mapping holds it, after every RM handle of it is freed, until UVM_FREE,
 *    UVM_UNMAP_EXTERNAL, a later map over it or the release of the file.
 * Other range kinds (semaphore pools, dynamic-parallelism regions, channel
 * ranges, managed ranges made by mmap) are not tracked: they neither collide
 * with external ranges nor are found by UVM_FREE.
 *
 * Locking: each file has a mutex (va_space->lock and its range trees'
 * locks). Commands run under it, after their params were copied in and
 * before they are copied out; nvstub_lock is taken under it, only to reach
 * RM (lock order: file mutex, then nvstub_lock). Allocations happen under
 * the file's mutex, as UVM allocates under its va_space lock, never under
 * nvstub_lock.
 */
#include <linux/bitops.h>
#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/list.h>
#include <linux/mm.h>
#include <linux/mutex.h>
#include <linux/sched/mm.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/xarray.h>

#include "nvstub.h"

/*
 * At most this many external ranges and mappings (pieces included) per file:
 * a bound of the TEST DOUBLE on kernel memory a caller can pin, answered
 * NV_ERR_NO_MEMORY as UVM answers a failed allocation.
 */
#define NVSTUB_UVM_MAX_OBJS	65536

struct nvstub_uvm_file {
	struct mutex lock;		/* va_space->lock */
	bool initialized;		/* UVM_FD_VA_SPACE */
	bool mm_initialized;		/* UVM_FD_MM */
	u64 flags;
	struct mm_struct *mm;		/* va_space_mm.mm, held with mmgrab() */
	struct xarray range_groups;
	u32 next_range_group;
	unsigned long registered_gpus;	/* va_space->registered_gpus, by GPU index */
	unsigned long gpu_va_spaces;	/* va_space->registered_gpu_va_spaces */
	struct list_head ranges;	/* external ranges, by address */
	unsigned int nr_objs;		/* ranges + mappings, <= NVSTUB_UVM_MAX_OBJS */
};

/* uvm_va_range_external_t */
struct nvstub_uvm_range {
	struct list_head node;		/* on nvstub_uvm_file.ranges */
	u64 start, end;			/* inclusive, as uvm_range_tree_node_t */
	/* gpu_ranges[]: each GPU's mappings, by address */
	struct list_head maps[NVSTUB_MAX_GPUS];
};

/*
 * uvm_ext_gpu_mem_handle: UVM's RM duplicate of the memory, shared by the
 * pieces a mapping is split into (uvm_ext_gpu_map_split: nv_kref_get) and
 * freed with the last one (uvm_release_rm_handle).
 */
struct nvstub_uvm_dup {
	unsigned int refs;		/* ref_count, under the file's mutex */
	struct nvstub_memdesc *md;	/* held; NULL: not duplicated yet, or system memory */
};

/* uvm_ext_gpu_map_t: [start, end] of an external range mapped on one GPU */
struct nvstub_uvm_map {
	struct list_head node;		/* on nvstub_uvm_range.maps[gpu] */
	u64 start, end;
	u64 page_size;			/* pt_range_vec.page_size (0 until mapped) */
	struct nvstub_uvm_dup *dup;
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
	UVM_CMD(UVM_UNMAP_EXTERNAL, uvm_unmap_external_params),
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
	mutex_init(&uf->lock);
	xa_init(&uf->range_groups);
	INIT_LIST_HEAD(&uf->ranges);
	filp->private_data = uf;
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

/* ---- external ranges and their mappings (uvm_map_external.c) ---- */

static struct nvstub_uvm_range *nvstub_uvm_range_find(struct nvstub_uvm_file *uf, u64 addr)
{
	struct nvstub_uvm_range *r;

	list_for_each_entry(r, &uf->ranges, node) {
		if (r->start > addr)
			break;
		if (r->end >= addr)
			return r;
	}
	return NULL;
}

/* The first range that overlaps [start, end], or NULL. */
static struct nvstub_uvm_range *nvstub_uvm_range_overlap(struct nvstub_uvm_file *uf,
							 u64 start, u64 end)
{
	struct nvstub_uvm_range *r;

	list_for_each_entry(r, &uf->ranges, node) {
		if (r->start > end)
			break;
		if (r->end >= start)
			return r;
	}
	return NULL;
}

/* uvm_release_rm_handle via nv_kref_put: the last piece lets the duplicate go. */
static void nvstub_uvm_dup_put(struct nvstub_uvm_dup *dup)
{
	if (--dup->refs)
		return;
	nvstub_rm_uvm_free_dup(dup->md);
	kfree(dup);
}

/* uvm_ext_gpu_map_destroy */
static void nvstub_uvm_map_destroy(struct nvstub_uvm_file *uf, struct nvstub_uvm_map *m)
{
	list_del(&m->node);
	nvstub_uvm_dup_put(m->dup);
	kfree(m);
	uf->nr_objs--;
}

/* The first mapping of @head that overlaps [start, end] (uvm_ext_gpu_map_iter_first). */
static struct nvstub_uvm_map *nvstub_uvm_map_first(struct list_head *head, u64 start, u64 end)
{
	struct nvstub_uvm_map *m;

	list_for_each_entry(m, head, node) {
		if (m->start > end)
			break;
		if (m->end >= start)
			return m;
	}
	return NULL;
}

/* The mapping after @m if it starts at or before @end (uvm_ext_gpu_map_iter_next). */
static struct nvstub_uvm_map *nvstub_uvm_map_next(struct list_head *head,
						  struct nvstub_uvm_map *m, u64 end)
{
	if (list_is_last(&m->node, head))
		return NULL;
	m = list_next_entry(m, node);
	return m->start <= end ? m : NULL;
}

/*
 * uvm_ext_gpu_map_split: @m becomes [start, new_end] and a new piece
 * [new_end + 1, end] follows it, sharing its duplicate. The cut must be
 * aligned to the page size @m was mapped with (NV_ERR_INVALID_ADDRESS).
 */
static u32 nvstub_uvm_map_split(struct nvstub_uvm_file *uf, struct nvstub_uvm_map *m,
				u64 new_end, struct nvstub_uvm_map **out)
{
	struct nvstub_uvm_map *n;

	if (!IS_ALIGNED(new_end + 1, m->page_size))
		return NV_ERR_INVALID_ADDRESS;
	if (uf->nr_objs >= NVSTUB_UVM_MAX_OBJS)
		return NV_ERR_NO_MEMORY;
	n = kzalloc(sizeof(*n), GFP_KERNEL);
	if (!n)
		return NV_ERR_NO_MEMORY;
	n->start = new_end + 1;
	n->end = m->end;
	n->page_size = m->page_size;
	n->dup = m->dup;
	n->dup->refs++;
	m->end = new_end;
	list_add(&n->node, &m->node);
	uf->nr_objs++;
	if (out)
		*out = n;
	return NV_OK;
}

/*
 * uvm_unmap_external_in_range: every mapping of @gpu in @r that overlaps
 * [start, end] goes; one that sticks out is split first and only its piece
 * inside goes. A failed split stops the walk; what went stays gone.
 */
static u32 nvstub_uvm_unmap_in_range(struct nvstub_uvm_file *uf, struct nvstub_uvm_range *r,
				     unsigned int gpu, u64 start, u64 end)
{
	struct list_head *head = &r->maps[gpu];
	struct nvstub_uvm_map *m, *next = NULL;
	u32 st;

	m = nvstub_uvm_map_first(head, start, end);
	while (m) {
		if (start > m->start) {
			st = nvstub_uvm_map_split(uf, m, start - 1, &next);
			if (st != NV_OK)
				return st;
		} else {
			if (end < m->end) {
				st = nvstub_uvm_map_split(uf, m, end, NULL);
				if (st != NV_OK)
					return st;
				next = NULL;
			} else {
				next = nvstub_uvm_map_next(head, m, end);
			}
			nvstub_uvm_map_destroy(uf, m);
		}
		m = next;
	}
	return NV_OK;
}

/* Every mapping of every GPU in @r, then @r (uvm_va_range_destroy_external). */
static void nvstub_uvm_range_destroy(struct nvstub_uvm_file *uf, struct nvstub_uvm_range *r)
{
	struct nvstub_uvm_map *m, *tmp;
	unsigned int gpu;

	for (gpu = 0; gpu < NVSTUB_MAX_GPUS; gpu++)
		list_for_each_entry_safe(m, tmp, &r->maps[gpu], node)
			nvstub_uvm_map_destroy(uf, m);
	list_del(&r->node);
	kfree(r);
	uf->nr_objs--;
}

/* uvm_api.h uvm_api_range_invalid_4k */
static bool nvstub_uvm_range_invalid_4k(u64 base, u64 length)
{
	return !IS_ALIGNED(base, SZ_4K) || !IS_ALIGNED(length, SZ_4K) || !base || !length ||
	       base + length < base;
}

/*
 * The GPU of @uuid among those registered in the VA space, with a GPU VA
 * space if @va_space (uvm_va_space_get_gpu_by_uuid[_with_gpu_va_space]);
 * -1 if none.
 */
static int nvstub_uvm_gpu(struct nvstub_uvm_file *uf, const struct nv_processor_uuid *uuid,
			  bool va_space)
{
	int gpu = nvstub_gpu_by_uuid(uuid->uuid);

	if (gpu < 0 || !test_bit(gpu, &uf->registered_gpus))
		return -1;
	if (va_space && !test_bit(gpu, &uf->gpu_va_spaces))
		return -1;
	return gpu;
}

/*
 * UVM_CREATE_EXTERNAL_RANGE (uvm_map_external.c uvm_create_external_range ->
 * uvm_va_range.c uvm_va_range_create_external): a 4K-aligned range
 * (NV_ERR_INVALID_ADDRESS) that overlaps no other range of the VA space
 * (uvm_range_tree.c uvm_range_tree_add: NV_ERR_UVM_ADDRESS_IN_USE).
 */
static u32 nvstub_uvm_create_external_range(struct nvstub_uvm_file *uf,
					    struct uvm_range_params *rp)
{
	struct nvstub_uvm_range *r, *pos;
	u64 end = rp->base + rp->length - 1;
	unsigned int gpu;

	if (nvstub_uvm_range_invalid_4k(rp->base, rp->length))
		return NV_ERR_INVALID_ADDRESS;
	if (uf->nr_objs >= NVSTUB_UVM_MAX_OBJS)
		return NV_ERR_NO_MEMORY;
	if (nvstub_uvm_range_overlap(uf, rp->base, end))
		return NV_ERR_UVM_ADDRESS_IN_USE;
	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return NV_ERR_NO_MEMORY;
	r->start = rp->base;
	r->end = end;
	for (gpu = 0; gpu < NVSTUB_MAX_GPUS; gpu++)
		INIT_LIST_HEAD(&r->maps[gpu]);
	list_for_each_entry(pos, &uf->ranges, node)
		if (pos->start > end)
			break;
	list_add_tail(&r->node, &pos->node);
	uf->nr_objs++;
	return NV_OK;
}

/* kernel-open/common/inc/nv_uvm_user_types.h: the ...Count of each enum */
#define NVSTUB_UVM_MAPPING_TYPES	4	/* Default, ReadWriteAtomic, ReadWrite, ReadOnly */
#define NVSTUB_UVM_CACHING_TYPES	3	/* Default, ForceUncached, ForceCached */
#define NVSTUB_UVM_FORMAT_TYPES		2	/* Default, BlockLinear */
#define NVSTUB_UVM_ELEMENT_BITS		7	/* Default, 8, 16, -, 32, 64, 128 */
#define NVSTUB_UVM_ELEMENT_BITS_24	3	/* no such value: CUDA has no 24-bit elements */
#define NVSTUB_UVM_COMPRESSION_TYPES	2	/* Default, EnabledNoPlc */

/*
 * uvm_map_external.c uvm_api_mapping_type_invalid, uvm_api_caching_type_invalid,
 * uvm_api_kind_type_invalid: known values, and format and element bits
 * either both default or both set.
 */
static bool nvstub_uvm_attrs_invalid(const struct uvm_gpu_mapping_attributes *a)
{
	if (a->gpu_mapping_type >= NVSTUB_UVM_MAPPING_TYPES ||
	    a->gpu_caching_type >= NVSTUB_UVM_CACHING_TYPES ||
	    a->gpu_compression_type >= NVSTUB_UVM_COMPRESSION_TYPES ||
	    a->gpu_format_type >= NVSTUB_UVM_FORMAT_TYPES ||
	    a->gpu_element_bits >= NVSTUB_UVM_ELEMENT_BITS ||
	    a->gpu_element_bits == NVSTUB_UVM_ELEMENT_BITS_24)
		return true;
	return !a->gpu_format_type != !a->gpu_element_bits;
}

/*
 * uvm_gpu.c uvm_gpu_can_address on a GH100 (57-bit GPU VA, used as is on
 * x86: the canonical lower half below 2^56 or the upper half from -2^56).
 */
static bool nvstub_uvm_gpu_can_address(u64 base, u64 length)
{
	u64 end = base + length - 1;

	return end < BIT_ULL(56) || base >= ~(BIT_ULL(56) - 1);
}

/*
 * uvm_mmu_biggest_page_size_up_to on a GH100 page tree: 512M, 2M, 64K or 4K
 * (uvm_ampere_mmu.c page_sizes_ampere, kept by uvm_hopper_mmu.c), 0 if
 * none fits. The GPU's max_vidmem_page_size (NV2080_CTRL_CMD_GPU_GET_MAX_
 * SUPPORTED_PAGE_SIZE: 512M on bare-metal GH100) clips nothing below that.
 */
static u64 nvstub_uvm_page_size_up_to(u64 max)
{
	static const u64 sizes[] = { SZ_512M, SZ_2M, SZ_64K, SZ_4K };
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(sizes); i++)
		if (sizes[i] <= max)
			return sizes[i];
	return 0;
}

/*
 * The part of uvm_map_external_allocation_on_gpu after the duplicate: where
 * the memory lives (set_ext_gpu_map_location: its GPU must be registered in
 * the VA space, and video memory of another GPU needs peer access, which no
 * command of the stand-in enables: NV_ERR_INVALID_DEVICE), the page size
 * (the largest GPU page size no larger than the lowest set bit of the
 * memory's page size, base, length and offset: NV_ERR_INVALID_ADDRESS if
 * none) and the window (uvm_va_range_map_rm_allocation: offset + length
 * within the memory, NV_ERR_INVALID_OFFSET).
 */
static u32 nvstub_uvm_map_check(struct nvstub_uvm_file *uf, unsigned int gpu,
				const struct nvstub_uvm_mem_info *info,
				const struct uvm_map_external_allocation_params *ep, u64 *page_size)
{
	u64 a = info->page_size | ep->base | ep->length | ep->offset;

	if (!test_bit(info->gpu, &uf->registered_gpus))
		return NV_ERR_INVALID_DEVICE;
	if (!info->sysmem && info->gpu != gpu)
		return NV_ERR_INVALID_DEVICE;
	*page_size = nvstub_uvm_page_size_up_to(a & ~(a - 1));
	if (!*page_size)
		return NV_ERR_INVALID_ADDRESS;
	if (ep->offset > info->size || ep->length > info->size - ep->offset)
		return NV_ERR_INVALID_OFFSET;
	return NV_OK;
}

/*
 * uvm_map_external_allocation_on_gpu: what the GPU had mapped over
 * [base, end] goes first (and stays gone if the rest fails); then a new
 * mapping holding UVM's duplicate of the memory. On failure the new
 * mapping, and the duplicate if made, go again.
 */
static u32 nvstub_uvm_map_on_gpu(struct nvstub_uvm_file *uf, struct nvstub_uvm_range *r,
				 unsigned int gpu,
				 const struct uvm_map_external_allocation_params *ep)
{
	struct nvstub_uvm_mem_info info;
	struct nvstub_uvm_map *m, *pos;
	u64 end = ep->base + ep->length - 1;
	u32 st;

	if (!nvstub_uvm_gpu_can_address(ep->base, ep->length))
		return NV_ERR_OUT_OF_RANGE;
	st = nvstub_uvm_unmap_in_range(uf, r, gpu, ep->base, end);
	if (st != NV_OK)
		return st;
	if (uf->nr_objs >= NVSTUB_UVM_MAX_OBJS)
		return NV_ERR_NO_MEMORY;
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return NV_ERR_NO_MEMORY;
	m->dup = kzalloc(sizeof(*m->dup), GFP_KERNEL);
	if (!m->dup) {
		kfree(m);
		return NV_ERR_NO_MEMORY;
	}
	m->start = ep->base;
	m->end = end;
	m->dup->refs = 1;
	list_for_each_entry(pos, &r->maps[gpu], node)
		if (pos->start > end)
			break;
	list_add_tail(&m->node, &pos->node);
	uf->nr_objs++;

	st = nvstub_rm_uvm_dup_memory(ep->h_client, ep->h_memory, &info);
	if (st != NV_OK)
		goto err;
	m->dup->md = info.md;
	st = nvstub_uvm_map_check(uf, gpu, &info, ep, &m->page_size);
	if (st != NV_OK)
		goto err;
	return NV_OK;

err:
	nvstub_uvm_map_destroy(uf, m);
	return st;
}

/*
 * UVM_MAP_EXTERNAL_ALLOCATION (uvm_map_external.c uvm_map_external_allocation):
 * [base, base + length) 4K-aligned (NV_ERR_INVALID_ADDRESS), 1..UVM_MAX_GPUS
 * GPU attributes (NV_ERR_INVALID_ARGUMENT), inside one external range
 * (NV_ERR_INVALID_ADDRESS). Then, GPU by GPU in the caller's order: valid
 * attributes (NV_ERR_INVALID_ARGUMENT), a GPU registered with a GPU VA space
 * (NV_ERR_INVALID_DEVICE), and its mapping (nvstub_uvm_map_on_gpu). When one
 * fails, the mappings this call made on the GPUs before it go again.
 * rmCtrlFd is not looked at: UVM only stores it (see the TODOs in
 * uvm_va_space.c and uvm_user_channel.c); hClient is resolved by RM in any
 * file.
 */
static u32 nvstub_uvm_map_external(struct nvstub_uvm_file *uf,
				   struct uvm_map_external_allocation_params *ep)
{
	const struct uvm_gpu_mapping_attributes *a;
	struct nvstub_uvm_map *m, *tmp;
	struct nvstub_uvm_range *r;
	unsigned long mapped = 0;
	unsigned int gpu;
	u64 end, i;
	u32 st;
	int g;

	if (nvstub_uvm_range_invalid_4k(ep->base, ep->length))
		return NV_ERR_INVALID_ADDRESS;
	if (!ep->gpu_attributes_count || ep->gpu_attributes_count > nvstub_abi->uvm_gpus)
		return NV_ERR_INVALID_ARGUMENT;
	end = ep->base + ep->length - 1;
	r = nvstub_uvm_range_find(uf, ep->base);
	if (!r || r->end < end)
		return NV_ERR_INVALID_ADDRESS;
	for (i = 0; i < ep->gpu_attributes_count; i++) {
		a = &ep->per_gpu_attributes[i];
		if (nvstub_uvm_attrs_invalid(a)) {
			st = NV_ERR_INVALID_ARGUMENT;
			goto err;
		}
		g = nvstub_uvm_gpu(uf, &a->gpu_uuid, true);
		if (g < 0) {
			st = NV_ERR_INVALID_DEVICE;
			goto err;
		}
		st = nvstub_uvm_map_on_gpu(uf, r, g, ep);
		if (st != NV_OK)
			goto err;
		__set_bit(g, &mapped);
	}
	return NV_OK;

err:
	for_each_set_bit(gpu, &mapped, NVSTUB_MAX_GPUS)
		list_for_each_entry_safe(m, tmp, &r->maps[gpu], node)
			if (m->start <= end && m->end >= ep->base)
				nvstub_uvm_map_destroy(uf, m);
	return st;
}

/*
 * UVM_UNMAP_EXTERNAL (uvm_map_external.c uvm_unmap_external): 4K-aligned
 * (NV_ERR_INVALID_ADDRESS), inside one external range
 * (NV_ERR_INVALID_ADDRESS), a GPU registered in the VA space
 * (NV_ERR_INVALID_DEVICE); then that GPU's mappings over the range go, split
 * where they stick out (nvstub_uvm_unmap_in_range).
 */
static u32 nvstub_uvm_unmap_external(struct nvstub_uvm_file *uf,
				     struct uvm_unmap_external_params *up)
{
	struct nvstub_uvm_range *r;
	u64 end;
	int gpu;

	if (nvstub_uvm_range_invalid_4k(up->base, up->length))
		return NV_ERR_INVALID_ADDRESS;
	end = up->base + up->length - 1;
	r = nvstub_uvm_range_find(uf, up->base);
	if (!r || end > r->end)
		return NV_ERR_INVALID_ADDRESS;
	gpu = nvstub_uvm_gpu(uf, &up->gpu_uuid, false);
	if (gpu < 0)
		return NV_ERR_INVALID_DEVICE;
	return nvstub_uvm_unmap_in_range(uf, r, gpu, up->base, end);
}

/*
 * UVM_FREE (uvm_va_range.c uvm_free): 4K-aligned (NV_ERR_INVALID_ADDRESS);
 * the range holding base must start at base and end at base + length - 1
 * (NV_ERR_INVALID_ADDRESS); an external range goes with all its mappings.
 * The stand-in tracks no other kind of range (semaphore pools,
 * dynamic-parallelism regions, ...): a FREE that meets no external range is
 * taken to free one of those and answers NV_OK, as before. One that overlaps
 * an external range without being it is refused, as the real driver refuses
 * it whatever holds base (ranges do not overlap).
 */
static u32 nvstub_uvm_free(struct nvstub_uvm_file *uf, struct uvm_range_params *rp)
{
	struct nvstub_uvm_range *r;
	u64 end;

	if (nvstub_uvm_range_invalid_4k(rp->base, rp->length))
		return NV_ERR_INVALID_ADDRESS;
	end = rp->base + rp->length - 1;
	r = nvstub_uvm_range_overlap(uf, rp->base, end);
	if (!r)
		return NV_OK;
	if (r->start != rp->base || r->end != end)
		return NV_ERR_INVALID_ADDRESS;
	nvstub_uvm_range_destroy(uf, r);
	return NV_OK;
}

/*
 * UVM_REGISTER_GPU (uvm_va_space.c uvm_va_space_register_gpu): the UUID
 * must be a GPU of the driver (uvm_gpu.c gpu_retain_by_uuid_locked ->
 * nvUvmInterfaceRegisterGpu: NV_ERR_GPU_UUID_NOT_FOUND), not yet registered
 * in this VA space (NV_ERR_INVALID_DEVICE). The stand-in also checks
 * rmCtrlFd/hClient (nvstub_uvm_check_rm), between the two.
 */
static u32 nvstub_uvm_register_gpu(struct nvstub_uvm_file *uf, struct uvm_register_gpu_params *gp)
{
	int gpu = nvstub_gpu_by_uuid(gp->gpu_uuid.uuid);
	u32 st;

	gp->numa_enabled = 0;
	gp->numa_node_id = -1;
	if (gpu < 0)
		return NV_ERR_GPU_UUID_NOT_FOUND;
	st = nvstub_uvm_check_rm(gp->rm_ctrl_fd, gp->h_client, 0, 0);
	if (st != NV_OK)
		return st;
	if (test_bit(gpu, &uf->registered_gpus))
		return NV_ERR_INVALID_DEVICE;
	__set_bit(gpu, &uf->registered_gpus);
	return NV_OK;
}

/*
 * UVM_REGISTER_GPU_VASPACE (uvm_va_space.c uvm_va_space_register_gpu_va_space):
 * the GPU must be registered in the VA space (NV_ERR_INVALID_DEVICE), the
 * RM VA space valid (nvstub_uvm_check_rm), the GPU without a GPU VA space
 * yet (check_gpu_va_space: NV_ERR_INVALID_DEVICE).
 */
static u32 nvstub_uvm_register_gpu_va_space(struct nvstub_uvm_file *uf,
					    struct uvm_register_gpu_vaspace_params *vp)
{
	int gpu = nvstub_uvm_gpu(uf, &vp->gpu_uuid, false);
	u32 st;

	if (gpu < 0)
		return NV_ERR_INVALID_DEVICE;
	st = nvstub_uvm_check_rm(vp->rm_ctrl_fd, vp->h_client, vp->h_va_space, FERMI_VASPACE_A);
	if (st != NV_OK)
		return st;
	if (test_bit(gpu, &uf->gpu_va_spaces))
		return NV_ERR_INVALID_DEVICE;
	__set_bit(gpu, &uf->gpu_va_spaces);
	return NV_OK;
}

/*
 * uvm_va_space_destroy, when the file goes: every range and mapping, and so
 * every duplicate UVM holds. munmap and UVM_DEINITIALIZE let nothing go.
 */
static int nvstub_uvm_release(struct inode *inode, struct file *filp)
{
	struct nvstub_uvm_file *uf = filp->private_data;
	struct nvstub_uvm_range *r, *tmp;

	list_for_each_entry_safe(r, tmp, &uf->ranges, node)
		nvstub_uvm_range_destroy(uf, r);
	WARN_ON(uf->nr_objs);
	if (uf->mm)
		mmdrop(uf->mm);
	xa_destroy(&uf->range_groups);
	mutex_destroy(&uf->lock);
	kfree(uf);
	return 0;
}

/* Called with uf->lock held. */
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
		if (f->f_op != &nvstub_uvm_fops || !READ_ONCE(other->initialized))
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
	case UVM_REGISTER_GPU:
		return nvstub_uvm_register_gpu(uf, p);
	case UVM_REGISTER_GPU_VASPACE:
		return nvstub_uvm_register_gpu_va_space(uf, p);
	case UVM_REGISTER_CHANNEL: {
		struct uvm_register_channel_params *cp = p;

		return nvstub_uvm_check_rm(cp->rm_ctrl_fd, cp->h_client,
					   cp->h_channel, HOPPER_CHANNEL_GPFIFO_A);
	}
	case UVM_MAP_EXTERNAL_ALLOCATION:
		return nvstub_uvm_map_external(uf, p);
	case UVM_UNMAP_EXTERNAL:
		return nvstub_uvm_unmap_external(uf, p);
	case UVM_FREE:
		return nvstub_uvm_free(uf, p);
	case UVM_CREATE_EXTERNAL_RANGE:
		return nvstub_uvm_create_external_range(uf, p);
	case UVM_PAGEABLE_MEM_ACCESS: {
		struct uvm_pageable_mem_access_params *ap = p;

		ap->pageable_mem_access = 0;
		return NV_OK;
	}
	case UVM_ALLOC_SEMAPHORE_POOL: {
		struct uvm_alloc_semaphore_pool_params *sp = p;

		if (sp->gpu_attributes_count > nvstub_abi->uvm_gpus)
			return NV_ERR_INVALID_ARGUMENT;
		return nvstub_uvm_check_range(sp->base, sp->length);
	}
	case UVM_MAP_DYNAMIC_PARALLELISM_REGION: {
		struct uvm_map_dynamic_parallelism_region_params *dp = p;

		return nvstub_uvm_check_range(dp->base, dp->length);
	}
	case UVM_VALIDATE_VA_RANGE: {
		struct uvm_range_params *rp = p;

		return nvstub_uvm_check_range(rp->base, rp->length);
	}
	}
	return NV_ERR_NOT_SUPPORTED;
}

/*
 * Moves n bytes at from to to within a block of the newest layout, zeroing what
 * the move leaves behind of the per-GPU array (GPUs past the release's count).
 */
static void nvstub_uvm_move_tail(void *p, u32 to, u32 from, u32 n)
{
	if (to == from)
		return;
	memmove(p + to, p + from, n);
	if (from < to)
		memset(p + from, 0, to - from);
}

static long nvstub_uvm_ioctl(struct file *filp, unsigned int cmd, unsigned long uarg)
{
	struct nvstub_uvm_file *uf = filp->private_data;
	void __user *uptr = (void __user *)uarg;
	const struct nvstub_uvm_cmd *c = NULL;
	u32 st, size, tail, ntail = 0, at = 0;
	unsigned int i;
	void *p;

	for (i = 0; i < ARRAY_SIZE(nvstub_uvm_cmds); i++)
		if (nvstub_uvm_cmds[i].cmd == cmd)
			c = &nvstub_uvm_cmds[i];
	if (!c)
		return -EINVAL;
	if (cmd == UVM_DEINITIALIZE)
		return 0;
	/*
	 * The two blocks with a per-GPU array are as long as the release's
	 * UVM_MAX_GPUS makes them (32 on 535 and early 550, 256 later: uvm_ioctl.h); what
	 * follows the array (from its gpuAttributesCount: the release's row has
	 * where) is moved to where the newest layout, which the handlers read,
	 * has it (offsetof its gpu_attributes_count, not status_off + 4 - the
	 * tail's size: the semaphore pool's tail ends in 4 bytes of padding),
	 * and back.
	 */
	size = c->size;
	tail = 0;
	if (cmd == UVM_MAP_EXTERNAL_ALLOCATION) {
		size = nvstub_abi->uvm_map_external_size;
		tail = nvstub_abi->uvm_map_external_tail;
		at = offsetof(struct uvm_map_external_allocation_params, gpu_attributes_count);
		ntail = sizeof(struct uvm_map_external_allocation_tail);
	} else if (cmd == UVM_ALLOC_SEMAPHORE_POOL) {
		size = nvstub_abi->uvm_semaphore_pool_size;
		tail = nvstub_abi->uvm_semaphore_pool_tail;
		at = offsetof(struct uvm_alloc_semaphore_pool_params, gpu_attributes_count);
		ntail = sizeof(struct uvm_alloc_semaphore_pool_tail);
	}
	p = kzalloc(c->size, GFP_KERNEL);
	if (!p)
		return -ENOMEM;
	if (copy_from_user(p, uptr, size)) {
		kfree(p);
		return -EFAULT;
	}
	if (tail)
		nvstub_uvm_move_tail(p, at, tail, ntail);
	mutex_lock(&uf->lock);
	st = nvstub_uvm_do(uf, cmd, p);
	mutex_unlock(&uf->lock);
	memcpy(p + c->status_off, &st, sizeof(st));
	if (tail)
		nvstub_uvm_move_tail(p, tail, at, ntail);
	if (copy_to_user(uptr, p, size)) {
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
