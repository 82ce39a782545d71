// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * preload.c - the decision core in user space: LD_PRELOAD=libgpuslice.so.
 *
 * Wraps ioctl() and, to know when RM forgets a file's clients, close(),
 * close_range(), dup*() and fcntl(F_DUPFD*); and mmap(), munmap() and
 * mremap() to find channels' USERD (userd.c). An fd is recognised as NVIDIA's by fstat() on
 * its first 'F' ioctl (character device, major 195: minor 255 is nvidiactl,
 * the rest nvidia<N>), so no open() wrapper is needed and fds opened before
 * the library was loaded are seen too. nvidia-uvm's commands that map, unmap
 * and free external ranges go through the core too (gs_uvm_ioctl(); its fds
 * are recognised by nvidia-uvm's major); ioctls of any other type go straight
 * to libc with no lookup.
 *
 * Each NVIDIA ioctl: copy the argument block in (process_vm_readv, so a bad
 * pointer is EFAULT rather than a crash), then gs_call_run() (kmod/core/call.c:
 * gs_pre(), the real ioctl on the copy, gs_post(), the block back). The
 * core's lock is the only lock on that path; the fd table is lock-free. A
 * signal handler that issues an NVIDIA ioctl while its thread is inside the
 * core would deadlock; CUDA does not do that.
 *
 * Environment:
 *   GPUSLICE_INSTANCE   name reported with every event (default "default")
 *   GPUSLICE_MEM_LIMIT  bytes, or with a K/M/G/T suffix (binary: 4G = 4GiB = 4 << 30),
 *                       for each GPU; or per GPU, "0=8G,1=4G" (RM's device
 *                       instance; a GPU not named has no limit); unset: no limit
 *   GPUSLICE_SOCKET     unix stream socket of the controller
 *                       (default /run/gpuslice/preload.sock); absent: no reports
 *   GPUSLICE_DEBUG      1: refusals and object events on stderr, stats at exit
 *   GPUSLICE_STATS      file that gets one JSON line of counters at exit
 *   GPUSLICE_SAMPLE_MS  how often channels' USERD is looked at (default 5; 0: never)
 *   GPUSLICE_SAMPLE_US  the same in microseconds (50-1000000), before _MS: an online
 *                       service is seen sooner (one 8-byte load per channel each time)
 *   GPUSLICE_TIMESLICE_US  the hardware timeslice of each TSG the process makes
 *                       (NVA06C_CTRL_CMD_SET_TIMESLICE, from the process that owns
 *                       it, as RM requires: docs/h100-findings.md), as the module applies an
 *                       instance's TIMESLICE_US; unset or 0: RM's default. CUDA's
 *                       own request is answered by the core and never passed.
 *   GPUSLICE_INTERLEAVE low, medium or high: the runlist interleave level of each
 *                       TSG the process makes (NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL,
 *                       ctrla06c.h: a HIGH TSG appears in the runlist between every
 *                       LOW one); unset: RM's default (MEDIUM). RM takes it from root
 *                       only (0x1b INSUFFICIENT_PERMISSIONS otherwise, on the H100;
 *                       seen with GPUSLICE_DEBUG). The module's build refuses it from
 *                       a container (not allowlisted): there the operator's tools own it.
 *   GPUSLICE_CAPS       the instance's capability set, as NVIDIA_DRIVER_CAPABILITIES
 *                       names it: compute, utility, graphics, video, comma-separated,
 *                       or all; unset or empty: all. A class, control, escape or
 *                       nvidia-uvm ioctl of none of them is refused as RM refuses one
 *                       it does not have (the module's CAPS); a set with a name not
 *                       among these: none (named on stderr), as the module refuses it
 *   GPUSLICE_EXPORTS    where an instance's processes list what they exported or
 *                       shared, for each other's imports (siblings.c; default
 *                       /dev/shm/gpuslice-exports)
 *
 * A forked child starts with a fresh instance (gs_atfork_child()); a vfork
 * child leaves its parent's state alone (gs_mine()).
 *
 * This is a process's own view: the limit applies per process (memory another
 * process of the instance exported stays charged to that process), and nothing
 * stops a process that bypasses libc (raw syscalls, static binaries). The
 * kernel module is the enforcing path; this build is for measuring the core
 * against the real driver and for hosts where a module cannot be loaded.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core.h"
#include "preload.h"

#define GS_MAX_FD	65536
#define GS_TAG_OTHER	1
#define GS_TAG_CTL	2
#define GS_TAG_GPU	3
#define GS_TAG_UVM	4	/* /dev/nvidia-uvm: its external ranges (kmod/core/uvm.c) */

/* per fd: file_id << 16 | minor << 8 | tag; 0 = not looked at yet */
static _Atomic nv_u64 gs_fds[GS_MAX_FD];
static _Atomic int gs_max_fd;
static _Atomic nv_u64 gs_next_file = 1;
static int gs_no_vm_rw;		/* process_vm_readv refused (seccomp): plain copies */

