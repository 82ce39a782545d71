// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * userd.c - which of this process's channels have work, from their USERD.
 *
 * A CUDA process submits by writing GPFIFO entries and then its channel's
 * GPPut, in the channel's USERD (Nvc86fControl, class/clc86f.h, branch 580:
 * GPGet at byte 0x88, GPPut at 0x8c), which it maps into its own address
 * space; no ioctl is made. The scheduler needs to know which instances have
 * work whatever the process does while it waits (spins, sleeps between
 * cuStreamQuery polls, blocks on an event): CPU time says nothing about a
 * process that sleeps. USERD says, for the cost of one 8-byte load per
 * channel (about 1 us over BAR1 on an H100, docs/h100-userd.md):
 *
 *   submitted = GPPut moved since the last look, or GPGet != GPPut
 *
 * GPGet is the PBDMA's fetch pointer, so this is a submission signal, not a
 * "running" one: a channel whose last entry was fetched looks quiet while its
 * kernel runs. The controller holds an instance busy for a while after its
 * last submission and, while the instance is gated, until it has had the GPU
 * for that long without submitting (pyctl/gpuslice/sched/probes.py, SubmitProbe).
 *
 * Finding USERD, as CUDA 13 does it on the H100 (docs/h100-userd.md):
 *   - RM_ALLOC of a *_CHANNEL_GPFIFO_* class: NV_CHANNEL_ALLOC_PARAMS
 *     (alloc/alloc_channel.h) names the memory object, hUserdMemory[0], and
 *     userdOffset[0] into it (0x2000 + 0x3000 * i for CUDA's channel i);
 *     hUserdMemory[0] == 0 means RM's own USERD, mapped through the channel's
 *     handle (kchannelMap_IMPL, kernel_channel.c), so the channel is then
 *     looked for as a memory object of its own at offset 0;
 *   - NV_ESC_RM_MAP_MEMORY of that object names a file descriptor (the
 *     nv_ioctl_nvos33_parameters_with_fd), and the next mmap() of that fd maps
 *     it: RM keeps one mmap context per open file (kernel-open/nvidia/nv-mmap.c).
 * So this file wraps mmap, munmap and mremap as well as seeing the ioctls
 * (preload.c). A mapping is forgotten before the real munmap/mremap runs,
 * and the memory or channel when RM frees it: the sampler never reads an
 * address that is not mapped any more. (A process that unmaps with a raw
 * syscall behind libc's back can fault its own sampler thread; it can crash
 * itself in many other ways too.)
 *
 * The sampler is the reporter thread (report.c), every GPUSLICE_SAMPLE_MS
 * (default 5). It sends CHANNEL_WORK (kmod/uapi/gpuslice.h) when a quiet
 * channel submits, and then at most every GS_WORK_REPEAT_NS (or the
 * controller's "repeat_us", report.c) while it keeps submitting, never from the process's own threads. What a look at USERD
 * means, and where a channel's USERD lies in a mapping, are the core's
 * (kmod/core/activity.c), shared with the module's sampler.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../uapi/gpuslice.h"	/* via -I../kmod/core */
#include "preload.h"

#define GS_UD_CHANS		512
#define GS_UD_MAPS		256

struct gs_ud_chan {
	nv_handle client;
	nv_handle handle;
	nv_handle mem;		/* hUserdMemory[0], or the channel itself */
	nv_u64 off;		/* userdOffset[0] */
	nv_u32 entries;		/* gpFifoEntries: GPGet and GPPut are below it */
	const volatile nv_u64 *word;	/* GPGet | GPPut << 32; NULL: not mapped (yet) */
	struct gs_userd_seen seen;	/* kmod/core/activity.c */
	int used;
};

struct gs_ud_map {
	nv_handle client;
	nv_handle mem;
	nv_u64 moff;		/* the RM_MAP_MEMORY's offset into the object */
	nv_u64 length;
	nv_u64 inpage;		/* where moff is in the mapping: the returned address's in-page part */
	int fd;			/* where the mmap comes from */
	uintptr_t addr;		/* 0: RM mapped it, the mmap has not come yet */
	int used;
};

static pthread_mutex_t gs_ud_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gs_ud_chan gs_ud_chans[GS_UD_CHANS];
static struct gs_ud_map gs_ud_maps[GS_UD_MAPS];
/* lock-free fast paths of mmap/munmap: is there anything to look at? */
static _Atomic int gs_ud_nr_pending;
static _Atomic int gs_ud_nr_mapped;

static int gs_is_gpfifo_class(nv_u32 klass)
{
	switch (klass) {
	case AMPERE_CHANNEL_GPFIFO_A:
	case HOPPER_CHANNEL_GPFIFO_A:
	case BLACKWELL_CHANNEL_GPFIFO_A:
	case BLACKWELL_CHANNEL_GPFIFO_B:
		return 1;
	}
	return 0;
}

/* under gs_ud_lock: a mapping goes (or is replaced), so do pointers into it */
static void gs_ud_map_drop(struct gs_ud_map *m)
{
	uintptr_t lo = m->addr, hi = m->addr + m->length;
	int i;

	if (m->addr) {
		for (i = 0; i < GS_UD_CHANS; i++) {
			uintptr_t w = (uintptr_t)gs_ud_chans[i].word;

			if (gs_ud_chans[i].used && w >= lo && w < hi)
				gs_ud_chans[i].word = NULL;
		}
		atomic_fetch_sub(&gs_ud_nr_mapped, 1);
	} else {
		atomic_fetch_sub(&gs_ud_nr_pending, 1);
	}
	m->used = 0;
}

static void gs_ud_channel_new(const struct gs_call *c, const struct nvos64_params *p)
{
	struct nv_channel_alloc_params_head cp;
	struct gs_ud_chan *ch = NULL;
	int i;

	if (!p->p_alloc_parms ||
	    gs_copy_in(&cp, (const void *)(uintptr_t)p->p_alloc_parms, sizeof(cp)))
		return;
	if (cp.gp_fifo_entries < 2)
		return;
	pthread_mutex_lock(&gs_ud_lock);
	for (i = 0; i < GS_UD_CHANS && !ch; i++)
		if (!gs_ud_chans[i].used)
			ch = &gs_ud_chans[i];
	if (ch) {
		memset(ch, 0, sizeof(*ch));
		ch->used = 1;
		ch->client = p->h_root;
		ch->handle = p->h_object_new;
		ch->mem = cp.h_userd_memory[0] ? cp.h_userd_memory[0] : p->h_object_new;
		ch->off = cp.h_userd_memory[0] ? cp.userd_offset[0] : 0;
		ch->entries = cp.gp_fifo_entries;
	}
	pthread_mutex_unlock(&gs_ud_lock);
}

/* under gs_ud_lock: does a channel's USERD live in this memory object? */
static int gs_ud_map_in_use(const struct gs_ud_map *m)
{
	int i;

	for (i = 0; i < GS_UD_CHANS; i++)
		if (gs_ud_chans[i].used && gs_ud_chans[i].client == m->client && gs_ud_chans[i].mem == m->mem)
			return 1;
	return 0;
}

/*
 * Every RM_MAP_MEMORY is remembered until its mapping goes, since a channel
 * names its USERD memory only after that memory was mapped (CUDA maps it
 * first, docs/h100-userd.md). A full table makes room by forgetting a mapping
 * that no channel uses, never one that a channel's USERD is in.
 */
static void gs_ud_mapped_by_rm(const struct nvos33_params_with_fd *p)
{
	struct gs_ud_map *m = NULL;
	int i;

	if (p->params.status != NV_OK || p->fd < 0 || !p->params.length)
		return;
	pthread_mutex_lock(&gs_ud_lock);
	for (i = 0; i < GS_UD_MAPS; i++) {
		struct gs_ud_map *o = &gs_ud_maps[i];

		if (o->used && !o->addr && o->fd == p->fd)
			gs_ud_map_drop(o);	/* never mmapped: the new one is the fd's */
		if (!o->used && !m)
			m = o;
	}
	for (i = 0; i < GS_UD_MAPS && !m; i++) {
		if (gs_ud_maps[i].addr && !gs_ud_map_in_use(&gs_ud_maps[i])) {
			gs_ud_map_drop(&gs_ud_maps[i]);
			m = &gs_ud_maps[i];
		}
	}
	if (m) {
		m->used = 1;
		m->client = p->params.h_client;
		m->mem = p->params.h_memory;
		m->moff = p->params.offset;
		m->length = p->params.length;
		m->inpage = p->params.p_linear_address & (nv_u64)(sysconf(_SC_PAGESIZE) - 1);
		m->fd = p->fd;
		m->addr = 0;
		atomic_fetch_add(&gs_ud_nr_pending, 1);
	}
	pthread_mutex_unlock(&gs_ud_lock);
}

static void gs_ud_freed(nv_handle client, nv_handle h)
{
	int i;

	pthread_mutex_lock(&gs_ud_lock);
	for (i = 0; i < GS_UD_MAPS; i++) {
		struct gs_ud_map *m = &gs_ud_maps[i];

		if (m->used && m->client == client && (h == client || m->mem == h))
			gs_ud_map_drop(m);
	}
	for (i = 0; i < GS_UD_CHANS; i++) {
		struct gs_ud_chan *ch = &gs_ud_chans[i];

		if (ch->used && ch->client == client &&
		    (h == client || ch->handle == h || ch->mem == h))
			ch->used = 0;
	}
	pthread_mutex_unlock(&gs_ud_lock);
}

void gs_userd_ioctl(const struct gs_call *c, const void *arg, int ret)
{
	if (ret != 0)
		return;
	switch (c->escape) {
	case NV_ESC_RM_ALLOC: {
		const struct nvos64_params *p = arg;

		if (c->arg_size >= sizeof(*p) && p->status == NV_OK && gs_is_gpfifo_class(p->h_class))
			gs_ud_channel_new(c, p);
		break;
	}
	case NV_ESC_RM_MAP_MEMORY:
		if (c->arg_size >= sizeof(struct nvos33_params_with_fd))
			gs_ud_mapped_by_rm(arg);
		break;
	case NV_ESC_RM_FREE: {
		const struct nvos00_params *p = arg;

		if (c->arg_size >= sizeof(*p) && p->status == NV_OK)
			gs_ud_freed(p->h_root, p->h_object_old);
		break;
	}
	}
}

/* ---- the process's mappings ---- */

static void gs_ud_mmapped(int fd, off_t off, void *addr, size_t len)
{
	int i;

	if (off != 0)
		return;		/* RM accepts page offset 0 only (nv-mmap.c) */
	pthread_mutex_lock(&gs_ud_lock);
	for (i = 0; i < GS_UD_MAPS; i++) {
		struct gs_ud_map *m = &gs_ud_maps[i];

		if (m->used && !m->addr && m->fd == fd) {
			if (m->inpage >= len) {
				gs_ud_map_drop(m);
				break;
			}
			/* RM packs its own USERDs 512 bytes apart: the object starts at that part */
			m->addr = (uintptr_t)addr + m->inpage;
			if (len - m->inpage < m->length)
				m->length = len - m->inpage;
			atomic_fetch_sub(&gs_ud_nr_pending, 1);
			atomic_fetch_add(&gs_ud_nr_mapped, 1);
			break;
		}
	}
	pthread_mutex_unlock(&gs_ud_lock);
}

/* before the real munmap/mremap: nothing of [addr, addr + len) is read again */
static void gs_ud_unmapping(void *addr, size_t len)
{
	uintptr_t lo = (uintptr_t)addr, hi = lo + len;
	int i;

	pthread_mutex_lock(&gs_ud_lock);
	for (i = 0; i < GS_UD_MAPS; i++) {
		struct gs_ud_map *m = &gs_ud_maps[i];

		if (m->used && m->addr && m->addr < hi && lo < m->addr + m->length)
			gs_ud_map_drop(m);
	}
	pthread_mutex_unlock(&gs_ud_lock);
}

/*
 * Through the raw syscalls: glibc's own mmap would be this function again
 * (and dlsym() may allocate, which may mmap, before the library is set up).
 */
GS_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	void *ret = (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);

	if (ret != MAP_FAILED && fd >= 0 && atomic_load(&gs_ud_nr_pending) > 0)
		gs_ud_mmapped(fd, off, ret, len);
	return ret;
}

GS_EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return mmap(addr, len, prot, flags, fd, off);
}

