/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * gpuslice.h - the contract between the gpuslice kernel module and its
 * controller (pyctl/gpuslice/netlink.py mirrors every value below; the test
 * tests/test_uapi.py parses this file and checks that it does).
 *
 * Generic netlink family GPUSLICE_GENL_NAME, version GPUSLICE_GENL_VERSION.
 *
 * Version handshake: GPUSLICE_GENL_VERSION is the version of this contract,
 * raised whenever a command or attribute changes meaning, is added or is
 * removed. The module registers the family with it (CTRL_ATTR_VERSION of
 * CTRL_CMD_GETFAMILY, which gpuctl reads before its first request and refuses
 * to go on when it differs from its own), and refuses every request whose
 * genetlink header carries another version with -EPROTO. Version 1 was the
 * contract before the handshake (no check); 2 adds only the check; 3 adds
 * SAMPLE_US and REPEAT_US; 4 adds CAPS; 5 adds INSTANCE_HANDOVER and its
 * HANDOVER_NS, HANDOVER_DRAIN_NS and SNAPSHOT_BYTES.
 *
 * Every command needs CAP_NET_ADMIN and CAP_SYS_ADMIN in the initial user
 * namespace (-EPERM without), reads and dumps included: replies name host
 * pids and RM handles. Joining GPUSLICE_MCGRP_EVENTS needs CAP_SYS_ADMIN on
 * kernels that have GENL_MCAST_CAP_SYS_ADMIN (upstream 6.7, Debian's 6.1).
 *
 * Commands (all attributes are top-level unless said otherwise):
 *
 *   GPUSLICE_CMD_INSTANCE_NEW
 *       in:  NAME (required), GPU_MASK (required), MEM_LIMIT (required),
 *            GPU_MEM_LIMIT, WEIGHT, SHARE, TIMESLICE_US, UID, GID, MODE,
 *            SAMPLE_US, REPEAT_US and CAPS (as INSTANCE_SET)
 *       Creates /dev/gpuslice/<NAME>/{nvidiactl,nvidia<N>...,nvidia-uvm}.
 *       -EEXIST if NAME exists, -EINVAL on a bad name, mask or limit,
 *       -ENODEV if a GPU in GPU_MASK is not present.
 *   GPUSLICE_CMD_INSTANCE_DEL
 *       in:  NAME. -EBUSY while any of its nodes is open (no draining).
 *   GPUSLICE_CMD_INSTANCE_SET
 *       in:  NAME, any of MEM_LIMIT, GPU_MEM_LIMIT, WEIGHT, SHARE,
 *            TIMESLICE_US, UID, GID, MODE, SAMPLE_US, REPEAT_US, CAPS.
 *       Takes effect for the next call; lowering a limit below what is used
 *       refuses further allocations but frees nothing.
 *       SAMPLE_US and REPEAT_US (both or neither; -EINVAL otherwise, or out
 *       of range) make the module's sampler look at this instance's channels
 *       every SAMPLE_US (GPUSLICE_SAMPLE_US_MIN..MAX; 0: every
 *       userd_sample_ms, as every instance by default) and send its
 *       CHANNEL_WORK at most every REPEAT_US (GPUSLICE_REPEAT_US_MIN..MAX;
 *       0: every 50 ms) while it keeps submitting. A controller asks it of the
 *       instances whose work must preempt others' at once (online ones
 *       beside offline ones); it costs a CPU wake-up per SAMPLE_US.
 *       CAPS (a non-empty subset of GPUSLICE_CAPS_ALL; -EINVAL otherwise)
 *       is the capability set: an RM class or control whose allowlist row
 *       is for none of them is refused as RM refuses one it does not have
 *       (NV_ERR_INVALID_CLASS, NV_ERR_NOT_SUPPORTED). Absent on NEW: all.
 *   GPUSLICE_CMD_INSTANCE_GET   (doit with NAME, or dump; NAME filters a dump)
 *       out: one message per instance with NAME, ID, GPU_MASK, MEM_LIMIT,
 *            MEM_USED, MEM_PEAK, GPU_MEM_LIMIT, GPU_MEM_USED, GPU_MEM_PEAK,
 *            WEIGHT, SHARE, TIMESLICE_US, UID, GID, MODE, SAMPLE_US,
 *            REPEAT_US, CAPS, NR_IOCTLS, NR_REFUSED_QUOTA, NR_REFUSED_FILTER,
 *            NR_EVENTS_SUPPRESSED, the LOCK_* figures of the instance's core
 *            lock (below), and PIDS: one or more nests of PID (at most 4096
 *            each; the list is their concatenation, in increasing order).
 *       The doit's reply holds every pid. In a dump, an instance whose pids
 *       do not fit one message continues in the next ones, which carry NAME,
 *       ID and PIDS only (the next pids, still in increasing order).
 *   GPUSLICE_CMD_OBJECT_GET     (dump, NAME filters)
 *       out: one message per tracked RM object of kind TSG or CHANNEL:
 *            NAME, OBJ_KIND, PID, CLIENT, HANDLE, PARENT, CLASS, ENGINE, GPU.
 *            Channels only once RM scheduled them (their TSG's or their own
 *            GPFIFO_SCHEDULE, or BIND, succeeded): before that RM refuses to
 *            disable them (NV_ERR_INVALID_CHANNEL), so a scheduler has nothing
 *            to gate. CHANNEL_NEW is sent at that moment, not at allocation;
 *            CHANNEL_DEL only for a channel that had its CHANNEL_NEW.
 *   GPUSLICE_CMD_INSTANCE_HANDOVER
 *       in:  NAME. out: NAME, HANDOVER_NS, HANDOVER_DRAIN_NS, SNAPSHOT_BYTES.
 *       Hands the instance's decision state (limits, charges, the objects
 *       it follows, counters) to a fresh decision core while its files stay
 *       open: the calls on the instance's nodes between the core's check and
 *       its record of RM's reply finish, new ones wait, the state is written
 *       and read into the fresh core, which the waiting calls then reach.
 *       HANDOVER_NS is how long new calls were held (from closing to opening
 *       again), HANDOVER_DRAIN_NS the part of it spent waiting for the calls
 *       in flight, SNAPSHOT_BYTES the state's size. -EBUSY when those calls
 *       do not finish within 100 ms; that, -ENOMEM, -EINTR and the fresh
 *       core's refusal of the state (-EBADMSG, -EPROTONOSUPPORT, -ENOEXEC)
 *       leave the instance with its old core, unchanged. -ENOENT without
 *       such an instance.
 *   GPUSLICE_CMD_EVENT          (multicast group GPUSLICE_MCGRP_EVENTS)
 *       out: EVENT (enum gpuslice_event), NAME, and the attributes of the
 *            object (as OBJECT_GET), PID, or SIZE, STATUS, CMD, CLASS and
 *            NR_EVENTS_SUPPRESSED for a refusal. Refusals (ALLOC_REFUSED,
 *            FILTER_REFUSED) are rate-limited per instance, 100/s with a
 *            burst of 100; NR_EVENTS_SUPPRESSED counts those not sent. TSG,
 *            CHANNEL and PROC events are never limited.
 *            CHANNEL_WORK (OBJ_KIND, CLIENT, HANDLE of an announced channel):
 *            work was submitted on it (its USERD's GPPut moved, or GPGet !=
 *            GPPut; kmod/core/activity.c). Sent when a quiet channel submits
 *            and then at most every 10 ms while it keeps submitting: by the
 *            module's sampler (kmod/activity.c, every userd_sample_ms while
 *            the group has a listener; at most one per instance every 50
 *            ms, naming one of its channels that submitted; an instance's
 *            SAMPLE_US and REPEAT_US replace both periods) and by the
 *            user-space build's (preload/userd.c, per channel). The object
 *            attributes other than OBJ_KIND, CLIENT and HANDLE are 0.
 *
 * The instance's core lock (one mutex per instance, taken by every
 * interposed ioctl, twice by a call that reaches the driver, and by these
 * reads): LOCK_ACQUIRED counts its completed holds since the instance was
 * created, LOCK_CONTENDED those that had to wait for it, LOCK_HOLD_NS and
 * LOCK_WAIT_NS sum the time it was held and waited for, LOCK_*_MAX_NS are the
 * longest, and LOCK_*_HIST are log2 histograms of the same: bucket 0 counts
 * 0 ns, bucket i (1..GPUSLICE_LOCK_HIST_BUCKETS-2) counts [2^(i-1), 2^i) ns,
 * the last bucket everything from 2^(GPUSLICE_LOCK_HIST_BUCKETS-2) ns on. An
 * uncontended acquisition waits 0 ns. Each histogram sums to LOCK_ACQUIRED.
 *
 * Video memory is limited per GPU: each GPU of an instance may hold its
 * GPU_MEM_LIMIT entry, or MEM_LIMIT where that entry is 0 (so MEM_LIMIT alone
 * gives every GPU the same limit; an instance of N GPUs may hold N times it).
 * Entries are indexed by RM's device instance (NV0080_ALLOC_PARAMETERS
 * .deviceId), which is the GPU's minor on hosts whose GPUs RM attached in
 * probe order; entries of GPUs outside GPU_MASK must be 0 (-EINVAL). MEM_USED
 * is the sum over the GPUs and MEM_PEAK its peak; video memory under no
 * device the module knows is refused.
 * Pinned system memory is capped at MEM_LIMIT, apart.
 *
 * Sizes are bytes; SHARE is in parts per 10000 (10000 = the whole GPU);
 * WEIGHT is 1..10000; TIMESLICE_US 0 means "leave the driver's default".
 */
