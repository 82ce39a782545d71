// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * preload_client.c - issues RM calls the way libcuda does, on the fake device
 * files of mockrm.c, under LD_PRELOAD="libgpuslice.so libmockrm.so". Prints
 * "key value" lines for tests/test_preload.py.
 *
 *   preload_client DIR         (DIR holds files named nvidiactl and nvidia0)
 *   preload_client DIR serve   a CUDA-like context (device 0, a TSG, two channels),
 *                              "ready", then cheap controls until stdin closes;
 *                              each line "chan" on stdin adds a channel ("chan_done"),
 *                              each "tsg" a TSG ("tsg_done")
 *   preload_client DIR userd   a channel whose USERD is a memory object mapped
 *                              the way CUDA maps it (RM_MAP_MEMORY with an fd of
 *                              nvidia0, then mmap of that fd), then phases that
 *                              write its GPGet/GPPut as a GPU's PBDMA and a
 *                              submitting process would; "phase NAME t_ns" lines
 *   preload_client DIR userd N the same after N other mappings of RM memory
 *   preload_client DIR export SOCK   NCCL's cuMem P2P sharing: 64 MiB exported
 *                              into DIR/fifo/nvidiactl (a file epoll can watch,
 *                              as the driver's), its fd sent over the unix socket
 *                              SOCK (listening), the fd closed; then a share
 *                              policy on it (legacy CUDA IPC) and its client and
 *                              handle sent; exits when the peer hangs up
 *   preload_client DIR exportlost    64 MiB exported into DIR/fifo/nvidiactl, the
 *                              file kept alive in flight on a socketpair (as while
 *                              a peer has not received it yet), the exported fd and
 *                              the handle closed ("lost_free_kib_sent F"); then
 *                              /dev/null dup2()ed over fds 512-1023 (where the
 *                              library keeps its epoll set), as an application
 *                              that closes fds it does not own does; after the
 *                              library's next look, "lost_free_kib_after F"
 *   preload_client DIR import SOCK   connects to SOCK, duplicates the memory from
 *                              the exporter's client ("dup_status S"), imports
 *                              from the fd it received: "import_status S",
 *                              "import_type T", "import_again S"
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nvrm_abi.h"

#define REQ(nr, type) _IOWR(NV_IOCTL_MAGIC, nr, type)
#define DEV 0x5c000001u
#define SUB 0x5c000002u
#define MiB (1ull << 20)

static int ctl;
static nv_handle client;
static _Atomic nv_u32 next_handle = 0x5c001000u;

static nv_u32 rm_alloc(nv_handle root, nv_handle parent, nv_handle h, nv_u32 klass, void *params,
		       int *ret)
{
	struct nvos64_params p = {
		.h_root = root, .h_object_parent = parent, .h_object_new = h, .h_class = klass,
		.p_alloc_parms = (nv_u64)(uintptr_t)params,
	};

	*ret = ioctl(ctl, REQ(NV_ESC_RM_ALLOC, struct nvos64_params), &p);
	if (klass == NV01_ROOT_CLIENT)
		client = p.h_object_new;
	return p.status;
}

static nv_u32 mem_alloc(nv_u64 size, nv_handle *h)
{
	struct nv_memory_allocation_params mp;
	int ret;

	memset(&mp, 0, sizeof(mp));
	mp.size = size;
	*h = atomic_fetch_add(&next_handle, 1);
	return rm_alloc(client, DEV, *h, NV01_MEMORY_LOCAL_USER, &mp, &ret);
}

static nv_u32 rm_free(nv_handle h)
{
	struct nvos00_params p = { client, DEV, h, 0 };

	ioctl(ctl, REQ(NV_ESC_RM_FREE, struct nvos00_params), &p);
	return p.status;
}

static nv_u32 control(nv_handle c, nv_handle obj, nv_u32 cmd, void *params, nv_u32 size)
{
	struct nvos54_params p = {
		.h_client = c, .h_object = obj, .cmd = cmd,
		.params = (nv_u64)(uintptr_t)params, .params_size = size,
	};

	ioctl(ctl, REQ(NV_ESC_RM_CONTROL, struct nvos54_params), &p);
	return p.status;
}

/* NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, bEnable: the TSG's channels become gateable */
static nv_u32 schedule(nv_handle tsg)
{
	struct nva06c_ctrl_gpfifo_schedule_params sp = { .b_enable = 1 };

	return control(client, tsg, NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, &sp, sizeof(sp));
}

static void fb_info(nv_u32 *total_kib, nv_u32 *free_kib)
{
	struct nv2080_ctrl_fb_get_info_v2_params fp;

	memset(&fp, 0, sizeof(fp));
	fp.fb_info_list_size = 2;
	fp.fb_info_list[0].index = NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE;
	fp.fb_info_list[1].index = NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE;
	control(client, SUB, NV2080_CTRL_CMD_FB_GET_INFO_V2, &fp, sizeof(fp));
	*total_kib = fp.fb_info_list[0].data;
	*free_kib = fp.fb_info_list[1].data;
}

static _Atomic nv_u64 live_bytes, max_live, thread_ok, thread_refused;

static void *worker(void *unused)
{
	nv_handle hs[64];
	int n = 0, i, round;

	for (round = 0; round < 50; round++) {
		while (n < 64) {
			nv_u32 st = mem_alloc(64 * MiB, &hs[n]);
			nv_u64 now, m;

			if (st == NV_ERR_NO_MEMORY) {
				thread_refused++;
				break;
			}
			n++;
			thread_ok++;
			now = atomic_fetch_add(&live_bytes, 64 * MiB) + 64 * MiB;
			m = atomic_load(&max_live);
			while (now > m && !atomic_compare_exchange_weak(&max_live, &m, now))
				;
		}
		for (i = 0; i < n; i++) {
			/* forget before freeing: live_bytes never exceeds what the core counts */
			atomic_fetch_sub(&live_bytes, 64 * MiB);
			rm_free(hs[i]);
		}
		n = 0;
	}
	return NULL;
}

/*
 * A context that lives until stdin closes, for a controller that comes and
 * goes. quiet: no ioctl while it waits, like a CUDA process in steady state
 * (it submits through its mapped channels); else one every 20 ms.
 */
static int serve(int quiet)
{
	struct nv0080_alloc_params dp;
	struct nv_channel_group_alloc_params tp = { .engine_type = 1 };
	struct nv_channel_alloc_params_head cp;
	nv_handle ch = 0x5c000031, tsg_h = 0x5c000040;
	nv_u32 total, free_kib;
	char line[64];
	int ret;

	memset(&dp, 0, sizeof(dp));
	memset(&cp, 0, sizeof(cp));
	rm_alloc(0, 0, 0, NV01_ROOT_CLIENT, NULL, &ret);
	rm_alloc(client, client, DEV, NV01_DEVICE_0, &dp, &ret);
	rm_alloc(client, DEV, SUB, NV20_SUBDEVICE_0, NULL, &ret);
	rm_alloc(client, DEV, 0x5c000030, KEPLER_CHANNEL_GROUP_A, &tp, &ret);
	{
		/* what CUDA asks for at every context (the traces) */
		struct nva06c_ctrl_timeslice_params ts = { .timeslice_us = 2048 };

		control(client, 0x5c000030, NVA06C_CTRL_CMD_SET_TIMESLICE, &ts, sizeof(ts));
	}
	rm_alloc(client, 0x5c000030, ch++, HOPPER_CHANNEL_GPFIFO_A, &cp, &ret);
	rm_alloc(client, 0x5c000030, ch++, HOPPER_CHANNEL_GPFIFO_A, &cp, &ret);
	schedule(0x5c000030);
	printf("ready 1\n");
	fflush(stdout);
	for (;;) {
		struct pollfd pfd = { .fd = 0, .events = POLLIN };

		if (!quiet)
			fb_info(&total, &free_kib);	/* the ioctl path retries the controller */
		if (poll(&pfd, 1, quiet ? -1 : 20) <= 0)
			continue;
		if (!fgets(line, sizeof(line), stdin))
			break;
		if (!strncmp(line, "chan", 4)) {
			rm_alloc(client, 0x5c000030, ch++, HOPPER_CHANNEL_GPFIFO_A, &cp, &ret);
			printf("chan_done 0x%x\n", ch - 1);
			fflush(stdout);
		}
		if (!strncmp(line, "tsg", 3)) {
			rm_alloc(client, DEV, tsg_h, KEPLER_CHANNEL_GROUP_A, &tp, &ret);
			printf("tsg_done 0x%x\n", tsg_h++);
			fflush(stdout);
		}
	}
	close(ctl);
	return 0;
}

static nv_u64 now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (nv_u64)ts.tv_sec * 1000000000ull + (nv_u64)ts.tv_nsec;
}

