// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * shim.c - a flat C interface to the decision core for tests/test_core*.py
 * (ctypes). "User memory" is this process's memory: a parameter pointer is a
 * real address; addresses below 64 KiB and the range set by t_set_bad() read
 * as -EFAULT, like copy_from_user on an unmapped page.
 */
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include "core.h"

#define T_MAX_EVENTS 4096

static struct gs_event t_events_buf[T_MAX_EVENTS];
static int t_nevents;
static pthread_mutex_t t_ev_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t t_bad_lo, t_bad_hi;
static uint32_t t_ns_pid;	/* gs_call.ns_pid of the next calls */
static uint64_t t_fd_file_id;	/* gs_call.fd_file_id of the next calls */
static uint8_t t_fd_sibling;	/* gs_call.fd_sibling of the next calls */

static void t_event(void *ctx, const struct gs_event *ev)
{
	pthread_mutex_lock(&t_ev_lock);
	if (t_nevents < T_MAX_EVENTS)
		t_events_buf[t_nevents++] = *ev;
	pthread_mutex_unlock(&t_ev_lock);
}

static int t_bad(uint64_t a, uint32_t len)
{
	if (a < 65536)
		return 1;
	return t_bad_hi && a + len > t_bad_lo && a < t_bad_hi;
}

static int t_read(void *ctx, nv_u64 uaddr, void *dst, nv_u32 len)
{
	if (t_bad(uaddr, len))
		return -EFAULT;
	memcpy(dst, (const void *)(uintptr_t)uaddr, len);
	return 0;
}

static int t_write(void *ctx, nv_u64 uaddr, const void *src, nv_u32 len)
{
	if (t_bad(uaddr, len))
		return -EFAULT;
	memcpy((void *)(uintptr_t)uaddr, src, len);
	return 0;
}

static const struct gs_io t_io = { .read = t_read, .write = t_write };

void t_set_ns_pid(uint32_t ns_pid)
{
	t_ns_pid = ns_pid;
}

void t_set_fd_file_id(uint64_t id, uint8_t sibling)
{
	t_fd_file_id = id;
	t_fd_sibling = sibling;	/* and for RM_DUP_OBJECT, gs_call.src_sibling */
}

/* gs_call_fd() of a control block: the fd it names, or -1000 */
int32_t t_call_fd(uint32_t req, void *arg, uint32_t arg_size)
{
	struct gs_call c = { .kind = GS_FILE_CTL, .req = req, .arg = arg, .arg_size = arg_size };
	nv_s32 fd;

	return gs_call_fd(&c, &t_io, &fd) ? fd : -1000;
}

void t_set_bad(uint64_t lo, uint64_t hi)
{
	t_bad_lo = lo;
	t_bad_hi = hi;
}

struct gs_inst *t_new(uint64_t limit)
{
	struct gs_inst_ops ops = { .event = t_event };

	return gs_inst_new(limit, &ops);
}

void t_free(struct gs_inst *in)
{
	gs_inst_free(in);
}

void t_set_limit(struct gs_inst *in, uint64_t limit)
{
	gs_inst_set_limit(in, limit);
}

void t_set_gpus(struct gs_inst *in, uint32_t mask)
{
	gs_inst_set_gpus(in, mask);
}

void t_set_gpu_ids(struct gs_inst *in, const uint32_t *ids)
{
	gs_inst_set_gpu_ids(in, ids);
}

void t_set_gpu_limits(struct gs_inst *in, const uint64_t *limits)
{
	gs_inst_set_gpu_limits(in, limits);
}

/* out: limit[GPUSLICE_MAX_GPUS], used[...], peak[...] */
void t_gpu_mem(struct gs_inst *in, uint64_t *out)
{
	gs_inst_gpu_mem(in, out, out + GPUSLICE_MAX_GPUS, out + 2 * GPUSLICE_MAX_GPUS);
}

void t_set_flags(struct gs_inst *in, uint32_t flags)
{
	gs_inst_set_flags(in, flags);
}

void t_set_caps(struct gs_inst *in, uint32_t caps)
{
	gs_inst_set_caps(in, caps);
}

/* gs_call.reply_trusted of the calls to come (an nvidia-uvm reply the caller could not rewrite) */
static uint8_t t_reply_trusted = 1;

void t_set_reply_trusted(uint8_t v)
{
	t_reply_trusted = v;
}

/* returns a call to hand to t_post (or t_done); out[0..3] = verdict, status, err, refusal */
struct gs_call *t_pre(struct gs_inst *in, int kind, uint32_t minor, uint32_t req, void *arg,
		      uint32_t arg_size, uint64_t file_id, uint32_t pid, int32_t *out)
{
	struct gs_call *c = calloc(1, sizeof(*c));

	c->kind = kind;
	c->gpu_minor = minor;
	c->req = req;
	c->arg = arg;
	c->arg_size = arg_size;
	c->file_id = file_id;
	c->pid = pid;
	c->ns_pid = t_ns_pid;
	c->fd_file_id = t_fd_file_id;
	c->fd_sibling = t_fd_sibling;
	c->src_sibling = t_fd_sibling;
	c->reply_trusted = t_reply_trusted;
	out[0] = gs_pre(in, c, &t_io);
	out[1] = (int32_t)c->status;
	out[2] = c->err;
	out[3] = c->refusal;
	return c;
}

