/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * port.h - the few environment primitives the decision core needs: zeroed
 * allocation, a sleeping mutex, a monotonic clock and errno values. The kernel
 * build (__KERNEL__) uses kzalloc/mutex/ktime; the user-space build (preload/,
 * tests/core/) uses calloc/pthread/clock_gettime. On top of the mutex, for
 * both builds: struct gs_mutex, which measures how long it is held and waited
 * for (its stats, kmod/uapi/gpuslice.h says what they mean).
 */
#ifndef GPUSLICE_PORT_H
#define GPUSLICE_PORT_H

#include "nvrm_abi.h"
#include "../uapi/gpuslice.h"

#ifdef __KERNEL__
#include <linux/bitops.h>
#include <linux/errno.h>
#include <linux/kernel.h>
#include <linux/ktime.h>
#include <linux/mm.h>
#include <linux/mutex.h>
#include <linux/random.h>
#include <linux/siphash.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "../inject.h"	/* gs_inject_fail(): the test build's failures, else none */

/* the instance lock; the glue's gs_io serves kernel copies, so nothing under it waits on user memory */
struct gs_os_mutex {
	struct mutex m;
};

static inline void *gs_zalloc(size_t n)
{
	return gs_inject_fail() ? NULL : kzalloc(n, GFP_KERNEL);
}

static inline void gs_free(void *p)
{
	kfree(p);
}

/* a zeroed array that may be large (snapshot.c's indexes); gs_free_array() frees it */
static inline void *gs_zalloc_array(size_t n, size_t size)
{
	return gs_inject_fail() ? NULL : kvcalloc(n, size, GFP_KERNEL);
}

static inline void gs_free_array(void *p)
{
	kvfree(p);
}

static inline void gs_os_mutex_init(struct gs_os_mutex *m)
{
	mutex_init(&m->m);
}

static inline void gs_os_mutex_destroy(struct gs_os_mutex *m)
{
	mutex_destroy(&m->m);
}

static inline int gs_os_trylock(struct gs_os_mutex *m)
{
	return mutex_trylock(&m->m);
}

static inline void gs_os_lock(struct gs_os_mutex *m)
{
	mutex_lock(&m->m);
}

static inline void gs_os_unlock(struct gs_os_mutex *m)
{
	mutex_unlock(&m->m);
}

static inline u64 gs_now_ns(void)
{
	return ktime_get_ns();
}

/* 0 for 0, else the position of the highest bit set, 1..64 */
static inline int gs_fls64(u64 x)
{
	return fls64(x);
}

/*
 * The object table's hash, keyed by a secret per instance: a container that
 * picks its handles cannot aim them all at one bucket.
 */
struct gs_hash_key {
	siphash_key_t k;
};

static inline void gs_hash_key_init(struct gs_hash_key *k)
{
	get_random_bytes(&k->k, sizeof(k->k));
}

static inline u32 gs_hash_keyed(const struct gs_hash_key *k, u32 a, u32 b)
{
	return (u32)siphash_2u32(a, b, &k->k);
}

#else /* user space */

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

struct gs_os_mutex {
	pthread_mutex_t m;
};

#ifndef ARRAY_SIZE
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#endif

static inline void *gs_zalloc(size_t n)
{
	return calloc(1, n);
}

static inline void gs_free(void *p)
{
	free(p);
}

static inline void *gs_zalloc_array(size_t n, size_t size)
{
	return calloc(n, size);
}

static inline void gs_free_array(void *p)
{
	free(p);
}

static inline void gs_os_mutex_init(struct gs_os_mutex *m)
{
	pthread_mutex_init(&m->m, NULL);
}

static inline void gs_os_mutex_destroy(struct gs_os_mutex *m)
{
	pthread_mutex_destroy(&m->m);
}

static inline int gs_os_trylock(struct gs_os_mutex *m)
{
	return pthread_mutex_trylock(&m->m) == 0;
}

static inline void gs_os_lock(struct gs_os_mutex *m)
{
	pthread_mutex_lock(&m->m);
}

static inline void gs_os_unlock(struct gs_os_mutex *m)
{
	pthread_mutex_unlock(&m->m);
}

