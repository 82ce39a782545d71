// SPDX-License-Identifier: MIT
/*
 * probe_userd.c - a standalone LD_PRELOAD tracer (not part of libgpuslice.so): where
 * does a CUDA process's channel USERD live, and can the process itself read each
 * channel's GPGet/GPPut cheaply, busy, sleeping, idle and while gated?
 * Driven by tests/gpu/probe_userd.py; results in docs/h100-userd.md.
 *
 *   gcc -O2 -shared -fPIC -o /tmp/probe_userd.so tests/gpu/probe_userd.c -ldl -lpthread
 *   LD_PRELOAD=/tmp/probe_userd.so PROBE_USERD_OUT=/tmp/pu python3 ...
 *
 * It wraps ioctl (real one via dlsym(RTLD_NEXT)), mmap/mmap64/munmap (real ones via
 * syscall, so no dlsym recursion) and records, one line each, to $PROBE_USERD_OUT.<pid>:
 *   CHAN  every NV_ESC_RM_ALLOC of HOPPER_CHANNEL_GPFIFO_A (0xc86f) with hUserdMemory[0],
 *         userdOffset[0], gpFifoOffset, gpFifoEntries of its NV_CHANNEL_ALLOC_PARAMS
 *   TSG   every KEPLER_CHANNEL_GROUP_A (0xa06c) with its engineType
 *   MAP   every NV_ESC_RM_MAP_MEMORY (hClient, hDevice, hMemory, offset, length, flags,
 *         fd, returned pLinearAddress and status)
 *   MMAP  every mmap of a /dev/nvidia* character device (major 195): fd, offset, length,
 *         returned address, and which MAP it belongs to (RM keeps one mmap context per
 *         file, kernel-open/nvidia/nv-mmap.c: the next mmap of the MAP's fd, pgoff 0)
 *   RESOLVE  a channel's USERD user address: the mapping of hUserdMemory[0] plus
 *         userdOffset[0] (CUDA-allocated USERD), or the mapping whose hMemory is the
 *         channel itself (RM-allocated USERD, kchannelMap_IMPL)
 *   W     per 100 ms window (CLOCK_MONOTONIC end time): samples taken, and for every
 *         channel with anything to report: samples with GPGet != GPPut, how far GPPut
 *         and GPGet advanced (GPFIFO entries, modulo gpFifoEntries), last GPGet/GPPut
 *   COST  time of a burst of 1000 reads of one GPGet, and of the sampling loop
 *   DUMP  words 0x40..0x8c of a USERD (Put, Get, Reference, PutHi, TopLevelGet, GetHi,
 *         GPGet, GPPut)
 *   SUMMARY per channel at exit
 * A background thread samples GPGet (byte 0x88) and GPPut (0x8c) of every resolved
 * channel every $PROBE_USERD_PERIOD_US microseconds (default 1000; 0: trace only), as two
 * 4-byte loads, or as one 8-byte load with PROBE_USERD_READ64=1.
 * If a channel's USERD cannot be located within 2 s, UNRESOLVED prints the MAP/MMAP
 * records and the nvidia lines of /proc/self/maps, so the mapping can be understood.
 *
 * Layouts (open-gpu-kernel-modules, branch 580):
 *   NVOS64_PARAMETERS (src/common/sdk/nvidia/inc/nvos.h; kmod/core/nvrm_abi.h):
 *     hRoot 0, hObjectParent 4, hObjectNew 8, hClass 12, pAllocParms 16, pRightsRequested 24,
 *     paramsSize 32, flags 36, status 40 (48 bytes). NVOS21 (32 bytes): status 28.
 *   NV_CHANNEL_ALLOC_PARAMS (src/common/sdk/nvidia/inc/alloc/alloc_channel.h), with
 *     NV_MAX_SUBDEVICES 8 (src/common/sdk/nvidia/inc/nvlimits.h):
 *     hObjectError 0, hObjectBuffer 4, gpFifoOffset 8 (NvU64), gpFifoEntries 16, flags 20,
 *     hContextShare 24, hVASpace 28, hUserdMemory[8] 32..63, userdOffset[8] 64..127 (NvU64,
 *     8-aligned), engineType 128, cid 132, subDeviceId 136.
 *   NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS (nvos.h): hObjectError 0, hObjectEccError 4,
 *     hVASpace 8, engineType 12.
 *   nv_ioctl_nvos33_parameters_with_fd (kernel-open/common/inc/nv-unix-nvos-params-wrappers.h):
 *     hClient 0, hDevice 4, hMemory 8, offset 16, length 24, pLinearAddress 32, status 40,
 *     flags 44, fd 48 (56 bytes).
 *   NVOS00_PARAMETERS (RM_FREE): hRoot 0, hObjectParent 4, hObjectOld 8, status 12.
 *   Nvc86fControl (src/common/sdk/nvidia/inc/class/clc86f.h): Put 0x40, Get 0x44,
 *     Reference 0x48, PutHi 0x4c, TopLevelGet 0x58, TopLevelGetHi 0x5c, GetHi 0x60,
 *     GPGet 0x88 (read only), GPPut 0x8c; 512 bytes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#define NV_MAJOR 195
#define ESC_RM_FREE 0x29
#define ESC_RM_ALLOC 0x2b
#define ESC_RM_MAP_MEMORY 0x4e
#define CLASS_CHANNEL 0xc86f
#define CLASS_TSG 0xa06c
#define CH_HUSERD 32
#define CH_UOFF 64
#define CH_ENGINE 128
#define CH_PARAMS_READ 144
#define USERD_SIZE 512
#define GPGET 0x88
#define GPPUT 0x8c

#define MAXCH 128
#define MAXTSG 64
#define MAXMAP 1024
#define WINDOW_NS 100000000ull

struct map_rec {
	uint32_t client, device, memory, status, flags;
	int ioctl_fd, fd;
	uint64_t offset, length, plinear;
	uintptr_t addr; /* user address from the mmap that followed, 0 if none yet */
	int dead;
};

