/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * port.h - the few environment primitives the decision core needs: zeroed
 * allocation, a sleeping mutex, a monotonic clock and errno values. The kernel
 * build (__KERNEL__) uses kzalloc/mutex/ktime; the user-space build (preload/,
 * tests/core/) uses calloc/pthread/clock_gettime.
 */
#ifndef GPUSLICE_PORT_H
#define GPUSLICE_PORT_H

#ifdef __KERNEL__
#include <linux/errno.h>
#include <linux/kernel.h>
#include <linux/ktime.h>
#include <linux/mutex.h>
#include <linux/slab.h>
#include <linux/string.h>

/* the instance lock; the glue's gs_io serves kernel copies, so nothing under it waits on user memory */
struct gs_mutex {
	struct mutex m;
};

bool gs_inject_fail(void);	/* kmod/inject.c, TEST ONLY */

static inline void *gs_zalloc(size_t n)
{
	return gs_inject_fail() ? NULL : kzalloc(n, GFP_KERNEL);
}

static inline void gs_free(void *p)
{
	kfree(p);
}

static inline void gs_mutex_init(struct gs_mutex *m)
{
	mutex_init(&m->m);
}

static inline void gs_mutex_destroy(struct gs_mutex *m)
{
	mutex_destroy(&m->m);
}

static inline void gs_lock(struct gs_mutex *m)
{
	mutex_lock(&m->m);
}

static inline void gs_unlock(struct gs_mutex *m)
{
	mutex_unlock(&m->m);
}

static inline u64 gs_now_ns(void)
{
	return ktime_get_ns();
}

#else /* user space */

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct gs_mutex {
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

static inline void gs_mutex_init(struct gs_mutex *m)
{
	pthread_mutex_init(&m->m, NULL);
}

static inline void gs_mutex_destroy(struct gs_mutex *m)
{
	pthread_mutex_destroy(&m->m);
}

static inline void gs_lock(struct gs_mutex *m)
{
	pthread_mutex_lock(&m->m);
}

static inline void gs_unlock(struct gs_mutex *m)
{
	pthread_mutex_unlock(&m->m);
}

static inline uint64_t gs_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif /* __KERNEL__ */

#endif /* GPUSLICE_PORT_H */
