// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * rmtrace.c - what a workload asks RM and what RM answers, counted.
 *
 * LD_PRELOAD=tests/gpu/rmtrace.so: wraps ioctl() and, for NVIDIA's RM escapes
 * (type 'F' on a character device of major 195), counts each (escape, class
 * or control, status) seen after the call returns. Put before libgpuslice.so
 * ("rmtrace.so:libgpuslice.so") it sees the library's answers; alone, the
 * driver's. For NV_MEMORY_FABRIC allocations it also keeps the parameters of
 * the first few (kmod/core/nvrm_abi.h: struct nv00f8_alloc_params). For
 * NV_ESC_RM_VID_HEAP_CONTROL "what" is the NVOS32 function, and the first few
 * ALLOC_SIZE requests are kept (size in and out, type, flags, attr, attr2);
 * for TSG and channel allocations the engineType their parameters name. Opens of
 * /dev/nvidia... and /dev/dri/... are kept too (path, and errno or 0).
 *
 * RMTRACE_OUT: a file prefix; at exit each process appends JSON lines to
 * PREFIX.PID: {"esc":..,"what":..,"status":..,"n":..}, then the fabric lines.
 * A tool for finding the calls no trace has seen (tests/gpu/compat.py), not
 * part of what ships.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#define NSLOT 4096
#define NFAB 16
#define NSAMPLE 256

struct slot {
	uint32_t esc, what, status, used;
	uint64_t n;
};

static struct slot slots[NSLOT];
static uint64_t fab[NFAB][6];
static int nfab;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int (*real_ioctl)(int, unsigned long, ...);

static char samples[NSAMPLE][200];
static int nsample;

static void sample(const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&lock);
	if (nsample < NSAMPLE) {
		va_start(ap, fmt);
		vsnprintf(samples[nsample++], sizeof(samples[0]), fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&lock);
}

static void count(uint32_t esc, uint32_t what, uint32_t status)
{
	uint32_t h = (esc * 2654435761u) ^ (what * 40503u) ^ status;
	unsigned int i;

	pthread_mutex_lock(&lock);
	for (i = 0; i < NSLOT; i++) {
		struct slot *s = &slots[(h + i) % NSLOT];

		if (!s->used) {
			s->used = 1;
			s->esc = esc;
			s->what = what;
			s->status = status;
		}
		if (s->esc == esc && s->what == what && s->status == status) {
			s->n++;
			break;
		}
	}
	pthread_mutex_unlock(&lock);
}

static int is_nvidia(int fd)
{
	struct stat st;

	return fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == 195;
}

static uint32_t u32at(const void *p, unsigned int off)
{
	uint32_t v;

	memcpy(&v, (const char *)p + off, sizeof(v));
	return v;
}

/*
 * NV2080_CTRL_CMD_GR_SET_CTXSW_PREEMPTION_MODE (ctrl2080gr.h: flags, hChannel,
 * gfxpPreemptMode, cilpPreemptMode): what the driver asks, and what RM answers.
 * RMTRACE_PREEMPT=gfxp|wfi (graphics) or cilp|cta|cwfi (compute) asks for that mode
 * instead: an experiment on how a context is preempted, never part of what ships.
 */
static int preempt_mode(int fd, unsigned long req, void *arg)
{
	const char *force = getenv("RMTRACE_PREEMPT");
	uint32_t *p, in[4] = { 0 };
	uint64_t pp;
	int ret;

	memcpy(&pp, (const char *)arg + 16, sizeof(pp));
	p = (uint32_t *)(uintptr_t)pp;
	if (p)
		memcpy(in, p, sizeof(in));
	if (p && force) {
		if (!strcmp(force, "gfxp") || !strcmp(force, "wfi")) {
			p[0] |= 2;
			p[2] = !strcmp(force, "gfxp");
		} else if (!strcmp(force, "cilp") || !strcmp(force, "cta") || !strcmp(force, "cwfi")) {
			p[0] |= 1;
			p[3] = !strcmp(force, "cilp") ? 2 : !strcmp(force, "cta");
		}
	}
	ret = real_ioctl(fd, req, arg);
	count(0x2a, 0x20801210, u32at(arg, 28));
	sample("{\"preempt\":{\"asked\":{\"flags\":%u,\"gfxp\":%u,\"cilp\":%u},"
	       "\"sent\":{\"flags\":%u,\"gfxp\":%u,\"cilp\":%u},\"status\":%u,\"ret\":%d}}",
	       in[0], in[2], in[3], p ? p[0] : 0, p ? p[2] : 0, p ? p[3] : 0, u32at(arg, 28), ret);
	return ret;
}

