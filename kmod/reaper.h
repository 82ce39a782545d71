/* SPDX-License-Identifier: GPL-2.0 */
/*
 * reaper.h - the accounting of a gpuslice file ends when its real file is
 * released, not when the gpuslice file is (reaper.c).
 */
#ifndef GPUSLICE_REAPER_H
#define GPUSLICE_REAPER_H

#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/workqueue.h>

struct gs_file;

/* An instance's reaper: its released files whose real file is still held. */
struct gs_reaper {
	struct mutex lock;	/* guards list */
	struct list_head list;	/* of gs_file.reap */
	struct delayed_work work;
};

int gs_reaper_init(void);
void gs_reaper_exit(void);

/* An instance's, from its creation to its release (instance.c). */
void gs_reaper_setup(struct gs_reaper *r);
/* From the instance's release: its list is empty (nr_open is 0). */
void gs_reaper_teardown(struct gs_reaper *r);

/* From gs_release(): takes over gf, its real file and its node reference. */
void gs_reaper_add(struct gs_file *gf);
/* Wait for the instance's files whose real file has no other holder now. */
void gs_reaper_flush(struct gs_reaper *r);

#endif /* GPUSLICE_REAPER_H */
