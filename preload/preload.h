/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * preload.h - what preload.c and report.c share.
 */
#ifndef GPUSLICE_PRELOAD_H
#define GPUSLICE_PRELOAD_H

#include <pthread.h>
#include <sys/types.h>
#include "core.h"

#define GS_EXPORT	__attribute__((visibility("default")))

struct gs_preload {
	struct gs_inst *inst;
	char name[32];
	char sock_path[108];
	char stats_path[256];
	nv_u64 limit;
	nv_u64 gpu_limit[GPUSLICE_MAX_GPUS];	/* 0: limit */
	int debug;
	pthread_mutex_t sock_lock;
	int sock;		/* -1: not connected */
	pid_t owner;		/* the process the state belongs to (not a vfork child) */
	nv_u64 next_try_ns;	/* no connect or liveness check before this (__atomic outside sock_lock) */
	int reporter;		/* the reporter thread was started (__atomic) */
	nv_u64 sample_ns;	/* GPUSLICE_SAMPLE_MS / _US; 0: USERD is never read */
	nv_u64 ctl_sample_ns;	/* the controller's {"sample_us":N}; 0: none (__atomic) */
	nv_u64 ctl_repeat_ns;	/* its "repeat_us"; 0: GS_WORK_REPEAT_NS (__atomic) */
	nv_u64 ctl_timeslice_us;	/* its "timeslice_us"; 0: none, GPUSLICE_TIMESLICE_US (__atomic) */
	int ctl_timeslice_new;	/* a timeslice_us to apply to the live TSGs (__atomic) */
	char ctl_line[96];	/* a controller's line being read (under sock_lock) */
	int ctl_len;		/* bytes in ctl_line; -1: the rest of a too long line */
	nv_u64 proof_file;	/* the RM file sent last as {"proof_file":1} on sock, 0: none (under sock_lock) */
	nv_u64 timeslice_us;	/* GPUSLICE_TIMESLICE_US; 0: RM's default */
	int interleave;		/* GPUSLICE_INTERLEAVE: NVA06C_CTRL_INTERLEAVE_LEVEL_*; -1: RM's default */
	nv_u32 caps;		/* GPUSLICE_CAPS: the capability set, GS_CAP_* */
};

extern struct gs_preload gs_pl;

int gs_parse_size(const char *s, nv_u64 *out);
int gs_parse_limits(const char *s, nv_u64 *dflt, nv_u64 *gpu);
void gs_report_event(void *ctx, const struct gs_event *ev);
/* from the ioctl path: connect / check the controller's socket, at most once a second */
void gs_report_poll(void);
void gs_report_refusal(const struct gs_call *c);
void gs_report_stats(void);
/* how often the sampler looks now (ns; 0: never): GPUSLICE_SAMPLE_*, or the controller's if shorter */
nv_u64 gs_sample_period(void);
/* the timeslice of this process's TSGs (us): the controller's, else GPUSLICE_TIMESLICE_US; 0: RM's */
nv_u64 gs_timeslice_us(void);
/* the reporter thread: a timeslice the controller sent, on every live TSG of the process */
void gs_apply_timeslice_all(void);
/* the fd of the RM call this thread is in, -1 outside one */
int gs_event_fd(void);
/* an fd of ours on the open file file_id (RM ties clients to it), or -1 */
int gs_fd_of_file(nv_u64 file_id);
/* the open file of fd if it is an NVIDIA one, else 0 */
nv_u64 gs_fd_file(int fd);
/* copy from the process's memory: -EFAULT for a bad pointer, never a crash */
int gs_copy_in(void *dst, const void *src, size_t len);

/* userd.c: channels' pending work, seen in their USERD */
void gs_userd_ioctl(const struct gs_call *c, const void *arg, int ret);
int gs_userd_sample(nv_u64 now, struct gs_event *evs, int max);
int gs_userd_channels(void);
void gs_userd_atfork_child(void);

/* siblings.c: exports between processes of one instance */
void gs_sibling_exported(int fd, nv_u64 file_id);
int gs_sibling_closing(struct gs_inst *in, nv_u64 file_id);
void gs_sibling_reap(struct gs_inst *in);
int gs_sibling_file(int fd);
void gs_sibling_shared(nv_handle client);
int gs_sibling_client(nv_handle client);
void gs_sibling_exit(void);
void gs_sibling_atfork_child(void);

#endif /* GPUSLICE_PRELOAD_H */
