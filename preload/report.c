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
 * workload goes on (sends never block; a failed connect is retried at most once
 * a second). GPUSLICE_DEBUG copies them to stderr.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "preload.h"

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

static void gs_send_line(const char *line, int len)
{
	struct sockaddr_un sa;
	nv_u64 now;

	pthread_mutex_lock(&gs_pl.sock_lock);
	if (gs_pl.sock < 0) {
		now = gs_now_ns();
		if (now < gs_pl.next_try_ns)
			goto out;
		gs_pl.next_try_ns = now + 1000000000ull;
		gs_pl.sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (gs_pl.sock < 0)
			goto out;
		memset(&sa, 0, sizeof(sa));
		sa.sun_family = AF_UNIX;
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", gs_pl.sock_path);
		if (connect(gs_pl.sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			close(gs_pl.sock);
			gs_pl.sock = -1;
			goto out;
		}
	}
	if (send(gs_pl.sock, line, len, MSG_NOSIGNAL | MSG_DONTWAIT) != len &&
	    errno != EAGAIN && errno != EWOULDBLOCK) {
		close(gs_pl.sock);
		gs_pl.sock = -1;
	}
out:
	pthread_mutex_unlock(&gs_pl.sock_lock);
}

void gs_report_event(void *ctx, const struct gs_event *ev)
{
	char line[512];
	int n;

	n = snprintf(line, sizeof(line),
		     "{\"event\":%u,\"name\":\"%s\",\"pid\":%u,\"client\":%u,\"handle\":%u,"
		     "\"parent\":%u,\"class\":%u,\"engine\":%u,\"gpu\":%u,\"obj_kind\":%u,"
		     "\"size\":%llu,\"status\":%u,\"cmd\":%u}\n",
		     ev->type, gs_pl.name, ev->pid, ev->client, ev->handle, ev->parent,
		     ev->klass, ev->engine, ev->gpu, ev->obj_kind,
		     (unsigned long long)ev->size, ev->status, ev->cmd);
	if (n <= 0 || n >= (int)sizeof(line))
		return;
	if (gs_pl.debug)
		fprintf(stderr, "gpuslice: %s", line);
	gs_send_line(line, n);
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
		     "\"ioctls\":%llu,\"refused_quota\":%llu,\"refused_filter\":%llu,\"objects\":%u}\n",
		     gs_pl.name, getpid(), (unsigned long long)st.mem_limit,
		     (unsigned long long)st.mem_used, (unsigned long long)st.mem_peak,
		     (unsigned long long)st.nr_ioctls, (unsigned long long)st.nr_refused_quota,
		     (unsigned long long)st.nr_refused_filter, st.nr_objects);
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
