/* SPDX-License-Identifier: MIT */
/*
 * nvrm_abi.h - the NVIDIA Resource Manager (RM) user ABI that gpuslice decodes.
 *
 * This is the ONE place the project spells out NVIDIA's ioctl numbers, struct
 * layouts, classes, control commands and status codes. Everything here is copied
 * (layouts and values only) from NVIDIA's open-gpu-kernel-modules, branch 580
 * (580.142; the traces in tests/traces were taken on 580.159.04), MIT licensed.
 * Each block names the file it comes from. Python mirrors these values in
 * pyctl/gpuslice/abi.py; tests/test_abi.py checks that the two agree.
 *
 * Compiles in the kernel (linux/types.h) and in user space (stdint.h).
 */
#ifndef GPUSLICE_NVRM_ABI_H
#define GPUSLICE_NVRM_ABI_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/ioctl.h>
#else
#include <stdint.h>
#include <sys/ioctl.h>
#endif

typedef uint8_t nv_u8;
typedef uint16_t nv_u16;
typedef uint32_t nv_u32;
typedef int32_t nv_s32;
typedef uint64_t nv_u64;
typedef uint32_t nv_handle;
#define NV_ALIGN8 __attribute__((aligned(8)))

/*
 * The values below are the newest supported branch's. What differs between the
 * supported driver versions is in struct nvrm_table: one row per layout, in
 * nvrm_tables.c, which scripts/nvrm-abi.py generates from abi/ (the values
 * extracted from each tagged release; docs/driver-versions.md). The running
 * driver's version picks the row: the module's at load (kmod/driver.c), the
 * library's at start (preload/preload.c); a version without one is refused.
 */
struct nvrm_table {
	const char *branch;			/* "535" */
	const char *const *versions;		/* the releases it serves, NULL-terminated */
	nv_u32 wait_open_complete;		/* NV_ESC_WAIT_OPEN_COMPLETE exists (550 on) */
	nv_u32 nvos46_size;			/* NVOS46_PARAMETERS: MAP_MEMORY_DMA */
	nv_u32 nvos46_status;
	nv_u32 nvos47_size;			/* NVOS47_PARAMETERS: UNMAP_MEMORY_DMA */
	nv_u32 nvos47_status;
	nv_u32 channel_alloc_size;		/* sizeof NV_CHANNEL_ALLOC_PARAMS */
	nv_u32 memory_alloc_size;		/* sizeof NV_MEMORY_ALLOCATION_PARAMS */
	nv_u32 memory_mapper_alloc_size;	/* sizeof NV_MEMORY_MAPPER_ALLOCATION_PARAMS */
	nv_u32 export_object_info_size;		/* NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS */
	nv_u32 uvm_gpus;			/* the per-GPU arrays' length (535: 32, then 256) */
	nv_u32 uvm_map_external_size;		/* UVM_MAP_EXTERNAL_ALLOCATION_PARAMS */
	nv_u32 uvm_map_external_tail;		/* offset of its gpuAttributesCount */
	nv_u32 uvm_semaphore_pool_size;		/* UVM_ALLOC_SEMAPHORE_POOL_PARAMS */
	nv_u32 uvm_semaphore_pool_tail;		/* offset of its gpuAttributesCount */
};

extern const struct nvrm_table nvrm_tables[];
extern const unsigned int nvrm_nr_tables;
/* the row serving a driver version string ("580.159.04"), NULL if none does */
const struct nvrm_table *nvrm_table_find(const char *version);

/* ---- device numbers: kernel-open/common/inc/nv-chardev-numbers.h ---- */
#define NV_MAJOR_DEVICE_NUMBER			195
#define NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE	255

/* ---- ioctl numbers: kernel-open/common/inc/nv-ioctl-numbers.h ---- */
#define NV_IOCTL_MAGIC			'F'
#define NV_IOCTL_BASE			200
#define NV_ESC_CARD_INFO		(NV_IOCTL_BASE + 0)	/* 0xc8 */
#define NV_ESC_REGISTER_FD		(NV_IOCTL_BASE + 1)	/* 0xc9 */
#define NV_ESC_ALLOC_OS_EVENT		(NV_IOCTL_BASE + 6)	/* 0xce */
#define NV_ESC_FREE_OS_EVENT		(NV_IOCTL_BASE + 7)	/* 0xcf */
#define NV_ESC_STATUS_CODE		(NV_IOCTL_BASE + 9)	/* 0xd1 */
#define NV_ESC_CHECK_VERSION_STR	(NV_IOCTL_BASE + 10)	/* 0xd2 */
#define NV_ESC_IOCTL_XFER_CMD		(NV_IOCTL_BASE + 11)	/* 0xd3 */
#define NV_ESC_ATTACH_GPUS_TO_FD	(NV_IOCTL_BASE + 12)	/* 0xd4 */
#define NV_ESC_QUERY_DEVICE_INTR	(NV_IOCTL_BASE + 13)	/* 0xd5 */
#define NV_ESC_SYS_PARAMS		(NV_IOCTL_BASE + 14)	/* 0xd6 */
/* kernel-open/common/inc/nv-ioctl-numa.h */
#define NV_ESC_NUMA_INFO		(NV_IOCTL_BASE + 15)	/* 0xd7 */
#define NV_ESC_SET_NUMA_STATUS		(NV_IOCTL_BASE + 16)	/* 0xd8 */
#define NV_ESC_EXPORT_TO_DMABUF_FD	(NV_IOCTL_BASE + 17)	/* 0xd9 */
#define NV_ESC_WAIT_OPEN_COMPLETE	(NV_IOCTL_BASE + 18)	/* 0xda */

/* ---- RM escapes: src/nvidia/arch/nvalloc/unix/include/nv_escape.h ---- */
#define NV_ESC_RM_ALLOC_MEMORY			0x27
#define NV_ESC_RM_ALLOC_OBJECT			0x28
#define NV_ESC_RM_FREE				0x29
#define NV_ESC_RM_CONTROL			0x2A
#define NV_ESC_RM_ALLOC				0x2B
#define NV_ESC_RM_DUP_OBJECT			0x34
#define NV_ESC_RM_SHARE				0x35
#define NV_ESC_RM_I2C_ACCESS			0x39
#define NV_ESC_RM_IDLE_CHANNELS			0x41
#define NV_ESC_RM_VID_HEAP_CONTROL		0x4A
#define NV_ESC_RM_ACCESS_REGISTRY		0x4D
#define NV_ESC_RM_MAP_MEMORY			0x4E
#define NV_ESC_RM_UNMAP_MEMORY			0x4F
#define NV_ESC_RM_GET_EVENT_DATA		0x52
#define NV_ESC_RM_ALLOC_CONTEXT_DMA2		0x54
#define NV_ESC_RM_ADD_VBLANK_CALLBACK		0x56
#define NV_ESC_RM_MAP_MEMORY_DMA		0x57
#define NV_ESC_RM_UNMAP_MEMORY_DMA		0x58
#define NV_ESC_RM_BIND_CONTEXT_DMA		0x59
#define NV_ESC_RM_EXPORT_OBJECT_TO_FD		0x5C
#define NV_ESC_RM_IMPORT_OBJECT_FROM_FD		0x5D
#define NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO	0x5E
#define NV_ESC_RM_LOCKLESS_DIAGNOSTIC		0x5F

