// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * wl_poll.c - a CUDA driver-API workload that is off the CPU while it waits:
 * it launches a batch of kernels, then polls cuStreamQuery() with usleep()
 * between polls (issue 12, item 1: runtimes that sleep-poll). Same protocol as
 * wl_sched.py, so tests/gpu/sched_common.Workload runs it:
 *
 *   wl_poll KERNEL_US CTLFILE OUTFILE [BATCH] [POLL_US] [MODE]
 *
 * prints {"ready": pid} once the context exists, then re-reads CTLFILE ("run",
 * "pause", "exit") before every batch; while "run" it launches BATCH (4)
 * kernels of about KERNEL_US us each (every SM spins on clock64), then waits
 * until the stream is idle, and appends one CLOCK_MONOTONIC double per
 * completed kernel to OUTFILE. MODE "poll" (default) waits with
 * cuStreamQuery + usleep(POLL_US, 500); "block" waits in cuStreamSynchronize
 * in a context made with CU_CTX_SCHED_BLOCKING_SYNC (the thread sleeps in the
 * driver); "spin" with CU_CTX_SCHED_SPIN.
 *
 * No CUDA headers are needed: libcuda.so.1 is opened with dlopen() and the few
 * entry points (stable driver ABI, cuda.h) are declared here. The kernel is PTX
 * JIT-compiled by the driver.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;

#define CU_CTX_SCHED_SPIN		0x1
#define CU_CTX_SCHED_BLOCKING_SYNC	0x4
#define CUDA_ERROR_NOT_READY		600

static CUresult (*cuInit)(unsigned int);
static CUresult (*cuDeviceGet)(CUdevice *, int);
static CUresult (*cuDeviceGetAttribute)(int *, int, CUdevice);
static CUresult (*cuCtxCreate)(CUcontext *, unsigned int, CUdevice);
static CUresult (*cuModuleLoadData)(CUmodule *, const void *);
static CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
static CUresult (*cuLaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
				  unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
static CUresult (*cuStreamQuery)(CUstream);
static CUresult (*cuStreamSynchronize)(CUstream);

static const char ptx[] =
	".version 7.0\n"
	".target sm_70\n"
	".address_size 64\n"
	".visible .entry spin(.param .u64 cycles)\n"
	"{\n"
	"  .reg .u64 %rd<5>;\n"
	"  .reg .pred %p;\n"
	"  ld.param.u64 %rd1, [cycles];\n"
	"  mov.u64 %rd2, %clock64;\n"
	"LOOP:\n"
	"  mov.u64 %rd3, %clock64;\n"
	"  sub.u64 %rd4, %rd3, %rd2;\n"
	"  setp.lt.u64 %p, %rd4, %rd1;\n"
	"  @%p bra LOOP;\n"
	"  ret;\n"
	"}\n";

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *sym(void *lib, const char *name)
{
	void *p = dlsym(lib, name);

	if (!p) {
		fprintf(stderr, "wl_poll: no %s in libcuda\n", name);
		exit(3);
	}
	return p;
}

#define CK(call) do { CUresult r_ = (call); if (r_) { fprintf(stderr, "wl_poll: %s = %d\n", #call, r_); return 4; } } while (0)

int main(int argc, char **argv)
{
	int kernel_us, batch = 4, poll_us = 500, sms = 0, khz = 0, i, cfd, ofd;
	const char *mode = "poll";
	unsigned long long cycles;
	void *args[1], *lib;
	double ts[64];
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;
	CUdevice dev;
	char c[16];

	if (argc < 4)
		return 2;
	kernel_us = atoi(argv[1]);
	if (argc > 4)
		batch = atoi(argv[4]);
	if (argc > 5)
		poll_us = atoi(argv[5]);
	if (argc > 6)
		mode = argv[6];
	if (batch < 1 || batch > 64)
		return 2;
	lib = dlopen("libcuda.so.1", RTLD_NOW);
	if (!lib)
		return 3;
	cuInit = sym(lib, "cuInit");
	cuDeviceGet = sym(lib, "cuDeviceGet");
	cuDeviceGetAttribute = sym(lib, "cuDeviceGetAttribute");
	cuCtxCreate = sym(lib, "cuCtxCreate_v2");
	cuModuleLoadData = sym(lib, "cuModuleLoadData");
	cuModuleGetFunction = sym(lib, "cuModuleGetFunction");
	cuLaunchKernel = sym(lib, "cuLaunchKernel");
	cuStreamQuery = sym(lib, "cuStreamQuery");
	cuStreamSynchronize = sym(lib, "cuStreamSynchronize");
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDeviceGetAttribute(&sms, 16, dev));	/* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
	CK(cuDeviceGetAttribute(&khz, 13, dev));	/* CU_DEVICE_ATTRIBUTE_CLOCK_RATE, kHz */
	CK(cuCtxCreate(&ctx, !strcmp(mode, "block") ? CU_CTX_SCHED_BLOCKING_SYNC :
		       !strcmp(mode, "spin") ? CU_CTX_SCHED_SPIN : 0, dev));
	CK(cuModuleLoadData(&mod, ptx));
	CK(cuModuleGetFunction(&fn, mod, "spin"));
	cycles = (unsigned long long)khz * kernel_us / 1000;
	args[0] = &cycles;
	CK(cuLaunchKernel(fn, sms, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
	CK(cuStreamSynchronize(NULL));
	cfd = open(argv[2], O_RDONLY);
	ofd = open(argv[3], O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (cfd < 0 || ofd < 0)
		return 5;
	printf("{\"ready\": %d, \"kernel_us\": %d, \"sms\": %d, \"clock_khz\": %d, \"mode\": \"%s\"}\n",
	       getpid(), kernel_us, sms, khz, mode);
	fflush(stdout);
	for (;;) {
		ssize_t n = pread(cfd, c, sizeof(c) - 1, 0);

		c[n > 0 ? n : 0] = 0;
		if (!strncmp(c, "exit", 4))
			break;
		if (strncmp(c, "run", 3)) {
			usleep(2000);
			continue;
		}
		for (i = 0; i < batch; i++)
			CK(cuLaunchKernel(fn, sms, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
		if (!strcmp(mode, "poll")) {
			CUresult r;

			while ((r = cuStreamQuery(NULL)) == CUDA_ERROR_NOT_READY)
				usleep(poll_us);
			CK(r);
		} else {
			CK(cuStreamSynchronize(NULL));
		}
		/* the batch's kernels ran back to back: spread their completions over it */
		ts[batch - 1] = now_s();
		for (i = 0; i < batch - 1; i++)
			ts[i] = ts[batch - 1];
		if (write(ofd, ts, batch * sizeof(double)) != (ssize_t)(batch * sizeof(double)))
			return 6;
	}
	close(ofd);
	return 0;
}