static int (*real_ioctl)(int, unsigned long, ...);
static int (*real_close)(int);
static int (*real_dup)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);
static int (*real_fcntl)(int, int, ...);
static int (*real_fcntl64)(int, int, ...);
static int (*real_close_range)(unsigned int, unsigned int, int);

struct gs_preload gs_pl;
static pthread_once_t gs_once = PTHREAD_ONCE_INIT;

/* the driver's ABI table (gs_abi_ready()) */
static pthread_mutex_t gs_abi_lock = PTHREAD_MUTEX_INITIALIZER;
static int gs_abi_state;	/* 0: not yet (or the query failed), 1: selected, -1: no table */
static int gs_abi_query_failed;	/* the failure was said on stderr */

/* ---- copies from and to the caller's memory ---- */

static int gs_copy(void *dst, const void *src, size_t len, int to_user)
{
	struct iovec local, remote;
	ssize_t n;

	if (!len)
		return 0;
	if (!src || !dst)
		return -EFAULT;
	if (!gs_no_vm_rw) {
		local.iov_base = to_user ? (void *)src : dst;
		local.iov_len = len;
		remote.iov_base = to_user ? dst : (void *)src;
		remote.iov_len = len;
		if (to_user)
			n = process_vm_writev(getpid(), &local, 1, &remote, 1, 0);
		else
			n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
		if (n == (ssize_t)len)
			return 0;
		if (n >= 0 || errno == EFAULT)
			return -EFAULT;
		gs_no_vm_rw = 1;	/* ENOSYS / EPERM: the syscall is filtered */
	}
	memcpy(dst, src, len);
	return 0;
}

int gs_copy_in(void *dst, const void *src, size_t len)
{
	return gs_copy(dst, src, len, 0);
}

static int gs_io_read(void *ctx, nv_u64 uaddr, void *dst, nv_u32 len)
{
	return gs_copy(dst, (const void *)(uintptr_t)uaddr, len, 0);
}

static int gs_io_write(void *ctx, nv_u64 uaddr, const void *src, nv_u32 len)
{
	return gs_copy((void *)(uintptr_t)uaddr, src, len, 1);
}

static const struct gs_io gs_pl_io = { .read = gs_io_read, .write = gs_io_write };

/* ---- setup ---- */

static void *gs_sym(const char *name)
{
	return dlsym(RTLD_NEXT, name);
}

/*
 * A forked child (PyTorch's DataLoader workers, subprocess) shares its parent's
 * files but not its RM clients' bookkeeping, and may have been forked while
 * another thread held the core's lock: it starts over with a fresh instance
 * and an empty fd table. The parent's instance is left as it was (not freed:
 * its lock may be held by a thread that does not exist in the child).
 */
static struct gs_inst *gs_new_inst(const struct gs_inst_ops *ops)
{
	struct gs_inst *in = gs_inst_new(gs_pl.limit, ops);

	if (in) {
		gs_inst_set_gpu_limits(in, gs_pl.gpu_limit);
		gs_inst_set_caps(in, gs_pl.caps);
	}
	return in;
}

/*
 * GPUSLICE_CAPS: "compute,utility" (or "all") -> GS_CAP_*; 0 for a set with a
 * name it does not know or no name at all, which the caller takes as no
 * capability (the module refuses such a set: netlink.c, CAPS 0 or unknown bits)
 */
static nv_u32 gs_parse_caps(const char *s)
{
	static const struct { const char *name; nv_u32 bit; } caps[] = {
		{ "compute", GS_CAP_COMPUTE }, { "utility", GS_CAP_UTILITY },
		{ "graphics", GS_CAP_GRAPHICS }, { "video", GS_CAP_VIDEO }, { "all", GS_CAPS_ALL },
	};
	nv_u32 mask = 0;

	while (*s) {
		size_t n = strcspn(s, ","), i;

		for (i = 0; i < sizeof(caps) / sizeof(caps[0]); i++)
			if (n == strlen(caps[i].name) && !strncasecmp(s, caps[i].name, n))
				break;
		if (n && i == sizeof(caps) / sizeof(caps[0]))
			return 0;
		if (n)
			mask |= caps[i].bit;
		s += n + (s[n] == ',');
	}
	return mask;
}

static void gs_atfork_child(void)
{
	struct gs_inst_ops ops = { .event = gs_report_event, .ctx = &gs_pl };
	int i;

	for (i = 0; i < GS_MAX_FD; i++)
		atomic_store(&gs_fds[i], 0);
	atomic_store(&gs_max_fd, 0);
	pthread_mutex_init(&gs_pl.sock_lock, NULL);
	/*
	 * Forked while another thread asked the driver its version: that thread
	 * is not in the child and never unlocks. A selection it had not made yet
	 * (gs_abi_state 0) is made again by the child's first call.
	 */
	pthread_mutex_init(&gs_abi_lock, NULL);
	if (gs_pl.sock >= 0)
		real_close(gs_pl.sock);
	gs_pl.sock = -1;
	gs_pl.next_try_ns = 0;
	gs_pl.ctl_sample_ns = 0;	/* the parent's controller said it to the parent */
	gs_pl.ctl_repeat_ns = 0;
	gs_pl.ctl_timeslice_us = 0;
	gs_pl.ctl_timeslice_new = 0;
	gs_pl.ctl_len = 0;
	gs_pl.reporter = 0;	/* threads do not survive fork: the child starts its own */
	gs_userd_atfork_child();
	gs_sibling_atfork_child();
	gs_pl.inst = gs_new_inst(&ops);
	gs_pl.owner = getpid();
}

