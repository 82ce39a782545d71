// SPDX-License-Identifier: GPL-2.0
/*
 * nvstub_main.c - character devices, file operations and escape dispatch of
 * nvstub, a TEST DOUBLE of NVIDIA's nvidia.ko (see README.md).
 *
 * nvstub answers the NVIDIA RM user ABI (nvstub_abi.h) on the real
 * device numbers: /dev/nvidia0..N-1 (195:0..N-1) and /dev/nvidiactl (195:255),
 * plus /dev/nvidia-uvm (nvstub_uvm.c). It exists so that gpuslice's
 * interposer can be tested in a VM: nothing here drives hardware. Behaviour
 * is copied from open-gpu-kernel-modules (branch 580), mainly
 * kernel-open/nvidia/nv.c (nvidia_ioctl, nv_get_file_private) and
 * src/nvidia/arch/nvalloc/unix/src/{escape.c,osapi.c}.
 */
#include <linux/cdev.h>
#include <linux/delay.h>
#include <linux/device.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/module.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "nvstub.h"
#include "nvstub_uapi.h"

int nvstub_num_gpus = 1;
module_param_named(num_gpus, nvstub_num_gpus, int, 0444);
MODULE_PARM_DESC(num_gpus, "number of simulated GPUs (1..8)");

unsigned int nvstub_fb_mib = 1024;
module_param_named(fb_mib, nvstub_fb_mib, uint, 0444);
MODULE_PARM_DESC(fb_mib, "video memory pool per GPU, MiB");

char *nvstub_version = "580.159.04";
/* the layouts of the release nvstub_version names (nvstub_tables.c) */
const struct nvstub_table *nvstub_abi;
module_param_named(version, nvstub_version, charp, 0444);
MODULE_PARM_DESC(version, "driver version string reported to user space");

/*
 * TEST-ONLY: a pause between the copy of an ioctl's top-level block and the
 * copy of RM_ALLOC's / RM_CONTROL's nested params, taken without nvstub_lock.
 * The real driver has the same two reads (nv.c nvidia_ioctl, then
 * alloc_free.c serverAllocApiCopyIn / control.c serverControlApiCopyIn,
 * before RM's locks) with no pause; the pause makes the window between them
 * wide enough for a racing thread in a test. 0 (default): no pause.
 */
unsigned int nvstub_race_delay_us;
module_param_named(race_delay_us, nvstub_race_delay_us, uint, 0644);
MODULE_PARM_DESC(race_delay_us,
		 "TEST ONLY: microseconds to sleep between the top-level and the nested params copy of RM_ALLOC/RM_CONTROL (max 1000000)");

#define NVSTUB_RACE_DELAY_MAX_US	1000000

/*
 * TEST-ONLY: a pause at the entry of an ioctl, before the top-level block is
 * copied. nvidia_ioctl() does work there too (nv_kmem_cache_alloc_stack(),
 * the system PM lock) before its copy_from_user(); the pause widens the window
 * between an interposer's check and that copy for a racing thread in a test.
 * 0 (default): no pause.
 */
static unsigned int nvstub_race_delay_entry_us;
module_param_named(race_delay_entry_us, nvstub_race_delay_entry_us, uint, 0644);
MODULE_PARM_DESC(race_delay_entry_us,
		 "TEST ONLY: microseconds to sleep before copying an ioctl's top-level block, and at mmap entry (max 1000000)");

/* TEST ONLY: a pause of us microseconds (capped), none for 0 */
static void nvstub_pause(unsigned int us)
{
	if (!us)
		return;
	us = min_t(unsigned int, us, NVSTUB_RACE_DELAY_MAX_US);
	usleep_range(us, us + us / 16 + 1);
}

/* TEST ONLY: the pause of race_delay_entry_us, also taken by nvstub_mmap() */
void nvstub_race_delay_entry(void)
{
	nvstub_pause(READ_ONCE(nvstub_race_delay_entry_us));
}

DEFINE_MUTEX(nvstub_lock);

