/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * core.h - gpuslice's decision core: decode, quota, filter, virtualized
 * replies and the per-instance registry of RM objects.
 *
 * Plain C. The same core.c compiles into the kernel module (kmod/) and into
 * the user-space LD_PRELOAD library (preload/). It never touches user memory,
 * files or the real driver itself: the glue copies the ioctl's argument block
 * in, calls gs_pre(), calls the real driver if told to, calls gs_post(), and
 * copies the block back. Nested parameter blocks (RM_ALLOC params, RM_CONTROL
 * params) are reached through struct gs_io. Environment-specific primitives
 * (allocation, mutex, clock) come from port.h.
 *
 * Thread safety: every function takes the instance's own mutex; the glue needs
 * no lock of its own around them. gs_pre()/gs_post() may sleep (gs_io reads).
 */
#ifndef GPUSLICE_CORE_H
#define GPUSLICE_CORE_H

#include "nvrm_abi.h"
#include "port.h"
#include "../uapi/gpuslice.h"

enum gs_file_kind {
	GS_FILE_CTL,	/* nvidiactl */
	GS_FILE_GPU,	/* nvidia<N> */
	GS_FILE_UVM,	/* nvidia-uvm */
};

enum gs_verdict {
	GS_PASS = 0,	/* call the real driver, then gs_post() */
	GS_REPLY = 1,	/* do not call it: the block (status set) is the reply, ioctl returns 0 */
	GS_FAIL = 2,	/* do not call it: the ioctl fails with -c->err (short block, escape) */
};

/* why a call was refused; also counted per instance */
enum gs_refusal {
	GS_REFUSE_NONE,
	GS_REFUSE_QUOTA,		/* video memory over the limit */
	GS_REFUSE_FOREIGN,		/* names a client or object that is not this instance's */
	GS_REFUSE_GLOBAL,		/* control that changes the whole GPU */
	GS_REFUSE_CLASS,		/* class not allowed (privileged / cross-instance) */
	GS_REFUSE_ESCAPE,		/* escape not allowed through an instance */
	GS_REFUSE_MALFORMED,		/* argument block could not be read or is too short */
	GS_REFUSE_UNLISTED,		/* not on the allowlist (deny by default) */
	GS_REFUSE_LIMIT,		/* over the instance's object or channel cap */
	GS_REFUSE_CAPS,			/* its row's capability is not in the instance's set */
};

/*
 * The container capabilities (NVIDIA_DRIVER_CAPABILITIES' names, as gVisor's
 * nvproxy has them): each filter row (filter.c) is for one or more of them,
 * and an instance may use a row only where its set, gs_inst_set_caps(), holds
 * one (default: all).
 */
#define GS_CAP_COMPUTE	0x1
#define GS_CAP_UTILITY	0x2
#define GS_CAP_GRAPHICS	0x4
#define GS_CAP_VIDEO	0x8
#define GS_CAPS_ALL	(GS_CAP_COMPUTE | GS_CAP_UTILITY | GS_CAP_GRAPHICS | GS_CAP_VIDEO)
/* nvproxy's compUtil (pkg/sentry/devices/nvproxy/seccomp_filters.go) */
#define GS_CAPS_COMPUTE_UTILITY	(GS_CAP_COMPUTE | GS_CAP_UTILITY)

/* instance flags, gs_inst_set_flags() */
#define GS_INST_ALLOW_TEST_ESCAPES	0x1	/* let GS_TEST_ESC_SUBMIT through (stand-in only) */

/* NVSTUB_ESC_SUBMIT of the stand-in driver (tests/standin/nvstub_uapi.h) */
#define GS_TEST_ESC_SUBMIT		0xF0

/* access to the calling process's memory (copy_from_user / memcpy) */
struct gs_io {
	int (*read)(void *ctx, nv_u64 uaddr, void *dst, nv_u32 len);	/* 0 or -errno */
	int (*write)(void *ctx, nv_u64 uaddr, const void *src, nv_u32 len);
	void *ctx;
};

/* bytes of the argument block kept as checked (the largest decoded block) */
#define GS_CHECKED_WORDS	23	/* the largest block decided on: NVOS32_PARAMETERS, 184 bytes */