/*
 * A vfork() child (Python's subprocess, posix_spawn) runs in its parent's memory
 * until it execs, without fork handlers: the fds it closes must not touch the
 * parent's table and instance. Everything but the owner goes straight to libc.
 */
static int gs_mine(void)
{
	return gs_pl.inst && getpid() == gs_pl.owner;
}

static void gs_init_once(void)
{
	struct gs_inst_ops ops = { .event = gs_report_event, .ctx = &gs_pl };
	const char *s;

	real_ioctl = gs_sym("ioctl");
	real_close = gs_sym("close");
	real_dup = gs_sym("dup");
	real_dup2 = gs_sym("dup2");
	real_dup3 = gs_sym("dup3");
	real_fcntl = gs_sym("fcntl");
	real_fcntl64 = gs_sym("fcntl64");
	if (!real_fcntl64)
		real_fcntl64 = real_fcntl;
	real_close_range = gs_sym("close_range");	/* glibc >= 2.34 */

	s = getenv("GPUSLICE_INSTANCE");
	snprintf(gs_pl.name, sizeof(gs_pl.name), "%s", s && *s ? s : "default");
	s = getenv("GPUSLICE_SOCKET");
	snprintf(gs_pl.sock_path, sizeof(gs_pl.sock_path), "%s",
		 s && *s ? s : "/run/gpuslice/preload.sock");
	s = getenv("GPUSLICE_DEBUG");
	gs_pl.debug = s && *s && *s != '0';
	s = getenv("GPUSLICE_STATS");
	if (s && *s)
		snprintf(gs_pl.stats_path, sizeof(gs_pl.stats_path), "%s", s);
	gs_pl.sample_ns = 5000000ull;
	s = getenv("GPUSLICE_SAMPLE_MS");
	if (s && *s) {
		nv_u64 ms;

		if (gs_parse_size(s, &ms) || ms > 1000)
			fprintf(stderr, "gpuslice: bad GPUSLICE_SAMPLE_MS '%s' (0-1000), 5 ms\n", s);
		else
			gs_pl.sample_ns = ms * 1000000ull;
	}
	s = getenv("GPUSLICE_SAMPLE_US");
	if (s && *s) {
		char *end;
		unsigned long long us;

		errno = 0;
		us = strtoull(s, &end, 10);
		if (errno || *end || *s < '0' || *s > '9' || us < 50 || us > 1000000)
			fprintf(stderr, "gpuslice: bad GPUSLICE_SAMPLE_US '%s' (50-1000000), ignored\n", s);
		else
			gs_pl.sample_ns = us * 1000ull;
	}
	gs_pl.interleave = -1;
	s = getenv("GPUSLICE_INTERLEAVE");
	if (s && *s) {
		if (!strcmp(s, "low"))
			gs_pl.interleave = NVA06C_CTRL_INTERLEAVE_LEVEL_LOW;
		else if (!strcmp(s, "medium"))
			gs_pl.interleave = NVA06C_CTRL_INTERLEAVE_LEVEL_MEDIUM;
		else if (!strcmp(s, "high"))
			gs_pl.interleave = NVA06C_CTRL_INTERLEAVE_LEVEL_HIGH;
		else
			fprintf(stderr, "gpuslice: bad GPUSLICE_INTERLEAVE '%s' (low, medium, high), RM's default\n", s);
	}
	s = getenv("GPUSLICE_TIMESLICE_US");
	if (s && *s && (gs_parse_size(s, &gs_pl.timeslice_us) || gs_pl.timeslice_us > 1000000000ull)) {
		fprintf(stderr, "gpuslice: bad GPUSLICE_TIMESLICE_US '%s', RM's default\n", s);
		gs_pl.timeslice_us = 0;
	}
	/*
	 * A bad set fails closed: no capability, so every class, control,
	 * escape and nvidia-uvm ioctl of one is refused as RM refuses what it
	 * does not have, and never more than was asked for.
	 */
	gs_pl.caps = GS_CAPS_ALL;
	s = getenv("GPUSLICE_CAPS");
	if (s && *s && !(gs_pl.caps = gs_parse_caps(s)))
		fprintf(stderr, "gpuslice: bad GPUSLICE_CAPS '%s' (compute, utility, graphics, video, all), none\n", s);
	gs_pl.limit = ~0ull;
	s = getenv("GPUSLICE_MEM_LIMIT");
	if (s && *s && gs_parse_limits(s, &gs_pl.limit, gs_pl.gpu_limit))
		fprintf(stderr, "gpuslice: bad GPUSLICE_MEM_LIMIT '%s', no limit\n", s);
	pthread_mutex_init(&gs_pl.sock_lock, NULL);
	gs_pl.sock = -1;
	gs_pl.inst = gs_new_inst(&ops);
	gs_pl.owner = getpid();
	pthread_atfork(NULL, NULL, gs_atfork_child);
	if (gs_pl.debug)
		fprintf(stderr, "gpuslice: pid %d instance %s limit %llu\n", getpid(), gs_pl.name,
			(unsigned long long)gs_pl.limit);
}