static void phase(const char *name)
{
	printf("phase %s %llu\n", name, (unsigned long long)now_ns());
	fflush(stdout);
}

static void msleep(int ms)
{
	usleep((useconds_t)ms * 1000);
}

/*
 * USERD of one channel (Nvc86fControl, class/clc86f.h): GPGet at 0x88, GPPut at
 * 0x8c, at userdOffset 0x2000 of a 64 KiB memory object, as CUDA lays it out
 * (docs/h100-userd.md).
 */
static int userd(const char *dir, int others)
{
	struct nv0080_alloc_params dp;
	struct nv_channel_group_alloc_params tp = { .engine_type = 1 };
	struct nv_channel_alloc_params_head cp;
	struct nvos33_params_with_fd mp;
	const nv_handle mem = 0x5c000017, tsg = 0x5c000030, ch = 0x5c000031;
	const size_t len = 0x10000;
	volatile nv_u32 *gpget, *gpput;
	char path[512];
	nv_u64 end;
	void *va;
	int ret, fdm, i;

	memset(&dp, 0, sizeof(dp));
	memset(&cp, 0, sizeof(cp));
	rm_alloc(0, 0, 0, NV01_ROOT_CLIENT, NULL, &ret);
	rm_alloc(client, client, DEV, NV01_DEVICE_0, &dp, &ret);
	rm_alloc(client, DEV, SUB, NV20_SUBDEVICE_0, NULL, &ret);
	{
		struct nv_memory_allocation_params ma;

		memset(&ma, 0, sizeof(ma));
		ma.size = len;
		rm_alloc(client, DEV, mem, NV01_MEMORY_LOCAL_USER, &ma, &ret);
	}
	rm_alloc(client, DEV, tsg, KEPLER_CHANNEL_GROUP_A, &tp, &ret);
	cp.gp_fifo_entries = 1024;
	cp.h_userd_memory[0] = mem;
	cp.userd_offset[0] = 0x2000;
	rm_alloc(client, tsg, ch, HOPPER_CHANNEL_GPFIFO_A, &cp, &ret);
	schedule(tsg);
	snprintf(path, sizeof(path), "%s/nvidia0", dir);
	fdm = open(path, O_RDWR);
	/* a new channel's USERD reads 0/0: nothing of an earlier run's in the file */
	if (fdm < 0 || ftruncate(fdm, 0) || ftruncate(fdm, len))
		return 4;
	/* a process with many other mappings first (more than the library keeps) */
	for (i = 0; i < others; i++) {
		struct nv_memory_allocation_params ma;
		nv_handle h = 0x5c100000 + i;

		memset(&ma, 0, sizeof(ma));
		ma.size = 4096;
		rm_alloc(client, DEV, h, NV01_MEMORY_LOCAL_USER, &ma, &ret);
		memset(&mp, 0, sizeof(mp));
		mp.params.h_client = client;
		mp.params.h_device = SUB;
		mp.params.h_memory = h;
		mp.params.length = 4096;
		mp.fd = fdm;
		if (ioctl(ctl, REQ(NV_ESC_RM_MAP_MEMORY, struct nvos33_params_with_fd), &mp) ||
		    mmap(NULL, 4096, PROT_READ, MAP_SHARED, fdm, 0) == MAP_FAILED)
			return 7;
	}
	memset(&mp, 0, sizeof(mp));
	mp.params.h_client = client;
	mp.params.h_device = SUB;
	mp.params.h_memory = mem;
	mp.params.length = len;
	mp.fd = fdm;
	if (ioctl(ctl, REQ(NV_ESC_RM_MAP_MEMORY, struct nvos33_params_with_fd), &mp) || mp.params.status)
		return 5;
	va = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fdm, 0);
	if (va == MAP_FAILED)
		return 6;
	gpget = (volatile nv_u32 *)((char *)va + 0x2000 + 0x88);
	gpput = (volatile nv_u32 *)((char *)va + 0x2000 + 0x8c);
	printf("ready 0x%x 0x%x\n", client, ch);
	phase("quiet");
	msleep(400);
	/* a spinning submitter: one entry every 2 ms, fetched at once */
	phase("busy");
	for (end = now_ns() + 1000000000ull; now_ns() < end;) {
		*gpput = (*gpput + 1) % 1024;
		*gpget = *gpput;
		msleep(2);
	}
	phase("idle");
	msleep(1000);
	/* an entry submitted and not fetched (a gated channel): pending all along */
	phase("pending");
	*gpput = (*gpput + 1) % 1024;
	msleep(600);
	*gpget = *gpput;
	phase("fetched");
	msleep(400);
	/* unmapped while submitting: the sampler must never read it again */
	for (i = 0; i < 5; i++) {
		*gpput = (*gpput + 1) % 1024;
		msleep(2);
	}
	munmap(va, len);
	phase("unmapped");
	msleep(500);
	phase("done");
	close(fdm);
	return 0;
}

