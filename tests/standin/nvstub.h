/* SPDX-License-Identifier: GPL-2.0 */
/*
 * nvstub.h - internal interfaces of the nvstub stand-in driver (a TEST DOUBLE
 * of nvidia.ko + nvidia-uvm.ko, see README.md).
 *
 * Locking: one mutex, nvstub_lock, guards every RM object, the memory pool,
 * every file's RM state and the engine's queues (like RM's API lock).
 * RM_ALLOC and RM_CONTROL read their nested params before taking it, as RM
 * does (nvstub_esc_alloc(), nvstub_esc_control()). Each nvidia-uvm file has
 * a mutex of its own (its VA space, nvstub_uvm.c), taken before nvstub_lock
 * when both are held; neither is held across a copy to or from user space.
 */
#ifndef NVSTUB_H
#define NVSTUB_H

#include <linux/fs.h>
#include <linux/seq_file.h>
#include <linux/spinlock.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/xarray.h>
#include <linux/types.h>

/* NVIDIA's values and layouts, from its headers (abi/nvidia/): scripts/nvrm-abi.py standin */
#include "nvstub_abi.h"

#define NVSTUB_MAX_GPUS	8
#define NVSTUB_FIRST_SLOT	6
#define NVSTUB_PCI_VENDOR	0x10de
#define NVSTUB_PCI_DEVICE	0x2330	/* H100 SXM5 80GB */
#define NVSTUB_PCI_REVISION	0xa1

/* RM's gpuId of simulated GPU i: (domain << 16) | (bus << 8) | slot, as in the traces */
static inline u32 nvstub_gpu_id(unsigned int i)
{
	return NVSTUB_FIRST_SLOT + i;
}

/*
 * A simulated GPU's UUID (RM's SHA-1 GID, 16 bytes: gpu.c gpuGetGidInfo_IMPL),
 * as NV2080_CTRL_CMD_GPU_GET_GID_INFO reports it and nvidia-uvm takes it:
 * "nvstub" then zeros, the GPU's index in the last byte
 * (GPU-6e767374-7562-0000-0000-0000000000NN). nvstub_main.c.
 */
#define NVSTUB_UUID_LEN		16
void nvstub_gpu_uuid(unsigned int gpu, u8 *uuid);
int nvstub_gpu_by_uuid(const u8 *uuid);		/* the GPU's index, or -1 */

/*
 * The heap owners RM keeps for itself: RM's own header, not the user ABI
 * (580 src/nvidia/generated/g_heap_nvoc.h), so not among the vendored headers.
 */
#define HEAP_OWNER_RM_SCRATCH_BEGIN	0xDEAF0000
#define HEAP_OWNER_RM_SCRATCH_END	(HEAP_OWNER_RM_SCRATCH_BEGIN + 3)

/*
 * NV2080_CTRL_CMD_GPU_GET_GID_INFO (580 src/common/sdk/nvidia/inc/ctrl/
 * ctrl2080/ctrl2080gpu.h NV2080_CTRL_GPU_GET_GID_INFO_PARAMS, 268 bytes).
 */
#define NVSTUB_GID_MAX_LENGTH			0x100	/* NV2080_GPU_MAX_GID_LENGTH */
#define NVSTUB_GID_FLAGS_FORMAT_MASK		0x3	/* _FORMAT 1:0 */
#define NVSTUB_GID_FLAGS_FORMAT_BINARY		0x2
#define NVSTUB_GID_FLAGS_TYPE_MASK		0x4	/* _TYPE 2:2, SHA1 = 0 */
#define NVSTUB_GID_STR_LEN			41	/* NV_UUID_STR_LEN: "GPU-" + 36 + NUL */
struct nvstub_gid_info_params {
	nv_u32 index;
	nv_u32 flags;
	nv_u32 length;
	nv_u8 data[NVSTUB_GID_MAX_LENGTH];
};

/*
 * Graphics and video (580 src/common/sdk/nvidia/inc/): parameter sizes of
 * the classes nvstub_rm.c allocates (rmapi/resource_list.h names the
 * structure of each).
 */