/* ---- status codes: src/common/sdk/nvidia/inc/nvstatuscodes.h ---- */
#define NV_OK					0x00
#define NV_ERR_IN_USE				0x17
#define NV_ERR_INSUFFICIENT_PERMISSIONS		0x1B
#define NV_ERR_INVALID_ARGUMENT			0x1F
#define NV_ERR_INVALID_BASE			0x20
#define NV_ERR_INVALID_CLASS			0x22
#define NV_ERR_INVALID_CLIENT			0x23
#define NV_ERR_INVALID_COMMAND			0x24
#define NV_ERR_INVALID_DEVICE			0x26
#define NV_ERR_INVALID_LIMIT			0x2E
#define NV_ERR_INVALID_OBJECT			0x31
#define NV_ERR_INVALID_OBJECT_HANDLE		0x33
#define NV_ERR_INVALID_OBJECT_OLD		0x35
#define NV_ERR_INVALID_OBJECT_PARENT		0x36
#define NV_ERR_INVALID_OPERATION		0x38
#define NV_ERR_INVALID_PARAM_STRUCT		0x3A
#define NV_ERR_INVALID_PARAMETER		0x3B
#define NV_ERR_INVALID_POINTER			0x3D
#define NV_ERR_INVALID_REQUEST			0x3F
#define NV_ERR_INVALID_STATE			0x40
#define NV_ERR_NO_MEMORY			0x51
#define NV_ERR_NOT_SUPPORTED			0x56
#define NV_ERR_OBJECT_NOT_FOUND			0x57
#define NV_ERR_OPERATING_SYSTEM			0x59
#define NV_ERR_OUT_OF_RANGE			0x5B
#define NV_ERR_PROTECTION_FAULT			0x5F
#define NV_ERR_STATE_IN_USE			0x63

/* ---- classes: src/common/sdk/nvidia/inc/class/cl*.h ---- */
#define NV01_ROOT			0x0000
#define NV01_ROOT_NON_PRIV		0x0001
#define NV01_ROOT_CLIENT		0x0041
#define NV01_DEVICE_0			0x0080
#define NV20_SUBDEVICE_0		0x2080
#define NV01_MEMORY_SYSTEM		0x003e
#define NV01_MEMORY_LOCAL_PRIVILEGED	0x003f
#define NV01_MEMORY_LOCAL_USER		0x0040
#define NV01_MEMORY_VIRTUAL		0x0070
#define NV01_MEMORY_SYSTEM_DYNAMIC	0x0070	/* the same class, allocated under a device */
#define NV01_EVENT_OS_EVENT		0x0079
#define NV01_MEMORY_LIST_FBMEM		0x0082
#define NV01_MEMORY_LOCAL_PHYSICAL	0x00c2
#define NV01_MEMORY_FLA			0x00f3
#define NV_MEMORY_EXPORT		0x00e0
#define NV_MEMORY_FABRIC		0x00f8
#define NV_MEMORY_FABRIC_IMPORT_V2	0x00f9
#define NV_MEMORY_FABRIC_IMPORTED_REF	0x00fb
#define NV_MEMORY_MULTICAST_FABRIC	0x00fd
#define NV50_MEMORY_VIRTUAL		0x50a0
#define NV50_P2P			0x503b
#define NV50_THIRD_PARTY_P2P		0x503c
#define FERMI_CONTEXT_SHARE_A		0x9067
#define FERMI_VASPACE_A			0x90f1
#define KEPLER_CHANNEL_GROUP_A		0xa06c
#define HOPPER_CHANNEL_GPFIFO_A		0xc86f
#define HOPPER_DMA_COPY_A		0xc8b5
#define HOPPER_COMPUTE_A		0xcbc0
/* more classes named by the filter (same directory; the rest of the traced
 * classes are in the stand-in's block at the end) */
#define NV01_CONTEXT_DMA_FROM_MEMORY	0x0002
#define NV01_EVENT			0x0005
#define NV20_SUBDEVICE_DIAG		0x208f
#define AMPERE_CHANNEL_GPFIFO_A		0xc56f
#define BLACKWELL_CHANNEL_GPFIFO_A	0xc96f
#define BLACKWELL_CHANNEL_GPFIFO_B	0xca6f
/* graphics and video (the graphics and video capabilities, filter.c) */
#define NV_SEMAPHORE_SURFACE		0x00da
#define NV_MEMORY_MAPPER		0x00fe
#define FERMI_TWOD_A			0x902d
#define GF100_ZBC_CLEAR			0x9096
#define KEPLER_INLINE_TO_MEMORY_B	0xa140
#define NVB8B0_VIDEO_DECODER		0xb8b0
#define NVB8D1_VIDEO_NVJPG		0xb8d1
#define NVB8FA_VIDEO_OFA		0xb8fa
#define HOPPER_A			0xcb97

/* class/cl00fe.h NV_MEMORY_MAPPER_ALLOCATION_PARAMS, 24 bytes */
struct nv_memory_mapper_alloc_params {
	nv_handle h_semaphore_surface;
	nv_u32 max_queue_size;
	nv_handle h_notification_memory;
	nv_u32 pad;
	nv_u64 notification_offset NV_ALIGN8;
};

/* class/cl00da.h NV_SEMAPHORE_SURFACE_ALLOC_PARAMETERS, 16 bytes */
struct nv_semaphore_surface_alloc_params {
	nv_handle h_semaphore_mem;
	nv_handle h_max_submitted_mem;
	nv_u64 flags NV_ALIGN8;
};

/*
 * NV_BSP_ALLOCATION_PARAMETERS, NV_NVJPG_ALLOCATION_PARAMETERS,
 * NV_OFA_ALLOCATION_PARAMETERS (nvos.h): the video engines' objects, 12 bytes.
 * prohibitMultipleInstances asks that no other client get the engine.
 */
struct nv_video_engine_alloc_params {
	nv_u32 size;
	nv_u32 prohibit_multiple_instances;
	nv_u32 engine_instance;
};

/* ---- argument blocks: src/common/sdk/nvidia/inc/nvos.h ---- */
/* NV_ESC_RM_FREE, _IOWR('F', 0x29, 16) */
struct nvos00_params {
	nv_handle h_root;
	nv_handle h_object_parent;
	nv_handle h_object_old;
	nv_u32 status;
};

/* NV_ESC_RM_ALLOC, _IOWR('F', 0x2b, 48): NVOS64_PARAMETERS */
struct nvos64_params {
	nv_handle h_root;
	nv_handle h_object_parent;
	nv_handle h_object_new;
	nv_u32 h_class;
	nv_u64 p_alloc_parms NV_ALIGN8;
	nv_u64 p_rights_requested NV_ALIGN8;
	nv_u32 params_size;	/* 0 from CUDA: RM sizes params by class */
	nv_u32 flags;
	nv_u32 status;		/* offset 40 */
};

/* NV_ESC_RM_CONTROL, _IOWR('F', 0x2a, 32): NVOS54_PARAMETERS */
struct nvos54_params {
	nv_handle h_client;
	nv_handle h_object;
	nv_u32 cmd;
	nv_u32 flags;
	nv_u64 params NV_ALIGN8;
	nv_u32 params_size;
	nv_u32 status;		/* offset 28 */
};

/* NV_ESC_RM_DUP_OBJECT: NVOS55_PARAMETERS */
struct nvos55_params {
	nv_handle h_client;
	nv_handle h_parent;
	nv_handle h_object;
	nv_handle h_client_src;
	nv_handle h_object_src;
	nv_u32 flags;
	nv_u32 status;
};

/* NV_ESC_RM_SHARE: NVOS57_PARAMETERS (RS_SHARE_POLICY is 12 bytes:
 * NvU32 target, RS_ACCESS_MASK accessMask (NvU32[1]), NvU16 type, NvU8 action) */
struct nvos57_params {
	nv_handle h_client;
	nv_handle h_object;
	nv_u32 share_target;
	nv_u32 share_access_mask;
	nv_u16 share_type;
	nv_u8 share_action;
	nv_u8 pad;
	nv_u32 status;
};

