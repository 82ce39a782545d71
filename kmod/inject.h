/* SPDX-License-Identifier: GPL-2.0 */
/*
 * inject.h - allocation failures on demand (module parameter fail_alloc_every,
 * TEST ONLY): the module's allocations on its open, ioctl and mmap paths, and
 * the core's, go through these, so a test can make every Nth one fail and
 * check that each failure unwinds cleanly (tests/guest/test_faults.py).
 */
#ifndef GPUSLICE_INJECT_H
#define GPUSLICE_INJECT_H

#include <linux/slab.h>
#include <linux/types.h>

bool gs_inject_fail(void);

static inline void *gs_kmalloc(size_t n, gfp_t gfp)
{
	return gs_inject_fail() ? NULL : kmalloc(n, gfp);
}

static inline void *gs_kzalloc(size_t n, gfp_t gfp)
{
	return gs_inject_fail() ? NULL : kzalloc(n, gfp);
}

static inline void *gs_kvmalloc(size_t n, gfp_t gfp)
{
	return gs_inject_fail() ? NULL : kvmalloc(n, gfp);
}

#endif /* GPUSLICE_INJECT_H */