static void gs_init(void)
{
	pthread_once(&gs_once, gs_init_once);
}

__attribute__((constructor)) static void gs_ctor(void)
{
	gs_init();
}

__attribute__((destructor)) static void gs_dtor(void)
{
	if (gs_pl.inst)
		gs_report_stats();
	gs_sibling_exit();
}

/* ---- the fd table ---- */

/* nvidia-uvm's major (dynamic: /proc/devices), -1 when it has none */
static long gs_uvm_major(void)
{
	static _Atomic long major_nr = -2;
	long m = atomic_load(&major_nr);
	char line[128], name[64];
	FILE *f;
	long n;

	if (m != -2)
		return m;
	m = -1;
	f = fopen("/proc/devices", "re");
	while (f && fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "Block", 5))
			break;
		if (sscanf(line, "%ld %63s", &n, name) == 2 && !strcmp(name, "nvidia-uvm"))
			m = n;
	}
	if (f)
		fclose(f);
	atomic_store(&major_nr, m);
	return m;
}

static nv_u64 gs_fd_state(int fd)
{
	struct stat st;
	nv_u64 v, tag, minor_nr = 0;
	int m;

	if (fd < 0 || fd >= GS_MAX_FD)
		return GS_TAG_OTHER;
	v = atomic_load(&gs_fds[fd]);
	if (v)
		return v;
	tag = GS_TAG_OTHER;
	if (fstat(fd, &st) == 0 && S_ISCHR(st.st_mode)) {
		if (major(st.st_rdev) == NV_MAJOR_DEVICE_NUMBER) {
			minor_nr = minor(st.st_rdev);
			if (minor_nr == NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE)
				tag = GS_TAG_CTL;
			else if (minor_nr < 254)	/* 254: nvidia-modeset */
				tag = GS_TAG_GPU;
		} else if ((long)major(st.st_rdev) == gs_uvm_major()) {
			tag = GS_TAG_UVM;
		}
	}
	v = tag | (minor_nr << 8);
	if (tag != GS_TAG_OTHER)
		v |= atomic_fetch_add(&gs_next_file, 1) << 16;
	atomic_store(&gs_fds[fd], v);
	m = atomic_load(&gs_max_fd);
	while (fd > m && !atomic_compare_exchange_weak(&gs_max_fd, &m, fd))
		;
	return v;
}

static int gs_is_nv(nv_u64 v)
{
	return (v & 0xff) == GS_TAG_CTL || (v & 0xff) == GS_TAG_GPU;
}

/* a file whose release the core hears of: RM's nodes and nvidia-uvm */
static int gs_is_tracked(nv_u64 v)
{
	return gs_is_nv(v) || (v & 0xff) == GS_TAG_UVM;
}

/* the fd of the RM call this thread is in (its events are of that file's clients) */
static __thread int gs_fd_now = -1;

int gs_event_fd(void)
{
	return gs_fd_now;
}

nv_u64 gs_fd_file(int fd)
{
	nv_u64 v = gs_fd_state(fd);

	return gs_is_nv(v) ? v >> 16 : 0;
}

int gs_fd_of_file(nv_u64 file_id)
{
	int i, max = atomic_load(&gs_max_fd);

	for (i = 0; i <= max && i < GS_MAX_FD; i++) {
		nv_u64 v = atomic_load(&gs_fds[i]);

		if (gs_is_nv(v) && v >> 16 == file_id)
			return i;
	}
	return -1;
}

/* fd no longer refers to its file: if it was the last one, RM frees the clients */
static void gs_fd_gone(int fd)
{
	nv_u64 v, fid;
	int i, max;

	if (fd < 0 || fd >= GS_MAX_FD)
		return;
	v = atomic_exchange(&gs_fds[fd], 0);
	if (!gs_is_tracked(v))
		return;
	fid = v >> 16;
	max = atomic_load(&gs_max_fd);
	for (i = 0; i <= max && i < GS_MAX_FD; i++) {
		nv_u64 w = atomic_load(&gs_fds[i]);

		if (gs_is_tracked(w) && (w >> 16) == fid)
			return;
	}
	/* an exported file lives on where it was sent: the core keeps it until released */
	if (gs_sibling_closing(gs_pl.inst, fid))
		return;
	gs_file_closed(gs_pl.inst, fid);
}

static void gs_fd_dup(int oldfd, int newfd)
{
	nv_u64 v;
	int m;

	if (oldfd < 0 || oldfd >= GS_MAX_FD || newfd < 0 || newfd >= GS_MAX_FD)
		return;
	v = atomic_load(&gs_fds[oldfd]);
	atomic_store(&gs_fds[newfd], gs_is_tracked(v) ? v : 0);
	m = atomic_load(&gs_max_fd);
	while (newfd > m && !atomic_compare_exchange_weak(&gs_max_fd, &m, newfd))
		;
}