/*
 * NVOS32_PARAMETERS, NV_ESC_RM_VID_HEAP_CONTROL (nvidiactl only), 184 bytes:
 * the legacy heap interface OpenGL and Vulkan allocate through. Each function
 * is RM's own call in disguise (interface/deprecated/
 * rmapi_deprecated_vidheapctrl.c): the allocations are an RmAlloc of
 * NV50_MEMORY_VIRTUAL, NV_MEMORY_EXTENDED_USER, NV01_MEMORY_LOCAL_USER or
 * NV01_MEMORY_SYSTEM by flags and attributes, FREE an RmFree. Offsets from
 * the start of the block; the union starts at 40.
 */
#define NVOS32_PARAMS_SIZE			184
#define NVOS32_OFF_FUNCTION			8
#define NVOS32_OFF_IVC_HEAP			16	/* NvS16 */
#define NVOS32_OFF_STATUS			20
#define NVOS32_OFF_TOTAL			24
#define NVOS32_OFF_FREE				32
#define NVOS32_OFF_HMEMORY			44	/* AllocSize, AllocSizeRange, AllocTiledPitchHeight, Free */
#define NVOS32_OFF_FLAGS			52	/* the three allocations */
#define NVOS32_OFF_FREE_FLAGS			48	/* Free */
/* data.AllocSize and data.AllocTiledPitchHeight: attr, size, alignment, attr2 */
#define NVOS32_OFF_SIZE_ATTR			56
#define NVOS32_OFF_SIZE_SIZE			88
#define NVOS32_OFF_SIZE_ALIGNMENT		96
#define NVOS32_OFF_SIZE_ATTR2			144
#define NVOS32_OFF_TILED_HEIGHT			56
#define NVOS32_OFF_TILED_PITCH			60
#define NVOS32_OFF_TILED_ATTR			64
/* data.AllocSizeRange */
#define NVOS32_OFF_RANGE_ATTR			56
#define NVOS32_OFF_RANGE_SIZE			80
#define NVOS32_OFF_RANGE_ALIGNMENT		88
#define NVOS32_OFF_RANGE_ATTR2			136
/* data.Info */
#define NVOS32_OFF_INFO_OFFSET			48
#define NVOS32_OFF_INFO_SIZE			56
#define NVOS32_OFF_INFO_BASE			64

#define NVOS32_FUNCTION_ALLOC_SIZE		2
#define NVOS32_FUNCTION_FREE			3
#define NVOS32_FUNCTION_INFO			5
#define NVOS32_FUNCTION_ALLOC_TILED_PITCH_HEIGHT	6
#define NVOS32_FUNCTION_ALLOC_SIZE_RANGE	14
#define NVOS32_FUNCTION_REACQUIRE_COMPR		15
#define NVOS32_FUNCTION_RELEASE_COMPR		16
#define NVOS32_FUNCTION_GET_MEM_ALIGNMENT	18
#define NVOS32_FUNCTION_HW_ALLOC		19
#define NVOS32_FUNCTION_HW_FREE			20
#define NVOS32_FUNCTION_ALLOC_OS_DESCRIPTOR	27

#define NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED	0x00004000
#define NVOS32_ALLOC_FLAGS_VIRTUAL		0x00080000
#define NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED	0x00000001
#define NVOS32_ATTR_LOCATION_SHIFT		25	/* 26:25 */
#define NVOS32_ATTR_LOCATION_VIDMEM		0
#define NVOS32_ATTR2_USE_EGM_SHIFT		24	/* 24:24 */

/* NVOS30_PARAMETERS, NV_ESC_RM_IDLE_CHANNELS: hClient first, timeout at 44 */
#define NVOS30_PARAMS_SIZE			56
#define NVOS30_OFF_TIMEOUT			44
#define NVOS30_OFF_STATUS			48
/* NVOS39_PARAMETERS, NV_ESC_RM_ALLOC_CONTEXT_DMA2: hObjectParent is the client */
#define NVOS39_PARAMS_SIZE			56
#define NVOS39_OFF_STATUS			48
/* NVOS46_PARAMETERS, NV_ESC_RM_MAP_MEMORY_DMA; NVOS47, NV_ESC_RM_UNMAP_MEMORY_DMA */
#define NVOS46_PARAMS_SIZE			64
#define NVOS46_OFF_STATUS			56
#define NVOS47_PARAMS_SIZE			48
#define NVOS47_OFF_STATUS			40

/* NVOS33_PARAMETERS; NV_ESC_RM_MAP_MEMORY carries it with an fd:
 * nv_ioctl_nvos33_parameters_with_fd (kernel-open/common/inc/nv-unix-nvos-params-wrappers.h) */
struct nvos33_params {
	nv_handle h_client;
	nv_handle h_device;
	nv_handle h_memory;
	nv_u64 offset NV_ALIGN8;
	nv_u64 length NV_ALIGN8;
	nv_u64 p_linear_address NV_ALIGN8;
	nv_u32 status;
	nv_u32 flags;
};

struct nvos33_params_with_fd {
	struct nvos33_params params;
	int fd;
} NV_ALIGN8;

/* NVOS02_PARAMETERS; NV_ESC_RM_ALLOC_MEMORY carries it with an fd:
 * nv_ioctl_nvos02_parameters_with_fd */
struct nvos02_params {
	nv_handle h_root;
	nv_handle h_object_parent;
	nv_handle h_object_new;
	nv_u32 h_class;
	nv_u32 flags;
	nv_u64 p_memory NV_ALIGN8;
	nv_u64 limit NV_ALIGN8;
	nv_u32 status;
};

struct nvos02_params_with_fd {
	struct nvos02_params params;
	int fd;
} NV_ALIGN8;

/* ---- escapes' own blocks: kernel-open/common/inc/nv-ioctl.h ---- */
struct nv_ioctl_xfer {
	nv_u32 cmd;
	nv_u32 size;
	nv_u64 ptr NV_ALIGN8;
};

struct nv_pci_info {
	nv_u32 domain;
	nv_u8 bus;
	nv_u8 slot;
	nv_u8 function;
	nv_u16 vendor_id;
	nv_u16 device_id;
};

struct nv_ioctl_card_info {
	nv_u8 valid;
	struct nv_pci_info pci_info;
	nv_u32 gpu_id;
	nv_u16 interrupt_line;
	nv_u64 reg_address NV_ALIGN8;
	nv_u64 reg_size NV_ALIGN8;
	nv_u64 fb_address NV_ALIGN8;
	nv_u64 fb_size NV_ALIGN8;
	nv_u32 minor_number;
	nv_u8 dev_name[10];
};

#define NV_MAX_DEVICES 32	/* CARD_INFO is an array of 32: _IOWR('F', 0xc8, 2304) */

struct nv_ioctl_alloc_os_event {
	nv_handle h_client;
	nv_handle h_device;
	nv_u32 fd;
	nv_u32 status;
};

struct nv_ioctl_free_os_event {
	nv_handle h_client;
	nv_handle h_device;
	nv_u32 fd;
	nv_u32 status;
};

#define NV_RM_API_VERSION_STRING_LENGTH		64
#define NV_RM_API_VERSION_CMD_STRICT		0
#define NV_RM_API_VERSION_CMD_RELAXED		'1'
#define NV_RM_API_VERSION_CMD_QUERY		'2'
#define NV_RM_API_VERSION_REPLY_UNRECOGNIZED	0
#define NV_RM_API_VERSION_REPLY_RECOGNIZED	1
struct nv_ioctl_rm_api_version {
	nv_u32 cmd;
	nv_u32 reply;
	char version_string[NV_RM_API_VERSION_STRING_LENGTH];
};

struct nv_ioctl_sys_params {
	nv_u64 memblock_size NV_ALIGN8;
};

struct nv_ioctl_register_fd {
	int ctl_fd;
};

struct nv_ioctl_wait_open_complete {
	int rc;
	nv_u32 adapter_status;
};