static int unix_sock(const char *path, int listen_too)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int s = socket(AF_UNIX, SOCK_STREAM, 0), c;

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	if (!listen_too)
		return connect(s, (struct sockaddr *)&a, sizeof(a)) ? -1 : s;
	if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 1))
		return -1;
	printf("listening 1\n");
	fflush(stdout);
	c = accept(s, NULL, NULL);
	close(s);
	return c;
}

/*
 * A client with 64 MiB of video memory, exported into a new nvidiactl file
 * (the fifo/ node of DIR): prints "alloc" and "export_status"; returns that
 * file's fd, *h the memory's handle.
 */
static int export_64mib(const char *dir, nv_handle *h)
{
	struct nv0000_export_objects_to_fd_params ep;
	char path[512];
	int efd, ret;

	rm_alloc(0, 0, 0, NV01_ROOT_CLIENT, NULL, &ret);
	rm_alloc(client, client, DEV, NV01_DEVICE_0, NULL, &ret);
	rm_alloc(client, DEV, SUB, NV20_SUBDEVICE_0, NULL, &ret);
	printf("alloc %u\n", mem_alloc(64 * MiB, h));
	snprintf(path, sizeof(path), "%s/fifo/nvidiactl", dir);
	efd = open(path, O_RDWR);
	memset(&ep, 0, sizeof(ep));
	ep.fd = efd;
	ep.h_device = DEV;
	ep.max_objects = 1;
	ep.objects[0] = *h;
	ep.num_objects = 1;
	printf("export_status %u\n", control(client, client, NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD,
					      &ep, sizeof(ep)));
	return efd;
}

