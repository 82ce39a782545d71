// SPDX-License-Identifier: GPL-2.0
/*
 * inject.c - the test build's hooks and their module parameters (inject.h);
 * linked only when kmod/Kbuild is built with GPUSLICE_TEST=1.
 */
#include <linux/atomic.h>
#include <linux/delay.h>
#include <linux/minmax.h>
#include <linux/moduleparam.h>

#include "inject.h"

static unsigned int gs_fail_alloc_every;
module_param_named(fail_alloc_every, gs_fail_alloc_every, uint, 0644);
MODULE_PARM_DESC(fail_alloc_every,
		 "TEST BUILD: make every Nth allocation of the module fail (0: none)");

static atomic_t gs_alloc_count = ATOMIC_INIT(0);

bool gs_inject_fail(void)
{
	unsigned int n = READ_ONCE(gs_fail_alloc_every);

	return n && (unsigned int)atomic_inc_return(&gs_alloc_count) % n == 0;
}

static unsigned int gs_race_delay_fd_us;
module_param_named(race_delay_fd_us, gs_race_delay_fd_us, uint, 0644);
MODULE_PARM_DESC(race_delay_fd_us,
		 "TEST BUILD: microseconds to pause between checking the fd an export or import control names and making the call's fd table (max 1000000; 0: none)");

void gs_inject_fd_delay(void)
{
	unsigned int us = min(READ_ONCE(gs_race_delay_fd_us), 1000000u);

	if (us)
		usleep_range(us, us + us / 16 + 1);
}

static bool gs_allow_test_escapes;
module_param_named(allow_test_escapes, gs_allow_test_escapes, bool, 0444);
MODULE_PARM_DESC(allow_test_escapes,
		 "TEST BUILD: let the stand-in driver's test escape 0xF0 through instances");

bool gs_inject_test_escapes(void)
{
	return gs_allow_test_escapes;
}

static bool gs_handover_corrupt;
module_param_named(handover_corrupt, gs_handover_corrupt, bool, 0644);
MODULE_PARM_DESC(handover_corrupt,
		 "TEST BUILD: change a byte of each handover's snapshot, so that the fresh core refuses it");

void gs_inject_snapshot(void *buf, long len)
{
	if (READ_ONCE(gs_handover_corrupt) && len > 0)
		((u8 *)buf)[len / 2] ^= 0x5a;
}
