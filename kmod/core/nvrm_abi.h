/* SPDX-License-Identifier: MIT */
/*
 * nvrm_abi.h - the NVIDIA Resource Manager (RM) user ABI that gpuslice decodes.
 *
 * This is the ONE place the project spells out NVIDIA's ioctl numbers, struct
 * layouts, classes, control commands and status codes. Everything here is copied
 * (layouts and values only) from NVIDIA's open-gpu-kernel-modules, branch 580
 * (580.142; the traces in ../shared/traces were taken on 580.159.04), MIT licensed.
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

/* Driver version this ABI is checked against (see docs/architecture.md). */
#define NVRM_TESTED_VERSIONS "580.159.04", "580.142"

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
#define NV_ERR_INVALID_POINTER			0x3D
#define NV_ERR_INVALID_REQUEST			0x3F
#define NV_ERR_INVALID_STATE			0x40
#define NV_ERR_NO_MEMORY			0x51
#define NV_ERR_NOT_SUPPORTED			0x56
#define NV_ERR_OBJECT_NOT_FOUND			0x57
#define NV_ERR_OPERATING_SYSTEM			0x59
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
#define NV01_EVENT_OS_EVENT		0x0079
#define NV01_MEMORY_LIST_FBMEM		0x0082
#define NV01_MEMORY_LOCAL_PHYSICAL	0x00c2
#define NV01_MEMORY_FLA			0x00f3
#define NV_MEMORY_FABRIC		0x00f8
#define NV_MEMORY_MULTICAST_FABRIC	0x00fd
#define NV50_MEMORY_VIRTUAL		0x50a0
#define NV50_THIRD_PARTY_P2P		0x503c
#define FERMI_CONTEXT_SHARE_A		0x9067
#define FERMI_VASPACE_A			0x90f1
#define KEPLER_CHANNEL_GROUP_A		0xa06c
#define HOPPER_CHANNEL_GPFIFO_A		0xc86f
#define HOPPER_DMA_COPY_A		0xc8b5
#define HOPPER_COMPUTE_A		0xcbc0

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

/* ---- controls: src/common/sdk/nvidia/inc/ctrl/ ---- */
/* ctrl2080/ctrl2080fb.h */
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
struct nva06c_ctrl_gpfifo_schedule_params {	/* NVA06F_CTRL_GPFIFO_SCHEDULE_PARAMS */
	nv_u8 b_enable;
	nv_u8 b_skip_submit;
	nv_u8 b_skip_enable;
};

struct nva06c_ctrl_timeslice_params {
	nv_u64 timeslice_us NV_ALIGN8;
};

/* ---- helpers ---- */
#define NV_IOC_NR(req)		((req) & 0xff)
#define NV_IOC_TYPE(req)	(((req) >> 8) & 0xff)
#define NV_IOC_SIZE(req)	(((req) >> 16) & 0x3fff)

#endif /* GPUSLICE_NVRM_ABI_H */