#define NVSTUB_TSG_PARAMS_SIZE			20	/* nvos.h NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS */
#define NVSTUB_CTXSHARE_PARAMS_SIZE		12	/* nvos.h NV_CTXSHARE_ALLOCATION_PARAMETERS */
#define NVSTUB_CONTEXT_DMA_PARAMS_SIZE		32	/* nvos.h NV_CONTEXT_DMA_ALLOCATION_PARAMS */
#define NVSTUB_SEMAPHORE_SURFACE_PARAMS_SIZE	16	/* cl00da.h NV_SEMAPHORE_SURFACE_ALLOC_PARAMETERS */
#define NVSTUB_MEMORY_MAPPER_PARAMS_SIZE	24	/* cl00fe.h NV_MEMORY_MAPPER_ALLOCATION_PARAMS */
#define NVSTUB_GR_ALLOC_PARAMS_SIZE		16	/* nvos.h NV_GR_ALLOCATION_PARAMETERS */
#define NVSTUB_MEMORY_VIRTUAL_PARAMS_SIZE	24	/* cl0070.h NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS */
#define NVSTUB_SYSMEM_DYNAMIC_HVASPACE		0xffffffffU	/* NV_MEMORY_VIRTUAL_SYSMEM_DYNAMIC_HVASPACE */
#define NVSTUB_BAR0_SIZE			(16u << 20)	/* register memory: GH100's BAR0 */
struct nvstub_memory_virtual_params {
	u64 offset;
	u64 limit;		/* in/out */
	u32 h_va_space;
	u32 pad;
};

/*
 * NVOS32_PARAMETERS (nvos.h), NV_ESC_RM_VID_HEAP_CONTROL, 184 bytes: the
 * members of the union the stand-in answers. Laid out from nvos.h here,
 * independently of kmod/core's offsets.
 */
struct nvstub_os32_alloc_size {		/* data.AllocSize, data.AllocTiledPitchHeight (TPH) */
	u32 owner, h_memory, type, flags;
	u32 attr;			/* TPH: height */
	u32 format;			/* TPH: pitch */
	u32 compr_covg;			/* TPH: attr */
	u32 zcull_covg;			/* TPH: width */
	u32 partition_stride;		/* TPH: format */
	u32 width;			/* TPH: comprCovg */
	u32 height;			/* TPH: zcullCovg */
	u32 pad;			/* TPH: partitionStride */
	u64 size, alignment, offset, limit, address, range_begin, range_end;
	u32 attr2, ctag_offset;
	s32 numa_node;
};
struct nvstub_os32_alloc_range {	/* data.AllocSizeRange */
	u32 owner, h_memory, type, flags, attr, format, compr_covg, zcull_covg, partition_stride, pad;
	u64 size, alignment, offset, limit, range_begin, range_end, address;
	u32 attr2, ctag_offset;
	s32 numa_node;
};
struct nvstub_os32_align {		/* data.AllocHintAlignment */
	u32 type, attr, input_flags, pad0;
	u64 size;
	u32 height, width, pitch, pad, mask, kind, adjust, attr2;
};
struct nvstub_os32 {
	u32 h_root, h_object_parent, function, h_va_space;
	s16 ivc_heap_number;
	u16 pad0;
	u32 status;
	u64 total, free;
	union {
		struct nvstub_os32_alloc_size size;
		struct nvstub_os32_alloc_range range;
		struct { u32 owner, h_memory, flags; } free;
		struct { u32 attr, pad; u64 offset, size, base; } info;
		struct nvstub_os32_align align;
		u8 raw[144];
	} data;
};
#define NVSTUB_OS32_ALLOC_SIZE			2
#define NVSTUB_OS32_FREE			3
#define NVSTUB_OS32_INFO			5
#define NVSTUB_OS32_ALLOC_TILED_PITCH_HEIGHT	6
#define NVSTUB_OS32_ALLOC_SIZE_RANGE		14
#define NVSTUB_OS32_GET_MEM_ALIGNMENT		18
#define NVSTUB_OS32_IVC_HEAP_DONT_ALLOCATE	0	/* NVOS32_IVC_HEAP_NUMBER_DONT_ALLOCATE_ON_IVC_HEAP */
#define NVSTUB_OS32_FLAGS_HANDLE_PROVIDED	0x00004000	/* NVOS32_ALLOC_FLAGS_MEMORY_HANDLE_PROVIDED */
#define NVSTUB_OS32_FLAGS_USE_BEGIN_END		0x00020000	/* NVOS32_ALLOC_FLAGS_USE_BEGIN_END */
#define NVSTUB_OS32_FLAGS_VIRTUAL		0x00080000	/* NVOS32_ALLOC_FLAGS_VIRTUAL */
#define NVSTUB_OS32_FREE_HANDLE_PROVIDED	0x00000001	/* NVOS32_FREE_FLAGS_MEMORY_HANDLE_PROVIDED */
#define NVSTUB_OS32_ATTR2_USE_EGM		(1u << 24)	/* NVOS32_ATTR2_USE_EGM 24:24 */