#ifndef _UAPI_GPUSLICE_H
#define _UAPI_GPUSLICE_H

#define GPUSLICE_GENL_NAME		"gpuslice"
#define GPUSLICE_GENL_VERSION		5
#define GPUSLICE_MCGRP_EVENTS		"events"

#define GPUSLICE_NAME_MAX		32	/* including the NUL */
#define GPUSLICE_SHARE_FULL		10000
#define GPUSLICE_WEIGHT_MAX		10000
#define GPUSLICE_DEV_DIR		"gpuslice"	/* /dev/gpuslice/<name>/ */
#define GPUSLICE_LOCK_HIST_BUCKETS	32	/* of LOCK_HOLD_HIST and LOCK_WAIT_HIST */
#define GPUSLICE_MAX_GPUS		32	/* bits of GPU_MASK, entries of GPU_MEM_* */
#define GPUSLICE_SAMPLE_US_MIN		50	/* SAMPLE_US other than 0 */
#define GPUSLICE_SAMPLE_US_MAX		1000000
#define GPUSLICE_REPEAT_US_MIN		500	/* REPEAT_US other than 0 */
#define GPUSLICE_REPEAT_US_MAX		10000
#define GPUSLICE_CAP_COMPUTE		0x1	/* CAPS: NVIDIA_DRIVER_CAPABILITIES' names */
#define GPUSLICE_CAP_UTILITY		0x2
#define GPUSLICE_CAP_GRAPHICS		0x4
#define GPUSLICE_CAP_VIDEO		0x8
#define GPUSLICE_CAPS_ALL		0xf