/* ---- allocation parameters by class (nvos.h, class/cl*.h) ---- */
/* NV_MEMORY_ALLOCATION_PARAMS: classes 0x3e, 0x40 ... 128 bytes, size at 64 */
struct nv_memory_allocation_params {
	nv_u32 owner;
	nv_u32 type;
	nv_u32 flags;
	nv_u32 width;
	nv_u32 height;
	nv_s32 pitch;
	nv_u32 attr;
	nv_u32 attr2;
	nv_u32 format;
	nv_u32 compr_covg;
	nv_u32 zcull_covg;
	nv_u32 pad0;
	nv_u64 range_lo NV_ALIGN8;
	nv_u64 range_hi NV_ALIGN8;
	nv_u64 size NV_ALIGN8;		/* offset 64, in/out */
	nv_u64 alignment NV_ALIGN8;
	nv_u64 offset NV_ALIGN8;
	nv_u64 limit NV_ALIGN8;
	nv_u64 address NV_ALIGN8;
	nv_u32 ctag_offset;
	nv_handle h_va_space;
	nv_u32 internalflags;
	nv_u32 tag;
	nv_s32 numa_node;
	nv_u32 pad1;
};

/*
 * The sizes RM reads of a TSG's and a channel's parameters on 580
 * (rmapiGetClassAllocParamSize: sizeof NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS,
 * sizeof NV_CHANNEL_ALLOC_PARAMS in alloc/alloc_channel.h).
 */
#define NV_CHANNEL_GROUP_ALLOC_PARAMS_SIZE	20
/* NV_CTXSHARE_ALLOCATION_PARAMETERS (nvos.h), class 0x9067: hVASpace, flags, subctxId */
#define NV_CTXSHARE_ALLOC_PARAMS_SIZE		12
#define NV_CHANNEL_ALLOC_PARAMS_SIZE		368

/* NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS (nvos.h), class 0xa06c */
struct nv_channel_group_alloc_params {
	nv_handle h_object_error;
	nv_handle h_object_ecc_error;
	nv_handle h_va_space;
	nv_u32 engine_type;		/* NV2080_ENGINE_TYPE_*, offset 12 */
	nv_u8 b_is_calling_context_vgpu_plugin;
};

/* NV_CHANNEL_ALLOC_PARAMS (alloc/alloc_channel.h), classes *_CHANNEL_GPFIFO_*:
 * only the head up to engineType is decoded (NV_MAX_SUBDEVICES is 8). */
#define NV_MAX_SUBDEVICES 8
struct nv_channel_alloc_params_head {
	nv_handle h_object_error;
	nv_handle h_object_buffer;
	nv_u64 gp_fifo_offset NV_ALIGN8;
	nv_u32 gp_fifo_entries;
	nv_u32 flags;
	nv_handle h_context_share;
	nv_handle h_va_space;
	nv_handle h_userd_memory[NV_MAX_SUBDEVICES];
	nv_u64 userd_offset[NV_MAX_SUBDEVICES] NV_ALIGN8;
	nv_u32 engine_type;		/* offset 128 */
	nv_u32 cid;
};

/* NV_PHYSICAL_MEMORY_ALLOCATION_PARAMS (class/cl00c2.h): memSize is an output */
struct nv_physical_memory_allocation_params {
	nv_u64 mem_size NV_ALIGN8;
	nv_u32 format;
	nv_u64 page_size NV_ALIGN8;
};

/* NV00F8_ALLOCATION_PARAMETERS (class/cl00f8.h), head */
struct nv00f8_allocation_params_head {
	nv_u64 alignment NV_ALIGN8;
	nv_u64 alloc_size NV_ALIGN8;
	nv_u64 page_size NV_ALIGN8;
	nv_u32 alloc_flags;
};

/* ---- controls: src/common/sdk/nvidia/inc/ctrl/ ---- */
/* ctrl2080/ctrl2080fb.h */
#define NV2080_CTRL_CMD_FB_GET_INFO			0x20801301	/* v1: the list behind a pointer */
#define NV2080_CTRL_CMD_FB_GET_INFO_V2			0x20801303
#define NV2080_CTRL_FB_INFO_MAX_LIST_SIZE		0x80
#define NV2080_CTRL_FB_INFO_INDEX_RAM_SIZE		0x07
#define NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE	0x08
#define NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE		0x09
#define NV2080_CTRL_FB_INFO_INDEX_MAPPABLE_HEAP_SIZE	0x0A
#define NV2080_CTRL_FB_INFO_INDEX_FB_TAX_SIZE_KB	0x10
#define NV2080_CTRL_FB_INFO_INDEX_LARGEST_FREE_REGION_SIZE_KB 0x12
#define NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE		0x16
#define NV2080_CTRL_FB_INFO_INDEX_USABLE_RAM_SIZE	0x20
struct nv2080_ctrl_fb_info {
	nv_u32 index;
	nv_u32 data;	/* sizes in KiB */
};

struct nv2080_ctrl_fb_get_info_v2_params {	/* 1028 bytes */
	nv_u32 fb_info_list_size;
	struct nv2080_ctrl_fb_info fb_info_list[NV2080_CTRL_FB_INFO_MAX_LIST_SIZE];
};

/* ctrl2080/ctrl2080gpu.h: processes using the GPU */
#define NV2080_CTRL_CMD_GPU_GET_PIDS			0x2080018d
#define NV2080_CTRL_GPU_GET_PIDS_MAX_COUNT		950
struct nv2080_ctrl_gpu_get_pids_params {	/* 3812 bytes */
	nv_u32 id_type;
	nv_u32 id;
	nv_u32 pid_tbl_count;
	nv_u32 pid_tbl[NV2080_CTRL_GPU_GET_PIDS_MAX_COUNT];
};

#define NV2080_CTRL_CMD_GPU_GET_PID_INFO		0x2080018e
#define NV2080_CTRL_GPU_GET_PID_INFO_MAX_COUNT		200
#define NV2080_CTRL_GPU_PID_INFO_INDEX_VIDEO_MEMORY_USAGE 0
#define NV2080_CTRL_GPU_PARTITION_ID_INVALID		0xffffffff
struct nv2080_ctrl_gpu_pid_info {		/* 72 bytes */
	nv_u32 pid;
	nv_u32 index;
	nv_u32 result;
	nv_u64 data[6] NV_ALIGN8;	/* VIDEO_MEMORY_USAGE: private, shared owned/duped, protected x3 */
	nv_u32 compute_instance_id;	/* smcSubscription */
	nv_u32 gpu_instance_id;
};

struct nv2080_ctrl_gpu_get_pid_info_params {	/* 14408 bytes */
	nv_u32 pid_info_list_count;
	struct nv2080_ctrl_gpu_pid_info pid_info_list[NV2080_CTRL_GPU_GET_PID_INFO_MAX_COUNT] NV_ALIGN8;
};

/* ctrl2080/ctrl2080fifo.h */
#define NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS		0x2080110b
#define NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES	64
struct nv2080_ctrl_fifo_disable_channels_params {	/* 536 bytes */
	nv_u8 b_disable;
	nv_u8 pad0[3];
	nv_u32 num_channels;
	nv_u8 b_only_disable_scheduling;
	nv_u8 b_rewind_gp_put;
	nv_u8 pad1[6];
	nv_u64 p_runlist_preempt_event NV_ALIGN8;
	nv_handle h_client_list[NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES];
	nv_handle h_channel_list[NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES];
};

/* ctrl/ctrla06c.h, ctrl/ctrla06f.h */
#define NVA06C_CTRL_CMD_GPFIFO_SCHEDULE		0xa06c0101
#define NVA06C_CTRL_CMD_SET_TIMESLICE		0xa06c0103
#define NVA06C_CTRL_CMD_GET_TIMESLICE		0xa06c0104
/* "for safety reasons ... requires PRIVILEGED", says the header; the 580 nvoc table
 * (g_kernel_channel_group_api_nvoc.c) flags it 0x10028: NON_PRIVILEGED with an access right */