GS_EXPORT int munmap(void *addr, size_t len)
{
	if (atomic_load(&gs_ud_nr_mapped) > 0)
		gs_ud_unmapping(addr, len);
	return (int)syscall(SYS_munmap, addr, len);
}

GS_EXPORT void *mremap(void *old, size_t old_len, size_t new_len, int flags, ...)
{
	void *new_addr = NULL;
	va_list ap;

	if (flags & MREMAP_FIXED) {
		va_start(ap, flags);
		new_addr = va_arg(ap, void *);
		va_end(ap);
	}
	if (atomic_load(&gs_ud_nr_mapped) > 0) {
		gs_ud_unmapping(old, old_len);
		if (flags & MREMAP_FIXED)
			gs_ud_unmapping(new_addr, new_len);
	}
	return (void *)syscall(SYS_mremap, old, old_len, new_len, flags, new_addr);
}

/* ---- sampling (the reporter thread) ---- */

/* under gs_ud_lock: where channel ch's USERD is mapped, if it is */
static void gs_ud_resolve(struct gs_ud_chan *ch)
{
	int i;

	nv_u64 at;

	for (i = 0; i < GS_UD_MAPS; i++) {
		const struct gs_ud_map *m = &gs_ud_maps[i];

		if (!m->used || !m->addr || m->client != ch->client || m->mem != ch->mem)
			continue;
		if (!gs_userd_locate(ch->off, m->moff, m->length, &at))
			continue;
		ch->word = (const volatile nv_u64 *)(m->addr + at);
		memset(&ch->seen, 0, sizeof(ch->seen));
		gs_userd_seen(&ch->seen, *ch->word, ch->entries, 0);
		return;
	}
}