static int share_export(const char *dir, const char *sock)
{
	char byte = 'x', cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { &byte, 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;
	nv_handle h;
	int efd, c;

	efd = export_64mib(dir, &h);
	c = unix_sock(sock, 1);
	cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &efd, sizeof(int));
	if (c < 0 || sendmsg(c, &m, 0) != 1)
		return 4;
	close(efd);	/* as NCCL does once the fd is sent */
	{
		nv_u32 total, free_kib;

		rm_free(h);	/* cuMemRelease: the export still holds the memory in RM */
		fb_info(&total, &free_kib);
		printf("exp_free_kib_sent %u\n", free_kib);
		fflush(stdout);
	}
	{
		/* legacy CUDA IPC: a share policy, then the client and handle sent */
		struct nvos57_params sp = { .h_client = client, .h_object = h, .share_type = 1 };
		nv_handle ids[2] = { client, h };

		ioctl(ctl, REQ(NV_ESC_RM_SHARE, struct nvos57_params), &sp);
		printf("share_status %u\n", sp.status);
		if (write(c, ids, sizeof(ids)) != sizeof(ids))
			return 4;
	}
	while (read(c, &byte, 1) > 0)
		;
	{
		nv_u32 total, free_kib;

		/* the peer is gone, and with it the export file: RM freed what it held */
		msleep(1100);
		fb_info(&total, &free_kib);	/* an ioctl: the library looks (at most once a second) */
		fb_info(&total, &free_kib);
		printf("exp_free_kib_released %u\n", free_kib);
	}
	return 0;
}

