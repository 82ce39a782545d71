/* SPDX-License-Identifier: GPL-2.0 */
/*
 * driver.h - the real NVIDIA driver behind gpuslice: where its nodes are, how
 * to open them on a caller's behalf, and which version it is.
 */
#ifndef GPUSLICE_DRIVER_H
#define GPUSLICE_DRIVER_H

#include <linux/fs.h>
#include <linux/types.h>

#include "core.h"

/* The stand-in driver's test-only escape (tests/standin/nvstub_uapi.h). */
#define GS_TEST_ESCAPE		0xF0

extern bool gs_passthrough_only;

int gs_driver_init(void);
void gs_driver_exit(void);
/* Resolves /dev/nvidia<gpu> if not done at load; false if it is not a GPU node. */
bool gs_driver_has_gpu(u32 gpu);
/* RM's gpuId of /dev/nvidia<minor> (CARD_INFO at load), 0 if unknown */
u32 gs_driver_gpu_id(u32 minor);
bool gs_driver_has_uvm(void);
/* Opens the real node with the caller's credentials, bypassing path lookup. */
struct file *gs_driver_open(enum gs_file_kind kind, u32 gpu, unsigned int flags);
/* Is f a file of the real driver (a node we must never hand to a container)? */
bool gs_driver_is_real_file(struct file *f);
/* A version string seen in a CHECK_VERSION_STR reply. */
void gs_driver_seen_version(const char *version, size_t len);

#endif /* GPUSLICE_DRIVER_H */