int gs_userd_sample(nv_u64 now, struct gs_event *evs, int max)
{
	nv_u64 repeat = __atomic_load_n(&gs_pl.ctl_repeat_ns, __ATOMIC_RELAXED);
	int i, n = 0;

	if (!repeat)
		repeat = GS_WORK_REPEAT_NS;

	pthread_mutex_lock(&gs_ud_lock);
	for (i = 0; i < GS_UD_CHANS; i++) {
		struct gs_ud_chan *ch = &gs_ud_chans[i];

		if (!ch->used)
			continue;
		if (!ch->word) {
			gs_ud_resolve(ch);
			continue;	/* its first look sets where GPPut was */
		}
		if (!gs_userd_seen_every(&ch->seen, *ch->word, ch->entries, now, repeat))
			continue;
		if (n < max) {
			memset(&evs[n], 0, sizeof(evs[n]));
			evs[n].type = GPUSLICE_EV_CHANNEL_WORK;
			evs[n].obj_kind = GPUSLICE_OBJ_CHANNEL;
			evs[n].client = ch->client;
			evs[n].handle = ch->handle;
			n++;
		}
	}
	pthread_mutex_unlock(&gs_ud_lock);
	return n;
}

int gs_userd_channels(void)
{
	int i, n = 0;

	pthread_mutex_lock(&gs_ud_lock);
	for (i = 0; i < GS_UD_CHANS; i++)
		n += gs_ud_chans[i].used && gs_ud_chans[i].word;
	pthread_mutex_unlock(&gs_ud_lock);
	return n;
}

/* a forked child: none of this is its own (its parent's channels and mappings) */
void gs_userd_atfork_child(void)
{
	pthread_mutex_init(&gs_ud_lock, NULL);
	memset(gs_ud_chans, 0, sizeof(gs_ud_chans));
	memset(gs_ud_maps, 0, sizeof(gs_ud_maps));
	atomic_store(&gs_ud_nr_pending, 0);
	atomic_store(&gs_ud_nr_mapped, 0);
}