/* Called without nvstub_lock, right before a nested params copy. */
void nvstub_race_delay(void)
{
	nvstub_pause(READ_ONCE(nvstub_race_delay_us));
}

/*
 * TEST-ONLY: make every Nth open, ioctl or mmap fail with -ENOMEM, as the real
 * driver's can (nv.c nvidia_open() allocating its file private, nvidia_ioctl()
 * allocating the argument copy, nvidia_mmap()). 0 (default): never.
 */
static unsigned int nvstub_fail_open_every;
module_param_named(fail_open_every, nvstub_fail_open_every, uint, 0644);
MODULE_PARM_DESC(fail_open_every, "TEST ONLY: fail every Nth open with -ENOMEM (0: never)");
static unsigned int nvstub_fail_ioctl_every;
module_param_named(fail_ioctl_every, nvstub_fail_ioctl_every, uint, 0644);
MODULE_PARM_DESC(fail_ioctl_every, "TEST ONLY: fail every Nth ioctl with -ENOMEM (0: never)");
unsigned int nvstub_fail_mmap_every;
module_param_named(fail_mmap_every, nvstub_fail_mmap_every, uint, 0644);
MODULE_PARM_DESC(fail_mmap_every, "TEST ONLY: fail every Nth mmap with -ENOMEM (0: never)");

bool nvstub_should_fail(unsigned int every, atomic_t *count)
{
	return every && (unsigned int)atomic_inc_return(count) % every == 0;
}

/*
 * TEST-ONLY: hold the next release of a file of minor release_hold_minor (-1,
 * the default: none) until the parameter changes, for at most
 * NVSTUB_RELEASE_HOLD_MAX_MS, before anything is freed and without
 * nvstub_lock, as RM's release of a file with many clients takes long
 * (nv.c nvidia_close() -> rm_cleanup_file_private()). One release is held at
 * a time: the others, of any minor, go through meanwhile. release_held (read
 * only) is 1 while one is held, so that a test knows it has begun.
 */
static int nvstub_release_hold_minor = -1;
module_param_named(release_hold_minor, nvstub_release_hold_minor, int, 0644);
MODULE_PARM_DESC(release_hold_minor,
		 "TEST ONLY: hold the next release of this minor until it changes (max 120 s; -1: none)");
static atomic_t nvstub_release_held = ATOMIC_INIT(0);

static int nvstub_release_held_get(char *buf, const struct kernel_param *kp)
{
	return sysfs_emit(buf, "%d\n", atomic_read(&nvstub_release_held));
}

static const struct kernel_param_ops nvstub_release_held_ops = {
	.get = nvstub_release_held_get,
};
module_param_cb(release_held, &nvstub_release_held_ops, NULL, 0444);
MODULE_PARM_DESC(release_held, "TEST ONLY: 1 while a release is held by release_hold_minor");

#define NVSTUB_RELEASE_HOLD_MAX_MS	120000

static void nvstub_release_hold(unsigned int minor)
{
	unsigned int ms = 0;

	if (READ_ONCE(nvstub_release_hold_minor) != (int)minor ||
	    atomic_cmpxchg(&nvstub_release_held, 0, 1) != 0)
		return;
	while (READ_ONCE(nvstub_release_hold_minor) == (int)minor &&
	       ms < NVSTUB_RELEASE_HOLD_MAX_MS) {
		msleep(10);
		ms += 10;
	}
	atomic_set(&nvstub_release_held, 0);
}

static atomic_t nvstub_open_count = ATOMIC_INIT(0);
static atomic_t nvstub_ioctl_count = ATOMIC_INIT(0);

#define NVSTUB_MAX_IOCTL_SIZE	(16 * 1024)	/* nv.h NV_ABSOLUTE_MAX_IOCTL_SIZE */