#define NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL	0xa06c0107
#define NVA06C_CTRL_INTERLEAVE_LEVEL_LOW	0
#define NVA06C_CTRL_INTERLEAVE_LEVEL_MEDIUM	1
#define NVA06C_CTRL_INTERLEAVE_LEVEL_HIGH	2
/* ctrl/ctrl9096.h: the ZBC clear table's writes (its reads are allowed) */
#define NV9096_CTRL_CMD_SET_ZBC_COLOR_CLEAR	0x90960101
#define NV9096_CTRL_CMD_SET_ZBC_DEPTH_CLEAR	0x90960102
#define NV9096_CTRL_CMD_SET_ZBC_CLEAR_TABLE	0x90960104
#define NV9096_CTRL_CMD_SET_ZBC_STENCIL_CLEAR	0x90960105
/* ctrl/ctrl2080/ctrl2080gr.h NV2080_CTRL_GR_CTXSW_ZCULL_BIND_PARAMS: the head */
#define NV2080_CTRL_CMD_GR_CTXSW_ZCULL_BIND	0x20801208
struct nv2080_ctrl_gr_ctxsw_zcull_bind_head {
	nv_handle h_client;
	nv_handle h_channel;
};
/* ctrl/ctrla06f/ctrla06fgpfifo.h: the same on one channel, and its bind to an engine */
#define NVA06F_CTRL_CMD_GPFIFO_SCHEDULE		0xa06f0103
#define NVA06F_CTRL_CMD_BIND			0xa06f0104
/* ctrla06c.h NVA06C_CTRL_PREEMPT_PARAMS */
#define NVA06C_CTRL_CMD_PREEMPT			0xa06c0105
struct nva06c_ctrl_preempt_params {
	nv_u8 b_wait;
	nv_u8 b_manual_timeout;
	nv_u8 pad[2];
	nv_u32 timeout_us;
};
struct nva06f_ctrl_bind_params {
	nv_u32 engine_type;	/* NV2080_ENGINE_TYPE_* */
};
struct nva06c_ctrl_gpfifo_schedule_params {	/* NVA06F_CTRL_GPFIFO_SCHEDULE_PARAMS */
	nv_u8 b_enable;
	nv_u8 b_skip_submit;
	nv_u8 b_skip_enable;
};

struct nva06c_ctrl_timeslice_params {
	nv_u64 timeslice_us NV_ALIGN8;
};

struct nva06c_ctrl_interleave_level_params {
	nv_u32 tsg_interleave_level;
};

/* Controls that change the whole GPU; flags from src/nvidia/generated/g_*_nvoc.c
 * (ctrl0000gpu.h, ctrl0080gpu.h, ctrl2080gpu.h, ctrl2080perf.h, ctrl2080fifo.h) */
#define NV0000_CTRL_CMD_GPU_MODIFY_DRAIN_STATE		0x00000278
#define NV0080_CTRL_CMD_GPU_MODIFY_SW_STATE_PERSISTENCE	0x00800287
#define NV2080_CTRL_CMD_GPU_SET_POWER			0x20800112
#define NV2080_CTRL_CMD_GPU_SET_COMPUTE_MODE_RULES	0x20800130
#define NV2080_CTRL_CMD_GPU_SET_ECC_CONFIGURATION	0x20800134
#define NV2080_CTRL_CMD_GPU_RESET_ECC_ERROR_STATUS	0x20800136
#define NV2080_CTRL_CMD_GPU_SET_PARTITIONS		0x20800174
#define NV2080_CTRL_CMD_PERF_SET_POWERSTATE		0x2080205b
#define NV2080_CTRL_CMD_PERF_RATED_TDP_SET_CONTROL	0x2080206f
#define NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS_FOR_KEY_ROTATION	0x2080111a
#define NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS_FOR_KEY_ROTATION_V2 0x2080111b
#define NV0080_CTRL_CMD_BIF_RESET			0x00800102
#define NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_RESET	0x208001a9
#define NV2080_CTRL_CMD_GPU_UNMARK_DEVICE_FOR_RESET	0x208001aa
#define NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_DRAIN_AND_RESET	0x208001ac
#define NV2080_CTRL_CMD_GPU_UNMARK_DEVICE_FOR_DRAIN_AND_RESET	0x208001ad
/* controls that export / import RM objects through file descriptors (ctrl0000unix.h) */
#define NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD	0x00003d05
#define NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD	0x00003d06
#define NV0000_CTRL_CMD_OS_UNIX_CREATE_EXPORT_OBJECT_FD	0x00003d0a
#define NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD	0x00003d0b
#define NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD	0x00003d0c
#define NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO	0x00003d08
#define NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM	1
#define NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_FLAGS_EMPTY_FD	0x1
#define NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_MAX_OBJECTS	512
#define NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_TO_FD_MAX_OBJECTS	128
#define NV0000_OS_UNIX_EXPORT_OBJECT_FD_BUFFER_SIZE	64
#define NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_NONE	0
#define NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_VIDMEM	1
#define NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_SYSMEM	2

/* NV0000_CTRL_OS_UNIX_EXPORT_OBJECT: type, then the RM object (ctrl0000unix.h) */
struct nv0000_os_unix_export_object {
	nv_u32 type;
	nv_handle h_device;
	nv_handle h_parent;
	nv_handle h_object;
};

/* NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_PARAMS, 24 bytes */
struct nv0000_export_object_to_fd_params {
	struct nv0000_os_unix_export_object object;
	nv_s32 fd;		/* a nvidiactl file to hold the export */
	nv_u32 flags;
};

/* NV0000_CTRL_OS_UNIX_IMPORT_OBJECT_FROM_FD_PARAMS, 20 bytes */
struct nv0000_import_object_from_fd_params {
	nv_s32 fd;
	struct nv0000_os_unix_export_object object;	/* h_parent, h_object: where it goes */
};

/* NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS, 80 bytes */
struct nv0000_get_export_object_info_params {
	nv_s32 fd;
	nv_u32 device_instance;
	nv_u32 gpu_instance_id;
	nv_u16 max_objects;
	nv_u8 metadata[NV0000_OS_UNIX_EXPORT_OBJECT_FD_BUFFER_SIZE];
};

/* NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_PARAMS, 2128 bytes */
struct nv0000_export_objects_to_fd_params {
	nv_s32 fd;
	nv_handle h_device;
	nv_u16 max_objects;
	nv_u8 metadata[NV0000_OS_UNIX_EXPORT_OBJECT_FD_BUFFER_SIZE];
	nv_handle objects[NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_MAX_OBJECTS];
	nv_u16 num_objects;
	nv_u16 index;
};

/* NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_FROM_FD_PARAMS, 652 bytes */
struct nv0000_import_objects_from_fd_params {
	nv_s32 fd;
	nv_handle h_parent;
	nv_handle objects[NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_TO_FD_MAX_OBJECTS];
	nv_u8 object_types[NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_TO_FD_MAX_OBJECTS];
	nv_u16 num_objects;
	nv_u16 index;
};
/* RMCTRL_FLAGS_* (src/nvidia/inc/kernel/rmapi/control.h) */
#define RMCTRL_FLAGS_PRIVILEGED		0x4
#define RMCTRL_FLAGS_NON_PRIVILEGED	0x8

/* ---- helpers ---- */
#define NV_IOC_NR(req)		((req) & 0xff)
#define NV_IOC_TYPE(req)	(((req) >> 8) & 0xff)
#define NV_IOC_SIZE(req)	(((req) >> 16) & 0x3fff)

