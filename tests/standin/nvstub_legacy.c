// SPDX-License-Identifier: GPL-2.0
/*
 * nvstub_legacy.c - the RM escapes older than RM_ALLOC and RM_CONTROL that
 * OpenGL, Vulkan and the video libraries use, in the nvstub TEST DOUBLE.
 *
 * Each is, in RM, a wrapper that turns the legacy block into RM's own calls
 * (580 src/nvidia/interface/deprecated/); the stand-in does the same with
 * its own RmAlloc/RmFree (nvstub_rm_alloc_locked(), nvstub_rm_free_locked()).
 * All of them are nvidiactl-only (escape.c NV_CTL_DEVICE_ONLY: -EINVAL
 * elsewhere) and take a block of exactly their size (-EINVAL otherwise), and
 * run under nvstub_lock (nvstub_main.c).
 */
#include <linux/build_bug.h>
#include <linux/sizes.h>

#include "nvstub.h"

static_assert(sizeof(struct nvstub_os32) == 184);
static_assert(offsetof(struct nvstub_os32, data) == 40);
static_assert(offsetof(struct nvstub_os32, data.size.size) == 88);
static_assert(offsetof(struct nvstub_os32, data.size.attr2) == 144);
static_assert(offsetof(struct nvstub_os32, data.range.size) == 80);
static_assert(offsetof(struct nvstub_os32, data.range.attr2) == 136);
static_assert(offsetof(struct nvstub_os32, data.info.offset) == 48);
static_assert(sizeof(struct nvstub_os30) == 56 && offsetof(struct nvstub_os30, status) == 48);
static_assert(sizeof(struct nvstub_os39) == 56 && offsetof(struct nvstub_os39, status) == 48);
static_assert(sizeof(struct nvstub_os46) == 64 && offsetof(struct nvstub_os46, status) == 56);
static_assert(sizeof(struct nvstub_os47) == 48 && offsetof(struct nvstub_os47, status) == 40);

/*
 * rmapi_deprecated_vidheapctrl.c _rmVidHeapControlAllocCommon: the class
 * RM allocates for a vid-heap allocation, by flags and attributes.
 * NV_MEMORY_EXTENDED_USER (EGM) is not modelled: NV_ERR_INVALID_CLASS, as
 * RM answers a class the GPU does not have.
 */
static u32 nvstub_vidheap_class(u32 flags, u32 attr, u32 attr2)
{
	if (flags & NVSTUB_OS32_FLAGS_VIRTUAL)
		return NV50_MEMORY_VIRTUAL;
	if (attr2 & NVSTUB_OS32_ATTR2_USE_EGM)
		return 0;
	if (((attr & NVOS32_ATTR_LOCATION_MASK) >> NVOS32_ATTR_LOCATION_SHIFT) == 0)	/* VIDMEM */
		return NV01_MEMORY_LOCAL_USER;
	return NV01_MEMORY_SYSTEM;
}

/*
 * _rmVidHeapControlAllocCommon: hMemory 0 unless MEMORY_HANDLE_PROVIDED
 * (RM then makes the handle), hVASpace from the block, the RmAlloc under
 * hObjectParent; free and total come back 0. *h is written back on success.
 */
static u32 nvstub_vidheap_alloc(struct nvstub_client *cl, struct nvstub_os32 *a, u32 *h,
				struct nv_memory_allocation_params *mp)
{
	u32 cls = nvstub_vidheap_class(mp->flags, mp->attr, mp->attr2);
	u32 handle = (mp->flags & NVSTUB_OS32_FLAGS_HANDLE_PROVIDED) ? *h : 0;
	u32 st;

	mp->h_va_space = a->h_va_space;
	st = cls ? nvstub_rm_alloc_locked(cl, a->h_object_parent, &handle, cls, mp) :
		   NV_ERR_INVALID_CLASS;
	if (st == NV_OK)
		*h = handle;
	a->free = 0;
	a->total = 0;
	return st;
}

