/* SPDX-License-Identifier: GPL-2.0 */
/*
 * uscratch.h - calls into the real driver that gpuslice issues itself, from
 * the calling process's context. The real driver reads its arguments from user
 * memory, so the block is staged in a scratch page mapped for the duration of
 * the call in current->mm.
 */
#ifndef GPUSLICE_USCRATCH_H
#define GPUSLICE_USCRATCH_H

#include <linux/fs.h>
#include <linux/types.h>

/* NV_ESC_RM_CONTROL on real; *status gets the RM status. 0 or -errno. */
int gs_scratch_control(struct file *real, u32 h_client, u32 h_object, u32 cmd,
		       void *params, u32 params_size, u32 *status);
/* NV_ESC_CHECK_VERSION_STR (query) on a real nvidiactl file. */
int gs_scratch_query_version(struct file *real, char *out, size_t len);
/* NV_ESC_CARD_INFO on a real nvidiactl file, in the loader's context: ci[NV_MAX_DEVICES] */
int gs_scratch_card_info(struct file *real, struct nv_ioctl_card_info *ci);

#endif /* GPUSLICE_USCRATCH_H */