/* NVOS30_PARAMETERS, NV_ESC_RM_IDLE_CHANNELS (56 bytes) */
struct nvstub_os30 {
	u32 h_client, h_device, h_channel, num_channels;
	u64 ph_clients, ph_devices, ph_channels;
	u32 flags, timeout, status, pad;
};
/* NVOS39_PARAMETERS, NV_ESC_RM_ALLOC_CONTEXT_DMA2 (56 bytes) */
struct nvstub_os39 {
	u32 h_object_parent, h_subdevice, h_object_new, h_class, flags, selector, h_memory, pad;
	u64 offset, limit;
	u32 status, pad1;
};
/* NVOS46_PARAMETERS, NV_ESC_RM_MAP_MEMORY_DMA (64 bytes) */
struct nvstub_os46 {
	u32 h_client, h_device, h_dma, h_memory;
	u64 offset, length;
	u32 flags, flags2, kind_override, pad;
	u64 dma_offset;
	u32 status, pad1;
};
/* NVOS47_PARAMETERS, NV_ESC_RM_UNMAP_MEMORY_DMA (48 bytes) */
struct nvstub_os47 {
	u32 h_client, h_device, h_dma, h_memory, flags, pad;
	u64 dma_offset, size;
	u32 status, pad1;
};

/* 535's NV0000_CTRL_OS_UNIX_GET_EXPORT_OBJECT_INFO_PARAMS (ctrl0000unix.h): no
 * gpuInstanceId, 76 bytes */
struct nvstub_export_info_535 {
	s32 fd;
	u32 device_instance;
	u16 max_objects;
	u8 metadata[NV0000_OS_UNIX_EXPORT_OBJECT_FD_BUFFER_SIZE];
};

/* NVA06F_CTRL_GPFIFO_SCHEDULE_PARAMS (ctrla06fgpfifo.h): three NvBool */
#define NVSTUB_A06F_SCHEDULE_PARAMS_SIZE	3

/*
 * nvstub_tables.c asserts each value and layout above against NVIDIA's headers
 * (abi/nvidia/, scripts/nvrm-abi.py standin: STANDIN_OWN).
 */

extern int nvstub_num_gpus;
extern unsigned int nvstub_fb_mib;
extern char *nvstub_version;
extern const struct nvstub_table *nvstub_abi;
extern unsigned int nvstub_race_delay_us;
extern struct mutex nvstub_lock;
extern const struct file_operations nvstub_fops;
extern struct class *nvstub_class;

/* One open file of nvidiactl or nvidiaN (private_data). */
struct nvstub_file {
	struct file *filp;
	unsigned int minor;		/* 0..N-1, or 255 for nvidiactl */
	struct nvstub_file *ctl;	/* set by REGISTER_FD */
	struct file *ctl_filp;		/* reference held on ctl's file */
	/*
	 * The pending mmap context (nv-usermap.c nv_add_mapping_context_to_file).
	 * Guarded by map_lock, not nvstub_lock: mmap() runs under mmap_lock and
	 * ioctls touch user memory (mmap_lock) while holding nvstub_lock.
	 */
	spinlock_t map_lock;
	bool map_valid;
	bool map_vid;
	u64 map_size;
	struct page *map_userd;		/* the page of a channel's USERD, else NULL */
	/*
	 * Objects exported to this file (nv.h nv_file_private_t: handles,
	 * maxHandles, deviceInstance, metadata), nvstub_export.c; freed with
	 * the file.
	 */
	bool attached;			/* NV_ESC_ATTACH_GPUS_TO_FD done (nvlfp->attached_gpus) */
	u32 *exp_handles;
	u16 exp_max;
	u32 exp_dev_inst;
	u8 exp_meta[64];
};