/* the driver answered (ret) and wrote its reply into arg: account and free the call */
uint32_t t_post(struct gs_inst *in, struct gs_call *c, int ret)
{
	uint32_t status;

	gs_post(in, c, &t_io, ret);
	status = c->status;
	free(c);
	return status;
}

void t_done(struct gs_call *c)
{
	free(c);
}

uint32_t t_uvm_arg_size(uint32_t cmd)
{
	return gs_uvm_arg_size(cmd);
}

uint32_t t_uvm_status_off(uint32_t cmd)
{
	return gs_uvm_status_off(cmd);
}

void t_file_closed(struct gs_inst *in, uint64_t file_id)
{
	gs_file_closed(in, file_id);
}

/* limit, used, peak, ioctls, refused quota, refused filter, objects, longest hash chain */
void t_stats(struct gs_inst *in, uint64_t *out)
{
	struct gs_stats st;

	gs_inst_stats(in, &st);
	out[0] = st.mem_limit;
	out[1] = st.mem_used;
	out[2] = st.mem_peak;
	out[3] = st.nr_ioctls;
	out[4] = st.nr_refused_quota;
	out[5] = st.nr_refused_filter;
	out[6] = st.nr_objects;
	out[7] = st.hash_max_chain;
}

/* the instance lock's figures: acquired, contended, hold_ns, wait_ns, hold_max_ns,
 * wait_max_ns, then the hold and the wait histograms (GPUSLICE_LOCK_HIST_BUCKETS each) */
void t_lock_stats(struct gs_inst *in, uint64_t *out)
{
	struct gs_stats st;

	gs_inst_stats(in, &st);
	out[0] = st.lock.acquired;
	out[1] = st.lock.contended;
	out[2] = st.lock.hold_ns;
	out[3] = st.lock.wait_ns;
	out[4] = st.lock.hold_max_ns;
	out[5] = st.lock.wait_max_ns;
	memcpy(out + 6, st.lock.hold_hist, sizeof(st.lock.hold_hist));
	memcpy(out + 6 + GPUSLICE_LOCK_HIST_BUCKETS, st.lock.wait_hist, sizeof(st.lock.wait_hist));
}

/* set while t_hold_lock() holds the instance lock */
volatile int t_holding;

static int t_hold_cb(void *ctx, const struct gs_object *o)
{
	t_holding = 1;
	usleep(*(unsigned int *)ctx);
	t_holding = 0;
	return 1;
}

/* holds the instance lock for us microseconds (the instance needs one object) */
void t_hold_lock(struct gs_inst *in, unsigned int us)
{
	gs_for_each_object(in, t_hold_cb, &us);
}

/* gs_lock_bucket() of ns */
int t_lock_bucket(uint64_t ns)
{
	return gs_lock_bucket(ns);
}

int t_pids(struct gs_inst *in, uint32_t *pids, int max)
{
	return gs_inst_pids(in, pids, max);
}

struct t_dump {
	uint64_t *out;
	int n, max;
};

static int t_dump_cb(void *ctx, const struct gs_object *o)
{
	struct t_dump *d = ctx;
	uint64_t *r;

	if (d->n >= d->max)
		return 1;
	r = d->out + 14 * d->n++;
	r[0] = o->obj_kind;
	r[1] = o->file_id;
	r[2] = o->pid;
	r[3] = o->gpu;
	r[4] = o->client;
	r[5] = o->handle;
	r[6] = o->parent;
	r[7] = o->klass;
	r[8] = o->engine;
	r[9] = o->size;
	r[10] = gs_object_gateable(o);
	r[11] = o->userd_mem;
	r[12] = o->userd_off;
	r[13] = o->gp_entries;
	return 0;
}

/* 14 u64 per object: kind, file, pid, gpu, client, handle, parent, class, engine, size, gateable,
   userd_mem, userd_off, gp_entries */
int t_objects(struct gs_inst *in, uint64_t *out, int max)
{
	struct t_dump d = { out, 0, max };

	gs_for_each_object(in, t_dump_cb, &d);
	return d.n;
}

/* 12 u64 per event: type, kind, pid, gpu, client, handle, parent, class, engine, size, status, cmd */
int t_events(uint64_t *out, int max)
{
	int i, n;

	pthread_mutex_lock(&t_ev_lock);
	n = t_nevents < max ? t_nevents : max;
	for (i = 0; i < n; i++) {
		const struct gs_event *e = &t_events_buf[i];
		uint64_t *r = out + 12 * i;

		r[0] = e->type;
		r[1] = e->obj_kind;
		r[2] = e->pid;
		r[3] = e->gpu;
		r[4] = e->client;
		r[5] = e->handle;
		r[6] = e->parent;
		r[7] = e->klass;
		r[8] = e->engine;
		r[9] = e->size;
		r[10] = e->status;
		r[11] = e->cmd;
	}
	t_nevents = 0;
	pthread_mutex_unlock(&t_ev_lock);
	return n;
}