static inline uint64_t gs_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline int gs_fls64(uint64_t x)
{
	return x ? 64 - __builtin_clzll(x) : 0;
}


/* user space (the preload build, not a boundary): a keyed 64-bit mix */
struct gs_hash_key {
	uint64_t k0, k1;
};

static inline void gs_hash_key_init(struct gs_hash_key *k)
{
	if (getrandom(k, sizeof(*k), 0) != (ssize_t)sizeof(*k)) {
		k->k0 = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull;
		k->k1 = (uint64_t)(uintptr_t)k;
	}
}

static inline uint32_t gs_hash_keyed(const struct gs_hash_key *k, uint32_t a, uint32_t b)
{
	uint64_t x = (((uint64_t)a << 32) | b) ^ k->k0;

	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x ^= k->k1;
	x *= 0xc4ceb9fe1a85ec53ull;
	x ^= x >> 33;
	return (uint32_t)x;
}

#endif /* __KERNEL__ */

/*
 * ---- a mutex that measures itself (both builds) ----
 *
 * What it costs: an uncontended gs_lock() is a trylock and one clock read,
 * gs_unlock() one clock read and a few counters, all under the mutex itself;
 * only a contended acquisition reads the clock before it waits. Holds and
 * waits are recorded at gs_unlock(), so a copy taken under the lock
 * (gs_mutex_stats()) is consistent: each histogram sums to acquired.
 */
struct gs_lock_stats {
	nv_u64 acquired;	/* completed holds */
	nv_u64 contended;	/* of them, acquisitions that waited */
	nv_u64 hold_ns;		/* sums */
	nv_u64 wait_ns;
	nv_u64 hold_max_ns;
	nv_u64 wait_max_ns;
	nv_u64 hold_hist[GPUSLICE_LOCK_HIST_BUCKETS];	/* log2 ns, see the uapi header */
	nv_u64 wait_hist[GPUSLICE_LOCK_HIST_BUCKETS];
};

struct gs_mutex {
	struct gs_os_mutex m;
	/* under m: the holder's acquisition, then everything recorded */
	nv_u64 since_ns;
	nv_u64 waited_ns;
	int waited;
	struct gs_lock_stats st;
};

/* bucket 0: 0 ns; i: [2^(i-1), 2^i) ns; the last: everything from 2^(N-2) ns */
static inline int gs_lock_bucket(nv_u64 ns)
{
	int b = gs_fls64(ns);

	return b < GPUSLICE_LOCK_HIST_BUCKETS ? b : GPUSLICE_LOCK_HIST_BUCKETS - 1;
}

static inline void gs_mutex_init(struct gs_mutex *m)
{
	memset(m, 0, sizeof(*m));
	gs_os_mutex_init(&m->m);
}

static inline void gs_mutex_destroy(struct gs_mutex *m)
{
	gs_os_mutex_destroy(&m->m);
}

static inline void gs_lock(struct gs_mutex *m)
{
	nv_u64 t0;

	if (gs_os_trylock(&m->m)) {
		m->since_ns = gs_now_ns();
		m->waited_ns = 0;
		m->waited = 0;
		return;
	}
	t0 = gs_now_ns();
	gs_os_lock(&m->m);
	m->since_ns = gs_now_ns();
	m->waited_ns = m->since_ns - t0;
	m->waited = 1;
}

static inline void gs_unlock(struct gs_mutex *m)
{
	nv_u64 hold = gs_now_ns() - m->since_ns;
	struct gs_lock_stats *st = &m->st;

	st->acquired++;
	st->contended += m->waited;
	st->hold_ns += hold;
	st->wait_ns += m->waited_ns;
	if (hold > st->hold_max_ns)
		st->hold_max_ns = hold;
	if (m->waited_ns > st->wait_max_ns)
		st->wait_max_ns = m->waited_ns;
	st->hold_hist[gs_lock_bucket(hold)]++;
	st->wait_hist[gs_lock_bucket(m->waited_ns)]++;
	gs_os_unlock(&m->m);
}

/* the stats so far; the caller holds m (its own hold is not in them yet) */
static inline void gs_mutex_stats(const struct gs_mutex *m, struct gs_lock_stats *st)
{
	*st = m->st;
}

#endif /* GPUSLICE_PORT_H */