struct chan {
	uint32_t client, parent, handle, huserd, engine, entries, gpfifo_entries_bad;
	uint64_t uoff, gpfifo;
	volatile uint32_t *u; /* USERD user address, NULL until resolved */
	const char *via;
	int dead, reported_unresolved;
	uint64_t t_alloc;
	/* sampling state */
	uint32_t last_get, last_put;
	int have_last;
	uint64_t w_samples, w_neq, w_putadv, w_getadv, w_bad;
	uint64_t t_samples, t_neq, t_putadv, t_getadv, t_bad;
};

static struct chan chans[MAXCH];
static int nchans;
static struct {
	uint32_t handle, engine;
} tsgs[MAXTSG];
static int ntsgs;
static struct map_rec maps[MAXMAP];
static int nmaps;
static int any_resolved;

static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER;    /* the tables */
static pthread_mutex_t sample_lock = PTHREAD_MUTEX_INITIALIZER; /* reads vs. unmap/free */
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static FILE *out;
static pthread_t sampler;
static int sampler_started, stop;
static int (*real_ioctl)(int, unsigned long, ...);

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void emit(const char *fmt, ...)
{
	va_list ap;
	pthread_mutex_lock(&out_lock);
	if (!out) {
		const char *base = getenv("PROBE_USERD_OUT");
		char path[512];
		snprintf(path, sizeof(path), "%s.%d", base && *base ? base : "/tmp/probe_userd", getpid());
		out = fopen(path, "a");
		if (!out)
			out = stderr;
	}
	fprintf(out, "%.6f ", now_ns() / 1e9);
	va_start(ap, fmt);
	vfprintf(out, fmt, ap);
	va_end(ap);
	fputc('\n', out);
	fflush(out);
	pthread_mutex_unlock(&out_lock);
}

static uint32_t engine_of(uint32_t tsg)
{
	for (int i = 0; i < ntsgs; i++)
		if (tsgs[i].handle == tsg)
			return tsgs[i].engine;
	return 0xffffffff;
}

static void dump_userd(int i)
{
	volatile uint32_t *u = chans[i].u;
	emit("DUMP ch=%d h=0x%08x Put=%u Get=%u Ref=%u PutHi=%u TopGet=%u TopGetHi=%u GetHi=%u GPGet=%u GPPut=%u",
	     i, chans[i].handle, u[0x40 / 4], u[0x44 / 4], u[0x48 / 4], u[0x4c / 4], u[0x58 / 4], u[0x5c / 4],
	     u[0x60 / 4], u[GPGET / 4], u[GPPUT / 4]);
}

