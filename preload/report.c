// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * report.c - the preload library's events, as newline-delimited JSON on the
 * controller's unix socket, with the fields of the netlink OBJECT_GET / EVENT
 * attributes (kmod/uapi/gpuslice.h), numbers as the enums there:
 *
 *   {"event":3,"name":"a","pid":12,"client":3251634253,"handle":1543503900,
 *    "parent":1543503899,"class":51311,"engine":1,"gpu":0,"obj_kind":2,
 *    "size":0,"status":0,"cmd":0}
 *
 * No socket, or a controller that stops reading: the events are dropped and the
 * workload goes on (sends never block). GPUSLICE_DEBUG copies them to stderr.
 *
 * A controller started or restarted after the workload still learns its
 * objects: every connect first sends the live TSGs and channels as TSG_NEW /
 * CHANNEL_NEW (a snapshot of the registry), then the events that follow.
 * A CUDA process in steady state makes no ioctls (it submits through its
 * mapped channels), so once a process has a TSG or a channel a thread of ours
 * (gs_reporter()) checks every GS_TICK_NS that the controller is still there
 * and connects to a new one: a restarted controller has every live channel
 * back within GS_TICK_NS plus its own start (a connect nobody answered is
 * tried again a tick later). Without that thread (it could not be made) the
 * ioctl path and the events do the same, as often.
 * The same thread reads the channels' USERD every GPUSLICE_SAMPLE_MS and sends
 * CHANNEL_WORK for those that submitted (userd.c).
 * The controller writes back one kind of line, {"sample_us":N},
 * {"sample_us":N,"repeat_us":M} or {"sample_us":N,"repeat_us":M,"timeslice_us":T}:
 * look at least every N us (50-1000000; 0: as the process was configured),
 * report a channel that keeps submitting every M us (50-10000; 0 or absent:
 * GS_WORK_REPEAT_NS), and give every TSG of the process the hardware timeslice
 * T us (100-1000000; 0 or absent: as they are), as the module does for an
 * instance's TIMESLICE_US. It asks the first two of the processes of an online
 * instance on a GPU with offline ones, whose work it must see at once to
 * preempt the offline work, and must keep seeing within its online hold, and
 * the timeslice of every instance it gates (docs/policies.md); the line is
 * read at each liveness check (every GS_TICK_NS), anything else is ignored,
 * and a new connection starts from the process's own sampling (a timeslice
 * stays as it was set).
 * A send that fails or is short closes the connection: the controller forgets
 * that connection's processes, and the next connect's snapshot gives them
 * back, so a lost event is never a lasting error.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../uapi/gpuslice.h"	/* via -I../kmod/core */
#include "preload.h"

#define GS_SNDBUF	(1 << 20)	/* bytes of events in flight to the controller */
#define GS_RETRY_NS	1000000000ull	/* after a failed send, and from the ioctl path */
#define GS_TICK_NS	50000000ull	/* the reporter thread's period, and connect retries */

int gs_parse_size(const char *s, nv_u64 *out)
{
	nv_u64 v = 0, mul = 1;
	const char *p = s;

	if (*p < '0' || *p > '9')
		return -1;
	while (*p >= '0' && *p <= '9') {
		if (v > (~0ull - 9) / 10)
			return -1;
		v = v * 10 + (nv_u64)(*p++ - '0');
	}
	switch (*p | 0x20) {
	case 'k':
		mul = 1ull << 10;
		break;
	case 'm':
		mul = 1ull << 20;
		break;
	case 'g':
		mul = 1ull << 30;
		break;
	case 't':
		mul = 1ull << 40;
		break;
	}
	if (mul != 1) {
		p++;
		if ((*p | 0x20) == 'i')
			p++;
		if ((*p | 0x20) == 'b')
			p++;
	} else if ((*p | 0x20) == 'b') {
		p++;
	}
	if (*p || v > ~0ull / mul)
		return -1;
	*out = v * mul;
	return 0;
}

/*
 * GPUSLICE_MEM_LIMIT: one size for every GPU, or sizes per GPU, "0=8G,1=4G"
 * (RM's device instance, as uapi GPU_MEM_LIMIT: a GPU not named has no
 * limit). -1 on anything else; *dflt and gpu[] are then unchanged.
 */