/* one ioctl, from gs_pre() to gs_post() */
struct gs_obj;
struct gs_mem;
struct gs_export;
struct gs_memref;
struct gs_uvm_rec;
struct gs_osev;
struct gs_call;

/* the most objects a new object depends on, besides its parent (core.c gs_dep_fields[]) */
#define GS_CALL_DEPS	4

/* a handle a call in flight creates, frees or takes from (core.c, registry.c) */
struct gs_busy {
	struct gs_busy *next;
	nv_handle client;
	nv_handle handle;
	nv_handle parent;	/* GS_BUSY_CREATE: the new object's parent */
	nv_u32 role;		/* GS_BUSY_* (core_int.h) */
};

struct gs_call {
	/* filled by the glue */
	enum gs_file_kind kind;
	nv_u32 gpu_minor;	/* for GS_FILE_GPU */
	nv_u32 req;		/* full ioctl request word */
	void *arg;		/* the glue's copy of the argument block */
	nv_u32 arg_size;	/* NV_IOC_SIZE(req), 0 for UVM */
	nv_u64 file_id;		/* identifies the open file; RM ties clients to it */
	nv_u32 pid;
	/*
	 * The caller's pid as its own pid namespace sees it (task_tgid_vnr();
	 * getpid() in user space), which is how RM writes pids into replies
	 * (GPU_GET_PIDS, GPU_GET_PID_INFO). 0: the same as pid.
	 */
	nv_u32 ns_pid;
	/* filled by the core, read by the glue (tracing) */
	nv_u32 escape;		/* NV_IOC_NR(req); the whole req for UVM */
	nv_u32 what;		/* class for RM_ALLOC, cmd for RM_CONTROL, else 0 */
	nv_u32 status;		/* NV status seen in / put into the reply */
	nv_s32 err;		/* positive errno for GS_FAIL */
	enum gs_refusal refusal;
	/*
	 * Set by the glue: the driver returned 0 but its reply could not be
	 * read back (a racing thread unmapped or protected the block). The
	 * core then assumes the call succeeded: it keeps what it charged and
	 * frees nothing.
	 */
	nv_u8 reply_lost;
	/*
	 * Set by the glue for an nvidia-uvm call whose reply the caller could
	 * not rewrite (the module: kmod/uvmcall.c; the user-space build, which
	 * is no boundary: always). The core lets go of a charge that UVM held
	 * only on such a reply (uvm.c).
	 */
	nv_u8 reply_trusted;
	/*
	 * Private to the core between pre and post, each field for one path:
	 * a reservation of counted memory (quota.c gs_quota_check(), held until
	 * gs_quota_charge() or gs_quota_release()); an RM_ALLOC of a device, its
	 * GPU as checked (core.c gs_pre_device_gpu()); a reply the core
	 * rewrote (virt.c).
	 */
	nv_u64 reserved;	/* bytes reserved */
	struct gs_call_quota {
		nv_u8 held;	/* a reservation is held */
		nv_u8 sys;	/* pinned system memory, else video memory */
		nv_u32 gpu;	/* video memory: the GPU it was checked against */
		nv_u64 asked;	/* the size that was checked */
		nv_u64 least;	/* what PMA takes for it at least (gs_pma_size()) */
	} quota;
	nv_u32 device_gpu;
	nv_u8 rewritten;
	/*
	 * What gs_post() adds to the registry for a call that creates an
	 * object, allocated by gs_pre() before the driver runs: once RM has
	 * acted, the core's record of it cannot fail to be made.
	 */
	struct gs_obj *spare_obj;	/* a list, through ->next, for an import of several */
	struct gs_mem *spare_mem;
	struct gs_export *spare_exp;	/* export.c: what an export or import will record */
	struct gs_memref *spare_ref;	/* a reference parked on the client (gs_park()) */
	struct gs_uvm_rec *spare_uvm;	/* uvm.c: what a UVM call will record */
	struct gs_uvm_rec *uvm_added;	/* uvm.c: what it recorded at the check */
	struct gs_osev *spare_osev;	/* osevent.c: what an NV_ESC_ALLOC_OS_EVENT will record */
	/*
	 * Set by the glue for a call that names an fd (gs_call_fd()): the id
	 * of the file the fd named if it is a nvidiactl node of the caller's
	 * instance, which the driver then sees at that fd for the whole call;
	 * 0 for any other file (another instance's, not ours, no file).
	 */
	nv_u64 fd_file_id;
	/*
	 * Set by the user-space build's glue only (one core per process): the
	 * file fd_file_id names holds exports that another process of the same
	 * instance made (preload/siblings.c), which this core did not record.
	 * An import from it is let through and registers what it made
	 * uncharged: the exporting process's core holds the charge. The module
	 * has one core per instance and never sets it.
	 */
	nv_u8 fd_sibling;
	/*
	 * Likewise, for RM_DUP_OBJECT: hClientSrc is a client another process
	 * of the instance made and shared an object of (RM_SHARE: legacy CUDA
	 * IPC). The duplicate is registered uncharged.
	 */
	nv_u8 src_sibling;
	/*
	 * Private to the core: what RM_DUP_OBJECT duplicates, as gs_pre()
	 * found it (its charge referenced from then on); and the handles the
	 * call creates, frees or takes from, on the instance's list of calls in
	 * flight from gs_pre() to gs_post() (registry.c, gs_busy_conflict()).
	 */
	struct gs_mem *src_mem;
	nv_u32 src_found, src_kind, src_klass, src_gpu, src_engine, src_flags;
	struct gs_busy busy[2 + GS_CALL_DEPS];
	nv_u8 nr_busy;
	/* RM_ALLOC: the handles the new object depends on, read from the checked parameters */
	nv_handle deps[GS_CALL_DEPS];
	/*
	 * The block as gs_pre() checked it. User memory can be rewritten by
	 * another thread at any time, so gs_post() takes what the caller
	 * asked for (class, handles, parents, sizes) from here and only what
	 * RM answered (status, handles RM chose) from the reply in arg.
	 */
	nv_u64 checked[GS_CHECKED_WORDS];
};

