// SPDX-License-Identifier: MIT
/*
 * rmclient: a static RM client for the container tests (tests/guest/test_podman.py).
 * The container image holds only this program (no shell, no Python), so it reports
 * what the test checks, one fact a line:
 *
 *   rmclient [devs] [fbinfo] [alloc MIB...]
 *
 *   devs       every device node under /dev:        dev c MAJ:MIN PATH
 *   fbinfo     with a session, the GPU's memory sizes as NV2080_CTRL_CMD_FB_GET_INFO_V2
 *              reports them (what cudaMemGetInfo and nvidia-smi read), before the
 *              allocations and, when there are any, after them:
 *                                                     fb start|end NAME KIB
 *              (NAME: ram, total_ram, heap, heap_free, usable_ram; a failed
 *              control:                               fb FAIL errno|0xSTATUS)
 *   alloc      a session on /dev/nvidiactl + /dev/nvidia0 (REGISTER_FD, client,
 *              device, subdevice), then one NV01_MEMORY_LOCAL_USER allocation of
 *              each size, kept until exit:            alloc MIB 0xSTATUS
 *              (a failed session step:                session FAIL STEP errno|0xSTATUS)
 *
 * RMCLIENT_CTL and RMCLIENT_GPU override the two node paths. Exit status 0 when every
 * step ran (the statuses are the test's to judge), 1 when a session step or fbinfo failed,
 * 2 on a usage error.
 *
 * Build: gcc -static -O2 -I kmod/core -o rmclient tests/guest/rmclient.c
 * Layouts and numbers come from kmod/core/nvrm_abi.h, as the module decodes them.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "nvrm_abi.h"

#define IOCTL_RM_ALLOC		_IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_ALLOC, struct nvos64_params)
#define IOCTL_REGISTER_FD	_IOWR(NV_IOCTL_MAGIC, NV_ESC_REGISTER_FD, struct nv_ioctl_register_fd)
#define IOCTL_RM_CONTROL	_IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_CONTROL, struct nvos54_params)

/* RM refuses owner 0 (standard_mem.c stdmemValidateParams); the tests' usual owner */
#define MEM_OWNER	0x5C000002u
#define H_DEVICE	0x5C000002u
#define H_SUBDEVICE	0x5C000003u
#define H_FIRST_MEM	0x5C000010u

static int dev_entry(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
	(void)type;
	(void)ftw;
	if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode))
		printf("dev %c %u:%u %s\n", S_ISCHR(st->st_mode) ? 'c' : 'b',
		       major(st->st_rdev), minor(st->st_rdev), path);
	return 0;
}

/* NV_ESC_RM_ALLOC: returns the RM status, or -errno when the ioctl itself failed */
static long rm_alloc(int ctl, nv_handle root, nv_handle parent, nv_handle *obj, nv_u32 cls,
		     void *params)
{
	struct nvos64_params p;

	memset(&p, 0, sizeof(p));
	p.h_root = root;
	p.h_object_parent = parent;
	p.h_object_new = *obj;
	p.h_class = cls;
	p.p_alloc_parms = (nv_u64)(unsigned long)params;
	if (ioctl(ctl, IOCTL_RM_ALLOC, &p) < 0)
		return -errno;
	*obj = p.h_object_new;
	return p.status;
}

/* NV_ESC_RM_CONTROL: returns the RM status, or -errno when the ioctl itself failed */
static long rm_control(int ctl, nv_handle client, nv_handle obj, nv_u32 cmd, void *params, nv_u32 size)
{
	struct nvos54_params p;

	memset(&p, 0, sizeof(p));
	p.h_client = client;
	p.h_object = obj;
	p.cmd = cmd;
	p.params = (nv_u64)(unsigned long)params;
	p.params_size = size;
	if (ioctl(ctl, IOCTL_RM_CONTROL, &p) < 0)
		return -errno;
	return p.status;
}

static const struct {
	nv_u32 index;
	const char *name;
} fb_indices[] = {
	{ NV2080_CTRL_FB_INFO_INDEX_RAM_SIZE, "ram" },
	{ NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE, "total_ram" },
	{ NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE, "heap" },
	{ NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE, "heap_free" },
	{ NV2080_CTRL_FB_INFO_INDEX_USABLE_RAM_SIZE, "usable_ram" },
};