/* ---- ioctl ---- */

/* one control on a TSG this process just made, past the core */
static void gs_tsg_control(int fd, nv_handle client, nv_handle tsg, nv_u32 cmd, void *params, nv_u32 size)
{
	struct nvos54_params p = {
		.h_client = client, .h_object = tsg, .cmd = cmd,
		.params = (nv_u64)(uintptr_t)params, .params_size = size,
	};
	int ret;

	ret = real_ioctl(fd, _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_CONTROL, struct nvos54_params), &p);
	if ((ret || p.status) && gs_pl.debug)
		fprintf(stderr, "gpuslice: control 0x%x on 0x%x/0x%x: ret %d status 0x%x\n",
			cmd, client, tsg, ret, p.status);
}

/* SET_TIMESLICE on one of this process's TSGs, from this process (RM takes it from the owner only) */
static void gs_tsg_set_timeslice(int fd, nv_handle client, nv_handle tsg, nv_u64 us)
{
	struct nva06c_ctrl_timeslice_params tp = { .timeslice_us = us };

	gs_tsg_control(fd, client, tsg, NVA06C_CTRL_CMD_SET_TIMESLICE, &tp, sizeof(tp));
}

/*
 * The operator's timeslice and interleave level on a TSG this process just
 * made: issued on the same file, past the core (which answers the
 * application's own timeslice requests). RM takes them only from the process
 * that owns the TSG (docs/h100-findings.md).
 */
static void gs_apply_tsg(int fd, const struct nvos64_params *a)
{
	nv_u64 us = gs_timeslice_us();

	if (us)
		gs_tsg_set_timeslice(fd, a->h_root, a->h_object_new, us);
	if (gs_pl.interleave >= 0) {
		struct nva06c_ctrl_interleave_level_params ip = { .tsg_interleave_level = gs_pl.interleave };

		gs_tsg_control(fd, a->h_root, a->h_object_new, NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL, &ip, sizeof(ip));
	}
}

nv_u64 gs_timeslice_us(void)
{
	nv_u64 ctl = __atomic_load_n(&gs_pl.ctl_timeslice_us, __ATOMIC_RELAXED);

	return ctl ? ctl : gs_pl.timeslice_us;
}

#define GS_TS_MAX_TSGS	256	/* TSGs of one process re-timed at once */

struct gs_tsg_list {
	struct { nv_handle client, handle; nv_u64 file_id; } t[GS_TS_MAX_TSGS];
	int n;
};

static int gs_tsg_collect(void *ctx, const struct gs_object *o)
{
	struct gs_tsg_list *l = ctx;

	if (o->obj_kind != GPUSLICE_OBJ_TSG || l->n >= GS_TS_MAX_TSGS)
		return 0;
	l->t[l->n].client = o->client;
	l->t[l->n].handle = o->handle;
	l->t[l->n].file_id = o->file_id;
	l->n++;
	return 0;
}

/*
 * The controller asked for a timeslice ({"timeslice_us":N}): the process's
 * live TSGs get it now, from this process (RM takes it only from the owner),
 * on a file of the TSG's client; TSGs made later get it in gs_apply_tsg().
 * The scheduler asks it of every instance it gates: with RM's default
 * timeslice the hardware switched the running TSG out every few ms even while
 * every other TSG was disabled (docs/policies.md). The TSGs are collected
 * under the core's lock and told after it, outside any lock of ours.
 */
void gs_apply_timeslice_all(void)
{
	struct gs_tsg_list *l;
	nv_u64 us;
	int i;

	if (!__atomic_exchange_n(&gs_pl.ctl_timeslice_new, 0, __ATOMIC_ACQ_REL))
		return;
	us = gs_timeslice_us();
	if (!us || !gs_pl.inst)
		return;
	l = calloc(1, sizeof(*l));
	if (!l)
		return;
	gs_for_each_object(gs_pl.inst, gs_tsg_collect, l);
	if (l->n == GS_TS_MAX_TSGS && gs_pl.debug)
		fprintf(stderr, "gpuslice: more than %d TSGs: the timeslice reaches the first %d\n",
			GS_TS_MAX_TSGS, GS_TS_MAX_TSGS);
	for (i = 0; i < l->n; i++) {
		int fd = gs_fd_of_file(l->t[i].file_id);

		if (fd >= 0)
			gs_tsg_set_timeslice(fd, l->t[i].client, l->t[i].handle, us);
	}
	if (gs_pl.debug)
		fprintf(stderr, "gpuslice: timeslice %llu us asked for %d TSG(s)\n", (unsigned long long)us, l->n);
	free(l);
}

/*
 * One call through gs_call_run() (kmod/core/call.c), the same protocol as the
 * module's, for RM's files and nvidia-uvm's: the real ioctl runs on the
 * caller's copied block, and the block goes back to the caller only when the
 * driver succeeded or the core answered.
 */
struct gs_pl_call {
	int fd;
	unsigned long req;
	void *uarg;
	nv_u32 cmd;	/* an export or import control's */
	nv_s32 pfd;	/* the fd it names */
};