/*
 * The parameter block that an argument block points at (RM_ALLOC's
 * pAllocParms, RM_CONTROL's params). The glue copies it once, before
 * gs_pre(), and serves the core's gs_io reads of it from that copy, never
 * from user memory again. With stage set, RM copies in exactly size bytes
 * from there, so the glue hands the driver its copy (kmod/shadow.c) and
 * nothing the caller writes after the check reaches RM. Without, the copy
 * only feeds the core's bookkeeping (a channel's engine), which a racer can
 * falsify for its own objects only.
 */
struct gs_nested {
	nv_u64 uaddr;		/* the caller's pointer */
	nv_u32 ptr_off;		/* where that pointer is in the argument block */
	nv_u32 size;		/* bytes at it */
	nv_u8 stage;		/* RM reads exactly size bytes */
};

/*
 * Largest nested block that is copied and staged: the controls the core
 * decides on or rewrites are smaller (GPU_GET_PID_INFO, 14408 bytes, is the
 * largest); RM's own cap is 1 MiB.
 */
#define GS_NESTED_MAX		(16 * 1024)

/* what happened, for the glue to publish (netlink multicast / unix socket) */
struct gs_event {
	nv_u32 type;		/* enum gpuslice_event (kmod/uapi/gpuslice.h) */
	nv_u32 obj_kind;	/* enum gpuslice_obj_kind */
	nv_u32 pid;
	nv_u32 gpu;
	nv_handle client;
	nv_handle handle;
	nv_handle parent;
	nv_u32 klass;
	nv_u32 engine;
	nv_u64 size;
	nv_u32 status;
	nv_u32 cmd;
};

struct gs_inst_ops {
	/* may be NULL; called without the core lock held */
	void (*event)(void *ctx, const struct gs_event *ev);
	void *ctx;
};

struct gs_stats {
	nv_u64 mem_limit;
	nv_u64 mem_used;
	nv_u64 mem_peak;
	nv_u64 nr_ioctls;
	nv_u64 nr_refused_quota;
	nv_u64 nr_refused_filter;
	nv_u32 nr_objects;
	nv_u32 hash_max_chain;		/* longest chain of the object table */
	struct gs_lock_stats lock;	/* the instance's lock (port.h), this read excluded */
};