/* Escapes this driver answers (for /proc/nvstub/implemented). */
const u32 nvstub_esc_list[] = {
	NV_ESC_CARD_INFO, NV_ESC_REGISTER_FD, NV_ESC_ALLOC_OS_EVENT,
	NV_ESC_FREE_OS_EVENT, NV_ESC_CHECK_VERSION_STR, NV_ESC_IOCTL_XFER_CMD,
	NV_ESC_SYS_PARAMS, NV_ESC_NUMA_INFO, NV_ESC_WAIT_OPEN_COMPLETE,
	NV_ESC_RM_ALLOC_MEMORY, NV_ESC_RM_FREE, NV_ESC_RM_CONTROL,
	NV_ESC_RM_ALLOC, NV_ESC_RM_DUP_OBJECT, NV_ESC_RM_SHARE, NV_ESC_RM_MAP_MEMORY,
	NV_ESC_RM_UNMAP_MEMORY, NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO,
	NV_ESC_ATTACH_GPUS_TO_FD, NVSTUB_ESC_SUBMIT,
	NV_ESC_RM_VID_HEAP_CONTROL, NV_ESC_RM_IDLE_CHANNELS, NV_ESC_RM_ALLOC_CONTEXT_DMA2,
	NV_ESC_RM_MAP_MEMORY_DMA, NV_ESC_RM_UNMAP_MEMORY_DMA,
};
const unsigned int nvstub_esc_count = ARRAY_SIZE(nvstub_esc_list);

static dev_t nvstub_devt;
static struct cdev nvstub_cdev;
struct class *nvstub_class;
static u64 nvstub_memblock_size;

/*
 * OS events registered by NV_ESC_ALLOC_OS_EVENT: one list for the driver, as
 * osapi.c allocate_os_event() keeps them on the control state; an event goes
 * away with FREE_OS_EVENT, with the file that registered it, or with its client.
 */
struct nvstub_os_event {
	struct list_head node;
	u32 h_client;
	u32 fd;
	struct nvstub_file *nf;
};

static LIST_HEAD(nvstub_os_events);

static void nvstub_os_events_drop(struct nvstub_file *nf, u32 h_client)
{
	struct nvstub_os_event *ev, *tmp;

	list_for_each_entry_safe(ev, tmp, &nvstub_os_events, node) {
		if ((nf && ev->nf == nf) || (!nf && ev->h_client == h_client)) {
			list_del(&ev->node);
			kfree(ev);
		}
	}
}

void nvstub_client_free_os_events(u32 h_client)
{
	nvstub_os_events_drop(NULL, h_client);
}

static int nvstub_open(struct inode *inode, struct file *filp)
{
	unsigned int minor = iminor(inode);
	struct nvstub_file *nf;

	if (nvstub_should_fail(READ_ONCE(nvstub_fail_open_every), &nvstub_open_count))
		return -ENOMEM;	/* TEST ONLY, see above */
	if (minor != NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE &&
	    minor >= nvstub_num_gpus)
		return -ENODEV;
	nf = kzalloc(sizeof(*nf), GFP_KERNEL);
	if (!nf)
		return -ENOMEM;
	nf->filp = filp;
	nf->minor = minor;
	spin_lock_init(&nf->map_lock);
	filp->private_data = nf;
	return 0;
}

static int nvstub_release(struct inode *inode, struct file *filp)
{
	struct nvstub_file *nf = filp->private_data;

	nvstub_release_hold(nf->minor);	/* TEST ONLY, see above */
	mutex_lock(&nvstub_lock);
	nvstub_export_file_release(nf);
	nvstub_file_free_clients(nf);
	nvstub_os_events_drop(nf, 0);
	mutex_unlock(&nvstub_lock);
	if (nf->ctl_filp)
		fput(nf->ctl_filp);
	kfree(nf);
	return 0;
}

/*
 * nv.c nv_get_file_private(): fget(fd), major 195 and the right minor. The
 * real driver then trusts private_data; we also require our own f_op (the
 * same test nv_match_dev_state() makes) so a foreign file is never misread.
 * On success *filp holds a reference the caller must fput().
 */