static long gs_pl_driver(void *ctx, struct gs_call *c, int *unread)
{
	struct gs_pl_call *pc = ctx;
	int r = real_ioctl(pc->fd, pc->req, c->arg_size ? c->arg : pc->uarg);

	if (r < 0)
		return -(long)(errno ? errno : EIO);
	return r;
}

static int gs_pl_copy_out(void *ctx, const struct gs_call *c, long ret)
{
	struct gs_pl_call *pc = ctx;

	if (ret == 0 && gs_copy(pc->uarg, c->arg, c->arg_size, 1))
		return -EFAULT;
	return 0;
}

static void gs_pl_answered(void *ctx, const struct gs_call *c)
{
	gs_report_refusal(c);
}

/* RM's reply, before it goes back to the caller */
static void gs_pl_nv_after(void *ctx, struct gs_call *c, long ret)
{
	struct gs_pl_call *pc = ctx;
	const void *buf = c->arg;
	nv_u32 size = c->arg_size;
	nv_u32 nr = NV_IOC_NR(pc->req);

	gs_userd_ioctl(c, buf, ret);
	if (ret == 0 && (gs_timeslice_us() || gs_pl.interleave >= 0) && nr == NV_ESC_RM_ALLOC &&
	    size >= sizeof(struct nvos64_params) &&
	    ((const struct nvos64_params *)buf)->h_class == KEPLER_CHANNEL_GROUP_A &&
	    ((const struct nvos64_params *)buf)->status == NV_OK)
		gs_apply_tsg(pc->fd, buf);
	/* an export RM made: its file may be handed to another process */
	if (ret == 0 && c->fd_file_id && ((const struct nvos54_params *)buf)->status == NV_OK &&
	    (pc->cmd == NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD ||
	     pc->cmd == NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD))
		gs_sibling_exported(pc->pfd, c->fd_file_id);
	/* a share policy set: another process may duplicate from this client */
	if (ret == 0 && nr == NV_ESC_RM_SHARE && size >= sizeof(struct nvos57_params) &&
	    ((const struct nvos57_params *)buf)->status == NV_OK)
		gs_sibling_shared(((const struct nvos57_params *)buf)->h_client);
}

static const struct gs_call_ops gs_pl_nv_ops = {
	.driver = gs_pl_driver,
	.after = gs_pl_nv_after,
	.copy_out = gs_pl_copy_out,
	.answered = gs_pl_answered,
};

static const struct gs_call_ops gs_pl_uvm_ops = {
	.driver = gs_pl_driver,
	.copy_out = gs_pl_copy_out,
	.answered = gs_pl_answered,
};

/*
 * The call, with the file of the RM call this thread is in for the events
 * its gs_post() sends (gs_event_fd()). Returns the ioctl's return, *err
 * set when it is -1.
 */
static int gs_pl_run(struct gs_call *c, const struct gs_call_ops *ops, struct gs_pl_call *pc,
		     int *err)
{
	long r;

	gs_fd_now = pc->fd;
	r = gs_call_run(gs_pl.inst, c, &gs_pl_io, ops, pc);
	gs_fd_now = -1;
	if (r < 0) {
		*err = (int)-r;
		return -1;
	}
	return (int)r;
}

static int gs_nv_ioctl(int fd, nv_u64 st, unsigned long req, void *uarg)
{
	nv_u64 stackbuf[512];	/* 4 KiB, 8-aligned; larger blocks go to the heap */
	nv_u32 size = NV_IOC_SIZE(req);
	struct gs_pl_call pc = { .fd = fd, .req = req, .uarg = uarg, .pfd = -1 };
	struct gs_call c;
	void *buf = stackbuf;
	int ret, err = errno;

	if (size > sizeof(stackbuf)) {
		buf = malloc(size);
		if (!buf) {
			errno = ENOMEM;
			return -1;
		}
	}
	if (gs_copy(buf, uarg, size, 0)) {
		ret = -1;
		err = EFAULT;
		goto out;
	}
	gs_report_poll();	/* a controller that came up late gets the live objects first */
	gs_sibling_reap(gs_pl.inst);	/* exported files released since */
	memset(&c, 0, sizeof(c));
	c.kind = (st & 0xff) == GS_TAG_CTL ? GS_FILE_CTL : GS_FILE_GPU;
	c.gpu_minor = (st >> 8) & 0xff;
	c.req = (nv_u32)req;
	c.arg = buf;
	c.arg_size = size;
	c.file_id = st >> 16;
	c.pid = getpid();
	/*
	 * An export or import control's fd: one of this process's nvidiactl
	 * files; for an import, one another process of the instance exported
	 * into, or not (siblings.c).
	 */
	if (gs_call_fd(&c, &gs_pl_io, &pc.pfd)) {
		nv_u64 pst = gs_fd_state(pc.pfd);

		if ((pst & 0xff) == GS_TAG_CTL) {
			c.fd_file_id = pst >> 16;
			pc.cmd = ((const struct nvos54_params *)buf)->cmd;
			if (pc.cmd == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD ||
			    pc.cmd == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD)
				c.fd_sibling = gs_sibling_file(pc.pfd);
		}
	}
	/* a duplicate from another client: another process's of the instance? */
	if (NV_IOC_NR(req) == NV_ESC_RM_DUP_OBJECT && size >= sizeof(struct nvos55_params)) {
		const struct nvos55_params *dp = buf;

		if (dp->h_client_src != dp->h_client)
			c.src_sibling = gs_sibling_client(dp->h_client_src);
	}
	ret = gs_pl_run(&c, &gs_pl_nv_ops, &pc, &err);
out:
	if (buf != stackbuf)
		free(buf);
	errno = err;
	return ret;
}

