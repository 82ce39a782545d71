// SPDX-License-Identifier: GPL-2.0
/*
 * main.c - gpuslice.ko: kernel-space GPU sharing for containers on NVIDIA
 * GPUs. Loads only next to a present NVIDIA driver of a release it has an ABI
 * table for (driver.c) unless passthrough_only=1.
 */
#include <linux/module.h>

#include "driver.h"
#include "fdswap.h"
#include "instance.h"
#include "netlink.h"
#include "reaper.h"
#include "shadow.h"
#include "uvmcall.h"
#include "version.h"	/* MODULE_VERSION: release and build, for gpuctl doctor */

bool gs_passthrough_only;
module_param_named(passthrough_only, gs_passthrough_only, bool, 0444);
MODULE_PARM_DESC(passthrough_only,
		 "Pass every call through without decoding (for untested driver versions)");

static int __init gs_init(void)
{
	int err;

	err = gs_shadow_init();
	if (err)
		return err;
	err = gs_uvmcall_init();
	if (err)
		goto err_shadow;
	err = gs_driver_init();
	if (err)
		goto err_uvmcall;
	err = gs_reaper_init();
	if (err)
		goto err_driver;
	err = gs_instances_init();
	if (err)
		goto err_reaper;
	err = gs_netlink_init();
	if (err)
		goto err_instances;
	pr_info("gpuslice: loaded\n");
	return 0;

err_instances:
	gs_instances_exit();
err_reaper:
	gs_reaper_exit();
err_driver:
	gs_driver_exit();
err_uvmcall:
	gs_uvmcall_exit();
err_shadow:
	gs_shadow_exit();
	return err;
}

static void __exit gs_exit(void)
{
	gs_netlink_exit();
	gs_instances_exit();
	gs_reaper_exit();
	gs_fdswap_barrier();
	gs_driver_exit();
	gs_uvmcall_exit();
	gs_shadow_exit();
}

module_init(gs_init);
module_exit(gs_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("gpuslice: GPU sharing for containers on NVIDIA GPUs");
MODULE_AUTHOR("gpuslice authors");
