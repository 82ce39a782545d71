// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * stress.c - the decision core under sanitizers (tests/test_core_stress.py builds it
 * with -fsanitize=address,undefined and again with -fsanitize=thread).
 *
 *   stress fuzz N       N random argument blocks (random escapes, sizes, bytes and
 *                       parameter pointers, a third of them unreadable)
 *   stress bench N      prints ns per call (no sanitizer: build with -O2)
 *   stress threads N    8 threads, each its own client and file, N random
 *                       alloc / free / dup / close steps against a mock RM; checks
 *                       that the limit is never passed and that used returns to 0
 * Prints "ok ..." and exits 0, or prints what broke and exits 1.
 */
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core.h"

#define LIMIT (1ull << 30)
#define NTHREADS 8

/* "user memory" for the fuzzer: only this buffer and the threads' stacks are mapped */
static unsigned char params[1100];
static int fuzzing;

static int bad(nv_u64 uaddr, nv_u32 len)
{
	nv_u64 lo = (nv_u64)(uintptr_t)params;

	if (fuzzing)
		return uaddr < lo || uaddr > lo + sizeof(params) || len > lo + sizeof(params) - uaddr;
	return uaddr < 65536;
}

static int io_read(void *ctx, nv_u64 uaddr, void *dst, nv_u32 len)
{
	if (bad(uaddr, len))
		return -EFAULT;
	memcpy(dst, (const void *)(uintptr_t)uaddr, len);
	return 0;
}

static int io_write(void *ctx, nv_u64 uaddr, const void *src, nv_u32 len)
{
	if (bad(uaddr, len))
		return -EFAULT;
	memcpy((void *)(uintptr_t)uaddr, src, len);
	return 0;
}

static const struct gs_io io = { .read = io_read, .write = io_write };

static nv_u32 ioc(nv_u32 type, nv_u32 nr, nv_u32 size)
{
	return 3u << 30 | size << 16 | type << 8 | nr;	/* _IOWR */
}

static nv_u32 rnd(nv_u64 *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return (nv_u32)*s;
}

static int fuzz(long n)
{
	static const nv_u32 nrs[] = { 0x27, 0x29, 0x2a, 0x2b, 0x34, 0x35, 0x4e, 0x4f, 0x5e,
				      0xc8, 0xc9, 0xce, 0xcf, 0xd3, 0xf0 };
	struct gs_inst *in = gs_inst_new(LIMIT, NULL);
	nv_u64 s = 88172645463325252ull;
	struct gs_stats st;
	long i;

	fuzzing = 1;
	for (i = 0; i < n; i++) {
		struct nvos64_params root = { .h_object_new = 0xc1d00001, .h_class = NV01_ROOT_CLIENT };
		unsigned char arg[300];
		struct gs_call c;
		nv_u32 size = rnd(&s) % sizeof(arg), nr, j;

		nr = rnd(&s) % 10 ? nrs[rnd(&s) % (sizeof(nrs) / sizeof(nrs[0]))] : rnd(&s) & 0xff;
		for (j = 0; j < size; j++)
			arg[j] = (unsigned char)rnd(&s);
		for (j = 0; j < sizeof(params); j++)
			params[j] = (unsigned char)rnd(&s);
		if (size >= 24 && rnd(&s) % 3) {
			nv_u64 p = rnd(&s) % 3 ? (nv_u64)(uintptr_t)params : rnd(&s) % 4096;

			memcpy(arg + 16, &p, sizeof(p));
		}
		if (size >= 48 && rnd(&s) % 2) {
			nv_u32 cls = rnd(&s) % 2 ? NV01_MEMORY_LOCAL_USER : NV01_ROOT_CLIENT;
			nv_handle client = 0xc1d00001;

			memcpy(arg + 12, &cls, sizeof(cls));
			if (rnd(&s) % 2)	/* our client, to get past the foreign check */
				memcpy(arg, &client, sizeof(client));
		}
		if (i % 1000 == 0) {	/* (re)create the client the blocks name */
			memset(&c, 0, sizeof(c));
			c.req = ioc(NV_IOCTL_MAGIC, NV_ESC_RM_ALLOC, sizeof(root));
			c.arg = &root;
			c.arg_size = sizeof(root);
			c.file_id = 1;
			if (gs_pre(in, &c, &io) == GS_PASS)
				gs_post(in, &c, &io, 0);
		}
		memset(&c, 0, sizeof(c));
		c.kind = rnd(&s) % 3;
		c.req = ioc(rnd(&s) % 20 ? NV_IOCTL_MAGIC : rnd(&s) & 0xff, nr, size);
		c.arg = size ? arg : NULL;
		c.arg_size = size;
		c.file_id = 1 + rnd(&s) % 3;
		c.pid = 1;
		if (gs_pre(in, &c, &io) == GS_PASS) {
			/* a mock RM that writes garbage back */
			for (j = 0; j < size; j++)
				if (rnd(&s) % 8 == 0)
					arg[j] = (unsigned char)rnd(&s);
			gs_post(in, &c, &io, rnd(&s) % 10 ? 0 : -5);
		}
		if (rnd(&s) % 100 == 0)
			gs_file_closed(in, 1 + rnd(&s) % 3);
	}
	gs_file_closed(in, 1);
	gs_file_closed(in, 2);
	gs_file_closed(in, 3);
	gs_inst_stats(in, &st);
	gs_inst_free(in);
	if (st.mem_used || st.nr_objects) {
		printf("fuzz: used %llu objects %u after closing every file\n",
		       (unsigned long long)st.mem_used, st.nr_objects);
		return 1;
	}
	printf("ok fuzz %ld calls, %llu refused by the filter, %llu by quota\n", n,
	       (unsigned long long)st.nr_refused_filter, (unsigned long long)st.nr_refused_quota);
	return 0;
}