static inline bool nvstub_is_ctl(const struct nvstub_file *nf)
{
	return nf->minor == NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE;
}

/* The file whose clients this file acts for (escape.c: secInfo.clientOSInfo). */
static inline struct nvstub_file *nvstub_owner(struct nvstub_file *nf)
{
	return nf->ctl ? nf->ctl : nf;
}

struct nvstub_file *nvstub_get_file(int fd, bool ctl, struct file **filp);

struct nvstub_client;
struct nvstub_tsg;
struct nvstub_chan;

/*
 * Pool-backed memory shared by an object and its duplicates, as RM's
 * MEMORY_DESCRIPTOR is (src/nvidia/src/kernel/mem_mgr/mem.c): the pages go
 * back to the pool when the last duplicate is freed.
 */
struct nvstub_memdesc {
	struct list_head dups;		/* nvstub_obj.dup_node, in RM's dup-list order */
	unsigned int dup_count;		/* MEMORY_DESCRIPTOR.DupCount (+ UVM's holds) */
	unsigned int gpu;
	u64 charged;			/* bytes taken from the GPU's pool (PMA pages) */
	u64 page_size;			/* memdescGetPageSize(AT_GPU) */
};

/* the dependencies an object of the modelled classes can have (a channel's three) */
#define NVSTUB_MAX_DEPS	3

/* An RM object: a node of a client's tree. */
struct nvstub_obj {
	u32 handle;
	u32 cls;
	struct nvstub_client *client;
	struct nvstub_obj *parent;
	struct list_head children;
	struct list_head sibling;
	unsigned int gpu;		/* device, subdevice and below */
	u64 mem_size;			/* memory classes: Memory.Length, the reported size */
	bool mem_vid;			/* video memory (mapped through a GPU node) */
	struct nvstub_memdesc *md;	/* pool-backed memory, shared with duplicates */
	struct list_head dup_node;	/* on md->dups */
	bool md_owner;			/* Memory.isMemDescOwner */
	struct nvstub_tsg *tsg;		/* KEPLER_CHANNEL_GROUP_A */
	struct nvstub_chan *chan;	/* HOPPER_CHANNEL_GPFIFO_A */
	u16 share_type;			/* RM_SHARE's last policy (RS_SHARE_TYPE_*), 0: none */
	u32 share_target;
	u32 engine_type;		/* channels: NVA06F_CTRL_CMD_BIND's engine, 0: none */
	/*
	 * resserv's dependants (580.142 src/nvidia/src/libraries/resserv/src/
	 * rs_resource.c:699-716 refAddDependant): the objects this one depends
	 * on (RsResourceRef.depBackRefMap), all of its own client, and how many
	 * depend on it (its depRefMap's size; the dependants are found by
	 * their deps[]). nvstub_rm.c nvstub_obj_free().
	 */
	struct nvstub_obj *deps[NVSTUB_MAX_DEPS];
	unsigned int nr_dependants;
	/*
	 * RsResourceRef.bInvalidated (rs_client.c:840): its destructor ran as a
	 * dependant of a freed object, its handle stays until it is freed.
	 */
	bool invalidated;
	bool on_pending;		/* on a free's pending list (RsClient.pendingFreeList) */
	struct list_head pending;
};

/* src/common/sdk/nvidia/inc/rs_access.h */
#define RS_SHARE_TYPE_ALL		1U
#define RS_SHARE_TYPE_CLIENT		3U
#define RS_SHARE_TYPE_PID		4U
#define RS_SHARE_TYPE_MAX		8U
#define RS_SHARE_ACTION_FLAG_REVOKE	0x1U

