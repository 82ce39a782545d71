/* SPDX-License-Identifier: GPL-2.0 */
/*
 * inject.h - allocation failures and a race window on demand (module
 * parameters fail_alloc_every and race_delay_fd_us, TEST ONLY): the module's
 * allocations on its open, ioctl and mmap paths, and the core's, go through
 * these, so a test can make every Nth one fail and check that each failure
 * unwinds cleanly (tests/guest/test_faults.py).
 */
#ifndef GPUSLICE_INJECT_H
#define GPUSLICE_INJECT_H

#include <linux/slab.h>
#include <linux/types.h>

bool gs_inject_fail(void);
/*
 * TEST ONLY (module parameter race_delay_fd_us): widens the window between the
 * check of a control's fd and the call's private fd table, where another
 * thread may dup2() another file over it (tests/guest/test_export.py).
 */
void gs_inject_fd_delay(void);

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