/*
 * _nvos32FunctionAllocSize, _nvos32FunctionAllocTiledPitchHeight: the
 * AllocSize-shaped members in (rangeLo/Hi only with USE_BEGIN_END),
 * partitionStride 256, the in/out members back (size, offset, attr, attr2,
 * format, limit, address, comprCovg, zcullCovg, ctagOffset), also on failure
 * (ALLOC_SIZE_PARAMS(_NO_COPY, _COPY_OUT) runs whatever the status).
 * Tiled: size = height x pitch (NvU64 x NvS32, as RM multiplies) first.
 */
static u32 nvstub_vidheap_alloc_size(struct nvstub_client *cl, struct nvstub_os32 *a, bool tiled)
{
	struct nvstub_os32_alloc_size *d = &a->data.size;
	struct nv_memory_allocation_params mp = { 0 };
	u32 attr = tiled ? d->compr_covg : d->attr;
	u32 format = tiled ? d->partition_stride : d->format;
	u32 st;

	if (tiled)		/* height is at attr's place, pitch (signed) at format's */
		d->size = (u64)d->attr * (s64)(s32)d->format;
	if (d->flags & NVSTUB_OS32_FLAGS_USE_BEGIN_END) {
		mp.range_lo = d->range_begin;
		mp.range_hi = d->range_end;
	}
	mp.owner = d->owner;
	mp.type = d->type;
	mp.flags = d->flags;
	mp.height = tiled ? d->attr : d->height;
	mp.width = tiled ? d->zcull_covg : d->width;
	mp.pitch = tiled ? (s32)d->format : 0;
	mp.size = d->size;
	mp.alignment = d->alignment;
	mp.numa_node = d->numa_node;
	mp.offset = d->offset;
	mp.attr = attr;
	mp.attr2 = d->attr2;
	mp.format = format;
	mp.limit = d->limit;
	mp.address = d->address;
	mp.compr_covg = tiled ? d->width : d->compr_covg;
	mp.zcull_covg = tiled ? d->height : d->zcull_covg;
	mp.ctag_offset = d->ctag_offset;
	if (tiled)
		d->pad = 256;		/* TPH partitionStride */
	else
		d->partition_stride = 256;
	st = nvstub_vidheap_alloc(cl, a, &d->h_memory, &mp);
	d->size = mp.size;
	d->offset = mp.offset;
	if (tiled) {
		d->compr_covg = mp.attr;
		d->partition_stride = mp.format;
		d->width = mp.compr_covg;
		d->height = mp.zcull_covg;
	} else {
		d->attr = mp.attr;
		d->format = mp.format;
		d->compr_covg = mp.compr_covg;
		d->zcull_covg = mp.zcull_covg;
	}
	d->attr2 = mp.attr2;
	d->limit = mp.limit;
	d->address = mp.address;
	d->ctag_offset = mp.ctag_offset;
	return st;
}

/* _nvos32FunctionAllocSizeRange: the same, from data.AllocSizeRange (range always taken) */
static u32 nvstub_vidheap_alloc_range(struct nvstub_client *cl, struct nvstub_os32 *a)
{
	struct nvstub_os32_alloc_range *d = &a->data.range;
	struct nv_memory_allocation_params mp = { 0 };
	u32 st;

	mp.owner = d->owner;
	mp.type = d->type;
	mp.flags = d->flags;
	mp.range_lo = d->range_begin;
	mp.range_hi = d->range_end;
	mp.size = d->size;
	mp.alignment = d->alignment;
	mp.numa_node = d->numa_node;
	mp.offset = d->offset;
	mp.attr = d->attr;
	mp.attr2 = d->attr2;
	mp.format = d->format;
	mp.limit = d->limit;
	mp.address = d->address;
	mp.compr_covg = d->compr_covg;
	mp.zcull_covg = d->zcull_covg;
	mp.ctag_offset = d->ctag_offset;
	d->partition_stride = 256;
	st = nvstub_vidheap_alloc(cl, a, &d->h_memory, &mp);
	d->size = mp.size;
	d->offset = mp.offset;
	d->attr = mp.attr;
	d->attr2 = mp.attr2;
	d->format = mp.format;
	d->limit = mp.limit;
	d->address = mp.address;
	d->compr_covg = mp.compr_covg;
	d->zcull_covg = mp.zcull_covg;
	d->ctag_offset = mp.ctag_offset;
	return st;
}