struct nvstub_client {
	struct nvstub_obj root;		/* handle == client handle, cls 0x41 */
	struct nvstub_file *owner;
	pid_t pid;			/* RmClient.ProcID: global tgid of the allocator */
	bool admin;			/* rmclientIsAdmin: cached privilege (CAP_SYS_ADMIN at alloc) */
	struct pid *pid_info;		/* RmClient.pOsPidInfo (get_task_pid, TGID) */
	struct xarray objs;		/* handle -> struct nvstub_obj */
	u32 next_handle;
};

void nvstub_client_free_os_events(u32 h_client);

/* nvstub_rm.c */
int nvstub_rm_init(void);
void nvstub_rm_exit(void);
struct nvstub_client *nvstub_client_get(u32 h_client);
struct nvstub_client *nvstub_client_validate(struct nvstub_file *nf, u32 h_client,
					     u32 *status);
struct nvstub_obj *nvstub_obj_get(struct nvstub_client *cl, u32 handle);
struct nvstub_obj *nvstub_obj_ancestor(struct nvstub_obj *obj, u32 cls);
void nvstub_file_free_clients(struct nvstub_file *nf);
int nvstub_esc_alloc(struct nvstub_file *nf, void *arg, u32 size);
int nvstub_esc_free(struct nvstub_file *nf, void *arg, u32 size);
int nvstub_esc_dup(struct nvstub_file *nf, void *arg, u32 size);
int nvstub_esc_share(struct nvstub_file *nf, void *arg, u32 size);
int nvstub_esc_alloc_memory(struct nvstub_file *nf, void *arg, u32 size);
u32 nvstub_rm_dup(struct nvstub_client *cl, struct nvstub_obj *parent, u32 *h,
		  struct nvstub_obj *src);
void nvstub_rm_free_obj(struct nvstub_obj *obj);
struct nvstub_client *nvstub_rm_kernel_client(struct nvstub_file *nf, u32 h);
void nvstub_rm_kernel_client_free(struct nvstub_client *cl);
struct nvstub_obj *nvstub_rm_kernel_obj(struct nvstub_client *cl, struct nvstub_obj *parent,
					u32 cls, unsigned int gpu);
void nvstub_memdesc_hold(struct nvstub_memdesc *md);
/* RmAlloc/RmFree as RM's deprecated wrappers call them (under nvstub_lock) */
u32 nvstub_rm_alloc_locked(struct nvstub_client *cl, u32 h_parent, u32 *h, u32 cls, void *params);
u32 nvstub_rm_free_locked(struct nvstub_client *cl, u32 h);

/* nvstub_legacy.c: the escapes of interface/deprecated/ (under nvstub_lock) */
int nvstub_esc_vid_heap(struct nvstub_file *nf, void *arg, u32 size);
int nvstub_esc_idle_channels(struct nvstub_file *nf, void *arg, u32 size);
int nvstub_esc_ctxdma2(struct nvstub_file *nf, void *arg, u32 size);
int nvstub_esc_map_dma(struct nvstub_file *nf, void *arg, u32 size);
int nvstub_esc_unmap_dma(struct nvstub_file *nf, void *arg, u32 size);
void nvstub_memdesc_release(struct nvstub_memdesc *md);

/* What nvidia-uvm learns of memory it duplicated (nv_uvm_types.h UvmGpuMemoryInfo). */
struct nvstub_uvm_mem_info {
	struct nvstub_memdesc *md;	/* held for UVM, NULL: system memory, nothing pooled */
	unsigned int gpu;		/* the owning GPU (uuid) */
	bool sysmem;
	u64 size;
	u64 page_size;
};
u32 nvstub_rm_uvm_dup_memory(u32 h_client, u32 h_memory, struct nvstub_uvm_mem_info *info);
void nvstub_rm_uvm_free_dup(struct nvstub_memdesc *md);
u32 nvstub_rm_get_pids(unsigned int gpu, u32 id_type, u32 id, u32 *tbl, u32 *count);
u32 nvstub_rm_pid_vidmem(unsigned int gpu, u32 pid, u64 *data);
void nvstub_rm_report(struct seq_file *m);
void nvstub_race_delay(void);