struct nvstub_file *nvstub_get_file(int fd, bool ctl, struct file **filp)
{
	struct file *f = fget(fd);
	struct inode *inode;
	unsigned int minor;

	if (!f)
		return NULL;
	inode = file_inode(f);
	if (!inode || f->f_op != &nvstub_fops ||
	    MAJOR(inode->i_rdev) != NV_MAJOR_DEVICE_NUMBER)
		goto fail;
	minor = MINOR(inode->i_rdev);
	if (ctl && minor != NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE)
		goto fail;
	if (!ctl && minor >= nvstub_num_gpus)
		goto fail;
	*filp = f;
	return f->private_data;
fail:
	fput(f);
	return NULL;
}

/* nv.c nvidia_read_card_info(): one entry per GPU, the rest zeroed. */
static int nvstub_card_info(void *arg, u32 size)
{
	struct nv_ioctl_card_info *ci = arg;
	unsigned int n = size / sizeof(*ci);
	unsigned int i;

	memset(arg, 0, size);
	for (i = 0; i < n && i < nvstub_num_gpus; i++) {
		ci[i].valid = 1;
		ci[i].pci_info.domain = 0;
		ci[i].pci_info.bus = 0;
		ci[i].pci_info.slot = NVSTUB_FIRST_SLOT + i;	/* 0000:00:06.0 in the traces */
		ci[i].pci_info.function = 0;
		ci[i].pci_info.vendor_id = NVSTUB_PCI_VENDOR;
		ci[i].pci_info.device_id = NVSTUB_PCI_DEVICE;
		ci[i].gpu_id = nvstub_gpu_id(i);
		ci[i].interrupt_line = 41;
		ci[i].reg_address = 0x102000000000ULL + (u64)i * 0x1000000000ULL;
		ci[i].reg_size = 16 << 20;
		ci[i].fb_address = 0x100000000000ULL + (u64)i * 0x1000000000ULL;
		ci[i].fb_size = (u64)nvstub_fb_mib << 20;
		ci[i].minor_number = i;
	}
	return 0;
}

/*
 * GPU i's UUID. A real one is the SHA-1 of the chip id and PDI
 * (gpu_uuid.c nvGenerateGpuUuid); the stand-in's are fixed and obviously
 * fake: "nvstub", zeros, i in the last byte.
 */
void nvstub_gpu_uuid(unsigned int gpu, u8 *uuid)
{
	static const u8 prefix[] = { 'n', 'v', 's', 't', 'u', 'b' };

	memset(uuid, 0, NVSTUB_UUID_LEN);
	memcpy(uuid, prefix, sizeof(prefix));
	uuid[NVSTUB_UUID_LEN - 1] = gpu;
}

/* gpumgrGetGpuFromUuid(): which simulated GPU has this UUID, or -1. */
int nvstub_gpu_by_uuid(const u8 *uuid)
{
	u8 mine[NVSTUB_UUID_LEN];
	int i;

	for (i = 0; i < nvstub_num_gpus; i++) {
		nvstub_gpu_uuid(i, mine);
		if (!memcmp(mine, uuid, NVSTUB_UUID_LEN))
			return i;
	}
	return -1;
}

/*
 * nv.c NV_ESC_ATTACH_GPUS_TO_FD: an array of gpuIds, once per file; each
 * nonzero id is opened and held (nvidia_dev_get(): -EINVAL for an id no GPU
 * has, and what was held is let go) until the file is released. Modelled:
 * the ids are checked and kept; nothing else depends on them here.
 */
static int nvstub_attach_gpus(struct nvstub_file *nf, void *arg, u32 size)
{
	const u32 *ids = arg;
	unsigned int i, g;

	if (!size || size % sizeof(u32))
		return -EINVAL;
	if (nf->attached)
		return -EINVAL;
	for (i = 0; i < size / sizeof(u32); i++) {
		if (!ids[i])
			continue;
		for (g = 0; g < nvstub_num_gpus; g++)
			if (nvstub_gpu_id(g) == ids[i])
				break;
		if (g == nvstub_num_gpus)
			return -EINVAL;
	}
	nf->attached = true;
	return 0;
}