int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	void *arg;
	int ret;
	uint32_t nr = req & 0xff, what = 0, status = 0, st_off = 0;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!real_ioctl)
		real_ioctl = (int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
	if (((req >> 8) & 0xff) == 'F' && nr == 0x2a && arg && u32at(arg, 8) == 0x20801210 &&
	    is_nvidia(fd))
		return preempt_mode(fd, req, arg);
	ret = real_ioctl(fd, req, arg);
	if (((req >> 8) & 0xff) != 'F' || !arg || !is_nvidia(fd))
		return ret;
	switch (nr) {
	case 0x2b:	/* RM_ALLOC: hClass at 12, status at 40 */
	case 0x27:	/* RM_ALLOC_MEMORY: hClass at 12, status at 40 */
		what = u32at(arg, 12);
		st_off = 40;
		break;
	case 0x2a:	/* RM_CONTROL: cmd at 8, status at 28 */
		what = u32at(arg, 8);
		st_off = 28;
		break;
	case 0x29:	/* RM_FREE: status at 12 */
		st_off = 12;
		break;
	case 0x34:	/* RM_DUP_OBJECT: status at 24 */
		st_off = 24;
		break;
	case 0x4a:	/* RM_VID_HEAP_CONTROL (NVOS32_PARAMETERS): function at 8, status at 20 */
		what = u32at(arg, 8);
		st_off = 20;
		break;
	}
	status = st_off ? u32at(arg, st_off) : (uint32_t)(ret ? 0xffff0000u : 0);
	count(nr, what, status);
	if (nr == 0x4a && what == 2) {	/* ALLOC_SIZE: data.AllocSize at 40 */
		uint64_t size;

		memcpy(&size, (const char *)arg + 88, sizeof(size));
		sample("{\"vidheap\":{\"hMemory\":%u,\"type\":%u,\"flags\":%u,\"attr\":%u,\"attr2\":%u,"
		       "\"size\":%llu,\"status\":%u}}", u32at(arg, 44), u32at(arg, 48), u32at(arg, 52),
		       u32at(arg, 56), u32at(arg, 144), (unsigned long long)size, status);
	}
	if (nr == 0x41)		/* IDLE_CHANNELS: numChannels, flags, timeout */
		sample("{\"idle\":{\"numChannels\":%u,\"flags\":%u,\"timeout\":%u,\"status\":%u}}",
		       u32at(arg, 12), u32at(arg, 40), u32at(arg, 44), status);
	if (nr == 0x2b && (what == 0xb8b0 || what == 0xb8d1 || what == 0xb8fa)) {
		uint64_t p;

		memcpy(&p, (const char *)arg + 16, sizeof(p));
		sample("{\"video\":{\"class\":%u,\"prohibitMultipleInstances\":%d,\"engineInstance\":%d,"
		       "\"status\":%u}}", what, p ? (int)*(const uint32_t *)(uintptr_t)(p + 4) : -1,
		       p ? (int)*(const uint32_t *)(uintptr_t)(p + 8) : -1, status);
	}
	if (nr == 0x2b && what == 0xfe) {	/* NV_MEMORY_MAPPER: maxQueueSize */
		uint64_t p;

		memcpy(&p, (const char *)arg + 16, sizeof(p));
		if (p)
			sample("{\"mapper\":{\"maxQueueSize\":%u,\"status\":%u}}",
			       *(const uint32_t *)(uintptr_t)(p + 4), status);
	}
	if (nr == 0x2a && what == 0xa06f0104) {	/* NVA06F_CTRL_CMD_BIND: engineType */
		uint64_t p;

		memcpy(&p, (const char *)arg + 16, sizeof(p));
		if (p)
			sample("{\"bind\":{\"engineType\":%u,\"status\":%u}}",
			       *(const uint32_t *)(uintptr_t)p, status);
	}
	if (nr == 0x2b && (what == 0xa06c || what == 0xc86f)) {
		uint64_t p;

		memcpy(&p, (const char *)arg + 16, sizeof(p));
		if (p)
			sample("{\"alloc\":{\"class\":%u,\"engineType\":%u,\"status\":%u}}", what,
			       *(const uint32_t *)(uintptr_t)(p + (what == 0xa06c ? 12 : 128)), status);
	}
	if (nr == 0x2b && what == 0xf8) {
		uint64_t p;

		memcpy(&p, (const char *)arg + 16, sizeof(p));
		pthread_mutex_lock(&lock);
		if (nfab < NFAB && p) {
			/* alignment, allocSize, pageSize, allocFlags, map.offset, map.hVidMem */
			memcpy(fab[nfab], (const void *)(uintptr_t)p, 8 * 3);
			fab[nfab][3] = *(const uint32_t *)(uintptr_t)(p + 24);
			memcpy(&fab[nfab][4], (const void *)(uintptr_t)(p + 32), 8);
			fab[nfab][5] = *(const uint32_t *)(uintptr_t)(p + 40);
			fab[nfab][5] |= (uint64_t)status << 32;
			nfab++;
		}
		pthread_mutex_unlock(&lock);
	}
	return ret;
}

