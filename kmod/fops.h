/* SPDX-License-Identifier: GPL-2.0 */
/*
 * fops.h - file operations of the gpuslice nodes: each open file wraps a file
 * of the real driver and forwards to it.
 */
#ifndef GPUSLICE_FOPS_H
#define GPUSLICE_FOPS_H

#include <linux/fs.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/types.h>

#include "activity.h"

struct gs_node;

/* private_data of an open gpuslice node */
struct gs_file {
	struct gs_node *node;
	struct file *real;	/* the real driver's file; never in a container's fd table */
	u64 id;			/* gs_call.file_id */
	pid_t tgid;		/* process that opened it (PROC_ATTACH/DETACH) */
	int timeslice_gen;	/* instance timeslice generation applied on this file */
	struct list_head reap;	/* on the reaper's list once released (reaper.c) */
	struct gs_act_note act_note;	/* the RM mapping its next mmap() maps (activity.c) */
	/*
	 * nvidia-uvm files: held by a call that maps, unmaps or frees UVM
	 * ranges from the core's check to its account of the reply, so that
	 * the core sees them in the order UVM ran them (core/uvm.c).
	 */
	struct mutex uvm_lock;
};

extern const struct file_operations gs_fops;

/* The real file behind f if f is a gpuslice node, else NULL. No reference taken. */
static inline struct file *gs_fops_real(struct file *f)
{
	struct gs_file *gf;

	if (f->f_op != &gs_fops)
		return NULL;
	gf = f->private_data;
	return gf->real;
}

#endif /* GPUSLICE_FOPS_H */