/* ==== appended by the stand-in driver (tests/standin) ==== */
/* more status codes: src/common/sdk/nvidia/inc/nvstatuscodes.h */
#define NV_ERR_ILLEGAL_ACTION			0x16
#define NV_ERR_INSERT_DUPLICATE_NAME		0x19
#define NV_ERR_INSUFFICIENT_RESOURCES		0x1A
#define NV_ERR_INVALID_CHANNEL			0x21
#define NV_ERR_INVALID_ADDRESS			0x1E
#define NV_ERR_INVALID_EVENT			0x28
#define NV_ERR_INVALID_FLAGS			0x29
#define NV_ERR_INVALID_OBJECT_NEW		0x34
#define NV_ERR_UVM_ADDRESS_IN_USE		0x68
#define NV_ERR_GENERIC				0xFFFF

/* more classes seen in the traces: src/common/sdk/nvidia/inc/class/cl*.h */
#define NV01_MEMORY_SYSTEM_OS_DESCRIPTOR	0x0071
#define NV04_DISPLAY_COMMON			0x0073
#define NV2081_BINAPI				0x2081
#define GT200_DEBUGGER				0x83de
#define GF100_SUBDEVICE_MASTER			0x90e6
#define GF100_SUBDEVICE_INFOROM			0x90e7
#define NV_CONFIDENTIAL_COMPUTE			0xcb33
#define HOPPER_USERMODE_A			0xc661
#define AMPERE_SMC_PARTITION_REF		0xc637
#define AMPERE_SMC_EXEC_PARTITION_REF		0xc638
#define AMPERE_SMC_CONFIG_SESSION		0xc639
#define AMPERE_SMC_MONITOR_SESSION		0xc640
#define RM_USER_SHARED_DATA			0x00de

/* kernel-open/common/inc/nv-ioctl-numa.h */
#define NV_IOCTL_NUMA_INFO_MAX_OFFLINE_ADDRESSES	64
struct nv_ioctl_numa_info {	/* _IOWR('F', 0xd7, 560) */
	nv_s32 nid;
	nv_s32 status;
	nv_u64 memblock_size NV_ALIGN8;
	nv_u64 numa_mem_addr NV_ALIGN8;
	nv_u64 numa_mem_size NV_ALIGN8;
	nv_u8 use_auto_online;
	nv_u64 offline_addresses[NV_IOCTL_NUMA_INFO_MAX_OFFLINE_ADDRESSES] NV_ALIGN8;
	nv_u32 offline_num_entries;
};

/* nvos.h NVOS34_PARAMETERS: NV_ESC_RM_UNMAP_MEMORY, _IOWR('F', 0x4f, 32) */
struct nvos34_params {
	nv_handle h_client;
	nv_handle h_device;
	nv_handle h_memory;
	nv_u64 p_linear_address NV_ALIGN8;
	nv_u32 status;
	nv_u32 flags;
};

/* nvos.h NVOS56_PARAMETERS: NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO, _IOWR('F', 0x5e, 40) */
struct nvos56_params {
	nv_handle h_client;
	nv_handle h_device;
	nv_handle h_memory;
	nv_u64 p_old_cpu_address NV_ALIGN8;
	nv_u64 p_new_cpu_address NV_ALIGN8;
	nv_u32 status;
};

/* class/cl0005.h NV0005_ALLOC_PARAMETERS (NV01_EVENT_OS_EVENT, 24 bytes) */
struct nv0005_alloc_params {
	nv_handle h_parent_client;
	nv_handle h_src_resource;
	nv_u32 h_class;
	nv_u32 notify_index;
	nv_u64 data NV_ALIGN8;
};

/*
 * class/cl00f8.h NV00F8_ALLOCATION_PARAMETERS (NV_MEMORY_FABRIC, 48 bytes): a
 * range of the fabric (FLA) address space mapping map.hVidMem, video memory of
 * the caller's own client (mem_mgr/mem_fabric.c memoryfabricConstruct_IMPL);
 * with FLEXIBLE_FLA, no memory until NV00F8_CTRL_CMD_ATTACH_MEM.
 */
#define NV00F8_ALLOC_FLAGS_FLEXIBLE_FLA	0x1
struct nv00f8_alloc_params {
	nv_u64 alignment NV_ALIGN8;
	nv_u64 alloc_size NV_ALIGN8;
	nv_u64 page_size NV_ALIGN8;
	nv_u32 alloc_flags;
	nv_u32 pad0;
	nv_u64 map_offset NV_ALIGN8;
	nv_handle map_h_vid_mem;
	nv_u32 map_flags;
};

/* class/cl83de.h NV83DE_ALLOC_PARAMETERS (GT200_DEBUGGER, 12 bytes) */
struct nv83de_alloc_params {
	nv_handle h_debugger_client_obsolete;
	nv_handle h_app_client;
	nv_handle h_class_3d_object;
};

/* class/cl0080.h NV0080_ALLOC_PARAMETERS (56 bytes) */
struct nv0080_alloc_params {
	nv_u32 device_id;
	nv_handle h_client_share;
	nv_handle h_target_client;
	nv_handle h_target_device;
	nv_u32 flags;
	nv_u64 va_space_size NV_ALIGN8;
	nv_u64 va_start_internal NV_ALIGN8;
	nv_u64 va_limit_internal NV_ALIGN8;
	nv_u32 va_mode;
};

/* class/cl2080.h NV2080_ALLOC_PARAMETERS */
struct nv2080_alloc_params {
	nv_u32 sub_device_id;
};

/* more controls (tests/standin): src/common/sdk/nvidia/inc/ctrl/ */
/* ctrl2080/ctrl2080fb.h */
#define NV2080_CTRL_FB_INFO_INDEX_NUMA_NODE_ID		0x3B
#define NV2080_CTRL_FB_INFO_INDEX_MAX			NV2080_CTRL_FB_INFO_INDEX_NUMA_NODE_ID

/* ctrl0000/ctrl0000client.h */
#define NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE		0xd01
#define NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE_INVALID	0
#define NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE_SYSMEM	1
#define NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE_VIDMEM	2
#define NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE_REGMEM	3
struct nv0000_ctrl_client_get_addr_space_type_params {
	nv_handle h_object;
	nv_u32 map_flags;
	nv_u32 addr_space_type;
};

#define NV0000_CTRL_CMD_CLIENT_SET_INHERITED_SHARE_POLICY	0xd04
#define NV0000_CTRL_CMD_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL	0xd08
#define NV0000_CTRL_CLIENT_SET_INHERITED_SHARE_POLICY_PARAMS_SIZE 12	/* RS_SHARE_POLICY */

/* ctrl0080/ctrl0080gpu.h */
#define NV0080_CTRL_CMD_GPU_GET_NUM_SUBDEVICES		0x800280
struct nv0080_ctrl_gpu_get_num_subdevices_params {
	nv_u32 num_subdevices;
};

/* ctrl2080/ctrl2080mc.h */
#define NV2080_CTRL_CMD_MC_GET_ARCH_INFO			0x20801701
#define NV2080_CTRL_MC_ARCH_INFO_ARCHITECTURE_GH100		0x180
#define NV2080_CTRL_MC_ARCH_INFO_IMPLEMENTATION_GH100		0x0
struct nv2080_ctrl_mc_get_arch_info_params {	/* 16 bytes */
	nv_u32 architecture;
	nv_u32 implementation;
	nv_u32 revision;
	nv_u8 sub_revision;
};

/* ctrl2080/ctrl2080gpu.h engine types */
#define NV2080_ENGINE_TYPE_GR0		0x01
#define NV2080_ENGINE_TYPE_COPY0	0x09
#define NV2080_ENGINE_TYPE_NVDEC0	0x13
#define NV2080_ENGINE_TYPE_NVENC2	0x1d
#define NV2080_ENGINE_TYPE_NVJPEG0	0x2b
#define NV2080_ENGINE_TYPE_OFA0		0x33
#define NV2080_ENGINE_TYPE_OFA1		0x3e
#define NV2080_ENGINE_TYPE_NVENC3	0x3f