const char *t_escape_name(uint32_t e)
{
	return gs_escape_name(e);
}

const char *t_class_name(uint32_t k)
{
	return gs_class_name(k);
}

const char *t_refusal_name(int r)
{
	return gs_refusal_name(r);
}

/* kmod/core/activity.c */
int t_userd_locate(uint64_t ch_off, uint64_t map_off, uint64_t map_len, uint64_t *at)
{
	return gs_userd_locate(ch_off, map_off, map_len, at);
}

int t_userd_seen(struct gs_userd_seen *s, uint64_t word, uint32_t entries, uint64_t now)
{
	return gs_userd_seen(s, word, entries, now);
}

size_t t_userd_seen_size(void)
{
	return sizeof(struct gs_userd_seen);
}

/* the glue's fault path: the driver ran, its reply could not be read back */
void t_set_reply_lost(struct gs_call *c)
{
	c->reply_lost = 1;
}

/*
 * gs_call_run() with a glue of the test's (kmod/core/call.c). The block is the
 * caller's memory itself, so copying it out is a no-op that can be told to
 * fail. log: the ops in the order they ran (D driver, A after, N nested_out,
 * C copy_out, R answered), each at most T_RUN_LOG.
 */
#define T_RUN_LOG	16

typedef int32_t (*t_driver_fn)(void *arg, uint32_t size);

struct t_run {
	t_driver_fn driver;	/* plays RM on the block; NULL: returns ret */
	int32_t ret;		/* the driver's return without a driver */
	int32_t unread;		/* the reply cannot be read back */
	int32_t lost;		/* ... and gs_call.reply_lost */
	int32_t nested;		/* 0: no nested_out op, else what it returns (1: 0) */
	int32_t copy_ret;	/* what copy_out returns */
	int64_t after_ret;	/* the ret after and copy_out were given */
	int64_t copy_ret_seen;
	int32_t n;
	char log[T_RUN_LOG + 1];
	int32_t done;		/* times the done op ran */
	int32_t done_at;	/* how many ops of log had run then */
};

static void t_run_log(struct t_run *r, char op)
{
	if (r->n < T_RUN_LOG)
		r->log[r->n++] = op;
}

static long t_run_driver(void *ctx, struct gs_call *c, int *unread)
{
	struct t_run *r = ctx;
	long ret = r->ret;

	t_run_log(r, 'D');
	if (r->driver)
		ret = r->driver(c->arg, c->arg_size);
	*unread = r->unread;
	c->reply_lost = r->lost;
	return ret;
}

static void t_run_after(void *ctx, struct gs_call *c, long ret)
{
	struct t_run *r = ctx;

	t_run_log(r, 'A');
	r->after_ret = ret;
}

static int t_run_nested(void *ctx, const struct gs_call *c)
{
	struct t_run *r = ctx;

	t_run_log(r, 'N');
	return r->nested == 1 ? 0 : r->nested;
}

static int t_run_copy(void *ctx, const struct gs_call *c, long ret)
{
	struct t_run *r = ctx;

	t_run_log(r, 'C');
	r->copy_ret_seen = ret;
	return r->copy_ret;
}

static void t_run_answered(void *ctx, const struct gs_call *c)
{
	t_run_log(ctx, 'R');
}

static void t_run_done(void *ctx)
{
	struct t_run *r = ctx;

	r->done++;
	r->done_at = r->n;
}

/* in NULL: nothing decided. out[0..2] = status, err, refusal; returns gs_call_run()'s return */
int64_t t_run(struct gs_inst *in, int kind, uint32_t minor, uint32_t req, void *arg,
	      uint32_t arg_size, uint64_t file_id, uint32_t pid, struct t_run *r, int32_t *out)
{
	struct gs_call_ops ops = {
		.driver = t_run_driver,
		.after = t_run_after,
		.nested_out = r->nested ? t_run_nested : NULL,
		.copy_out = t_run_copy,
		.answered = t_run_answered,
		.done = t_run_done,
	};
	struct gs_call c = {
		.kind = kind,
		.gpu_minor = minor,
		.req = req,
		.arg = arg,
		.arg_size = arg_size,
		.file_id = file_id,
		.pid = pid,
		.ns_pid = t_ns_pid,
		.fd_file_id = t_fd_file_id,
		.fd_sibling = t_fd_sibling,
		.src_sibling = t_fd_sibling,
		.reply_trusted = t_reply_trusted,
	};
	long ret;

	if (kind == GS_FILE_UVM)
		c.escape = req;
	else
		c.escape = NV_IOC_NR(req);
	ret = gs_call_run(in, &c, &t_io, &ops, r);
	r->log[r->n] = '\0';
	out[0] = (int32_t)c.status;
	out[1] = c.err;
	out[2] = c.refusal;
	return ret;
}

size_t t_run_size(void)
{
	return sizeof(struct t_run);
}
