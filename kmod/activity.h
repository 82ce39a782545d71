/* SPDX-License-Identifier: GPL-2.0 */
/*
 * activity.h - the module's sampler of channels' USERD (activity.c): the
 * CHANNEL_WORK events of kmod/uapi/gpuslice.h.
 */
#ifndef GPUSLICE_ACTIVITY_H
#define GPUSLICE_ACTIVITY_H

#include <linux/mm_types.h>
#include <linux/types.h>

struct gs_instance;
struct gs_file;
struct gs_activity;

/* What an RM_MAP_MEMORY left on the file whose next mmap() maps it. */
struct gs_act_note {
	bool valid;
	u32 client;
	u32 mem;
	u64 offset;
	u64 length;
	u64 inpage;	/* offset_in_page() of the address RM returned */
};

int gs_activity_new(struct gs_instance *inst);
/* Stops the sampler and drops every mapping it knew; process context. */
void gs_activity_free(struct gs_instance *inst);
/* After a successful RM_MAP_MEMORY naming fd in the caller's table. */
void gs_activity_map_memory(struct gs_instance *inst, int fd, const struct gs_act_note *note);
/* A channel was announced or went (CHANNEL_NEW, CHANNEL_DEL). */
void gs_activity_channels_changed(struct gs_instance *inst);
/* After the driver's mmap() of gf succeeded. */
void gs_activity_mmap(struct gs_file *gf, struct vm_area_struct *vma);

#endif /* GPUSLICE_ACTIVITY_H */