/* ctrl906f.h */
#define NV906F_CTRL_CMD_GET_CLASS_ENGINEID	0x906f0101
struct nv906f_ctrl_get_class_engineid_params {
	nv_handle h_object;
	nv_u32 class_engine_id;
	nv_u32 class_id;
	nv_u32 engine_id;
};

/* ctrlc36f.h: NvU32 workSubmitToken */
#define NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN	0xc36f0108

/* ---- nvidia-uvm: kernel-open/nvidia-uvm/uvm_ioctl.h, uvm_linux_ioctl.h ----
 * The request is the bare command number (no _IOC encoding); the argument
 * is a pointer to the command's params struct; status is its rmStatus. */
#define UVM_INITIALIZE				0x30000001
#define UVM_DEINITIALIZE			0x30000002
#define UVM_CREATE_RANGE_GROUP			23
#define UVM_DESTROY_RANGE_GROUP			24
#define UVM_REGISTER_GPU_VASPACE		25
#define UVM_REGISTER_CHANNEL			27
#define UVM_UNREGISTER_CHANNEL			28
#define UVM_MAP_EXTERNAL_ALLOCATION		33
#define UVM_FREE				34
#define UVM_REGISTER_GPU			37
#define UVM_PAGEABLE_MEM_ACCESS			39
#define UVM_MAP_DYNAMIC_PARALLELISM_REGION	65
#define UVM_UNMAP_EXTERNAL			66
#define UVM_ALLOC_SEMAPHORE_POOL		68
#define UVM_VALIDATE_VA_RANGE			72
#define UVM_CREATE_EXTERNAL_RANGE		73
#define UVM_MM_INITIALIZE			75
#define UVM_INIT_FLAGS_MASK			0x3ULL
#define UVM_MAX_GPUS				256	/* NV_MAX_DEVICES * 8 (uvm_types.h) */

struct nv_processor_uuid {
	nv_u8 uuid[16];
};

/* uvm_types.h UvmGpuMappingAttributes: 36 bytes */
struct uvm_gpu_mapping_attributes {
	struct nv_processor_uuid gpu_uuid;
	nv_u32 gpu_mapping_type;
	nv_u32 gpu_caching_type;
	nv_u32 gpu_format_type;
	nv_u32 gpu_element_bits;
	nv_u32 gpu_compression_type;
};

struct uvm_initialize_params {		/* 16 */
	nv_u64 flags NV_ALIGN8;
	nv_u32 rm_status;
};

struct uvm_range_group_params {		/* 16: CREATE/DESTROY_RANGE_GROUP */
	nv_u64 range_group_id NV_ALIGN8;
	nv_u32 rm_status;
};

struct uvm_register_gpu_vaspace_params {	/* 32 */
	struct nv_processor_uuid gpu_uuid;
	nv_s32 rm_ctrl_fd;
	nv_handle h_client;
	nv_handle h_va_space;
	nv_u32 rm_status;
};

struct uvm_register_channel_params {	/* 56 */
	struct nv_processor_uuid gpu_uuid;
	nv_s32 rm_ctrl_fd;
	nv_handle h_client;
	nv_handle h_channel;
	nv_u64 base NV_ALIGN8;
	nv_u64 length NV_ALIGN8;
	nv_u32 rm_status;
};

struct uvm_unregister_channel_params {	/* 28 */
	struct nv_processor_uuid gpu_uuid;
	nv_handle h_client;
	nv_handle h_channel;
	nv_u32 rm_status;
};

struct uvm_map_external_allocation_params {	/* 9264 */
	nv_u64 base NV_ALIGN8;
	nv_u64 length NV_ALIGN8;
	nv_u64 offset NV_ALIGN8;
	struct uvm_gpu_mapping_attributes per_gpu_attributes[UVM_MAX_GPUS];
	nv_u64 gpu_attributes_count NV_ALIGN8;
	nv_s32 rm_ctrl_fd;
	nv_u32 h_client;
	nv_u32 h_memory;
	nv_u32 rm_status;
};

/*
 * What follows the per-GPU array of UVM_MAP_EXTERNAL_ALLOCATION_PARAMS and
 * UVM_ALLOC_SEMAPHORE_POOL_PARAMS: at nvrm_table.uvm_map_external_tail and
 * .uvm_semaphore_pool_tail, since the array's length (UVM_MAX_GPUS) is 32 on
 * 535 and 256 from 550 on.
 */
struct uvm_map_external_allocation_tail {
	nv_u64 gpu_attributes_count NV_ALIGN8;
	nv_s32 rm_ctrl_fd;
	nv_u32 h_client;
	nv_u32 h_memory;
	nv_u32 rm_status;
};

struct uvm_alloc_semaphore_pool_tail {
	nv_u64 gpu_attributes_count NV_ALIGN8;
	nv_u32 rm_status;
};

struct uvm_range_params {	/* 24: FREE, VALIDATE_VA_RANGE, CREATE_EXTERNAL_RANGE */
	nv_u64 base NV_ALIGN8;
	nv_u64 length NV_ALIGN8;
	nv_u32 rm_status;
};

struct uvm_unmap_external_params {	/* 40 */
	nv_u64 base NV_ALIGN8;
	nv_u64 length NV_ALIGN8;
	struct nv_processor_uuid gpu_uuid;
	nv_u32 rm_status;
};

struct uvm_register_gpu_params {	/* 40 */
	struct nv_processor_uuid gpu_uuid;
	nv_u8 numa_enabled;
	nv_s32 numa_node_id;
	nv_s32 rm_ctrl_fd;
	nv_handle h_client;
	nv_handle h_smc_part_ref;
	nv_u32 rm_status;
};

struct uvm_pageable_mem_access_params {	/* 8 */
	nv_u8 pageable_mem_access;
	nv_u32 rm_status;
};

struct uvm_map_dynamic_parallelism_region_params {	/* 40 */
	nv_u64 base NV_ALIGN8;
	nv_u64 length NV_ALIGN8;
	struct nv_processor_uuid gpu_uuid;
	nv_u32 rm_status;
};

struct uvm_alloc_semaphore_pool_params {	/* 9248 */
	nv_u64 base NV_ALIGN8;
	nv_u64 length NV_ALIGN8;
	struct uvm_gpu_mapping_attributes per_gpu_attributes[UVM_MAX_GPUS];
	nv_u64 gpu_attributes_count NV_ALIGN8;
	nv_u32 rm_status;
};

struct uvm_mm_initialize_params {	/* 8 */
	nv_s32 uvm_fd;
	nv_u32 rm_status;
};

/* ctrl503c.h (NV50_THIRD_PARTY_P2P), tests/standin */
#define NV503C_CTRL_CMD_REGISTER_VA_SPACE	0x503c0102
#define NV503C_CTRL_CMD_REGISTER_VIDMEM		0x503c0104
#define NV503C_CTRL_CMD_UNREGISTER_VIDMEM	0x503c0105
struct nv503c_ctrl_register_va_space_params {	/* 16 */
	nv_handle h_va_space;
	nv_u64 va_space_token NV_ALIGN8;
};

struct nv503c_ctrl_register_vidmem_params {	/* 32 */
	nv_handle h_memory;
	nv_u64 address NV_ALIGN8;
	nv_u64 size NV_ALIGN8;
	nv_u64 offset NV_ALIGN8;
};

struct nv503c_ctrl_unregister_vidmem_params {	/* 4 */
	nv_handle h_memory;
};

/* ctrl0080/ctrl0080fifo.h: user pointers to numChannels NvU32 each */
#define NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST	0x80170d
struct nv0080_ctrl_fifo_get_channellist_params {	/* 24 */
	nv_u32 num_channels;
	nv_u64 p_channel_handle_list NV_ALIGN8;
	nv_u64 p_channel_list NV_ALIGN8;
};