/*
 * The GPU of hObjectParent, a device or subdevice
 * (RmDeprecatedFindOrCreateSubDeviceHandle): -1 if it is neither.
 */
static int nvstub_vidheap_gpu(struct nvstub_client *cl, u32 h_parent, u32 *st)
{
	struct nvstub_obj *o = nvstub_obj_get(cl, h_parent);

	if (!o || (o->cls != NV01_DEVICE_0 && o->cls != NV20_SUBDEVICE_0)) {
		*st = NV_ERR_INVALID_OBJECT_HANDLE;
		return -1;
	}
	return o->gpu;
}

/*
 * _nvos32FunctionInfo: FB_GET_INFO_V2 of HEAP_FREE, HEAP_SIZE (+ FB tax,
 * 0), HEAP_BASE_KB, LARGEST_FREE_REGION_SIZE_KB and _BASE_KB, each KiB << 10:
 * the stand-in's pool (nvstub_ctrl.c nvstub_fb_info_value(): one free
 * region, at 0).
 */
static u32 nvstub_vidheap_info(struct nvstub_client *cl, struct nvstub_os32 *a)
{
	u32 st = NV_OK;
	int gpu = nvstub_vidheap_gpu(cl, a->h_object_parent, &st);
	u64 free_b;

	if (gpu < 0)
		return st;
	free_b = (nvstub_mem_free(gpu) >> 10) << 10;
	a->free = free_b;
	a->total = (nvstub_mem_total() >> 10) << 10;
	a->data.info.base = 0;
	a->data.info.size = free_b;
	a->data.info.offset = 0;
	return NV_OK;
}

/*
 * _nvos32FunctionGetMemAlignment: NV2080_CTRL_CMD_FB_GET_MEM_ALIGNMENT on the
 * subdevice. Simplified to the page-size rule of NV01_MEMORY_LOCAL_USER's
 * default (README: 2 MiB from 2 MiB up, else 64 KiB): alignSize rounded up
 * to it, alignMask = page - 1, alignAdjust 0; the rest comes back as given.
 */
static u32 nvstub_vidheap_align(struct nvstub_client *cl, struct nvstub_os32 *a)
{
	struct nvstub_os32_align *d = &a->data.align;
	u32 st = NV_OK;
	u64 page;

	if (nvstub_vidheap_gpu(cl, a->h_object_parent, &st) < 0)
		return st;
	if (d->size == 0 || d->size > U64_MAX - SZ_2M)
		return NV_ERR_INVALID_ARGUMENT;
	page = d->size >= SZ_2M ? SZ_2M : SZ_64K;
	d->size = round_up(d->size, page);
	d->mask = page - 1;
	d->adjust = 0;
	return NV_OK;
}

/*
 * NV_ESC_RM_VID_HEAP_CONTROL (escape.c: nvidiactl only; ALLOC_OS_DESCRIPTOR
 * goes to RmCreateOsDescriptor, not modelled), rmapi_deprecated_vidheapctrl.c
 * RmDeprecatedVidHeapControl: an IVC heap number other than 0 is
 * NV_ERR_NOT_SUPPORTED, a function without a handler NV_ERR_INVALID_ARGUMENT;
 * the status is written at offset 20. Modelled: ALLOC_SIZE, ALLOC_SIZE_RANGE,
 * ALLOC_TILED_PITCH_HEIGHT, FREE, INFO, GET_MEM_ALIGNMENT; the compression
 * and HW-resource functions answer NV_ERR_NOT_SUPPORTED (not modelled).
 * The client must be the caller's (RmAlloc/RmFree: NV_ERR_INVALID_CLIENT).
 */