/* one tracked RM object, as handed to gs_for_each_object() */
struct gs_object {
	nv_u32 obj_kind;	/* enum gpuslice_obj_kind */
	nv_u64 file_id;
	nv_u32 pid;
	nv_u32 gpu;
	nv_handle client;
	nv_handle handle;
	nv_handle parent;
	nv_u32 klass;
	nv_u32 engine;
	nv_u64 size;		/* bytes of video memory, 0 for the rest */
	nv_u32 flags;		/* GS_OBJ_* */
	/* channels: where their USERD is (activity.c), gpFifoEntries; 0 unknown */
	nv_handle userd_mem;
	nv_u64 userd_off;
	nv_u32 gp_entries;
};

/*
 * A TSG or channel that RM scheduled: NVA06C_CTRL_CMD_GPFIFO_SCHEDULE on the
 * TSG, NVA06F_CTRL_CMD_GPFIFO_SCHEDULE or NVA06F_CTRL_CMD_BIND on the channel
 * succeeded, or the channel was made in a TSG scheduled already (it inherits
 * the TSG's runlist: kernel_channel.c, kchannelConstruct, 580). Before that a
 * FIFO_DISABLE_CHANNELS naming the channel fails with NV_ERR_INVALID_CHANNEL
 * (every new channel's first disable on the H100, docs/h100-scheduler.md), so
 * the controller hears of a channel, by CHANNEL_NEW and in object dumps, only
 * once it is scheduled: gs_object_gateable().
 */
#define GS_OBJ_SCHEDULED	0x1
/*
 * RM destroyed it with an object it depended on, and keeps its handle until
 * the caller frees that (registry.c gs_obj_lose()): no memory, not gated.
 */
#define GS_OBJ_LOST		0x2

static inline int gs_object_gateable(const struct gs_object *o)
{
	if (o->flags & GS_OBJ_LOST)
		return 0;
	return o->obj_kind != GPUSLICE_OBJ_CHANNEL || (o->flags & GS_OBJ_SCHEDULED);
}

struct gs_inst;

struct gs_inst *gs_inst_new(nv_u64 mem_limit, const struct gs_inst_ops *ops);
void gs_inst_free(struct gs_inst *in);
void gs_inst_set_limit(struct gs_inst *in, nv_u64 mem_limit);
/* the instance's GPUs, bit N = RM device instance N (default: all); others get no memory */
void gs_inst_set_gpus(struct gs_inst *in, nv_u32 mask);
/*
 * RM's gpuId of each of the instance's GPUs, [GPUSLICE_MAX_GPUS], 0 for none:
 * the only GPUs NV_ESC_ATTACH_GPUS_TO_FD may name. Not set (the user-space
 * build): any.
 */
void gs_inst_set_gpu_ids(struct gs_inst *in, const nv_u32 *ids);
/* per-GPU limits (kmod/uapi/gpuslice.h: GPU_MEM_LIMIT), [GPUSLICE_MAX_GPUS] */
void gs_inst_set_gpu_limits(struct gs_inst *in, const nv_u64 *limits);
/* each [GPUSLICE_MAX_GPUS]: the limit in effect, the use and the peak per GPU */
void gs_inst_gpu_mem(struct gs_inst *in, nv_u64 *limit, nv_u64 *used, nv_u64 *peak);
void gs_inst_stats(struct gs_inst *in, struct gs_stats *st);
void gs_inst_set_flags(struct gs_inst *in, nv_u32 flags);
/* the instance's capability set, GS_CAP_* (bits outside GS_CAPS_ALL are ignored) */
void gs_inst_set_caps(struct gs_inst *in, nv_u32 caps);
nv_u32 gs_inst_caps(struct gs_inst *in);
/* pids with a live RM client; returns how many (may exceed max: call again bigger) */
int gs_inst_pids(struct gs_inst *in, nv_u32 *pids, int max);

