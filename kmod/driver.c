// SPDX-License-Identifier: GPL-2.0
/*
 * driver.c - finding, opening and version-checking the real NVIDIA driver.
 *
 * The real nodes are looked up once, at load, in the namespace of the process
 * that loads the module (the host's /dev), and kept as paths. A caller's open
 * of a gpuslice node opens the real node with dentry_open(): no path walk in
 * the caller's (container's) mount namespace, where /dev/nvidiactl may be our
 * own node bind-mounted, and no device-cgroup check, which is what lets the
 * container's cgroup deny major 195 while our major is allowed.
 */
#include <linux/cred.h>
#include <linux/ctype.h>
#include <linux/device_cgroup.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/kdev_t.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/namei.h>
#include <linux/path.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "driver.h"
#include "instance.h"
#include "uscratch.h"

static DEFINE_MUTEX(gs_driver_lock);
static struct path gs_ctl_path;
static struct path gs_uvm_path;
static struct path gs_gpu_path[GS_MAX_GPUS];
static bool gs_gpu_valid[GS_MAX_GPUS];
static unsigned int gs_uvm_major;
static u32 gs_gpu_id[GS_MAX_GPUS];	/* by minor, from CARD_INFO at load */
static char gs_version[NV_RM_API_VERSION_STRING_LENGTH];

static int gs_lookup_chr(const char *name, struct path *path)
{
	int err;

	err = kern_path(name, LOOKUP_FOLLOW, path);
	if (err)
		return err;
	if (!S_ISCHR(d_inode(path->dentry)->i_mode)) {
		path_put(path);
		return -ENODEV;
	}
	return 0;
}

static int gs_lookup_gpu(u32 gpu)
{
	char name[24];
	struct path path;
	int err;

	snprintf(name, sizeof(name), "/dev/nvidia%u", gpu);
	err = gs_lookup_chr(name, &path);
	if (err)
		return err;
	if (d_inode(path.dentry)->i_rdev != MKDEV(NV_MAJOR_DEVICE_NUMBER, gpu)) {
		path_put(&path);
		return -ENODEV;
	}
	gs_gpu_path[gpu] = path;
	gs_gpu_valid[gpu] = true;
	return 0;
}

bool gs_driver_has_gpu(u32 gpu)
{
	bool ok;

	if (gpu >= GS_MAX_GPUS)
		return false;
	mutex_lock(&gs_driver_lock);
	ok = gs_gpu_valid[gpu] || !gs_lookup_gpu(gpu);
	mutex_unlock(&gs_driver_lock);
	return ok;
}

static bool gs_require_devcg = true;
module_param_named(require_device_cgroup, gs_require_devcg, bool, 0644);
MODULE_PARM_DESC(require_device_cgroup,
		 "Refuse instance nodes to processes whose device cgroup lets them open the real node (default Y; N for host use and the test bed)");

/*
 * During a call the real files sit in the caller's private fd table, where
 * another thread of the process can reach them through
 * /proc/<pid>/task/<tid>/fd and open them again: only the device cgroup stands
 * in the way (fdswap.c, docs/fd-translation.md). So a process whose device
 * cgroup would let it open the real node itself gets no instance node.
 */
static int gs_driver_check_devcg(const struct path *path)
{
	struct inode *inode = d_inode(path->dentry);

	if (!READ_ONCE(gs_require_devcg))
		return 0;
	if (devcgroup_check_permission(DEVCG_DEV_CHAR, imajor(inode), iminor(inode),
				       DEVCG_ACC_READ | DEVCG_ACC_WRITE))
		return 0;
	pr_warn_ratelimited("gpuslice: pid %d may open the real device %u:%u (device cgroup): instance node refused; deny it to containers, or load gpuslice with require_device_cgroup=0 for host use\n",
			    task_tgid_nr(current), imajor(inode), iminor(inode));
	return -EPERM;
}

struct file *gs_driver_open(enum gs_file_kind kind, u32 gpu, unsigned int flags)
{
	const struct path *path;
	int err;

	flags &= ~(O_CREAT | O_EXCL | O_TRUNC | O_NOCTTY | O_CLOEXEC);
	switch (kind) {
	case GS_FILE_CTL:
		path = &gs_ctl_path;
		break;
	case GS_FILE_UVM:
		path = &gs_uvm_path;
		if (!path->dentry)
			return ERR_PTR(-ENODEV);
		break;
	case GS_FILE_GPU:
		if (gpu >= GS_MAX_GPUS || !gs_driver_has_gpu(gpu))
			return ERR_PTR(-ENODEV);
		path = &gs_gpu_path[gpu];
		break;
	default:
		return ERR_PTR(-EINVAL);
	}
	err = gs_driver_check_devcg(path);
	if (err)
		return ERR_PTR(err);
	return dentry_open(path, flags, current_cred());
}

bool gs_driver_is_real_file(struct file *f)
{
	struct inode *inode = file_inode(f);

	if (!inode || !S_ISCHR(inode->i_mode))
		return false;
	if (imajor(inode) == NV_MAJOR_DEVICE_NUMBER)
		return true;
	return gs_uvm_major && imajor(inode) == gs_uvm_major;
}

/*
 * The reply was read back from the caller's memory, so it is the caller's
 * text as much as the driver's: only a version string (digits and dots) is
 * ever printed, never what a container chose to write into the host's log.
 */