struct worker {
	struct gs_inst *in;
	long steps;
	int id;
	nv_u64 live;		/* bytes this thread holds, as RM says */
	nv_u64 refused;
	nv_u64 file;		/* the file its client lives on at the end */
	int bad;
};

static enum gs_verdict call(struct worker *w, nv_u32 nr, void *arg, nv_u32 size, nv_u64 file,
			    nv_u32 status_off)
{
	struct gs_call c;
	enum gs_verdict v;
	nv_u32 ok = NV_OK;

	memset(&c, 0, sizeof(c));
	c.kind = GS_FILE_CTL;
	c.req = ioc(NV_IOCTL_MAGIC, nr, size);
	c.arg = arg;
	c.arg_size = size;
	c.file_id = file;
	c.pid = 1000 + w->id;
	v = gs_pre(w->in, &c, &io);
	if (v == GS_PASS) {
		memcpy((char *)arg + status_off, &ok, sizeof(ok));	/* RM: done */
		gs_post(w->in, &c, &io, 0);
	}
	return v;
}

/*
 * What RM takes, and reports, for video memory of the default page size (not
 * written back here): 2 MiB pages from 2 MiB up, 64 KiB ones below (quota.c
 * gs_pma_size()).
 */
static nv_u64 rm_takes(nv_u64 size)
{
	nv_u64 unit = size >= (2ull << 20) ? 2ull << 20 : 64ull << 10;

	return (size + unit - 1) & ~(unit - 1);
}

static void *work(void *p)
{
	struct worker *w = p;
	nv_u64 s = 0x9e3779b97f4a7c15ull * (w->id + 1), file = 100 + w->id;
	nv_handle client = 0xc1d00000 + w->id, next = 0x100;
	nv_handle handles[64];
	nv_u64 sizes[64];
	int n = 0;
	long i;

	for (i = 0; i < w->steps; i++) {
		nv_u32 op = rnd(&s) % 100;

		if (i == 0 || op < 2) {
			struct nvos64_params a = { .h_object_new = client, .h_class = NV01_ROOT_CLIENT };

			if (i) {	/* the file dies: RM forgets the client and its memory */
				gs_file_closed(w->in, file);
				file += NTHREADS;
				w->live = 0;
				n = 0;
			}
			call(w, NV_ESC_RM_ALLOC, &a, sizeof(a), file, 40);
			a = (struct nvos64_params){ .h_root = client, .h_object_parent = client,
						   .h_object_new = 0x5c000001, .h_class = NV01_DEVICE_0 };
			call(w, NV_ESC_RM_ALLOC, &a, sizeof(a), file, 40);
		} else if (op < 60 && n < 64) {
			struct nv_memory_allocation_params mp;
			struct nvos64_params a = { .h_root = client, .h_object_parent = 0x5c000001,
						   .h_object_new = ++next, .h_class = NV01_MEMORY_LOCAL_USER };

			memset(&mp, 0, sizeof(mp));
			mp.size = (nv_u64)(1 + rnd(&s) % 64) << 20;
			a.p_alloc_parms = (nv_u64)(uintptr_t)&mp;
			if (call(w, NV_ESC_RM_ALLOC, &a, sizeof(a), file, 40) == GS_PASS) {
				handles[n] = next;
				sizes[n] = rm_takes(mp.size);
				w->live += sizes[n++];
			} else if (a.status == NV_ERR_NO_MEMORY) {
				w->refused++;
			} else {
				w->bad = 1;
			}
		} else if (n) {
			int k = rnd(&s) % n;
			struct nvos00_params f = { .h_root = client, .h_object_parent = 0x5c000001,
						   .h_object_old = handles[k] };

			/* forget first: the sum of live never exceeds what the core counts */
			w->live -= sizes[k];
			call(w, NV_ESC_RM_FREE, &f, sizeof(f), file, 12);
			handles[k] = handles[--n];
			sizes[k] = sizes[n];
		}
	}
	w->file = file;
	return NULL;
}