static int export_lost(const char *dir)
{
	nv_u32 total, free_kib;
	char byte = 'x', cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { &byte, 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;
	nv_handle h;
	int efd, sv[2], nul, fd;

	efd = export_64mib(dir, &h);
	/* the file stays alive, in flight, while this process has no fd of it */
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return 4;
	cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &efd, sizeof(int));
	if (sendmsg(sv[0], &m, 0) != 1)
		return 4;
	close(efd);
	rm_free(h);
	fb_info(&total, &free_kib);
	printf("lost_free_kib_sent %u\n", free_kib);
	nul = open("/dev/null", O_RDONLY);
	for (fd = 512; fd < 1024; fd++)
		if (fd != sv[0] && fd != sv[1] && fd != nul && fd != ctl)
			dup2(nul, fd);
	msleep(1100);
	fb_info(&total, &free_kib);	/* an ioctl: the library looks (at most once a second) */
	fb_info(&total, &free_kib);
	printf("lost_free_kib_after %u\n", free_kib);
	return 0;
}

static int share_import(const char *sock)
{
	struct nv0000_import_objects_from_fd_params ip;
	char byte, cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { &byte, 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = sizeof(cbuf) };
	int c = unix_sock(sock, 0), fd = -1, ret, i;
	nv_handle ids[2];

	if (c < 0 || recvmsg(c, &m, 0) != 1 || !CMSG_FIRSTHDR(&m))
		return 4;
	memcpy(&fd, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof(int));
	if (read(c, ids, sizeof(ids)) != sizeof(ids))
		return 4;
	rm_alloc(0, 0, 0, NV01_ROOT_CLIENT, NULL, &ret);
	rm_alloc(client, client, DEV, NV01_DEVICE_0, NULL, &ret);
	{
		struct nvos55_params dp = { .h_client = client, .h_parent = DEV, .h_object = 0x5c00b000u,
					    .h_client_src = ids[0], .h_object_src = ids[1] };

		ioctl(ctl, REQ(NV_ESC_RM_DUP_OBJECT, struct nvos55_params), &dp);
		printf("dup_status %u\n", dp.status);
	}
	for (i = 0; i < 2; i++) {
		memset(&ip, 0, sizeof(ip));
		ip.fd = fd;
		ip.h_parent = DEV;
		ip.objects[0] = 0x5c00a000u;	/* the same handle twice */
		ip.num_objects = 1;
		printf("%s %u\n", i ? "import_again" : "import_status",
		       control(client, client, NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD, &ip, sizeof(ip)));
		if (!i)
			printf("import_type %u\n", ip.object_types[0]);
	}
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	char path[512];
	nv_u32 total, free_kib, st;
	nv_handle h[8], hbig;
	pthread_t th[8];
	int gpu, ret, i, fd2;

	if (argc < 2)
		return 2;
	snprintf(path, sizeof(path), "%s/nvidiactl", argv[1]);
	ctl = open(path, O_RDWR);
	snprintf(path, sizeof(path), "%s/nvidia0", argv[1]);
	gpu = open(path, O_RDWR);
	if (ctl < 0 || gpu < 0)
		return 3;
	if (argc > 2 && !strcmp(argv[2], "serve-quiet"))
		return serve(1);
	if (argc > 2 && !strcmp(argv[2], "serve"))
		return serve(0);
	if (argc > 2 && !strcmp(argv[2], "exportlost"))
		return export_lost(argv[1]);
	if (argc > 3 && !strcmp(argv[2], "export"))
		return share_export(argv[1], argv[3]);
	if (argc > 3 && !strcmp(argv[2], "import"))
		return share_import(argv[3]);
	if (argc > 2 && !strcmp(argv[2], "userd"))
		return userd(argv[1], argc > 3 ? atoi(argv[3]) : 0);

	st = rm_alloc(0, 0, 0, NV01_ROOT_CLIENT, NULL, &ret);
	printf("client_status %u client 0x%x\n", st, client);
	rm_alloc(client, client, DEV, NV01_DEVICE_0, NULL, &ret);
	rm_alloc(client, DEV, SUB, NV20_SUBDEVICE_0, NULL, &ret);

	fb_info(&total, &free_kib);
	printf("fb_total_kib %u fb_free_kib %u\n", total, free_kib);
	for (i = 0; i < 4; i++) {
		st = mem_alloc(256 * MiB, &h[i]);
		printf("alloc256_%d %u\n", i, st);
	}
	st = mem_alloc(1, &hbig);
	printf("alloc_over %u\n", st);
	fb_info(&total, &free_kib);
	printf("fb_total_kib_after %u fb_free_kib_after %u\n", total, free_kib);
	for (i = 0; i < 4; i++)
		rm_free(h[i]);
	fb_info(&total, &free_kib);
	printf("fb_free_kib_freed %u\n", free_kib);

	{
		struct nv2080_ctrl_fifo_disable_channels_params dp;

		memset(&dp, 0, sizeof(dp));
		dp.b_disable = 1;
		dp.num_channels = 1;
		dp.h_client_list[0] = 0xc1d0beef;
		dp.h_channel_list[0] = 0x5c000010;
		st = control(client, SUB, NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, &dp, sizeof(dp));
		printf("disable_foreign %u\n", st);
	}
	st = control(client, SUB, NV2080_CTRL_CMD_GPU_SET_COMPUTE_MODE_RULES, NULL, 0);
	printf("compute_mode %u\n", st);

	errno = 0;
	ret = ioctl(ctl, REQ(NV_ESC_RM_ALLOC, struct nvos64_params), (void *)8);
	printf("bad_arg_ret %d errno %d\n", ret, errno);
	errno = 0;
	ret = ioctl(ctl, _IOWR(NV_IOCTL_MAGIC, NV_ESC_RM_ALLOC, nv_u32), &st);
	printf("short_arg_ret %d errno %d\n", ret, errno);
	errno = 0;
	ret = ioctl(ctl, REQ(NV_ESC_IOCTL_XFER_CMD, struct nv_ioctl_xfer), path);
	printf("xfer_ret %d errno %d\n", ret, errno);
	{
		struct nv_memory_allocation_params mp;
		struct nvos64_params p = {
			.h_root = client, .h_object_parent = DEV, .h_object_new = 0x5c000f00,
			.h_class = NV01_MEMORY_LOCAL_USER, .p_alloc_parms = 16,
		};

		memset(&mp, 0, sizeof(mp));
		ret = ioctl(ctl, REQ(NV_ESC_RM_ALLOC, struct nvos64_params), &p);
		printf("bad_params_ret %d status %u\n", ret, p.status);
	}

	for (i = 0; i < 8; i++)
		pthread_create(&th[i], NULL, worker, NULL);
	for (i = 0; i < 8; i++)
		pthread_join(th[i], NULL);
	printf("threads_ok %llu threads_refused %llu max_live %llu\n",
	       (unsigned long long)thread_ok, (unsigned long long)thread_refused,
	       (unsigned long long)max_live);
	fb_info(&total, &free_kib);
	printf("fb_free_kib_threads %u\n", free_kib);

	/* a dup'd fd keeps the file; closing both returns everything */
	mem_alloc(512 * MiB, &h[0]);

	/* a forked child starts with its own, empty instance; its close() does not
	 * touch the parent's accounting */
	{
		pid_t pid = fork();
		int wst = 0;

		if (pid == 0) {
			fb_info(&total, &free_kib);	/* the parent's client: not the child's */
			st = control(client, SUB, NV2080_CTRL_CMD_FB_GET_INFO_V2, NULL, 0);
			close(ctl);
			_exit(st == NV_ERR_INSUFFICIENT_PERMISSIONS ? 0 : 1);
		}
		waitpid(pid, &wst, 0);
		printf("fork_child_exit %d\n", WIFEXITED(wst) ? WEXITSTATUS(wst) : -1);
		fb_info(&total, &free_kib);
		printf("fb_free_kib_fork %u\n", free_kib);
		/* a vfork child runs in our memory: its close() must not touch our state */
		pid = vfork();
		if (pid == 0) {
			close(ctl);
			_exit(0);
		}
		waitpid(pid, &wst, 0);
		fb_info(&total, &free_kib);
		printf("fb_free_kib_vfork %u\n", free_kib);
	}
	fd2 = dup(ctl);
	close(ctl);
	ctl = fd2;
	fb_info(&total, &free_kib);
	printf("fb_free_kib_dup %u\n", free_kib);
	close(ctl);
	ctl = open(argv[1][0] ? strcat(strcpy(path, argv[1]), "/nvidiactl") : path, O_RDWR);
	rm_alloc(0, 0, 0, NV01_ROOT_CLIENT, NULL, &ret);
	rm_alloc(client, client, DEV, NV01_DEVICE_0, NULL, &ret);
	rm_alloc(client, DEV, SUB, NV20_SUBDEVICE_0, NULL, &ret);
	fb_info(&total, &free_kib);
	printf("fb_free_kib_reopen %u\n", free_kib);
	/* close_range() forgets the files too */
	mem_alloc(256 * MiB, &h[1]);
	fd2 = dup(ctl);
	if (close_range(fd2, fd2, 0) || close_range(ctl, ctl, 0))
		printf("close_range_errno %d\n", errno);
	ctl = open(argv[1][0] ? strcat(strcpy(path, argv[1]), "/nvidiactl") : path, O_RDWR);
	rm_alloc(0, 0, 0, NV01_ROOT_CLIENT, NULL, &ret);
	rm_alloc(client, client, DEV, NV01_DEVICE_0, NULL, &ret);
	rm_alloc(client, DEV, SUB, NV20_SUBDEVICE_0, NULL, &ret);
	fb_info(&total, &free_kib);
	printf("fb_free_kib_close_range %u\n", free_kib);
	{
		struct nv_channel_group_alloc_params tp = { .engine_type = 1 };
		struct nv_channel_alloc_params_head cp;

		memset(&cp, 0, sizeof(cp));
		cp.engine_type = 1;
		rm_alloc(client, DEV, 0x5c000020, KEPLER_CHANNEL_GROUP_A, &tp, &ret);
		rm_alloc(client, 0x5c000020, 0x5c000021, HOPPER_CHANNEL_GPFIFO_A, &cp, &ret);
		schedule(0x5c000020);	/* as CUDA does: the channel is announced now */
		rm_free(0x5c000020);
	}
	close(gpu);
	return 0;
}