/* Decide on a call before the real driver sees it. */
enum gs_verdict gs_pre(struct gs_inst *in, struct gs_call *c, const struct gs_io *io);
/*
 * 1 if gs_pre() decides on the contents of c's argument block (the escapes it
 * decodes); the other escapes it passes are decided on their number alone.
 */
int gs_block_decided(const struct gs_call *c);
/*
 * The size of the block of an nvidia-uvm command that gs_pre() decides on
 * (the glue copies it into arg, arg_size, and the driver reads that copy);
 * 0 for the commands decided on their number alone.
 */
nv_u32 gs_uvm_arg_size(nv_u32 cmd);

/*
 * The driver's ABI table (nvrm_abi.h struct nvrm_table): the glue selects the
 * running driver's row once, before any call (the module at load, the library
 * at start); gs_abi_select() returns -1, selecting nothing, for a version with
 * no row. Until then gs_abi() is the newest row (the host tests' driver).
 */
int gs_abi_select(const char *version);
const struct nvrm_table *gs_abi(void);
/* the supported releases in one line, each branch's oldest to newest, for a refusal */
void gs_abi_supported(char *buf, unsigned long size);
nv_u32 gs_uvm_status_off(nv_u32 cmd);
/*
 * 1 for the nvidia-uvm commands whose success lets the core uncharge what UVM
 * held (UVM_FREE, UVM_UNMAP_EXTERNAL, UVM_UNREGISTER_CHANNEL): the glue says in
 * gs_call.reply_trusted whether the caller could have rewritten their reply.
 */
int gs_uvm_releases(nv_u32 cmd);
/* 1 and *n set if c's argument block (req, kind, arg, arg_size) points at one */
int gs_nested(const struct gs_call *c, struct gs_nested *n);
/*
 * 1 and *fd set if c names a file descriptor that RM resolves in the
 * caller's fd table (the NV0000 OS_UNIX export and import controls, whose
 * fd holds exported objects): the glue then sets c->fd_file_id before
 * gs_pre(). io: the nested block, as for gs_pre().
 */
int gs_call_fd(const struct gs_call *c, const struct gs_io *io, nv_s32 *fd);
/* Account for / rewrite the reply of a call GS_PASS sent to the driver; ret: its return */
void gs_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io, int ret);

/*
 * What the glue does for gs_call_run(): whatever touches the caller's
 * memory, the real driver or the glue's own state. ctx is the glue's, the
 * same for the whole call. None of them runs under the instance lock.
 */
struct gs_call_ops {
	/*
	 * Runs the real driver on c->arg, the block as gs_pre() checked it, and
	 * reads its reply back into c->arg. Returns the driver's return (0 or
	 * -errno). Sets *unread when the reply could not be read back (the
	 * caller then gets -EFAULT), and c->reply_lost when the driver ran but
	 * its reply is gone (gs_post() then counts the call as a success).
	 */
	long (*driver)(void *ctx, struct gs_call *c, int *unread);
	/* may be NULL: after gs_post() of a reply that was read back; ret: the driver's */
	void (*after)(void *ctx, struct gs_call *c, long ret);
	/*
	 * May be NULL: the glue's copy of the nested block (gs_nested()) back
	 * to the caller, if the core or the driver wrote to it; 0, or -EFAULT
	 * when the caller's memory cannot take it (the call's status is then
	 * NV_ERR_INVALID_ADDRESS, as RM answers).
	 */
	int (*nested_out)(void *ctx, const struct gs_call *c);
	/* the block back to the caller: 0 or -EFAULT; ret: the driver's, 0 for the core's answer */
	int (*copy_out)(void *ctx, const struct gs_call *c, long ret);
	/* may be NULL: gs_pre() answered the call itself (GS_REPLY or GS_FAIL) */
	void (*answered)(void *ctx, const struct gs_call *c);
	/*
	 * May be NULL: the core is done with the call (gs_pre() answered it, or
	 * gs_post() ran), before the ops above that copy to the caller; once
	 * per call. The kernel module leaves the instance's gate there (gate.h).
	 */
	void (*done)(void *ctx);
};