/*
 * The nvidia-uvm commands the core decides on by their block (mapping,
 * unmapping and freeing external ranges, kmod/core/uvm.c). Here the reply is
 * taken as UVM's (gs_call.reply_trusted): in user space nothing stops the
 * process from rewriting it, or from making the call without this library.
 */
static pthread_mutex_t gs_uvm_lock = PTHREAD_MUTEX_INITIALIZER;

static int gs_uvm_ioctl_locked(int fd, nv_u64 st, unsigned long req, void *uarg);

/* one at a time, so that the core sees them in the order UVM ran them (kmod/core/uvm.c) */
static int gs_uvm_ioctl(int fd, nv_u64 st, unsigned long req, void *uarg)
{
	int ret, err;

	pthread_mutex_lock(&gs_uvm_lock);
	ret = gs_uvm_ioctl_locked(fd, st, req, uarg);
	err = errno;
	pthread_mutex_unlock(&gs_uvm_lock);
	errno = err;
	return ret;
}

static int gs_uvm_ioctl_locked(int fd, nv_u64 st, unsigned long req, void *uarg)
{
	nv_u32 size = gs_uvm_arg_size((nv_u32)req);
	struct gs_pl_call pc = { .fd = fd, .req = req, .uarg = uarg, .pfd = -1 };
	struct gs_call c;
	void *buf;
	int ret, err = errno;

	buf = malloc(size);
	if (!buf) {
		errno = ENOMEM;
		return -1;
	}
	if (gs_copy(buf, uarg, size, 0)) {
		ret = -1;
		err = EFAULT;
		goto out;
	}
	memset(&c, 0, sizeof(c));
	c.kind = GS_FILE_UVM;
	c.req = (nv_u32)req;
	c.arg = buf;
	c.arg_size = size;
	c.file_id = st >> 16;
	c.pid = getpid();
	/* the reply is taken as UVM's: nothing here can stop a rewrite anyway */
	c.reply_trusted = 1;
	ret = gs_pl_run(&c, &gs_pl_uvm_ops, &pc, &err);
out:
	free(buf);
	errno = err;
	return ret;
}

/*
 * The driver's ABI table (kmod/core/nvrm_tables.c), chosen from its version at
 * the first call on one of its files: the version query the module makes at
 * load (NV_ESC_CHECK_VERSION_STR, cmd QUERY), which RM answers on nvidiactl
 * only: on the call's file if it is one, else on a nvidiactl of our own, opened
 * beside the file (or /dev/nvidiactl for nvidia-uvm's). A driver with no table
 * gets one line on stderr and every call the library would decode on its
 * files (RM's, and nvidia-uvm's of gs_uvm_arg_size()) refused with EPERM, for
 * the rest of the process: decoding with another release's layouts would
 * misread, and write past, its blocks. A query that got no answer (no
 * nvidiactl could be opened: EMFILE, a container without /dev/nvidiactl; the
 * ioctl failed) selects nothing: that call is refused (EPERM; one line on
 * stderr, the first time) and the next call asks again.
 */
static int gs_abi_open_ctl(int fd)
{
	char link[64], path[PATH_MAX];
	ssize_t n = -1;
	char *slash;

	if (fd >= 0) {
		snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
		n = readlink(link, path, sizeof(path) - sizeof("nvidiactl"));
	}
	if (n > 0) {
		path[n] = '\0';
		slash = strrchr(path, '/');
		if (slash) {
			strcpy(slash + 1, "nvidiactl");
			fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDWR | O_CLOEXEC);
			if (fd >= 0)
				return fd;
		}
	}
	return (int)syscall(SYS_openat, AT_FDCWD, "/dev/nvidiactl", O_RDWR | O_CLOEXEC);
}