/* with rec_lock held */
static void print_unresolved(int i)
{
	struct chan *c = &chans[i];
	emit("UNRESOLVED ch=%d h=0x%08x hUserd=0x%08x uoff=0x%lx: %d MAP records follow", i, c->handle, c->huserd,
	     (unsigned long)c->uoff, nmaps);
	for (int m = 0; m < nmaps; m++)
		emit("UNRESOLVED-MAP hMemory=0x%08x off=0x%lx len=0x%lx fd=%d status=0x%x addr=0x%lx dead=%d",
		     maps[m].memory, (unsigned long)maps[m].offset, (unsigned long)maps[m].length, maps[m].fd,
		     maps[m].status, (unsigned long)maps[m].addr, maps[m].dead);
	FILE *f = fopen("/proc/self/maps", "r");
	if (f) {
		char line[512];
		while (fgets(line, sizeof(line), f))
			if (strstr(line, "/dev/nvidia")) {
				line[strcspn(line, "\n")] = 0;
				emit("UNRESOLVED-PROC %s", line);
			}
		fclose(f);
	}
}

/* with rec_lock held; sample_lock held by the caller too */
static void resolve(void)
{
	for (int i = 0; i < nchans; i++) {
		struct chan *c = &chans[i];
		if (c->u || c->dead)
			continue;
		for (int m = nmaps - 1; m >= 0; m--) {
			struct map_rec *r = &maps[m];
			if (!r->addr || r->dead || r->status || r->client != c->client)
				continue;
			if (c->huserd) {
				if (r->memory != c->huserd || c->uoff < r->offset ||
				    c->uoff + USERD_SIZE > r->offset + r->length)
					continue;
				c->u = (volatile uint32_t *)(r->addr + (c->uoff - r->offset));
				c->via = "hUserdMemory+userdOffset";
			} else {
				if (r->memory != c->handle)
					continue;
				c->u = (volatile uint32_t *)(r->addr - r->offset);
				c->via = "channel-handle";
			}
			emit("RESOLVE ch=%d h=0x%08x via=%s map=%d hMemory=0x%08x addr=%p after_ms=%.1f", i, c->handle,
			     c->via, m, r->memory, (void *)c->u, (now_ns() - c->t_alloc) / 1e6);
			any_resolved = 1;
			dump_userd(i);
			break;
		}
		if (!c->u && !c->reported_unresolved && now_ns() - c->t_alloc > 2000000000ull) {
			c->reported_unresolved = 1;
			print_unresolved(i);
		}
	}
}

static void cost_burst(void)
{
	volatile uint32_t *u = NULL;
	for (int i = 0; i < nchans && !u; i++)
		if (chans[i].u && !chans[i].dead)
			u = chans[i].u;
	if (!u)
		return;
	uint64_t t0 = now_ns(), x = 0;
	for (int k = 0; k < 1000; k++)
		x += u[GPGET / 4];
	uint64_t t1 = now_ns();
	for (int k = 0; k < 1000; k++)
		x += u[GPGET / 4] + u[GPPUT / 4];
	uint64_t t2 = now_ns();
	for (int k = 0; k < 1000; k++)
		x += *(volatile uint64_t *)(u + GPGET / 4);
	uint64_t t3 = now_ns();
	emit("COST burst: 1000 reads of GPGet %.3f us/read; 1000 GPGet+GPPut pairs %.3f us/pair; "
	     "1000 8-byte reads of GPGet|GPPut %.3f us/read (x=%lu)",
	     (t1 - t0) / 1000.0 / 1000.0, (t2 - t1) / 1000.0 / 1000.0, (t3 - t2) / 1000.0 / 1000.0,
	     (unsigned long)x);
}

static void flush_window(uint64_t tend, uint64_t samples, uint64_t missed, uint64_t cost_sum, uint64_t cost_max,
			 uint64_t reads)
{
	char buf[8192];
	int n = snprintf(buf, sizeof(buf), "W %.3f n=%lu miss=%lu loop_us=%.2f/%.2f reads=%lu |", tend / 1e9,
			 (unsigned long)samples, (unsigned long)missed, samples ? cost_sum / 1e3 / samples : 0.0,
			 cost_max / 1e3, (unsigned long)reads);
	for (int i = 0; i < nchans && n < (int)sizeof(buf) - 128; i++) {
		struct chan *c = &chans[i];
		if (!c->w_samples)
			continue;
		if (c->w_neq || c->w_putadv || c->w_getadv || c->w_bad)
			n += snprintf(buf + n, sizeof(buf) - n, " c%d:%lu/%lu/%lu/%u,%u%s", i, (unsigned long)c->w_neq,
				      (unsigned long)c->w_putadv, (unsigned long)c->w_getadv, c->last_get, c->last_put,
				      c->w_bad ? "!bad" : "");
		c->t_samples += c->w_samples;
		c->t_neq += c->w_neq;
		c->t_putadv += c->w_putadv;
		c->t_getadv += c->w_getadv;
		c->t_bad += c->w_bad;
		c->w_samples = c->w_neq = c->w_putadv = c->w_getadv = c->w_bad = 0;
	}
	emit("%s", buf);
}