int nvstub_esc_vid_heap(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvstub_os32 *a = arg;
	struct nvstub_client *cl;
	u32 st;

	if (size != sizeof(*a) || !nvstub_is_ctl(nf))
		return -EINVAL;
	if (a->ivc_heap_number > NVSTUB_OS32_IVC_HEAP_DONT_ALLOCATE) {
		a->status = NV_ERR_NOT_SUPPORTED;
		return 0;
	}
	switch (a->function) {
	case NVSTUB_OS32_ALLOC_SIZE:
	case NVSTUB_OS32_ALLOC_SIZE_RANGE:
	case NVSTUB_OS32_ALLOC_TILED_PITCH_HEIGHT:
	case NVSTUB_OS32_FREE:
	case NVSTUB_OS32_INFO:
	case NVSTUB_OS32_GET_MEM_ALIGNMENT:
		break;
	case 15: case 16: case 19: case 20: case 27:	/* REACQUIRE/RELEASE_COMPR, HW_ALLOC/FREE, OS_DESC */
		a->status = NV_ERR_NOT_SUPPORTED;
		return 0;
	default:
		a->status = NV_ERR_INVALID_ARGUMENT;
		return 0;
	}
	/* _nvos32FunctionFree checks its flags before any RM call */
	if (a->function == NVSTUB_OS32_FREE && !(a->data.free.flags & NVSTUB_OS32_FREE_HANDLE_PROVIDED)) {
		a->status = NV_ERR_INVALID_ARGUMENT;
		return 0;
	}
	cl = nvstub_client_validate(nf, a->h_root, &st);
	if (!cl) {
		a->status = st;
		return 0;
	}
	switch (a->function) {
	case NVSTUB_OS32_ALLOC_SIZE:
		st = nvstub_vidheap_alloc_size(cl, a, false);
		break;
	case NVSTUB_OS32_ALLOC_TILED_PITCH_HEIGHT:
		st = nvstub_vidheap_alloc_size(cl, a, true);
		break;
	case NVSTUB_OS32_ALLOC_SIZE_RANGE:
		st = nvstub_vidheap_alloc_range(cl, a);
		break;
	case NVSTUB_OS32_FREE:
		st = nvstub_rm_free_locked(cl, a->data.free.h_memory);
		break;
	case NVSTUB_OS32_INFO:
		st = nvstub_vidheap_info(cl, a);
		break;
	default:
		st = nvstub_vidheap_align(cl, a);
		break;
	}
	a->status = st;
	return 0;
}

/*
 * NV_ESC_RM_IDLE_CHANNELS (NVOS30): rmapi_deprecated_misc.c
 * RmDeprecatedIdleChannels -> NV0000_CTRL_CMD_IDLE_CHANNELS on hClient
 * (kernel_idle_channels.c): the client must be the caller's; the stand-in's
 * engine has nothing in flight that a wait could drain, so it answers NV_OK
 * at once, whatever the timeout.
 */
int nvstub_esc_idle_channels(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvstub_os30 *a = arg;

	if (size != sizeof(*a) || !nvstub_is_ctl(nf))
		return -EINVAL;
	if (!nvstub_client_validate(nf, a->h_client, &a->status))
		return 0;
	a->status = NV_OK;
	return 0;
}

/*
 * NV_ESC_RM_ALLOC_CONTEXT_DMA2 (NVOS39): rmapi_deprecated_misc.c
 * RmDeprecatedAllocContextDma: hObjectParent is the client; the context DMA
 * is made under hMemory's parent (RmDeprecatedGetHandleParent) as an RmAlloc
 * of hClass with NV_CONTEXT_DMA_ALLOCATION_PARAMS {hSubDevice, flags,
 * hMemory, offset, limit}. Not modelled: the NV01_MEMORY_SYSTEM_DYNAMIC case
 * (RM makes a virtual range of it instead).
 */