void gs_driver_seen_version(const char *version, size_t len)
{
	char v[NV_RM_API_VERSION_STRING_LENGTH];
	size_t i;

	strscpy(v, version, min(len + 1, sizeof(v)));
	if (!strcmp(v, gs_version))
		return;
	for (i = 0; v[i]; i++)
		if (!isdigit(v[i]) && v[i] != '.')
			return;
	pr_warn_ratelimited("gpuslice: the driver answered version %s, loaded against %s\n",
			    v, gs_version);
}

u32 gs_driver_gpu_id(u32 minor)
{
	return minor < GS_MAX_GPUS ? READ_ONCE(gs_gpu_id[minor]) : 0;
}

/*
 * Each GPU's RM gpuId by its minor (nv.c nvidia_read_card_info()), which
 * NV_ESC_ATTACH_GPUS_TO_FD names GPUs by. Without it, an instance can attach
 * none.
 */
static void gs_read_gpu_ids(struct file *ctl)
{
	struct nv_ioctl_card_info *ci;
	unsigned int i;
	int err;

	ci = kcalloc(NV_MAX_DEVICES, sizeof(*ci), GFP_KERNEL);
	if (!ci)
		return;
	err = gs_scratch_card_info(ctl, ci);
	if (err)
		pr_warn("gpuslice: the driver did not answer CARD_INFO (%d): no instance can attach GPUs to a file\n",
			err);
	for (i = 0; !err && i < NV_MAX_DEVICES; i++)
		if (ci[i].valid && ci[i].minor_number < GS_MAX_GPUS)
			WRITE_ONCE(gs_gpu_id[ci[i].minor_number], ci[i].gpu_id);
	kfree(ci);
}

#define GS_SUPPORTED_LEN	512

static int gs_check_version(void)
{
	struct file *ctl;
	char *supported;
	int err;

	ctl = dentry_open(&gs_ctl_path, O_RDWR, current_cred());
	if (IS_ERR(ctl)) {
		pr_err("gpuslice: /dev/nvidiactl does not open (%ld): is the NVIDIA driver loaded?\n",
		       PTR_ERR(ctl));
		return PTR_ERR(ctl);
	}
	err = gs_scratch_query_version(ctl, gs_version, sizeof(gs_version));
	gs_read_gpu_ids(ctl);
	fput(ctl);
	if (err) {
		strscpy(gs_version, "unknown", sizeof(gs_version));
		pr_warn("gpuslice: the driver did not answer a version query (%d)\n", err);
	}
	if (!gs_abi_select(gs_version)) {
		pr_info("gpuslice: NVIDIA driver %s, ABI table of branch %s%s\n", gs_version,
			gs_abi()->branch, gs_passthrough_only ? " (passthrough_only)" : "");
		return 0;
	}
	if (gs_passthrough_only) {
		pr_warn("gpuslice: NVIDIA driver %s has no ABI table: pass-through only, no decoding\n",
			gs_version);
		return 0;
	}
	supported = kmalloc(GS_SUPPORTED_LEN, GFP_KERNEL);
	if (supported)
		gs_abi_supported(supported, GS_SUPPORTED_LEN);
	pr_err("gpuslice: NVIDIA driver %s has no ABI table (supported: %s); load with passthrough_only=1 to pass calls through undecoded\n",
	       gs_version, supported ? supported : "see docs/driver-versions.md");
	kfree(supported);
	return -EPROTO;
}

int gs_driver_init(void)
{
	struct path path;
	u32 gpu;
	int err;

	err = gs_lookup_chr("/dev/nvidiactl", &gs_ctl_path);
	if (err) {
		pr_err("gpuslice: no NVIDIA driver: /dev/nvidiactl is missing or not a character device (%d)\n",
		       err);
		return -ENODEV;
	}
	if (d_inode(gs_ctl_path.dentry)->i_rdev !=
	    MKDEV(NV_MAJOR_DEVICE_NUMBER, NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE)) {
		pr_err("gpuslice: no NVIDIA driver: /dev/nvidiactl is not char device %d:%d\n",
		       NV_MAJOR_DEVICE_NUMBER, NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE);
		err = -ENODEV;
		goto err_ctl;
	}
	err = gs_check_version();
	if (err)
		goto err_ctl;

	if (!gs_lookup_chr("/dev/nvidia-uvm", &path)) {
		gs_uvm_path = path;
		gs_uvm_major = imajor(d_inode(path.dentry));
	} else {
		pr_warn("gpuslice: no /dev/nvidia-uvm: instances get no nvidia-uvm node\n");
	}
	mutex_lock(&gs_driver_lock);
	for (gpu = 0; gpu < GS_MAX_GPUS; gpu++)
		gs_lookup_gpu(gpu);
	mutex_unlock(&gs_driver_lock);
	return 0;

err_ctl:
	path_put(&gs_ctl_path);
	return err;
}

void gs_driver_exit(void)
{
	u32 gpu;

	for (gpu = 0; gpu < GS_MAX_GPUS; gpu++)
		if (gs_gpu_valid[gpu])
			path_put(&gs_gpu_path[gpu]);
	if (gs_uvm_path.dentry)
		path_put(&gs_uvm_path);
	path_put(&gs_ctl_path);
}

bool gs_driver_has_uvm(void)
{
	return gs_uvm_path.dentry;
}