int gs_parse_limits(const char *s, nv_u64 *dflt, nv_u64 *gpu)
{
	nv_u64 lim[GPUSLICE_MAX_GPUS] = { 0 };
	char buf[512], *tok, *save = NULL;

	if (!strchr(s, '=')) {
		if (gs_parse_size(s, dflt))
			return -1;
		memset(gpu, 0, sizeof(lim));
		return 0;
	}
	if (strlen(s) >= sizeof(buf))
		return -1;
	strcpy(buf, s);
	for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(tok, '='), *end;
		unsigned long idx;
		nv_u64 size;

		if (!eq || eq == tok)
			return -1;
		*eq = 0;
		idx = strtoul(tok, &end, 10);
		if (*end || tok[0] < '0' || tok[0] > '9' || idx >= GPUSLICE_MAX_GPUS || lim[idx])
			return -1;
		if (gs_parse_size(eq + 1, &size) || !size)
			return -1;
		lim[idx] = size;
	}
	*dflt = ~0ull;
	memcpy(gpu, lim, sizeof(lim));
	return 0;
}

/* proof: the file of the channel's client went before, as {"proof_file":1} (gs_prove_locked) */
static int gs_format_event(char *line, int size, const struct gs_event *ev, int proof)
{
	int n;

	n = snprintf(line, size,
		     "{\"event\":%u,\"name\":\"%s\",\"pid\":%u,\"client\":%u,\"handle\":%u,"
		     "\"parent\":%u,\"class\":%u,\"engine\":%u,\"gpu\":%u,\"obj_kind\":%u,"
		     "\"size\":%llu,\"status\":%u,\"cmd\":%u%s}\n",
		     ev->type, gs_pl.name, ev->pid, ev->client, ev->handle, ev->parent,
		     ev->klass, ev->engine, ev->gpu, ev->obj_kind,
		     (unsigned long long)ev->size, ev->status, ev->cmd, proof ? ",\"proof\":1" : "");
	return n > 0 && n < size ? n : 0;
}

/*
 * After a send of ours failed, the next connect waits GS_RETRY_NS: the
 * controller must see this connection end first. After the controller went
 * away (pause 0), a new one may be listening already.
 */
static void gs_sock_close_locked(nv_u64 now, nv_u64 pause)
{
	close(gs_pl.sock);
	gs_pl.sock = -1;
	gs_pl.proof_file = 0;
	gs_pl.ctl_len = 0;
	__atomic_store_n(&gs_pl.ctl_sample_ns, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&gs_pl.ctl_repeat_ns, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&gs_pl.next_try_ns, now + pause, __ATOMIC_RELAXED);
}

/*
 * A send of n bytes (-1: errno) failed: the connection goes. A controller that
 * closed its end (stopped or killed: EPIPE, ECONNRESET) is gone, and a
 * restarted one may be listening already: connect again at the next look, as
 * when the liveness check finds it gone. Else (a full buffer: the controller
 * stopped reading) it must see this connection end first: GS_RETRY_NS.
 */
static void gs_send_failed_locked(ssize_t n)
{
	int gone = n < 0 && (errno == EPIPE || errno == ECONNRESET || errno == ENOTCONN);

	gs_sock_close_locked(gs_now_ns(), gone ? 0 : GS_RETRY_NS);
}

