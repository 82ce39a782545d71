// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * mockrm.c - a stand-in for the NVIDIA driver below libgpuslice.so, for host
 * tests: LD_PRELOAD="libgpuslice.so libmockrm.so". It defines ioctl() and
 * fstat(), which libgpuslice.so reaches through RTLD_NEXT / the global scope:
 * files whose name ends in "nvidiactl" or "nvidia<N>" look like major-195
 * character devices, and their 'F' ioctls are answered like RM would:
 * client handles handed out, every status NV_OK, FB_GET_INFO_V2 from an
 * 80 GiB GPU with 70 GiB free, each named slot of an import vidmem.
 * MOCKRM_LOG=path records every call the driver really saw ("nr class-or-cmd"),
 * so tests can tell refused calls never got here. mockrm_fstats counts the
 * fstat() calls (a test's program reads it with dlsym); MOCKRM_VERSION_DELAY_MS
 * makes the version query take that long, mockrm_in_version_query set while
 * it does.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "nvrm_abi.h"

/* RM's client handles are unique on the host: each process draws from its own range */
static _Atomic nv_u32 next_client;

_Atomic unsigned int mockrm_fstats;		/* fstat() calls */
_Atomic int mockrm_in_version_query;		/* a version query is under way */

static int fake_minor(int fd)
{
	char p[64], path[512];
	ssize_t n;
	const char *b;

	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	n = readlink(p, path, sizeof(path) - 1);
	if (n <= 0)
		return -1;
	path[n] = 0;
	b = strrchr(path, '/');
	b = b ? b + 1 : path;
	if (!strcmp(b, "nvidiactl"))
		return 255;
	if (!strncmp(b, "nvidia", 6) && b[6] >= '0' && b[6] <= '9')
		return atoi(b + 6);
	return -1;
}

int fstat(int fd, struct stat *st)
{
	static int (*real)(int, struct stat *);
	int m, ret;

	if (!real)
		real = dlsym(RTLD_NEXT, "fstat");
	atomic_fetch_add(&mockrm_fstats, 1);
	ret = real(fd, st);
	if (ret == 0 && (m = fake_minor(fd)) >= 0) {
		st->st_mode = S_IFCHR | 0666;
		st->st_rdev = makedev(NV_MAJOR_DEVICE_NUMBER, m);
	}
	return ret;
}

static void log_call(nv_u32 nr, nv_u32 what)
{
	const char *path = getenv("MOCKRM_LOG");
	char line[64];
	int fd, n;

	if (!path)
		return;
	n = snprintf(line, sizeof(line), "%x %x\n", nr, what);
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (fd >= 0) {
		if (write(fd, line, n) != n)
			n = 0;
		syscall(SYS_close, fd);	/* not through the preload */
	}
}

static int rm(nv_u32 nr, void *arg)
{
	switch (nr) {
	case NV_ESC_RM_ALLOC: {
		struct nvos64_params *p = arg;

		log_call(nr, p->h_class);
		if ((p->h_class == NV01_ROOT || p->h_class == NV01_ROOT_CLIENT) && !p->h_object_new) {
			nv_u32 zero = 0;

			atomic_compare_exchange_strong(&next_client, &zero,
						       0xc1000001u + ((nv_u32)(getpid() & 0xffff) << 8));
			p->h_object_new = atomic_fetch_add(&next_client, 1);
		}
		p->status = NV_OK;
		return 0;
	}
	case NV_ESC_RM_CONTROL: {
		struct nvos54_params *p = arg;

		log_call(nr, p->cmd);
		if (p->cmd == NV2080_CTRL_CMD_FB_GET_INFO_V2) {
			struct nv2080_ctrl_fb_get_info_v2_params *fp = (void *)(uintptr_t)p->params;
			nv_u32 i;

			for (i = 0; i < fp->fb_info_list_size && i < NV2080_CTRL_FB_INFO_MAX_LIST_SIZE; i++)
				fp->fb_info_list[i].data =
					fp->fb_info_list[i].index == NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE ?
					70u << 20 : 80u << 20;
		}
		if (p->cmd == NVA06C_CTRL_CMD_SET_TIMESLICE && p->params) {
			const struct nva06c_ctrl_timeslice_params *tp = (void *)(uintptr_t)p->params;

			log_call(0x7473, (nv_u32)tp->timeslice_us);	/* "7473 <us>": the value RM got */
		}
		if (p->cmd == NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL && p->params) {
			const struct nva06c_ctrl_interleave_level_params *lp = (void *)(uintptr_t)p->params;

			log_call(0x696c, lp->tsg_interleave_level);	/* "696c <level>" */
		}
		if (p->cmd == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD) {
			struct nv0000_import_objects_from_fd_params *ip = (void *)(uintptr_t)p->params;
			nv_u32 i;

			for (i = 0; i < ip->num_objects && i < NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_TO_FD_MAX_OBJECTS; i++)
				ip->object_types[i] = ip->objects[i] ?
					NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_VIDMEM :
					NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_NONE;
		}
		p->status = NV_OK;
		return 0;
	}
	case NV_ESC_RM_FREE:
		log_call(nr, 0);
		((struct nvos00_params *)arg)->status = NV_OK;
		return 0;
	case NV_ESC_CHECK_VERSION_STR: {
		/* RM's answer to a query (nv.c rm_perform_version_check): its version;
		 * MOCKRM_VERSION names another driver */
		struct nv_ioctl_rm_api_version *p = arg;
		const char *v = getenv("MOCKRM_VERSION");
		const char *delay = getenv("MOCKRM_VERSION_DELAY_MS");

		if (delay && *delay) {
			atomic_store(&mockrm_in_version_query, 1);
			usleep((useconds_t)atoi(delay) * 1000);
			atomic_store(&mockrm_in_version_query, 0);
		}
		if (p->cmd == NV_RM_API_VERSION_CMD_QUERY) {
			snprintf(p->version_string, sizeof(p->version_string), "%s", v ? v : "580.159.04");
			p->reply = NV_RM_API_VERSION_REPLY_RECOGNIZED;
		}
		return 0;
	}
	}
	log_call(nr, 0);
	return 0;
}

int ioctl(int fd, unsigned long req, ...)
{
	static int (*real)(int, unsigned long, ...);
	va_list ap;
	void *arg;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!real)
		real = dlsym(RTLD_NEXT, "ioctl");
	/* RM answers the version query on nvidiactl only (nv.c NV_CTL_DEVICE_ONLY: -EINVAL) */
	if (NV_IOC_TYPE(req) == NV_IOCTL_MAGIC && NV_IOC_NR(req) == NV_ESC_CHECK_VERSION_STR &&
	    fake_minor(fd) >= 0 && fake_minor(fd) != 255) {
		errno = EINVAL;
		return -1;
	}
	if (NV_IOC_TYPE(req) == NV_IOCTL_MAGIC && fake_minor(fd) >= 0)
		return rm(NV_IOC_NR(req), arg);
	return real(fd, req, arg);
}