/*
 * One call, the whole protocol (call.c): gs_pre(); GS_FAIL returns -c->err;
 * GS_REPLY copies the block (status set) back and returns 0; GS_PASS runs
 * ops->driver, then gs_post() (once, whatever the driver did), ops->after,
 * and copies the nested block and the block back. Returns the ioctl's
 * return: 0, the driver's, or -errno. in NULL decides nothing: the driver
 * runs and its reply goes back (the module's passthrough_only).
 */
long gs_call_run(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
		 const struct gs_call_ops *ops, void *ctx);
/* The file died (close, process exit, kill -9): RM frees every client it owned. */
void gs_file_closed(struct gs_inst *in, nv_u64 file_id);

/* Registry walk; cb returns non-zero to stop. Under the core lock: cb must not sleep long. */
int gs_for_each_object(struct gs_inst *in,
		       int (*cb)(void *ctx, const struct gs_object *o), void *ctx);

/*
 * An instance's state as bytes (snapshot.c), for a new core to take over:
 * limits, capability set, flags, charges, counters, the registry with its
 * links, parked and orphaned charges, exports, nvidia-uvm's records and the
 * OS events. The format's layout is at the top of snapshot.c; its version is
 * GS_SNAPSHOT_VERSION, the only place it is defined. The bytes hold kernel
 * state and are never for user space.
 *
 * gs_snapshot_size() and gs_snapshot_write() need an instance with no call
 * between gs_pre() and gs_post() (-EBUSY); write returns the bytes written or
 * -ENOSPC. gs_snapshot_read() fills in, an instance gs_inst_new() made and no
 * call has reached (-EBUSY), and checks everything first: on any refusal in is
 * unchanged. Its refusals: -EBADMSG malformed (magic, lengths, checksum, a
 * count past its cap, an index or link out of range, charges that do not add
 * up), -EPROTONOSUPPORT a format version this core does not read, -ENOEXEC
 * another driver ABI or another build's GPU count, -ENOMEM.
 */
#define GS_SNAPSHOT_VERSION	1
long gs_snapshot_size(struct gs_inst *in);
long gs_snapshot_write(struct gs_inst *in, void *buf, unsigned long len);
int gs_snapshot_read(struct gs_inst *in, const void *buf, unsigned long len);

/*
 * A channel's submissions from its USERD (activity.c). GPGet and GPPut are
 * one 8-byte word (GPGet | GPPut << 32) at GS_USERD_GPGET into the USERD;
 * GS_USERD_SIZE bytes of it must be mapped. A channel that keeps submitting
 * is reported at most every GS_WORK_REPEAT_NS.
 */
#define GS_USERD_GPGET		0x88
#define GS_USERD_SIZE		0x90
#define GS_WORK_REPEAT_NS	10000000ull

struct gs_userd_seen {
	nv_u32 last_put;
	nv_u8 primed;		/* 0: not looked at yet */
	nv_u64 sent_ns;		/* last report; 0: quiet */
};

/*
 * 1 and *at (GPGet's offset into the mapping) if the USERD at ch_off of a
 * memory object lies in a mapping of [map_off, map_off + map_len) of it.
 */
int gs_userd_locate(nv_u64 ch_off, nv_u64 map_off, nv_u64 map_len, nv_u64 *at);
/* 1: report CHANNEL_WORK for this look at the channel's word (now: ns, monotonic) */
int gs_userd_seen(struct gs_userd_seen *s, nv_u64 word, nv_u32 entries, nv_u64 now);
/*
 * The same, with a channel that keeps submitting reported at most every
 * repeat_ns: the user-space build's controller asks for a repeat shorter than
 * its online hold, so a busy online channel never looks quiet between reports.
 */
int gs_userd_seen_every(struct gs_userd_seen *s, nv_u64 word, nv_u32 entries, nv_u64 now,
			nv_u64 repeat_ns);

/* Names for tracing and tools: NULL if unknown. */
const char *gs_escape_name(nv_u32 escape);
const char *gs_class_name(nv_u32 klass);
const char *gs_control_name(nv_u32 cmd);
const char *gs_refusal_name(enum gs_refusal r);

#endif /* GPUSLICE_CORE_H */
