/* SPDX-License-Identifier: GPL-2.0 */
/*
 * fdswap.h - run one call into the real driver with a private fd table in
 * which the caller's gpuslice files are replaced by the real driver's files
 * (see fdswap.c and docs/fd-translation.md).
 */
#ifndef GPUSLICE_FDSWAP_H
#define GPUSLICE_FDSWAP_H

#include <linux/types.h>

struct file;

#define GS_FDSWAP_MAX_NEW	4

struct gs_fdswap;

/* Files the driver installed into the private table during the call, moved
 * into the caller's table: the driver returned old_fd, the caller has new_fd. */
struct gs_fdswap_moved {
	unsigned int nr;
	int old_fd[GS_FDSWAP_MAX_NEW];
	int new_fd[GS_FDSWAP_MAX_NEW];
};

/*
 * Installs the private table as current->files. 0 or -errno (-EINTR, -ENOMEM,
 * -EBADF). pin: a real file the driver must find at pin_fd, whatever the
 * caller's table holds there by now (the file a control's fd was checked
 * as, ioctl.c); NULL for none.
 */
int gs_fdswap_enter(struct gs_fdswap **swap, int pin_fd, struct file *pin);
/* Puts the caller's table back, moves new files over, frees the private one. */
void gs_fdswap_exit(struct gs_fdswap *swap, struct gs_fdswap_moved *moved);
/* Waits for private tables still being freed (module exit). */
void gs_fdswap_barrier(void);

#endif /* GPUSLICE_FDSWAP_H */