static void *sample_main(void *arg)
{
	(void)arg;
	const char *p = getenv("PROBE_USERD_PERIOD_US");
	uint64_t period = (p && *p ? strtoull(p, NULL, 0) : 1000) * 1000ull;
	uint64_t next = now_ns(), wend = (next / WINDOW_NS + 1) * WINDOW_NS, last_resolve = 0;
	uint64_t samples = 0, missed = 0, cost_sum = 0, cost_max = 0, reads = 0, windows = 0;
	int resolved_before = 0;
	int sampling = period != 0;
	const char *r64 = getenv("PROBE_USERD_READ64");
	int read64 = r64 && *r64 == '1';
	if (!sampling)
		period = 10000000ull; /* trace only: still resolve (every 50 ms), never read */
	emit("SAMPLER period_us=%lu sampling=%d read64=%d", (unsigned long)(period / 1000), sampling, read64);
	while (!stop) {
		struct timespec ts = {.tv_sec = next / 1000000000ull, .tv_nsec = next % 1000000000ull};
		clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
		uint64_t t = now_ns();
		if (t >= wend) {
			pthread_mutex_lock(&sample_lock);
			flush_window(wend, samples, missed, cost_sum, cost_max, reads);
			if (sampling && (++windows % 30) == 0) {
				cost_burst();
				for (int i = 0; i < nchans; i++)
					if (chans[i].u && !chans[i].dead)
						dump_userd(i);
			}
			pthread_mutex_unlock(&sample_lock);
			samples = missed = cost_sum = cost_max = reads = 0;
			wend = (t / WINDOW_NS + 1) * WINDOW_NS;
		}
		if (t - last_resolve > 50000000ull) {
			last_resolve = t;
			pthread_mutex_lock(&sample_lock);
			pthread_mutex_lock(&rec_lock);
			resolve();
			pthread_mutex_unlock(&rec_lock);
			if (any_resolved && !resolved_before && sampling) {
				resolved_before = 1;
				cost_burst();
			}
			pthread_mutex_unlock(&sample_lock);
		}
		if (sampling) {
			pthread_mutex_lock(&sample_lock);
			uint64_t t0 = now_ns();
			int nread = 0;
			for (int i = 0; i < nchans; i++) {
				struct chan *c = &chans[i];
				if (!c->u || c->dead)
					continue;
				uint32_t g, pp;
				if (read64) { /* GPGet and GPPut are adjacent: one 8-byte load */
					uint64_t v = *(volatile uint64_t *)(c->u + GPGET / 4);
					g = (uint32_t)v;
					pp = (uint32_t)(v >> 32);
					nread += 1;
				} else {
					g = c->u[GPGET / 4];
					pp = c->u[GPPUT / 4];
					nread += 2;
				}
				c->w_samples++;
				if (g != pp)
					c->w_neq++;
				if (c->entries && (g >= c->entries || pp >= c->entries))
					c->w_bad++;
				else if (c->have_last && c->entries) {
					c->w_putadv += (pp + c->entries - c->last_put) % c->entries;
					c->w_getadv += (g + c->entries - c->last_get) % c->entries;
				}
				c->last_get = g;
				c->last_put = pp;
				c->have_last = 1;
			}
			uint64_t dt = now_ns() - t0;
			pthread_mutex_unlock(&sample_lock);
			if (nread) {
				samples++;
				reads += nread;
				cost_sum += dt;
				if (dt > cost_max)
					cost_max = dt;
			}
		}
		next += period;
		uint64_t t2 = now_ns();
		if (next < t2) { /* fell behind: skip the ticks missed */
			uint64_t k = (t2 - next) / period + 1;
			missed += k;
			next += k * period;
		}
	}
	return NULL;
}

static void start_sampler(void)
{
	if (sampler_started)
		return;
	sampler_started = 1;
	pthread_attr_t a;
	pthread_attr_init(&a);
	pthread_attr_setdetachstate(&a, PTHREAD_CREATE_JOINABLE);
	if (pthread_create(&sampler, &a, sample_main, NULL))
		emit("ERROR pthread_create failed");
}