enum gpuslice_cmd {
	GPUSLICE_CMD_UNSPEC,
	GPUSLICE_CMD_INSTANCE_NEW,
	GPUSLICE_CMD_INSTANCE_DEL,
	GPUSLICE_CMD_INSTANCE_SET,
	GPUSLICE_CMD_INSTANCE_GET,
	GPUSLICE_CMD_OBJECT_GET,
	GPUSLICE_CMD_EVENT,
	GPUSLICE_CMD_INSTANCE_HANDOVER,
	__GPUSLICE_CMD_MAX,
};
#define GPUSLICE_CMD_MAX (__GPUSLICE_CMD_MAX - 1)

enum gpuslice_attr {
	GPUSLICE_A_UNSPEC,
	GPUSLICE_A_NAME,		/* NUL-terminated string, [a-zA-Z0-9_.-]{1,31} */
	GPUSLICE_A_ID,			/* u32 */
	GPUSLICE_A_GPU_MASK,		/* u32, bit N = /dev/nvidiaN */
	GPUSLICE_A_MEM_LIMIT,		/* u64 bytes, > 0 */
	GPUSLICE_A_MEM_USED,		/* u64 bytes */
	GPUSLICE_A_MEM_PEAK,		/* u64 bytes */
	GPUSLICE_A_WEIGHT,		/* u32 1..GPUSLICE_WEIGHT_MAX */
	GPUSLICE_A_SHARE,		/* u32 0..GPUSLICE_SHARE_FULL */
	GPUSLICE_A_TIMESLICE_US,	/* u64 */
	GPUSLICE_A_UID,			/* u32 owner of the nodes */
	GPUSLICE_A_GID,			/* u32 */
	GPUSLICE_A_MODE,		/* u32 permission bits of the nodes, <= 0777 */
	GPUSLICE_A_NR_IOCTLS,		/* u64 */
	GPUSLICE_A_NR_REFUSED_QUOTA,	/* u64 */
	GPUSLICE_A_NR_REFUSED_FILTER,	/* u64 */
	GPUSLICE_A_PIDS,		/* nest of GPUSLICE_A_PID */
	GPUSLICE_A_PID,			/* u32 */
	GPUSLICE_A_OBJ_KIND,		/* u32 enum gpuslice_obj_kind */
	GPUSLICE_A_CLIENT,		/* u32 RM client handle */
	GPUSLICE_A_HANDLE,		/* u32 RM object handle */
	GPUSLICE_A_PARENT,		/* u32 RM parent handle */
	GPUSLICE_A_CLASS,		/* u32 RM class */
	GPUSLICE_A_ENGINE,		/* u32 engine type from the alloc params */
	GPUSLICE_A_GPU,			/* u32 GPU minor */
	GPUSLICE_A_EVENT,		/* u32 enum gpuslice_event */
	GPUSLICE_A_SIZE,		/* u64 bytes of a refused allocation */
	GPUSLICE_A_STATUS,		/* u32 NV status returned to the caller */
	GPUSLICE_A_CMD,			/* u32 RM control cmd or escape of a refusal */
	GPUSLICE_A_PAD,
	GPUSLICE_A_NR_EVENTS_SUPPRESSED,	/* u64 refusal events not sent (rate limit) */
	GPUSLICE_A_LOCK_ACQUIRED,	/* u64 holds of the instance's core lock */
	GPUSLICE_A_LOCK_CONTENDED,	/* u64 of them that waited for it */
	GPUSLICE_A_LOCK_HOLD_NS,	/* u64 ns held, in all */
	GPUSLICE_A_LOCK_HOLD_MAX_NS,	/* u64 longest hold */
	GPUSLICE_A_LOCK_HOLD_HIST,	/* u64[GPUSLICE_LOCK_HIST_BUCKETS] holds, log2 ns */
	GPUSLICE_A_LOCK_WAIT_NS,	/* u64 ns waited, in all */
	GPUSLICE_A_LOCK_WAIT_MAX_NS,	/* u64 longest wait */
	GPUSLICE_A_LOCK_WAIT_HIST,	/* u64[GPUSLICE_LOCK_HIST_BUCKETS] waits, log2 ns */
	GPUSLICE_A_GPU_MEM_LIMIT,	/* u64[GPUSLICE_MAX_GPUS] bytes per GPU, 0: MEM_LIMIT */
	GPUSLICE_A_GPU_MEM_USED,	/* u64[GPUSLICE_MAX_GPUS] bytes per GPU */
	GPUSLICE_A_GPU_MEM_PEAK,	/* u64[GPUSLICE_MAX_GPUS] bytes per GPU */
	GPUSLICE_A_SAMPLE_US,		/* u32 the sampler's period for the instance, 0: default */
	GPUSLICE_A_REPEAT_US,		/* u32 its CHANNEL_WORK at most this often, 0: default */
	GPUSLICE_A_CAPS,		/* u32 GPUSLICE_CAP_* the instance may use; absent on NEW: all */
	GPUSLICE_A_HANDOVER_NS,		/* u64 ns new calls were held by a handover */
	GPUSLICE_A_HANDOVER_DRAIN_NS,	/* u64 ns of it waiting for the calls in flight */
	GPUSLICE_A_SNAPSHOT_BYTES,	/* u64 bytes of the state handed over */
	__GPUSLICE_A_MAX,
};
#define GPUSLICE_A_MAX (__GPUSLICE_A_MAX - 1)

enum gpuslice_obj_kind {
	GPUSLICE_OBJ_CLIENT,
	GPUSLICE_OBJ_TSG,
	GPUSLICE_OBJ_CHANNEL,
	GPUSLICE_OBJ_MEMORY,
	GPUSLICE_OBJ_OTHER,
};

enum gpuslice_event {
	GPUSLICE_EV_TSG_NEW = 1,
	GPUSLICE_EV_TSG_DEL,
	GPUSLICE_EV_CHANNEL_NEW,
	GPUSLICE_EV_CHANNEL_DEL,
	GPUSLICE_EV_PROC_ATTACH,
	GPUSLICE_EV_PROC_DETACH,
	GPUSLICE_EV_ALLOC_REFUSED,
	GPUSLICE_EV_FILTER_REFUSED,
	GPUSLICE_EV_CHANNEL_WORK,
};

#endif /* _UAPI_GPUSLICE_H */