static int gs_abi_ready(int fd, nv_u64 st)
{
	struct nv_ioctl_rm_api_version v;
	char supported[512];
	int ready = __atomic_load_n(&gs_abi_state, __ATOMIC_ACQUIRE);
	int own = -1, err = 0;

	if (ready)
		return ready > 0;
	pthread_mutex_lock(&gs_abi_lock);
	if (!gs_abi_state) {
		if ((st & 0xff) != GS_TAG_CTL)
			fd = own = gs_abi_open_ctl((st & 0xff) == GS_TAG_UVM ? -1 : fd);
		memset(&v, 0, sizeof(v));
		v.cmd = NV_RM_API_VERSION_CMD_QUERY;
		if (fd < 0 || real_ioctl(fd, _IOWR(NV_IOCTL_MAGIC, NV_ESC_CHECK_VERSION_STR,
						   struct nv_ioctl_rm_api_version), &v))
			err = errno ? errno : EIO;
		v.version_string[sizeof(v.version_string) - 1] = '\0';
		if (own >= 0)
			syscall(SYS_close, own);
		if (err) {
			/* no answer: nothing selected, the next call asks again */
			if (!gs_abi_query_failed || gs_pl.debug)
				fprintf(stderr, "gpuslice: cannot ask the NVIDIA driver its version (%s): "
					"the call is refused, the next one asks again\n", strerror(err));
			gs_abi_query_failed = 1;
			pthread_mutex_unlock(&gs_abi_lock);
			return 0;
		}
		ready = gs_abi_select(v.version_string) ? -1 : 1;
		if (ready < 0) {
			gs_abi_supported(supported, sizeof(supported));
			fprintf(stderr, "gpuslice: NVIDIA driver %s has no ABI table (supported: %s): its calls are refused\n",
				v.version_string, supported);
		} else if (gs_pl.debug) {
			fprintf(stderr, "gpuslice: NVIDIA driver %s, ABI table of branch %s\n",
				v.version_string, gs_abi()->branch);
		}
		__atomic_store_n(&gs_abi_state, ready, __ATOMIC_RELEASE);
	}
	ready = gs_abi_state;
	pthread_mutex_unlock(&gs_abi_lock);
	return ready > 0;
}

GS_EXPORT int ioctl(int fd, unsigned long req, ...)
{
	va_list ap;
	void *arg;
	nv_u64 st;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	gs_init();
	if (!gs_mine())
		return real_ioctl(fd, req, arg);
	if (NV_IOC_TYPE(req) != NV_IOCTL_MAGIC) {
		/*
		 * The command number first: only nvidia-uvm's commands the core
		 * decodes look at the fd (its first look is an fstat()); every
		 * other ioctl of the process goes straight to libc.
		 */
		if (req > 0xffffffffu || !gs_uvm_arg_size((nv_u32)req))
			return real_ioctl(fd, req, arg);
		if (((st = gs_fd_state(fd)) & 0xff) != GS_TAG_UVM)
			return real_ioctl(fd, req, arg);
		if (!gs_abi_ready(fd, st)) {
			errno = EPERM;
			return -1;
		}
		return gs_uvm_ioctl(fd, st, req, arg);
	}
	st = gs_fd_state(fd);
	if (!gs_is_nv(st))
		return real_ioctl(fd, req, arg);
	if (!gs_abi_ready(fd, st)) {
		errno = EPERM;
		return -1;
	}
	return gs_nv_ioctl(fd, st, req, arg);
}

/* ---- file descriptor bookkeeping ---- */

GS_EXPORT int close(int fd)
{
	gs_init();
	if (gs_mine())
		gs_fd_gone(fd);
	return real_close(fd);
}

GS_EXPORT int dup(int oldfd)
{
	int fd;

	gs_init();
	fd = real_dup(oldfd);
	if (fd >= 0 && gs_mine())
		gs_fd_dup(oldfd, fd);
	return fd;
}

GS_EXPORT int dup2(int oldfd, int newfd)
{
	int fd;

	gs_init();
	if (!gs_mine())
		return real_dup2(oldfd, newfd);
	if (oldfd != newfd)
		gs_fd_gone(newfd);
	fd = real_dup2(oldfd, newfd);
	if (fd >= 0 && oldfd != newfd)
		gs_fd_dup(oldfd, fd);
	return fd;
}

GS_EXPORT int dup3(int oldfd, int newfd, int flags)
{
	int fd;

	gs_init();
	if (!gs_mine())
		return real_dup3(oldfd, newfd, flags);
	if (oldfd != newfd)
		gs_fd_gone(newfd);
	fd = real_dup3(oldfd, newfd, flags);
	if (fd >= 0)
		gs_fd_dup(oldfd, fd);
	return fd;
}

static int gs_fcntl(int (*real)(int, int, ...), int fd, int cmd, void *arg)
{
	int ret = real(fd, cmd, arg);

	if (ret >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && gs_mine())
		gs_fd_dup(fd, ret);
	return ret;
}

GS_EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	gs_init();
	return gs_fcntl(real_fcntl, fd, cmd, arg);
}

GS_EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	void *arg;

	va_start(ap, cmd);
	arg = va_arg(ap, void *);
	va_end(ap);
	gs_init();
	return gs_fcntl(real_fcntl64, fd, cmd, arg);
}

GS_EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
	unsigned int fd, max;

	gs_init();
	if (!real_close_range) {
		errno = ENOSYS;
		return -1;
	}
	max = (unsigned int)atomic_load(&gs_max_fd);
	if (gs_mine() && !(flags & 4)) {	/* CLOSE_RANGE_CLOEXEC only marks */
		for (fd = first; fd <= last && fd <= max; fd++)
			gs_fd_gone((int)fd);
	}
	return real_close_range(first, last, flags);
}
