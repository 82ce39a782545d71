/* SPDX-License-Identifier: GPL-2.0 */
/*
 * ioctl.h - the interposed ioctl path: copy in, decision core, real call with
 * fd translation, copy out, tracepoints.
 */
#ifndef GPUSLICE_IOCTL_H
#define GPUSLICE_IOCTL_H

#include <linux/fs.h>
#include <linux/types.h>

long gs_ioctl(struct file *file, unsigned int cmd, void __user *arg, bool compat);

#endif /* GPUSLICE_IOCTL_H */