/* FB_GET_INFO_V2 on the subdevice: one line per size; 0, or 1 when the control failed */
static int fbinfo(int ctl, nv_handle client, const char *when)
{
	static struct nv2080_ctrl_fb_get_info_v2_params fp;
	unsigned int i, n = sizeof(fb_indices) / sizeof(fb_indices[0]);
	long r;

	memset(&fp, 0, sizeof(fp));
	fp.fb_info_list_size = n;
	for (i = 0; i < n; i++)
		fp.fb_info_list[i].index = fb_indices[i].index;
	r = rm_control(ctl, client, H_SUBDEVICE, NV2080_CTRL_CMD_FB_GET_INFO_V2, &fp, sizeof(fp));
	if (r) {
		if (r < 0)
			printf("fb FAIL errno %ld (%s)\n", -r, strerror((int)-r));
		else
			printf("fb FAIL 0x%lx\n", r);
		return 1;
	}
	for (i = 0; i < n; i++)
		printf("fb %s %s %u\n", when, fb_indices[i].name, fp.fb_info_list[i].data);
	return 0;
}

static int fail(const char *step, long r)
{
	if (r < 0)
		printf("session FAIL %s errno %ld (%s)\n", step, -r, strerror((int)-r));
	else
		printf("session FAIL %s 0x%lx\n", step, r);
	return 1;
}

static int allocs(int with_fb, int argc, char **argv)
{
	const char *ctl_path = getenv("RMCLIENT_CTL") ?: "/dev/nvidiactl";
	const char *gpu_path = getenv("RMCLIENT_GPU") ?: "/dev/nvidia0";
	struct nv_ioctl_register_fd reg;
	struct nv0080_alloc_params dev;
	struct nv2080_alloc_params sub;
	nv_handle client = 0, h;
	int ctl, gpu, i;
	long r;

	ctl = open(ctl_path, O_RDWR | O_CLOEXEC);
	if (ctl < 0)
		return fail("open-nvidiactl", -errno);
	gpu = open(gpu_path, O_RDWR | O_CLOEXEC);
	if (gpu < 0)
		return fail("open-nvidia0", -errno);
	reg.ctl_fd = ctl;
	if (ioctl(gpu, IOCTL_REGISTER_FD, &reg) < 0)
		return fail("register-fd", -errno);
	r = rm_alloc(ctl, 0, 0, &client, NV01_ROOT_CLIENT, NULL);
	if (r)
		return fail("client", r);
	memset(&dev, 0, sizeof(dev));
	dev.device_id = 0;
	h = H_DEVICE;
	r = rm_alloc(ctl, client, client, &h, NV01_DEVICE_0, &dev);
	if (r)
		return fail("device", r);
	memset(&sub, 0, sizeof(sub));
	h = H_SUBDEVICE;
	r = rm_alloc(ctl, client, H_DEVICE, &h, NV20_SUBDEVICE_0, &sub);
	if (r)
		return fail("subdevice", r);
	printf("session ok\n");
	if (with_fb && fbinfo(ctl, client, "start"))
		return 1;

	for (i = 0; i < argc; i++) {
		struct nv_memory_allocation_params mp;
		unsigned long mib = strtoul(argv[i], NULL, 0);

		memset(&mp, 0, sizeof(mp));
		mp.owner = MEM_OWNER;
		mp.size = (nv_u64)mib << 20;
		h = H_FIRST_MEM + i;
		r = rm_alloc(ctl, client, H_DEVICE, &h, NV01_MEMORY_LOCAL_USER, &mp);
		if (r < 0)
			return fail("alloc", r);
		printf("alloc %lu 0x%lx\n", mib, r);
	}
	if (with_fb && argc > 0 && fbinfo(ctl, client, "end"))
		return 1;
	return 0;	/* closing the files frees the client and its memory */
}

int main(int argc, char **argv)
{
	int i = 1, with_fb = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (i < argc && !strcmp(argv[i], "devs")) {
		if (nftw("/dev", dev_entry, 16, FTW_PHYS) < 0)
			perror("nftw /dev");
		i++;
	}
	if (i < argc && !strcmp(argv[i], "fbinfo")) {
		with_fb = 1;
		i++;
	}
	if (i < argc && !strcmp(argv[i], "alloc"))
		return allocs(with_fb, argc - i - 1, argv + i + 1);
	if (with_fb && i == argc)
		return allocs(with_fb, 0, argv + i);
	if (i < argc) {
		fprintf(stderr, "usage: rmclient [devs] [fbinfo] [alloc MIB...]\n");
		return 2;
	}
	return 0;
}