/* osapi.c RmPerformVersionCheck(). Returns an NV status. */
static u32 nvstub_version_check(void *arg, u32 size)
{
	struct nv_ioctl_rm_api_version *p = arg;
	bool relaxed;
	unsigned int i;

	if (size != sizeof(*p))
		return NV_ERR_INVALID_ARGUMENT;
	p->reply = NV_RM_API_VERSION_REPLY_RECOGNIZED;
	if (p->cmd == NV_RM_API_VERSION_CMD_QUERY) {
		strscpy(p->version_string, nvstub_version, sizeof(p->version_string));
		return NV_OK;
	}
	relaxed = p->cmd == NV_RM_API_VERSION_CMD_RELAXED;
	for (i = 0; i < NV_RM_API_VERSION_STRING_LENGTH; i++) {
		char c = p->version_string[i];
		char r = i < strlen(nvstub_version) ? nvstub_version[i] : '\0';

		if (c != r)
			break;
		if (relaxed && c == '.')
			return NV_OK;
		if (c == '\0')
			return NV_OK;
	}
	strscpy(p->version_string, nvstub_version, sizeof(p->version_string));
	return NV_ERR_GENERIC;
}

/* escape.c NV_ESC_REGISTER_FD. Returns an NV status. */
static u32 nvstub_register_fd(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nv_ioctl_register_fd *p = arg;
	struct nvstub_file *ctl;
	struct file *ctl_filp;

	if (size != sizeof(*p))
		return NV_ERR_INVALID_ARGUMENT;
	if (nf->ctl)
		return NV_ERR_INVALID_STATE;
	ctl = nvstub_get_file(p->ctl_fd, true, &ctl_filp);
	if (!ctl)
		return NV_ERR_INVALID_ARGUMENT;
	if (ctl == nf || ctl->ctl) {
		fput(ctl_filp);
		return NV_ERR_INVALID_ARGUMENT;
	}
	nf->ctl = ctl;
	nf->ctl_filp = ctl_filp;	/* held until this file is released */
	return NV_OK;
}

/* osapi.c allocate_os_event() / free_os_event(). */
static void nvstub_alloc_os_event(struct nvstub_file *nf,
				  struct nv_ioctl_alloc_os_event *p)
{
	struct nvstub_os_event *ev;

	list_for_each_entry(ev, &nvstub_os_events, node) {
		if (ev->h_client == p->h_client && ev->fd == p->fd) {
			p->status = NV_ERR_INSUFFICIENT_RESOURCES;
			return;
		}
	}
	ev = kzalloc(sizeof(*ev), GFP_KERNEL);
	if (!ev) {
		p->status = NV_ERR_INSUFFICIENT_RESOURCES;
		return;
	}
	ev->h_client = p->h_client;
	ev->fd = p->fd;
	ev->nf = nf;
	list_add(&ev->node, &nvstub_os_events);
	p->status = NV_OK;
}

static void nvstub_free_os_event(struct nv_ioctl_alloc_os_event *p)
{
	struct nvstub_os_event *ev;

	list_for_each_entry(ev, &nvstub_os_events, node) {
		if (ev->h_client == p->h_client && ev->fd == p->fd) {
			list_del(&ev->node);
			kfree(ev);
			p->status = NV_OK;
			return;
		}
	}
	p->status = NV_ERR_INVALID_EVENT;
}

/* nv-ioctl-numa.h nv_ioctl_numa_info_t: no NUMA memory on this "GPU". */
static int nvstub_numa_info(void *arg, u32 size)
{
	struct nv_ioctl_numa_info *p = arg;

	if (size != sizeof(*p))
		return -EINVAL;
	memset(p, 0, size);
	p->nid = -1;
	p->status = 0;		/* NV_IOCTL_NUMA_STATUS_DISABLED */
	p->memblock_size = nvstub_memblock_size;
	return 0;
}