int nvstub_esc_ctxdma2(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvstub_os39 *a = arg;
	struct nvstub_client *cl;
	struct nvstub_obj *mem;
	u8 params[NVSTUB_CONTEXT_DMA_PARAMS_SIZE] = { 0 };
	u32 h = a->h_object_new;

	if (size != sizeof(*a) || !nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, a->h_object_parent, &a->status);
	if (!cl)
		return 0;
	mem = nvstub_obj_get(cl, a->h_memory);
	if (!mem || mem == &cl->root) {
		a->status = NV_ERR_INVALID_OBJECT_HANDLE;
		return 0;
	}
	memcpy(params, &a->h_subdevice, 4);
	memcpy(params + 4, &a->flags, 4);
	memcpy(params + 8, &a->h_memory, 4);
	memcpy(params + 16, &a->offset, 8);
	memcpy(params + 24, &a->limit, 8);
	a->status = nvstub_rm_alloc_locked(cl, mem->parent->handle, &h, a->h_class, params);
	return 0;
}

/*
 * NV_ESC_RM_MAP_MEMORY_DMA (NVOS46), rmapi/mapping.c: hDevice, hDma (a VA
 * space or context DMA) and hMemory are looked up in hClient, which must be
 * the caller's (NV_ERR_INVALID_CLIENT; a missing handle
 * NV_ERR_INVALID_OBJECT_HANDLE). The stand-in has no GPU VA space: dmaOffset
 * is the next free 2 MiB-aligned address of a counter.
 */
static u64 nvstub_next_dma_offset = 0x200000000ull;

int nvstub_esc_map_dma(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvstub_os46 *a = arg;
	struct nvstub_client *cl;
	/* before 580 no flags2 and kindOverride: dmaOffset and status 8 bytes earlier */
	u32 shift = sizeof(*a) - nvstub_abi->nvos46_size;
	u32 *status = (u32 *)((char *)arg + nvstub_abi->nvos46_status);
	u64 *dma_offset = (u64 *)((char *)arg + offsetof(struct nvstub_os46, dma_offset) - shift);

	if (size != nvstub_abi->nvos46_size || !nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, a->h_client, status);
	if (!cl)
		return 0;
	if (!nvstub_obj_get(cl, a->h_device) || !nvstub_obj_get(cl, a->h_dma) ||
	    !nvstub_obj_get(cl, a->h_memory)) {
		*status = NV_ERR_INVALID_OBJECT_HANDLE;
		return 0;
	}
	if (a->length == 0 || a->length > U64_MAX - SZ_2M) {
		*status = NV_ERR_INVALID_LIMIT;
		return 0;
	}
	*dma_offset = nvstub_next_dma_offset;
	nvstub_next_dma_offset += round_up(a->length, SZ_2M);
	*status = NV_OK;
	return 0;
}

/* NV_ESC_RM_UNMAP_MEMORY_DMA (NVOS47): the same lookups; nothing to undo here */
int nvstub_esc_unmap_dma(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvstub_os47 *a = arg;
	struct nvstub_client *cl;
	/* before 580 no size: status 8 bytes earlier */
	u32 *status = (u32 *)((char *)arg + nvstub_abi->nvos47_status);

	if (size != nvstub_abi->nvos47_size || !nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, a->h_client, status);
	if (!cl)
		return 0;
	if (!nvstub_obj_get(cl, a->h_device) || !nvstub_obj_get(cl, a->h_dma) ||
	    !nvstub_obj_get(cl, a->h_memory)) {
		*status = NV_ERR_INVALID_OBJECT_HANDLE;
		return 0;
	}
	*status = NV_OK;
	return 0;
}
