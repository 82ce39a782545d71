/* SPDX-License-Identifier: GPL-2.0 */
/*
 * reaper.h - the accounting of a gpuslice file ends when its real file is
 * released, not when the gpuslice file is (reaper.c).
 */
#ifndef GPUSLICE_REAPER_H
#define GPUSLICE_REAPER_H

struct gs_file;

/* From gs_release(): takes over gf, its real file and its node reference. */
void gs_reaper_add(struct gs_file *gf);
/* Wait for every real file that has no other holder now to be reaped. */
void gs_reaper_flush(void);
/* Module exit: every reaped file is gone by then (each holds the module). */
void gs_reaper_exit(void);

#endif /* GPUSLICE_REAPER_H */