/*
 * escape.c RmIoctl() and osapi.c rm_ioctl(): an RM status other than NV_OK
 * in the return value means the ioctl fails with -EINVAL; statuses of the
 * operation itself travel in the params' status field.
 */
static int nvstub_rm_ioctl(struct nvstub_file *nf, u32 nr, void *arg, u32 size)
{
	u32 st;

	switch (nr) {
	case NV_ESC_ALLOC_OS_EVENT:
	case NV_ESC_FREE_OS_EVENT:
		if (size != sizeof(struct nv_ioctl_alloc_os_event))
			return -EINVAL;
		if (nr == NV_ESC_ALLOC_OS_EVENT)
			nvstub_alloc_os_event(nf, arg);
		else
			nvstub_free_os_event(arg);
		return 0;
	case NV_ESC_REGISTER_FD:
		st = nvstub_register_fd(nf, arg, size);
		return st == NV_OK ? 0 : -EINVAL;
	case NV_ESC_RM_ALLOC:
		return nvstub_esc_alloc(nf, arg, size);
	case NV_ESC_RM_ALLOC_MEMORY:
		return nvstub_esc_alloc_memory(nf, arg, size);
	case NV_ESC_RM_FREE:
		return nvstub_esc_free(nf, arg, size);
	case NV_ESC_RM_CONTROL:
		return nvstub_esc_control(nf, arg, size);
	case NV_ESC_RM_DUP_OBJECT:
		return nvstub_esc_dup(nf, arg, size);
	case NV_ESC_RM_SHARE:
		return nvstub_esc_share(nf, arg, size);
	case NV_ESC_RM_MAP_MEMORY:
		return nvstub_esc_map(nf, arg, size);
	case NV_ESC_RM_UNMAP_MEMORY:
		return nvstub_esc_unmap(nf, arg, size);
	case NV_ESC_RM_UPDATE_DEVICE_MAPPING_INFO:
		return nvstub_esc_update_mapping(nf, arg, size);
	case NVSTUB_ESC_SUBMIT:
		return nvstub_esc_submit(nf, arg, size);
	/* interface/deprecated/ (nvstub_legacy.c) */
	case NV_ESC_RM_VID_HEAP_CONTROL:
		return nvstub_esc_vid_heap(nf, arg, size);
	case NV_ESC_RM_IDLE_CHANNELS:
		return nvstub_esc_idle_channels(nf, arg, size);
	case NV_ESC_RM_ALLOC_CONTEXT_DMA2:
		return nvstub_esc_ctxdma2(nf, arg, size);
	case NV_ESC_RM_MAP_MEMORY_DMA:
		return nvstub_esc_map_dma(nf, arg, size);
	case NV_ESC_RM_UNMAP_MEMORY_DMA:
		return nvstub_esc_unmap_dma(nf, arg, size);
	default:
		return -EINVAL;	/* "unknown NVRM ioctl command" */
	}
}

static int nvstub_dispatch(struct nvstub_file *nf, u32 nr, void *arg, u32 size)
{
	bool ctl = nvstub_is_ctl(nf);
	u32 st;

	switch (nr) {
	case NV_ESC_WAIT_OPEN_COMPLETE: {
		struct nv_ioctl_wait_open_complete *p = arg;

		/* 535 has no such escape: rm_ioctl()'s "unknown NVRM ioctl command" */
		if (!nvstub_abi->wait_open_complete || size != sizeof(*p))
			return -EINVAL;
		p->rc = 0;
		p->adapter_status = NV_OK;
		return 0;
	}
	case NV_ESC_CARD_INFO:
		if (!ctl)
			return -EINVAL;
		return nvstub_card_info(arg, size);
	case NV_ESC_ATTACH_GPUS_TO_FD:
		if (!ctl)
			return -EINVAL;
		return nvstub_attach_gpus(nf, arg, size);
	case NV_ESC_CHECK_VERSION_STR:
		if (!ctl)
			return -EINVAL;
		st = nvstub_version_check(arg, size);
		return st == NV_OK ? 0 : -EINVAL;
	case NV_ESC_SYS_PARAMS: {
		struct nv_ioctl_sys_params *p = arg;

		if (!ctl || size != sizeof(*p))
			return -EINVAL;
		if (nvstub_memblock_size == 0)
			nvstub_memblock_size = p->memblock_size;
		else if (nvstub_memblock_size != p->memblock_size)
			return -EBUSY;
		return 0;
	}
	case NV_ESC_NUMA_INFO:
		if (ctl)
			return -EINVAL;
		return nvstub_numa_info(arg, size);
	default:
		return nvstub_rm_ioctl(nf, nr, arg, size);
	}
}