static int threads(long steps)
{
	struct gs_inst *in = gs_inst_new(LIMIT, NULL);
	struct worker w[NTHREADS];
	pthread_t th[NTHREADS];
	nv_u64 live = 0, refused = 0;
	struct gs_stats st;
	int i, bad = 0;

	for (i = 0; i < NTHREADS; i++) {
		w[i] = (struct worker){ .in = in, .steps = steps, .id = i };
		pthread_create(&th[i], NULL, work, &w[i]);
	}
	for (i = 0; i < NTHREADS; i++) {
		pthread_join(th[i], NULL);
		live += w[i].live;
		refused += w[i].refused;
		bad |= w[i].bad;
	}
	gs_inst_stats(in, &st);
	if (bad || st.mem_used != live || st.mem_peak > LIMIT || !refused) {
		printf("threads: bad %d used %llu live %llu peak %llu refused %llu\n", bad,
		       (unsigned long long)st.mem_used, (unsigned long long)live,
		       (unsigned long long)st.mem_peak, (unsigned long long)refused);
		return 1;
	}
	for (i = 0; i < NTHREADS; i++)
		gs_file_closed(in, w[i].file);
	gs_inst_stats(in, &st);
	gs_inst_free(in);
	if (st.mem_used || st.nr_objects) {
		printf("threads: used %llu objects %u after every file closed\n",
		       (unsigned long long)st.mem_used, st.nr_objects);
		return 1;
	}
	printf("ok threads %d x %ld steps, peak %llu of %llu, %llu refused\n", NTHREADS, steps,
	       (unsigned long long)st.mem_peak, (unsigned long long)LIMIT,
	       (unsigned long long)refused);
	return 0;
}

static nv_u64 now_ns(void)
{
	return gs_now_ns();
}

/* ns per call: an allowed control, and alloc + free of memory with `live` objects around */
static int bench(long rounds)
{
	static const long lives[] = { 100, 1000, 10000 };
	unsigned int k;

	for (k = 0; k < sizeof(lives) / sizeof(lives[0]); k++) {
		struct gs_inst *in = gs_inst_new(~0ull, NULL);
		struct worker w = { .in = in, .id = 0 };
		struct nvos64_params a = { .h_object_new = 0xc1d00001, .h_class = NV01_ROOT_CLIENT };
		struct nv_memory_allocation_params mp;
		struct nvos54_params ctl;
		nv_u64 t0, t_ctl, t_mem;
		long i;

		call(&w, NV_ESC_RM_ALLOC, &a, sizeof(a), 1, 40);
		a = (struct nvos64_params){ .h_root = 0xc1d00001, .h_object_parent = 0xc1d00001,
					    .h_object_new = 0x5c000001, .h_class = NV01_DEVICE_0 };
		call(&w, NV_ESC_RM_ALLOC, &a, sizeof(a), 1, 40);
		memset(&mp, 0, sizeof(mp));
		mp.size = 2 << 20;
		for (i = 0; i < lives[k]; i++) {
			a = (struct nvos64_params){ .h_root = 0xc1d00001, .h_object_parent = 0x5c000001,
						    .h_object_new = 0x10000 + i,
						    .h_class = NV01_MEMORY_LOCAL_USER,
						    .p_alloc_parms = (nv_u64)(uintptr_t)&mp };
			call(&w, NV_ESC_RM_ALLOC, &a, sizeof(a), 1, 40);
		}
		t0 = now_ns();
		for (i = 0; i < rounds; i++) {
			ctl = (struct nvos54_params){ .h_client = 0xc1d00001, .h_object = 0x5c000001,
						      .cmd = 0x00800280 };
			call(&w, NV_ESC_RM_CONTROL, &ctl, sizeof(ctl), 1, 28);
		}
		t_ctl = now_ns() - t0;
		t0 = now_ns();
		for (i = 0; i < rounds; i++) {
			struct nvos00_params f = { .h_root = 0xc1d00001, .h_object_parent = 0x5c000001,
						   .h_object_old = 0x900000 };

			a = (struct nvos64_params){ .h_root = 0xc1d00001, .h_object_parent = 0x5c000001,
						    .h_object_new = 0x900000,
						    .h_class = NV01_MEMORY_LOCAL_USER,
						    .p_alloc_parms = (nv_u64)(uintptr_t)&mp };
			call(&w, NV_ESC_RM_ALLOC, &a, sizeof(a), 1, 40);
			call(&w, NV_ESC_RM_FREE, &f, sizeof(f), 1, 12);
		}
		t_mem = now_ns() - t0;
		printf("live objects %6ld: allowed control %6.0f ns (pre+post), memory alloc+free %8.0f ns\n",
		       lives[k] + 2, (double)t_ctl / rounds, (double)t_mem / rounds);
		gs_inst_free(in);
	}
	return 0;
}

int main(int argc, char **argv)
{
	long n = argc > 2 ? atol(argv[2]) : 10000;

	if (argc > 1 && !strcmp(argv[1], "fuzz"))
		return fuzz(n);
	if (argc > 1 && !strcmp(argv[1], "threads"))
		return threads(n);
	if (argc > 1 && !strcmp(argv[1], "bench"))
		return bench(n);
	fprintf(stderr, "usage: stress fuzz|threads N\n");
	return 2;
}
