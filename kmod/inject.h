/* SPDX-License-Identifier: GPL-2.0 */
/*
 * inject.h - the test build's hooks (kmod/Kbuild with GPUSLICE_TEST=1, which
 * links inject.c and defines GPUSLICE_TEST; scripts/build-modules.sh builds it
 * into build/test-kmod/ for the guest suite). Its module parameters:
 *
 *   fail_alloc_every    make every Nth allocation of the module fail: its
 *                       allocations on the open, ioctl and mmap paths, and the
 *                       core's (core/port.h), go through gs_inject_fail(), so a
 *                       test can check that each failure unwinds cleanly
 *                       (tests/guest/test_faults.py)
 *   race_delay_fd_us    widen the window between the check of a control's fd
 *                       and the call's private fd table, where another thread
 *                       may dup2() another file over it (tests/guest/test_export.py)
 *   allow_test_escapes  let the stand-in driver's test escape 0xF0 through
 *                       instances (GS_INST_ALLOW_TEST_ESCAPES on each new one)
 *   handover_corrupt    change a byte of each handover's snapshot before the
 *                       fresh core reads it, so that the reader refuses it
 *                       (tests/guest/test_handover.py)
 *
 * The shipped module (what DKMS builds) has none of them: there the hooks are
 * the no-op stubs below and compile to nothing.
 */
#ifndef GPUSLICE_INJECT_H
#define GPUSLICE_INJECT_H

#include <linux/slab.h>
#include <linux/types.h>

#ifdef GPUSLICE_TEST
bool gs_inject_fail(void);
void gs_inject_fd_delay(void);
bool gs_inject_test_escapes(void);
void gs_inject_snapshot(void *buf, long len);
#else
static inline bool gs_inject_fail(void)
{
	return false;
}

static inline void gs_inject_fd_delay(void)
{
}

static inline bool gs_inject_test_escapes(void)
{
	return false;
}

static inline void gs_inject_snapshot(void *buf, long len)
{
}
#endif /* GPUSLICE_TEST */

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
