/* SPDX-License-Identifier: GPL-2.0 */
/*
 * uvmcall.h - nvidia-uvm calls whose reply no process can rewrite (uvmcall.c).
 */
#ifndef GPUSLICE_UVMCALL_H
#define GPUSLICE_UVMCALL_H

#include <linux/fs.h>
#include <linux/types.h>

/* At module load, in the loading process's context: keeps its mm. */
int gs_uvmcall_init(void);
void gs_uvmcall_exit(void);

/*
 * Runs the nvidia-uvm ioctl cmd on real with block (size bytes, at most a
 * page) as its argument, from a page no process maps; block holds the reply
 * after. Returns the ioctl's return; -ENODEV when the module has no such
 * page (gs_uvmcall_init()): the caller then makes the call itself.
 */
long gs_uvmcall(struct file *real, unsigned int cmd, void *block, size_t size);

#endif /* GPUSLICE_UVMCALL_H */