static void note_open(const char *path, int ret)
{
	if (path && (!strncmp(path, "/dev/nvidia", 11) || !strncmp(path, "/dev/dri/", 9)))
		sample("{\"open\":\"%.120s\",\"errno\":%d}", path, ret < 0 ? errno : 0);
}

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);

int open(const char *path, int flags, ...)
{
	va_list ap;
	mode_t mode;
	int ret;

	va_start(ap, flags);
	mode = va_arg(ap, mode_t);
	va_end(ap);
	if (!real_open)
		real_open = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
	ret = real_open(path, flags, mode);
	note_open(path, ret);
	return ret;
}

int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int openat(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	mode_t mode;
	int ret;

	va_start(ap, flags);
	mode = va_arg(ap, mode_t);
	va_end(ap);
	if (!real_openat)
		real_openat = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, "openat");
	ret = real_openat(dirfd, path, flags, mode);
	note_open(path, ret);
	return ret;
}

int openat64(int dirfd, const char *path, int flags, ...) __attribute__((alias("openat")));

__attribute__((destructor)) static void dump(void)
{
	const char *pre = getenv("RMTRACE_OUT");
	char path[4096];
	FILE *f;
	int i;

	if (!pre)
		return;
	snprintf(path, sizeof(path), "%s.%d", pre, (int)getpid());
	f = fopen(path, "a");
	if (!f)
		return;
	for (i = 0; i < NSLOT; i++)
		if (slots[i].used)
			fprintf(f, "{\"esc\":%u,\"what\":%u,\"status\":%u,\"n\":%llu}\n",
				slots[i].esc, slots[i].what, slots[i].status,
				(unsigned long long)slots[i].n);
	for (i = 0; i < nsample; i++)
		fprintf(f, "%s\n", samples[i]);
	for (i = 0; i < nfab; i++)
		fprintf(f, "{\"fabric\":{\"alignment\":%llu,\"allocSize\":%llu,\"pageSize\":%llu,"
			"\"allocFlags\":%llu,\"offset\":%llu,\"hVidMem\":%llu,\"status\":%llu}}\n",
			(unsigned long long)fab[i][0], (unsigned long long)fab[i][1],
			(unsigned long long)fab[i][2], (unsigned long long)fab[i][3],
			(unsigned long long)fab[i][4],
			(unsigned long long)(fab[i][5] & 0xffffffffu),
			(unsigned long long)(fab[i][5] >> 32));
	fclose(f);
}