/*
 * Escapes that read nested params: they take nvstub_lock themselves, after
 * that read, as RM takes its locks after serverAllocApiCopyIn() /
 * serverControlApiCopyIn() (rs_server.c serverAllocResource, serverControl).
 */
static bool nvstub_esc_locks_itself(u32 nr)
{
	return nr == NV_ESC_RM_ALLOC || nr == NV_ESC_RM_CONTROL;
}

/* nv.c nvidia_ioctl(): copy in _IOC_SIZE bytes (or an XFER block), dispatch
 * on _IOC_NR, copy the block back out unless copying failed.
 */
static long nvstub_ioctl(struct file *filp, unsigned int cmd, unsigned long uarg)
{
	struct nvstub_file *nf = filp->private_data;
	void __user *uptr = (void __user *)uarg;
	u32 nr = _IOC_NR(cmd);
	u32 size = _IOC_SIZE(cmd);
	void *arg;
	int ret;

	nvstub_race_delay_entry();	/* TEST ONLY, see above */
	if (nvstub_should_fail(READ_ONCE(nvstub_fail_ioctl_every), &nvstub_ioctl_count))
		return -ENOMEM;	/* TEST ONLY, see above */
	if (nr == NV_ESC_IOCTL_XFER_CMD) {
		struct nv_ioctl_xfer x;

		if (size != sizeof(x))
			return -EINVAL;
		if (copy_from_user(&x, uptr, sizeof(x)))
			return -EFAULT;
		nr = x.cmd;
		size = x.size;
		uptr = u64_to_user_ptr(x.ptr);
		if (size > NVSTUB_MAX_IOCTL_SIZE)
			return -EINVAL;
	}
	arg = kmalloc(size ? size : 1, GFP_KERNEL);
	if (!arg)
		return -ENOMEM;
	if (copy_from_user(arg, uptr, size)) {
		kfree(arg);
		return -EFAULT;
	}
	if (nvstub_esc_locks_itself(nr)) {
		ret = nvstub_dispatch(nf, nr, arg, size);
	} else {
		mutex_lock(&nvstub_lock);
		ret = nvstub_dispatch(nf, nr, arg, size);
		mutex_unlock(&nvstub_lock);
	}
	if (copy_to_user(uptr, arg, size))
		ret = -EFAULT;
	kfree(arg);
	return ret;
}

const struct file_operations nvstub_fops = {
	.owner = THIS_MODULE,
	.open = nvstub_open,
	.release = nvstub_release,
	.unlocked_ioctl = nvstub_ioctl,
	.compat_ioctl = nvstub_ioctl,
	.mmap = nvstub_mmap,
	.llseek = noop_llseek,
};

static char *nvstub_devnode(struct device *dev, umode_t *mode)
{
	if (mode)
		*mode = 0666;
	return NULL;
}