static int is_nvidia_fd(int fd, char *path, size_t n)
{
	struct stat st;
	if (fd < 0 || fstat(fd, &st) || !S_ISCHR(st.st_mode) || major(st.st_rdev) != NV_MAJOR)
		return 0;
	char link[64];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t k = readlink(link, path, n - 1);
	path[k > 0 ? k : 0] = 0;
	return 1;
}

int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (!real_ioctl)
		real_ioctl = (int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
	if (_IOC_TYPE(req) != 'F' || !arg)
		return real_ioctl(fd, req, arg);
	unsigned nr = _IOC_NR(req), size = _IOC_SIZE(req);
	uint8_t *a = arg;
	uint8_t pre[CH_PARAMS_READ];
	uint32_t klass = 0;
	int have_pre = 0;
	if (nr == ESC_RM_ALLOC && (size == 48 || size == 32)) {
		memcpy(&klass, a + 12, 4);
		uint64_t pp;
		memcpy(&pp, a + 16, 8);
		if (pp && (klass == CLASS_CHANNEL || klass == CLASS_TSG)) {
			memcpy(pre, (void *)(uintptr_t)pp, klass == CLASS_CHANNEL ? CH_PARAMS_READ : 16);
			have_pre = 1;
		}
	}
	int r = real_ioctl(fd, req, arg);
	if (nr == ESC_RM_ALLOC && (size == 48 || size == 32) && (klass == CLASS_CHANNEL || klass == CLASS_TSG)) {
		uint32_t root, parent, hnew, status;
		memcpy(&root, a, 4);
		memcpy(&parent, a + 4, 4);
		memcpy(&hnew, a + 8, 4);
		memcpy(&status, a + (size == 48 ? 40 : 28), 4);
		if (klass == CLASS_TSG) {
			uint32_t eng = 0;
			if (have_pre)
				memcpy(&eng, pre + 12, 4);
			emit("TSG client=0x%08x parent=0x%08x h=0x%08x engineType=%u ret=%d status=0x%x", root, parent,
			     hnew, eng, r, status);
			pthread_mutex_lock(&rec_lock);
			if (r == 0 && !status && ntsgs < MAXTSG) {
				tsgs[ntsgs].handle = hnew;
				tsgs[ntsgs].engine = eng;
				ntsgs++;
			}
			pthread_mutex_unlock(&rec_lock);
		} else {
			uint32_t hu = 0, entries = 0, ceng = 0;
			uint64_t uoff = 0, gpf = 0;
			if (have_pre) {
				memcpy(&gpf, pre + 8, 8);
				memcpy(&entries, pre + 16, 4);
				memcpy(&hu, pre + CH_HUSERD, 4);
				memcpy(&uoff, pre + CH_UOFF, 8);
				memcpy(&ceng, pre + CH_ENGINE, 4);
			}
			pthread_mutex_lock(&rec_lock);
			int idx = -1;
			if (r == 0 && !status && nchans < MAXCH) {
				idx = nchans;
				struct chan *c = &chans[idx];
				memset(c, 0, sizeof(*c));
				c->client = root;
				c->parent = parent;
				c->handle = hnew;
				c->huserd = hu;
				c->uoff = uoff;
				c->gpfifo = gpf;
				c->entries = entries;
				c->engine = engine_of(parent);
				c->t_alloc = now_ns();
				nchans++;
			}
			uint32_t teng = engine_of(parent);
			pthread_mutex_unlock(&rec_lock);
			emit("CHAN idx=%d client=0x%08x tsg=0x%08x h=0x%08x hUserdMemory0=0x%08x userdOffset0=0x%lx "
			     "gpFifoOffset=0x%lx gpFifoEntries=%u engineType(param)=%u tsgEngineType=%u ret=%d status=0x%x",
			     idx, root, parent, hnew, hu, (unsigned long)uoff, (unsigned long)gpf, entries, ceng, teng, r,
			     status);
			if (idx >= 0)
				start_sampler();
		}
	} else if (nr == ESC_RM_MAP_MEMORY && size == 56) {
		struct map_rec m = {0};
		memcpy(&m.client, a, 4);
		memcpy(&m.device, a + 4, 4);
		memcpy(&m.memory, a + 8, 4);
		memcpy(&m.offset, a + 16, 8);
		memcpy(&m.length, a + 24, 8);
		memcpy(&m.plinear, a + 32, 8);
		memcpy(&m.status, a + 40, 4);
		memcpy(&m.flags, a + 44, 4);
		memcpy(&m.fd, a + 48, 4);
		m.ioctl_fd = fd;
		pthread_mutex_lock(&rec_lock);
		int idx = nmaps < MAXMAP ? nmaps++ : -1;
		if (idx >= 0)
			maps[idx] = m;
		pthread_mutex_unlock(&rec_lock);
		emit("MAP idx=%d ioctl_fd=%d client=0x%08x device=0x%08x memory=0x%08x offset=0x%lx length=0x%lx "
		     "flags=0x%x fd=%d ret=%d status=0x%x pLinearAddress=0x%lx",
		     idx, fd, m.client, m.device, m.memory, (unsigned long)m.offset, (unsigned long)m.length, m.flags,
		     m.fd, r, m.status, (unsigned long)m.plinear);
	} else if (nr == ESC_RM_FREE && size == 16 && r == 0) {
		uint32_t hold;
		memcpy(&hold, a + 8, 4);
		pthread_mutex_lock(&sample_lock);
		pthread_mutex_lock(&rec_lock);
		for (int i = 0; i < nchans; i++)
			if (chans[i].handle == hold && !chans[i].dead) {
				chans[i].dead = 1;
				emit("FREE ch=%d h=0x%08x", i, hold);
			}
		for (int i = 0; i < nmaps; i++)
			if (maps[i].memory == hold)
				maps[i].dead = 1;
		pthread_mutex_unlock(&rec_lock);
		pthread_mutex_unlock(&sample_lock);
	}
	return r;
}