/* nvstub_mem.c */
u32 nvstub_mem_charge(unsigned int gpu, u64 size);
void nvstub_mem_uncharge(unsigned int gpu, u64 size);
u64 nvstub_mem_total(void);
u64 nvstub_mem_free(unsigned int gpu);
void nvstub_mem_report(struct seq_file *m);
int nvstub_esc_map(struct nvstub_file *nf, void *arg, u32 size);
int nvstub_esc_unmap(struct nvstub_file *nf, void *arg, u32 size);
int nvstub_esc_update_mapping(struct nvstub_file *nf, void *arg, u32 size);
int nvstub_mmap(struct file *filp, struct vm_area_struct *vma);
int nvstub_mem_init(void);
void nvstub_mem_exit(void);

/* nvstub_export.c: objects exported to and imported from fds (under nvstub_lock) */
u32 nvstub_ctrl_export_object(struct nvstub_file *nf, struct nvstub_client *cl, void *params);
u32 nvstub_ctrl_export_objects(struct nvstub_file *nf, struct nvstub_client *cl, void *params);
u32 nvstub_ctrl_import_object(struct nvstub_file *nf, struct nvstub_client *cl, void *params);
u32 nvstub_ctrl_import_objects(struct nvstub_file *nf, struct nvstub_client *cl, void *params);
u32 nvstub_ctrl_export_info(struct nvstub_file *nf, struct nvstub_client *cl, void *params);
void nvstub_export_file_release(struct nvstub_file *nf);

/* nvstub_ctrl.c */
int nvstub_esc_control(struct nvstub_file *nf, void *arg, u32 size);
extern const unsigned int nvstub_ctrl_count;
u32 nvstub_ctrl_cmd(unsigned int i);

/* nvstub_engine.c: the simulated engine (TEST DOUBLE) */
int nvstub_engine_start(void);
void nvstub_engine_stop(void);
int nvstub_tsg_create(struct nvstub_obj *obj);
void nvstub_tsg_destroy(struct nvstub_obj *obj);
int nvstub_chan_create(struct nvstub_obj *obj, struct nvstub_obj *tsg_obj,
		       const struct nv_channel_alloc_params_head *params);
void nvstub_chan_destroy(struct nvstub_obj *obj);
void nvstub_tsg_schedule(struct nvstub_tsg *tsg, bool enable);
void nvstub_tsg_set_timeslice(struct nvstub_tsg *tsg, u64 us);
u64 nvstub_tsg_get_timeslice(struct nvstub_tsg *tsg);
u32 nvstub_chan_id(struct nvstub_chan *chan);
struct nvstub_tsg *nvstub_chan_tsg(struct nvstub_chan *chan);	/* its TSG (RM's own for a channel under a device) */
/* NV_RAMUSERD_CHAN_SIZE (published/maxwell/gm107/dev_ram.h): one channel's USERD */
#define NVSTUB_USERD_SIZE	512
/* the page of RM's own USERD of a channel and its offset in it (NULL: the client allocated it) */
struct page *nvstub_chan_userd(struct nvstub_chan *chan, u32 *off);
void nvstub_userd_exit(void);
void nvstub_chan_set_disabled(struct nvstub_chan *chan, bool disabled);
int nvstub_esc_submit(struct nvstub_file *nf, void *arg, u32 size);
void nvstub_engine_report(struct seq_file *m);

/* nvstub_uvm.c */
int nvstub_uvm_init(void);
void nvstub_uvm_exit(void);
extern const unsigned int nvstub_uvm_count;
u32 nvstub_uvm_cmd(unsigned int i);

/* nvstub_proc.c */
int nvstub_proc_init(void);
void nvstub_proc_exit(void);

/* nvstub_main.c: lists for /proc/nvstub/implemented */
extern const u32 nvstub_esc_list[];
extern const unsigned int nvstub_esc_count;
extern const u32 nvstub_class_list[];
extern const unsigned int nvstub_class_count;

/* TEST ONLY failure injection (nvstub_main.c) */
extern unsigned int nvstub_fail_mmap_every;
bool nvstub_should_fail(unsigned int every, atomic_t *count);
void nvstub_race_delay_entry(void);

#endif /* NVSTUB_H */