/* all of it or the connection goes: half a line would garble the stream */
static int gs_send_locked(const char *buf, size_t len)
{
	ssize_t n;

	if (gs_pl.sock < 0)
		return -1;
	n = send(gs_pl.sock, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
	if (n == (ssize_t)len)
		return 0;
	gs_send_failed_locked(n);
	return -1;
}

/*
 * Before the CHANNEL_NEW lines of a channel whose client was made through RM
 * file file_id (open as fd here), the line {"proof_file":1} goes in a message
 * of its own with that file (SCM_RIGHTS), once per file and connection: the
 * controller asks RM through the file whether each channel is ours
 * (pyctl/gpuslice/sched/rm.py owns_channel), so no process can make it gate
 * another's channel, and the lines say "proof":1 only after it. 1: the file
 * went (or had gone); 0: it could not (no fd: the line goes unproven, and the
 * controller does not take the channel). The in-flight files of a user are
 * limited (ETOOMANYREFS), which another tenant of that user can exhaust: then
 * the line goes unproven rather than the connection.
 */
static int gs_prove_locked(nv_u64 file_id, int fd)
{
	static const char line[] = "{\"proof_file\":1}\n";
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = (void *)line, .iov_len = sizeof(line) - 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	struct cmsghdr *cm;
	ssize_t n;

	if (gs_pl.sock < 0 || !file_id)
		return 0;
	if (file_id == gs_pl.proof_file)
		return 1;
	if (fd < 0)
		return 0;
	memset(&u, 0, sizeof(u));
	mh.msg_control = u.buf;
	mh.msg_controllen = sizeof(u.buf);
	cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	n = sendmsg(gs_pl.sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	if (n == (ssize_t)iov.iov_len) {
		gs_pl.proof_file = file_id;
		return 1;
	}
	if (n < 0 && (errno == EBADF || errno == ETOOMANYREFS))
		return 0;
	gs_send_failed_locked(n);
	return 0;
}

/* the live TSGs and channels, TSGs first, as NEW events */
struct gs_snap {
	char *buf;
	size_t len, cap;
	nv_u32 kind;
	int failed;
};

static int gs_snap_cb(void *ctx, const struct gs_object *o)
{
	struct gs_snap *sn = ctx;
	struct gs_event ev;
	char line[512];
	int n;

	if (o->obj_kind != sn->kind || !gs_object_gateable(o))
		return 0;
	memset(&ev, 0, sizeof(ev));
	ev.type = o->obj_kind == GPUSLICE_OBJ_TSG ? GPUSLICE_EV_TSG_NEW : GPUSLICE_EV_CHANNEL_NEW;
	ev.obj_kind = o->obj_kind;
	ev.pid = o->pid;
	ev.gpu = o->gpu;
	ev.client = o->client;
	ev.handle = o->handle;
	ev.parent = o->parent;
	ev.klass = o->klass;
	ev.engine = o->engine;
	if (ev.type == GPUSLICE_EV_CHANNEL_NEW && o->file_id != gs_pl.proof_file) {
		/* the lines before go first, then the file of these */
		if (sn->len && gs_send_locked(sn->buf, sn->len))
			return 1;
		sn->len = 0;
		gs_prove_locked(o->file_id, gs_fd_of_file(o->file_id));
		if (gs_pl.sock < 0)
			return 1;
	}
	n = gs_format_event(line, sizeof(line), &ev,
			    ev.type == GPUSLICE_EV_CHANNEL_NEW && o->file_id == gs_pl.proof_file);
	if (!n)
		return 0;
	if (sn->len + n > sn->cap) {
		size_t cap = sn->cap ? sn->cap * 2 : 8192;
		char *b = realloc(sn->buf, cap);

		if (!b) {
			sn->failed = 1;
			return 1;
		}
		sn->buf = b;
		sn->cap = cap;
	}
	memcpy(sn->buf + sn->len, line, n);
	sn->len += n;
	return 0;
}

/* under sock_lock: connect, then the snapshot before anything else */
static void gs_connect_locked(nv_u64 now)
{
	struct gs_snap sn = { 0 };
	struct sockaddr_un sa;

	__atomic_store_n(&gs_pl.next_try_ns, now + GS_RETRY_NS, __ATOMIC_RELAXED);
	gs_pl.sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (gs_pl.sock < 0)
		return;
	/*
	 * Room for bursts (a refusal per thread of a process that hits its
	 * limit) while the controller is briefly busy: events are dropped
	 * only when this is full. The kernel caps it at wmem_max.
	 */
	setsockopt(gs_pl.sock, SOL_SOCKET, SO_SNDBUF, &(int){ GS_SNDBUF }, sizeof(int));
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", gs_pl.sock_path);
	if (connect(gs_pl.sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		/*
		 * Nobody listens (yet): a restarted controller is listening within
		 * its start, so try again at the reporter's next tick rather than in
		 * a second (a failed connect to a unix socket costs microseconds).
		 */
		close(gs_pl.sock);
		gs_pl.sock = -1;
		__atomic_store_n(&gs_pl.next_try_ns, now + GS_TICK_NS, __ATOMIC_RELAXED);
		return;
	}
	/* the core lock is taken under sock_lock, never the other way round */
	gs_pl.proof_file = 0;
	sn.kind = GPUSLICE_OBJ_TSG;
	gs_for_each_object(gs_pl.inst, gs_snap_cb, &sn);
	sn.kind = GPUSLICE_OBJ_CHANNEL;
	if (!sn.failed && gs_pl.sock >= 0)
		gs_for_each_object(gs_pl.inst, gs_snap_cb, &sn);
	if (sn.failed)
		gs_sock_close_locked(now, GS_RETRY_NS);
	else if (sn.len)
		gs_send_locked(sn.buf, sn.len);
	free(sn.buf);
	if (gs_pl.debug && gs_pl.sock >= 0)
		fprintf(stderr, "gpuslice: connected to %s, live objects sent\n", gs_pl.sock_path);
}

nv_u64 gs_sample_period(void)
{
	nv_u64 ctl = __atomic_load_n(&gs_pl.ctl_sample_ns, __ATOMIC_RELAXED);

	if (!gs_pl.sample_ns)
		return 0;	/* the operator turned the sampler off */
	return ctl && ctl < gs_pl.sample_ns ? ctl : gs_pl.sample_ns;
}

/* the digits at *i (at least one), at most max: 0 and the value, with *i past them; or -1 */
static int gs_ctl_number(const char *s, int n, int *i, nv_u64 max, nv_u64 *out)
{
	nv_u64 v = 0;
	int start = *i;

	for (; *i < n && s[*i] >= '0' && s[*i] <= '9'; (*i)++) {
		v = v * 10 + (nv_u64)(s[*i] - '0');
		if (v > max)
			return -1;
	}
	if (*i == start)
		return -1;
	*out = v;
	return 0;
}

/*
 * One line from the controller: {"sample_us":N}, {"sample_us":N,"repeat_us":M}
 * or {"sample_us":N,"repeat_us":M,"timeslice_us":T} (T 0: leave the TSGs as
 * they are, 100-1000000: their hardware timeslice), else nothing.
 */
static void gs_ctl_line(const char *s, int n)
{
	static const char key[] = "{\"sample_us\":", key2[] = ",\"repeat_us\":",
			  key3[] = ",\"timeslice_us\":";
	int i = sizeof(key) - 1, i2 = sizeof(key2) - 1, i3 = sizeof(key3) - 1;
	nv_u64 us, rep = 0, ts = 0;

	if (n < i || memcmp(s, key, i) || gs_ctl_number(s, n, &i, 1000000, &us))
		return;
	if (n - i >= i2 && !memcmp(s + i, key2, i2)) {
		i += i2;
		if (gs_ctl_number(s, n, &i, 10000, &rep) || (rep && rep < 50))
			return;
		if (n - i >= i3 && !memcmp(s + i, key3, i3)) {
			i += i3;
			if (gs_ctl_number(s, n, &i, 1000000, &ts) || (ts && ts < 100))
				return;
		}
	}
	if (i != n - 1 || s[i] != '}' || (us && us < 50))
		return;
	__atomic_store_n(&gs_pl.ctl_sample_ns, us * 1000ull, __ATOMIC_RELAXED);
	__atomic_store_n(&gs_pl.ctl_repeat_ns, rep * 1000ull, __ATOMIC_RELAXED);
	if (ts && __atomic_exchange_n(&gs_pl.ctl_timeslice_us, ts, __ATOMIC_RELAXED) != ts)
		__atomic_store_n(&gs_pl.ctl_timeslice_new, 1, __ATOMIC_RELEASE);
	if (gs_pl.debug)
		fprintf(stderr, "gpuslice: sampling every %llu us (controller: %llu, repeat %llu)\n",
			(unsigned long long)gs_sample_period() / 1000, (unsigned long long)us,
			(unsigned long long)rep);
}

/*
 * Has the controller closed its end (EOF or an error)? What it wrote
 * meanwhile is taken in, a few reads at most: lines of up to
 * sizeof(ctl_line) bytes, a longer one dropped whole.
 */
static int gs_peer_gone_locked(void)
{
	char b[256];
	int r, i;

	for (r = 0; r < 4; r++) {
		ssize_t n = recv(gs_pl.sock, b, sizeof(b), MSG_DONTWAIT);

		if (n == 0)
			return 1;
		if (n < 0)
			return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
		for (i = 0; i < n; i++) {
			if (b[i] == '\n') {
				if (gs_pl.ctl_len > 0)
					gs_ctl_line(gs_pl.ctl_line, gs_pl.ctl_len);
				gs_pl.ctl_len = 0;
			} else if (gs_pl.ctl_len >= 0 && gs_pl.ctl_len < (int)sizeof(gs_pl.ctl_line)) {
				gs_pl.ctl_line[gs_pl.ctl_len++] = b[i];
			} else {
				gs_pl.ctl_len = -1;
			}
		}
	}
	return 0;
}

/* under sock_lock: drop a connection whose controller went away, then (re)connect */
static void gs_check_locked(nv_u64 now)
{
	if (gs_pl.sock >= 0 && gs_peer_gone_locked())
		gs_sock_close_locked(now, 0);
	if (gs_pl.sock < 0 && now >= gs_pl.next_try_ns)
		gs_connect_locked(now);
}

void gs_report_poll(void)
{
	nv_u64 now;

	if (!gs_pl.sock_path[0])
		return;
	now = gs_now_ns();
	if (now < __atomic_load_n(&gs_pl.next_try_ns, __ATOMIC_RELAXED))
		return;
	if (pthread_mutex_trylock(&gs_pl.sock_lock))
		return;		/* another thread is at it */
	if (now >= gs_pl.next_try_ns) {
		gs_check_locked(now);
		if (now >= gs_pl.next_try_ns)
			__atomic_store_n(&gs_pl.next_try_ns, now + GS_RETRY_NS, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&gs_pl.sock_lock);
}

static void gs_sleep_ns(nv_u64 ns)
{
	struct timespec ts = { .tv_sec = ns / 1000000000ull, .tv_nsec = ns % 1000000000ull };

	nanosleep(&ts, NULL);
}

/* CHANNEL_WORK for the channels that submitted since the last look (userd.c) */
static void gs_send_work(nv_u64 now)
{
	struct gs_event evs[32];
	char buf[32 * 512];
	int i, n, len = 0;

	n = gs_userd_sample(now, evs, 32);
	for (i = 0; i < n; i++) {
		evs[i].pid = gs_pl.owner;
		len += gs_format_event(buf + len, sizeof(buf) - len, &evs[i], 0);
	}
	if (!len)
		return;
	pthread_mutex_lock(&gs_pl.sock_lock);
	gs_send_locked(buf, len);
	pthread_mutex_unlock(&gs_pl.sock_lock);
}

/*
 * Every GS_TICK_NS: is the controller there (else connect to a new one), and
 * what did it say; every gs_sample_period() in between: which channels
 * submitted work.
 */
static void *gs_reporter(void *arg)
{
	nv_u64 now, period, last = gs_pl.sample_ns, next_check = 0;

	for (;;) {
		period = gs_sample_period();
		if (period != last && gs_pl.debug)
			fprintf(stderr, "gpuslice: the sampler looks every %llu us\n",
				(unsigned long long)period / 1000);
		last = period;
		gs_sleep_ns(period && period < GS_TICK_NS ? period : GS_TICK_NS);
		now = gs_now_ns();
		/* a connection that just went (gs_send_failed_locked) is tried again at once */
		if (now >= next_check ||
		    (__atomic_load_n(&gs_pl.sock, __ATOMIC_RELAXED) < 0 &&
		     now >= __atomic_load_n(&gs_pl.next_try_ns, __ATOMIC_RELAXED))) {
			next_check = now + GS_TICK_NS;
			pthread_mutex_lock(&gs_pl.sock_lock);
			gs_check_locked(now);
			pthread_mutex_unlock(&gs_pl.sock_lock);
			gs_apply_timeslice_all();	/* what the controller just said, outside sock_lock */
		}
		if (period)	/* 0 only where the operator turned it off: no request changes that */
			gs_send_work(now);
	}
	return arg;
}

/*
 * Started with the process's first TSG or channel (a process that never
 * makes one, a shell in the container, gets no thread), with every signal
 * blocked so that none of the process's signals is delivered to it.
 */
static void gs_reporter_start(void)
{
	sigset_t all, old;
	pthread_attr_t attr;
	pthread_t t;

	if (__atomic_exchange_n(&gs_pl.reporter, 1, __ATOMIC_ACQ_REL))
		return;
	if (pthread_attr_init(&attr))
		return;
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&attr, 64 << 10);
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	if (!pthread_create(&t, &attr, gs_reporter, NULL))
		pthread_setname_np(t, "gpuslice-report");
	else if (gs_pl.debug)
		fprintf(stderr, "gpuslice: no reporter thread: a restarted controller hears of this process at its next ioctl\n");
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	pthread_attr_destroy(&attr);
}

/* ev with the file of the RM call this thread is in, for a CHANNEL_NEW (gs_prove_locked) */
static void gs_send_event(const struct gs_event *ev)
{
	int fd = ev->type == GPUSLICE_EV_CHANNEL_NEW ? gs_event_fd() : -1;
	char line[512];
	int n, proof = 0;
	nv_u64 now;

	pthread_mutex_lock(&gs_pl.sock_lock);
	if (gs_pl.sock < 0) {
		now = gs_now_ns();
		if (now >= gs_pl.next_try_ns)
			gs_connect_locked(now);	/* the snapshot already shows this event */
	}
	if (fd >= 0)
		proof = gs_prove_locked(gs_fd_file(fd), fd);
	n = gs_format_event(line, sizeof(line), ev, proof);
	if (n && gs_pl.debug)
		fprintf(stderr, "gpuslice: %s", line);
	if (n)
		gs_send_locked(line, n);
	pthread_mutex_unlock(&gs_pl.sock_lock);
}

void gs_report_event(void *ctx, const struct gs_event *ev)
{
	gs_send_event(ev);
	if ((ev->type == GPUSLICE_EV_TSG_NEW || ev->type == GPUSLICE_EV_CHANNEL_NEW) &&
	    gs_pl.sock_path[0])
		gs_reporter_start();
}

void gs_report_refusal(const struct gs_call *c)
{
	const char *esc, *cls;

	if (!gs_pl.debug)
		return;
	esc = gs_escape_name(c->escape);
	if (c->escape == NV_ESC_RM_ALLOC)
		cls = c->what ? gs_class_name(c->what) : NULL;
	else
		cls = gs_control_name(c->what);
	fprintf(stderr, "gpuslice: refused %s (%s) escape 0x%x %s what 0x%x %s status 0x%x errno %d\n",
		gs_refusal_name(c->refusal), gs_pl.name, c->escape, esc ? esc : "?", c->what,
		cls ? cls : "", c->status, c->err);
}

void gs_report_stats(void)
{
	struct gs_stats st;
	char line[512];
	int n, fd;

	gs_inst_stats(gs_pl.inst, &st);
	n = snprintf(line, sizeof(line),
		     "{\"name\":\"%s\",\"pid\":%d,\"limit\":%llu,\"used\":%llu,\"peak\":%llu,"
		     "\"ioctls\":%llu,\"refused_quota\":%llu,\"refused_filter\":%llu,\"objects\":%u,"
		     "\"lock_acquired\":%llu,\"lock_contended\":%llu,\"lock_hold_max_ns\":%llu,"
		     "\"lock_wait_max_ns\":%llu}\n",
		     gs_pl.name, getpid(), (unsigned long long)st.mem_limit,
		     (unsigned long long)st.mem_used, (unsigned long long)st.mem_peak,
		     (unsigned long long)st.nr_ioctls, (unsigned long long)st.nr_refused_quota,
		     (unsigned long long)st.nr_refused_filter, st.nr_objects,
		     (unsigned long long)st.lock.acquired, (unsigned long long)st.lock.contended,
		     (unsigned long long)st.lock.hold_max_ns, (unsigned long long)st.lock.wait_max_ns);
	if (n <= 0 || n >= (int)sizeof(line))
		return;
	if (gs_pl.debug)
		fprintf(stderr, "gpuslice: stats %s", line);
	if (!gs_pl.stats_path[0])
		return;
	fd = open(gs_pl.stats_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	if (write(fd, line, n) != n)
		fprintf(stderr, "gpuslice: short write to %s\n", gs_pl.stats_path);
	close(fd);
}
