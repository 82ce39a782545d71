/* SPDX-License-Identifier: GPL-2.0 */
/*
 * version.h - the module's version, /sys/module/gpuslice/version: "RELEASE BUILD",
 * e.g. "0.1.0 8015fbc1a2b3-dirty". RELEASE is pyproject.toml's version (a host test
 * holds them equal). BUILD is `git describe --always --dirty --tags --abbrev=12` of the
 * checkout the module was built from, written into gpuslice_build.h (not in git) by
 * scripts/build-modules.sh and scripts/dkms.sh; "unknown" for a build without it.
 * `gpuctl --version` names the same of gpuctl, and `gpuctl doctor` compares them.
 * Included by main.c alone.
 */
#ifndef GPUSLICE_VERSION_H
#define GPUSLICE_VERSION_H

#include <linux/module.h>

#if defined(__has_include)
#if __has_include("gpuslice_build.h")
#include "gpuslice_build.h"
#endif
#endif
#ifndef GPUSLICE_BUILD
#define GPUSLICE_BUILD "unknown"
#endif

#define GPUSLICE_RELEASE "0.1.0"

MODULE_VERSION(GPUSLICE_RELEASE " " GPUSLICE_BUILD);

#endif /* GPUSLICE_VERSION_H */