static void *do_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	void *ret = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
	char path[128];
	if (fd < 0 || ret == MAP_FAILED || !is_nvidia_fd(fd, path, sizeof(path)))
		return ret;
	pthread_mutex_lock(&rec_lock);
	int idx = -1;
	for (int m = nmaps - 1; m >= 0; m--)
		if (!maps[m].addr && (maps[m].fd == fd || (maps[m].fd < 0 && maps[m].ioctl_fd == fd))) {
			idx = m;
			if (off == 0)
				maps[m].addr = (uintptr_t)ret;
			break;
		}
	uint32_t mem = idx >= 0 ? maps[idx].memory : 0;
	pthread_mutex_unlock(&rec_lock);
	emit("MMAP fd=%d path=%s offset=0x%lx length=0x%lx prot=0x%x flags=0x%x req_addr=%p addr=%p map=%d hMemory=0x%08x",
	     fd, path, (unsigned long)off, (unsigned long)len, prot, flags, addr, ret, idx, mem);
	return ret;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return do_mmap(addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return do_mmap(addr, len, prot, flags, fd, off);
}

int munmap(void *addr, size_t len)
{
	if (any_resolved) {
		uintptr_t lo = (uintptr_t)addr, hi = lo + len;
		int hit = 0;
		for (int m = 0; m < nmaps; m++)
			if (maps[m].addr && maps[m].addr < hi && maps[m].addr + maps[m].length > lo)
				hit = 1;
		if (hit) {
			pthread_mutex_lock(&sample_lock);
			pthread_mutex_lock(&rec_lock);
			for (int m = 0; m < nmaps; m++)
				if (maps[m].addr && maps[m].addr < hi && maps[m].addr + maps[m].length > lo)
					maps[m].dead = 1;
			for (int i = 0; i < nchans; i++)
				if (chans[i].u && (uintptr_t)chans[i].u < hi && (uintptr_t)chans[i].u + USERD_SIZE > lo &&
				    !chans[i].dead) {
					chans[i].dead = 1;
					emit("MUNMAP ch=%d h=0x%08x", i, chans[i].handle);
				}
			pthread_mutex_unlock(&rec_lock);
			int r = (int)syscall(SYS_munmap, addr, len);
			pthread_mutex_unlock(&sample_lock);
			return r;
		}
	}
	return (int)syscall(SYS_munmap, addr, len);
}

__attribute__((destructor)) static void fini(void)
{
	if (!sampler_started)
		return;
	stop = 1;
	pthread_join(sampler, NULL);
	for (int i = 0; i < nchans; i++) {
		struct chan *c = &chans[i];
		emit("SUMMARY ch=%d h=0x%08x tsg=0x%08x engineType=%u resolved=%s samples=%lu neq=%lu putadv=%lu getadv=%lu "
		     "bad=%lu",
		     i, c->handle, c->parent, c->engine, c->u ? c->via : "no", (unsigned long)c->t_samples,
		     (unsigned long)c->t_neq, (unsigned long)c->t_putadv, (unsigned long)c->t_getadv,
		     (unsigned long)c->t_bad);
	}
}
