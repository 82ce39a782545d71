/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * nvstub_uapi.h - the test-only interface of the nvstub stand-in driver.
 *
 * nvstub is a TEST DOUBLE of NVIDIA's nvidia.ko (see README.md). Besides the
 * real RM ABI (kmod/core/nvrm_abi.h) it offers one escape that does not exist
 * in the real driver: NVSTUB_ESC_SUBMIT on /dev/nvidiactl queues simulated
 * work (a duration in ns) on a channel; the simulated engine thread runs it.
 * Mirrored in tests/guest/nvstub.py; keep both stable, other tests use them.
 */
#ifndef NVSTUB_UAPI_H
#define NVSTUB_UAPI_H

#ifdef __KERNEL__
#include <linux/types.h>
#include <linux/ioctl.h>
#else
#include <stdint.h>
#include <sys/ioctl.h>
#endif

#define NVSTUB_ESC_SUBMIT	0xF0

struct nvstub_submit {
	uint32_t h_client;	/* a client created through this nvidiactl file */
	uint32_t h_channel;	/* a channel (0xc86f) of that client */
	uint64_t work_ns;	/* simulated work to append to the channel */
	uint32_t status;	/* out: NV_OK, 0x23 foreign client, 0x33 no channel */
	uint32_t pad;
};

#define NVSTUB_IOCTL_SUBMIT	_IOWR('F', NVSTUB_ESC_SUBMIT, struct nvstub_submit)

#endif /* NVSTUB_UAPI_H */
