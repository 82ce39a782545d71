/* SPDX-License-Identifier: GPL-2.0 */
/*
 * instance.h - gpuslice instances and their character-device nodes.
 *
 * An instance is a named slice of one or more GPUs with a memory limit and
 * scheduling parameters. It owns a decision-core instance (core/core.h) and
 * the nodes /dev/gpuslice/<name>/{nvidiactl,nvidia<N>...,nvidia-uvm}.
 *
 * Locking: gs_instances_lock (a mutex) guards the instance list, the minor
 * table, every instance's configuration and its nr_open count. procs_lock
 * guards an instance's process list. The decision core has its own lock,
 * which a container's call can hold for long (it reads user memory under it):
 * never wait for it with gs_instances_lock held. inst->core is read and used
 * inside the instance's gate (gate.h), which a handover closes to swap it;
 * cfg_lock orders handovers and INSTANCE_SETs of an instance.
 *
 * Lifetime: the list holds one reference (ref); netlink handlers take their
 * own under gs_instances_lock (gs_instance_get(), gs_instance_hold()) and
 * use the instance after dropping that lock. Deleting an instance unlists it
 * and removes its nodes and minors under gs_instances_lock, so no open() can
 * find it afterwards; the core and the struct go with the last reference.
 * Open files need no reference: an instance with open files is not deleted.
 * Released files wait on the instance's own reaper (reaper.c), whose work
 * item the release cancels.
 */
#ifndef GPUSLICE_INSTANCE_H
#define GPUSLICE_INSTANCE_H

#include <linux/device.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/uidgid.h>

#include "activity.h"
#include "core.h"
#include "gate.h"
#include "netlink.h"
#include "reaper.h"
#include "uapi/gpuslice.h"

#define GS_MAX_GPUS	GPUSLICE_MAX_GPUS
#define GS_NR_MINORS	4096

struct gs_instance;

/* One character device node of an instance. */
struct gs_node {
	struct device dev;
	struct gs_instance *inst;
	enum gs_file_kind kind;
	u32 gpu;		/* minor of /dev/nvidia<N> for GS_FILE_GPU */
};

/* A process (thread group) with at least one node of the instance open. */
struct gs_proc {
	struct list_head list;
	pid_t tgid;
	unsigned int nr_open;
};

struct gs_instance {
	struct list_head list;
	struct kref ref;
	u32 id;
	char name[GPUSLICE_NAME_MAX];
	u32 gpu_mask;
	u32 weight;
	u32 share;
	u64 timeslice_us;
	atomic_t timeslice_gen;	/* bumped when timeslice_us changes */
	kuid_t uid;
	kgid_t gid;
	umode_t mode;
	struct gs_inst *core;	/* used inside gate, swapped with it closed (handover) */
	struct gs_gate gate;
	struct gs_inst_ops core_ops;
	struct gs_node *nodes[GS_MAX_GPUS + 2];
	unsigned int nr_nodes;
	unsigned int nr_open;	/* open files on any node */
	bool live;		/* set once fully created, cleared on destroy */
	struct mutex cfg_lock;	/* orders INSTANCE_SETs of this instance */
	struct mutex procs_lock;
	struct list_head procs;
	spinlock_t refused_lock;	/* size of the last quota refusal, per thread */
	pid_t refused_tid;
	u64 refused_size;
	struct gs_nl_ratelimit refusal_events;
	struct gs_activity *act;	/* the USERD sampler (activity.c) */
	u32 sample_us;		/* its period for this instance, 0: userd_sample_ms (READ_ONCE) */
	u32 repeat_us;		/* CHANNEL_WORK at most this often, 0: 50 ms (READ_ONCE) */
	struct gs_reaper reaper;	/* its released files still held (reaper.c) */
};

/* What INSTANCE_NEW / INSTANCE_SET carry; 'set' says which fields are given. */
#define GS_CFG_MEM_LIMIT	BIT(0)
#define GS_CFG_WEIGHT		BIT(1)
#define GS_CFG_SHARE		BIT(2)
#define GS_CFG_TIMESLICE	BIT(3)
#define GS_CFG_UID		BIT(4)
#define GS_CFG_GID		BIT(5)
#define GS_CFG_MODE		BIT(6)
#define GS_CFG_GPU_MEM_LIMIT	BIT(7)
#define GS_CFG_SAMPLE		BIT(8)	/* sample_us and repeat_us */
#define GS_CFG_CAPS		BIT(9)

struct gs_inst_cfg {
	char name[GPUSLICE_NAME_MAX];
	u32 gpu_mask;
	u64 mem_limit;
	u64 gpu_mem_limit[GS_MAX_GPUS];	/* 0: mem_limit */
	u32 weight;
	u32 share;
	u64 timeslice_us;
	u32 uid;
	u32 gid;
	u32 mode;
	u32 sample_us;
	u32 repeat_us;
	u32 caps;		/* GPUSLICE_CAP_* */
	u32 set;
};

extern struct mutex gs_instances_lock;
extern struct list_head gs_instances;

int gs_instances_init(void);
void gs_instances_exit(void);

int gs_instance_new(const struct gs_inst_cfg *cfg);
int gs_instance_del(const char *name);
int gs_instance_set(const struct gs_inst_cfg *cfg);

/* What one handover took (gs_instance_handover()). */
struct gs_handover_stats {
	u64 pause_ns;		/* the gate closed: from closing it to opening it */
	u64 drain_ns;		/* of which waiting for the calls inside */
	u64 bytes;		/* the snapshot's length */
};

/*
 * Hands the instance's decision state to a fresh core while its files stay
 * open: -EBUSY when the calls inside do not finish within the bound (or the
 * core refuses its snapshot), -EINTR, -ENOMEM, or the reader's refusal; on any
 * of them the old core stays, unchanged.
 */
int gs_instance_handover(struct gs_instance *inst, struct gs_handover_stats *hs);
/* Caller holds gs_instances_lock. */
struct gs_instance *gs_instance_find(const char *name);
/* Caller holds gs_instances_lock and found inst listed: takes a reference. */
void gs_instance_hold(struct gs_instance *inst);
/* The listed instance NAME with a reference taken, or NULL. */
struct gs_instance *gs_instance_get(const char *name);
void gs_instance_put(struct gs_instance *inst);
bool gs_instance_name_valid(const char *name);

/* Open/close bookkeeping for fops.c. */
struct gs_node *gs_node_open(unsigned int minor);
void gs_node_close(struct gs_node *node);
void gs_proc_attach(struct gs_instance *inst, pid_t tgid);
void gs_proc_detach(struct gs_instance *inst, pid_t tgid);
/* Size of the allocation the core just refused in this thread's call, or 0. */
u64 gs_refused_size(struct gs_instance *inst);

#endif /* GPUSLICE_INSTANCE_H */