static int nvstub_create_nodes(void)
{
	struct device *d;
	int i;

	d = device_create(nvstub_class, NULL,
			  MKDEV(NV_MAJOR_DEVICE_NUMBER,
				NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE),
			  NULL, "nvidiactl");
	if (IS_ERR(d))
		return PTR_ERR(d);
	for (i = 0; i < nvstub_num_gpus; i++) {
		d = device_create(nvstub_class, NULL,
				  MKDEV(NV_MAJOR_DEVICE_NUMBER, i), NULL,
				  "nvidia%d", i);
		if (IS_ERR(d))
			goto fail;
	}
	return 0;
fail:
	while (i--)
		device_destroy(nvstub_class, MKDEV(NV_MAJOR_DEVICE_NUMBER, i));
	device_destroy(nvstub_class, MKDEV(NV_MAJOR_DEVICE_NUMBER,
					   NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE));
	return PTR_ERR(d);
}

static void nvstub_destroy_nodes(void)
{
	int i;

	for (i = 0; i < nvstub_num_gpus; i++)
		device_destroy(nvstub_class, MKDEV(NV_MAJOR_DEVICE_NUMBER, i));
	device_destroy(nvstub_class, MKDEV(NV_MAJOR_DEVICE_NUMBER,
					   NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE));
}

static int __init nvstub_init(void)
{
	int ret;

	if (nvstub_num_gpus < 1 || nvstub_num_gpus > NVSTUB_MAX_GPUS ||
	    nvstub_fb_mib == 0 || strlen(nvstub_version) >= NV_RM_API_VERSION_STRING_LENGTH)
		return -EINVAL;
	/* a release with no table (the refusal tests' 999.1.2) answers as the newest */
	nvstub_abi = nvstub_table_find(nvstub_version);
	if (!nvstub_abi)
		nvstub_abi = &nvstub_tables[nvstub_nr_tables - 1];
	nvstub_devt = MKDEV(NV_MAJOR_DEVICE_NUMBER, 0);
	ret = register_chrdev_region(nvstub_devt, 256, "nvidia");
	if (ret)
		return ret;
	cdev_init(&nvstub_cdev, &nvstub_fops);
	nvstub_cdev.owner = THIS_MODULE;
	ret = cdev_add(&nvstub_cdev, nvstub_devt, 256);
	if (ret)
		goto err_region;
	nvstub_class = class_create(THIS_MODULE, "nvstub");
	if (IS_ERR(nvstub_class)) {
		ret = PTR_ERR(nvstub_class);
		goto err_cdev;
	}
	nvstub_class->devnode = nvstub_devnode;
	ret = nvstub_rm_init();
	if (ret)
		goto err_class;
	ret = nvstub_mem_init();
	if (ret)
		goto err_rm;
	ret = nvstub_create_nodes();
	if (ret)
		goto err_mem;
	ret = nvstub_uvm_init();
	if (ret)
		goto err_nodes;
	ret = nvstub_engine_start();
	if (ret)
		goto err_uvm;
	ret = nvstub_proc_init();
	if (ret)
		goto err_engine;
	pr_info("nvstub: stand-in NVIDIA driver %s, %d GPU(s), %u MiB each\n",
		nvstub_version, nvstub_num_gpus, nvstub_fb_mib);
	return 0;

err_engine:
	nvstub_engine_stop();
err_uvm:
	nvstub_uvm_exit();
err_nodes:
	nvstub_destroy_nodes();
err_mem:
	nvstub_mem_exit();
	nvstub_userd_exit();
err_rm:
	nvstub_rm_exit();
err_class:
	class_destroy(nvstub_class);
err_cdev:
	cdev_del(&nvstub_cdev);
err_region:
	unregister_chrdev_region(nvstub_devt, 256);
	return ret;
}

static void __exit nvstub_exit(void)
{
	nvstub_proc_exit();
	nvstub_engine_stop();
	nvstub_uvm_exit();
	nvstub_destroy_nodes();
	nvstub_mem_exit();
	nvstub_userd_exit();
	nvstub_rm_exit();
	class_destroy(nvstub_class);
	cdev_del(&nvstub_cdev);
	unregister_chrdev_region(nvstub_devt, 256);
}

module_init(nvstub_init);
module_exit(nvstub_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("nvstub: stand-in for nvidia.ko with a simulated engine (test double)");