/* ctrl0000/ctrl0000gpu.h (tests/standin) */
#define NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS	0x201
#define NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2	0x205
#define NV0000_CTRL_CMD_GPU_GET_PROBED_IDS	0x214
#define NV0000_CTRL_GPU_MAX_ATTACHED_GPUS	32
#define NV0000_CTRL_GPU_MAX_PROBED_GPUS		32
#define NV0000_CTRL_GPU_INVALID_ID		0xffffffff
#define NV0000_CTRL_SLI_STATUS_INVALID_GPU_COUNT	0x01
#define NV0000_CTRL_SLI_STATUS_GPU_NOT_SUPPORTED	0x40
struct nv0000_ctrl_gpu_get_attached_ids_params {	/* 128 */
	nv_u32 gpu_ids[NV0000_CTRL_GPU_MAX_ATTACHED_GPUS];
};

struct nv0000_ctrl_gpu_get_probed_ids_params {		/* 384 */
	nv_u32 gpu_ids[NV0000_CTRL_GPU_MAX_PROBED_GPUS];
	nv_u32 excluded_gpu_ids[NV0000_CTRL_GPU_MAX_PROBED_GPUS];
	nv_u32 gpu_flags[NV0000_CTRL_GPU_MAX_PROBED_GPUS];
};

struct nv0000_ctrl_gpu_get_id_info_v2_params {		/* 32 */
	nv_u32 gpu_id;
	nv_u32 gpu_flags;
	nv_u32 device_instance;
	nv_u32 sub_device_instance;
	nv_u32 sli_status;
	nv_u32 board_id;
	nv_u32 gpu_instance;
	nv_s32 numa_id;
};

/* ctrl2080/ctrl2080gpu.h, ctrl2080gr.h (tests/standin) */
#define NV2080_CTRL_CMD_GPU_GET_NAME_STRING		0x20800110
#define NV2080_GPU_MAX_NAME_STRING_LENGTH		0x40
#define NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_ASCII	0
#define NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_UNICODE	1
struct nv2080_ctrl_gpu_get_name_string_params {	/* 132 */
	nv_u32 gpu_name_string_flags;
	union {
		nv_u8 ascii[NV2080_GPU_MAX_NAME_STRING_LENGTH];
		nv_u16 unicode[NV2080_GPU_MAX_NAME_STRING_LENGTH];
	} gpu_name_string;
};

#define NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE		0x20801218
struct nv2080_ctrl_gr_get_ctx_buffer_size_params {	/* 16 */
	nv_handle h_channel;
	nv_u64 total_buffer_size NV_ALIGN8;
};

/* ctrl2080/ctrl2080gr.h GPC/TPC masks; NV2080_CTRL_GR_ROUTE_INFO is 16 bytes (tests/standin) */
#define NV2080_CTRL_CMD_GR_GET_GPC_MASK		0x2080122a
#define NV2080_CTRL_CMD_GR_GET_TPC_MASK		0x2080122b
struct nv2080_ctrl_gr_route_info {
	nv_u32 flags;
	nv_u64 route NV_ALIGN8;
};

struct nv2080_ctrl_gr_get_gpc_mask_params {	/* 24 */
	struct nv2080_ctrl_gr_route_info gr_route_info;
	nv_u32 gpc_mask;
};

struct nv2080_ctrl_gr_get_tpc_mask_params {	/* 24 */
	struct nv2080_ctrl_gr_route_info gr_route_info;
	nv_u32 gpc_id;
	nv_u32 tpc_mask;
};

/* ctrl2080/ctrl2080bus.h, ctrl0080/ctrl0080gpu.h (tests/standin) */
#define NV2080_CTRL_CMD_BUS_GET_PCI_INFO		0x20801801
struct nv2080_ctrl_bus_get_pci_info_params {	/* 16 */
	nv_u32 pci_device_id;		/* (device << 16) | vendor */
	nv_u32 pci_sub_system_id;
	nv_u32 pci_revision_id;
	nv_u32 pci_ext_device_id;
};

#define NV0080_CTRL_CMD_GPU_GET_VIRTUALIZATION_MODE	0x800289
#define NV0080_CTRL_GPU_VIRTUALIZATION_MODE_NONE	0
struct nv0080_ctrl_gpu_get_virtualization_mode_params {	/* 8 */
	nv_u32 virtualization_mode;
	nv_u8 is_grid_build;
};


/*
 * ---- video memory allocation attributes: src/common/sdk/nvidia/inc/nvos.h ----
 * Used by the quota's page-size bound (quota.c) and the stand-in's rounding. "The
 * default huge page is 2MB, so a request with _DEFAULT set will always be
 * interpreted as 2MB" (attr2); mem_mgr/mem.c memConstructCommon maps 512MB, 256GB.
 */
#define NV_ERR_INVALID_OWNER			0x39
#define NVOS32_ATTR_PAGE_SIZE_SHIFT		23	/* NVOS32_ATTR_PAGE_SIZE 24:23 */
#define NVOS32_ATTR_PAGE_SIZE_MASK		(0x3u << 23)
#define NVOS32_ATTR_PAGE_SIZE_DEFAULT		0
#define NVOS32_ATTR_PAGE_SIZE_4KB		1
#define NVOS32_ATTR_PAGE_SIZE_BIG		2
#define NVOS32_ATTR_PAGE_SIZE_HUGE		3
#define NVOS32_ATTR_LOCATION_SHIFT		25	/* NVOS32_ATTR_LOCATION 26:25 */
#define NVOS32_ATTR_LOCATION_MASK		(0x3u << 25)
#define NVOS32_ATTR_LOCATION_VIDMEM		0
#define NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT	20	/* NVOS32_ATTR2_PAGE_SIZE_HUGE 21:20 */
#define NVOS32_ATTR2_PAGE_SIZE_HUGE_MASK	(0x3u << 20)
#define NVOS32_ATTR2_PAGE_SIZE_HUGE_DEFAULT	0
#define NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB		1
#define NVOS32_ATTR2_PAGE_SIZE_HUGE_512MB	2
#define NVOS32_ATTR2_PAGE_SIZE_HUGE_256GB	3
#define NVOS32_ATTR2_MEMORY_PROTECTION_SHIFT	25	/* NVOS32_ATTR2_MEMORY_PROTECTION 26:25 */
#define NVOS32_ATTR2_MEMORY_PROTECTION_MASK	(0x3u << 25)
#define NVOS32_ATTR2_MEMORY_PROTECTION_PROTECTED 1
#define NVOS32_ATTR_COMPR_SHIFT			12	/* NVOS32_ATTR_COMPR 13:12 */
#define NVOS32_ATTR_COMPR_MASK			(0x3u << 12)
#define NVOS32_ATTR_COMPR_NONE			0
#define NVOS32_ALLOC_FLAGS_FIXED_ADDRESS_ALLOCATE	0x00000010
#define NVOS32_ALLOC_FLAGS_ALIGNMENT_HINT	0x00000080
#define NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE	0x00000100
#define NVOS32_ALLOC_FLAGS_VIRTUAL		0x00080000
/* src/nvidia/generated/g_heap_nvoc.h: owners RM keeps for itself */
#define HEAP_OWNER_RM_SCRATCH_BEGIN		0xDEAF0000
#define HEAP_OWNER_RM_SCRATCH_END		(HEAP_OWNER_RM_SCRATCH_BEGIN + 3)

/* ctrl2080/ctrl2080gpu.h GET_PIDS id types; class/cl900e.h (tests/standin) */
#define NV2080_CTRL_GPU_GET_PIDS_ID_TYPE_CLASS		0
#define NV2080_CTRL_GPU_GET_PIDS_ID_TYPE_VGPU_GUEST	1
#define MPS_COMPUTE					0x900e

/* uvm_types.h (tests/standin) */
#define UVM_INIT_FLAGS_DISABLE_HMM			0x1ULL
#define UVM_INIT_FLAGS_MULTI_PROCESS_SHARING_MODE	0x2ULL

#endif /* GPUSLICE_NVRM_ABI_H */
