// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * siblings.c - memory shared through fds between processes of one instance,
 * in the user-space build.
 *
 * NCCL's P2P transport and cuMemExportToShareableHandle(POSIX_FD) export
 * memory into a nvidiactl file and pass that file to another process over a
 * unix socket, which imports from it (kmod/core/export.c). The module has one
 * core per instance and knows every export file of the instance. Here each
 * process has its own core, so an import from another process's file meets a
 * core that recorded no export on it, and is refused as foreign unless the
 * glue can say the file is another process's of the same instance
 * (gs_call.fd_sibling). How it says so:
 *
 *  - an exporter adds each file it exported into to an epoll set of its own
 *    (interest in no events: nothing is ever read from it) and appends
 *    "e <epoll fd> <fd>" to $GPUSLICE_EXPORTS/<instance>/<pid>. An epoll set
 *    holds no reference on a file: the entry goes when the file is released,
 *    and until then it names the file even after the exporter closed its fd
 *    (fs/eventpoll.c, eventpoll_release());
 *  - the exporter's core keeps the export's charge until the file is released,
 *    not when the exporter closes its fd (which it does once the fd is sent):
 *    a closed exported file stays open to the core until its epoll entry is
 *    gone (/proc/self/fdinfo of the epoll set lists the live entries, each
 *    with the core's file id as its data), looked at on each close and at
 *    most once a second from the ioctl path;
 *  - an importer asks kcmp(KCMP_EPOLL_TFD) whether the fd it was handed is
 *    the file one of its instance's exporters registered (kernel/kcmp.c): the
 *    kernel compares files, so neither a reused fd number nor a stale line
 *    can match another file.
 *
 * Legacy CUDA IPC (cudaIpcGetMemHandle, torch.multiprocessing) shares memory
 * with RM_SHARE and the other process duplicates it from the exporter's
 * client (RM_DUP_OBJECT): a process that shared an object appends "c <client>"
 * to its file, and a duplicate from a client listed by a live process of the
 * instance is let through (gs_call.src_sibling). RM's share policy still
 * decides whether the object may be taken.
 *
 * Only the instance's own directory is read, so a file exported by a process
 * of another instance, however it was received, stays foreign and is refused.
 * kcmp needs PTRACE_MODE_READ on the exporter (same user; Yama's ptrace_scope
 * does not restrict it); where it is refused (Docker's default seccomp profile
 * without CAP_SYS_PTRACE, another user) the import is refused as before, and
 * after the first EPERM or ENOSYS the directory is not looked at again. The nvidiactl poll handler that epoll_ctl()
 * calls only registers a wait and reads the file's event state
 * (kernel-open/nvidia/nv.c, nvidia_poll(); an export file has no events).
 * The exporter must be alive at the import: kcmp looks it up by pid.
 *
 * This is not a security boundary, as nothing in the user-space build is
 * (a process can bypass libc); it is what lets an instance's processes share
 * memory the way the module lets them, with the charge staying with the
 * exporting process's core.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/kcmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "preload.h"

#define GS_SIB_DIR	"/dev/shm/gpuslice-exports"
#define GS_SIB_TOFF	256	/* entries of one fd number in one epoll set looked at */
#define GS_SIB_LINES	4096	/* lines of one process's file looked at */
#define GS_SIB_FDS	65536	/* fd numbers listed once each */
#define GS_SIB_KEPT	1024	/* closed exported files whose charge is kept */
#define GS_SIB_CLIENTS	16
#define GS_SIB_REAP_NS	1000000000ull

static pthread_mutex_t gs_sib_lock = PTHREAD_MUTEX_INITIALIZER;
static int gs_sib_epfd = -1;
static char gs_sib_path[512];	/* this process's file; "" until the first line */
static unsigned long gs_sib_listed[GS_SIB_FDS / (8 * sizeof(unsigned long))];	/* "e" lines */
static nv_handle gs_sib_clients[GS_SIB_CLIENTS];	/* "c" lines */
static unsigned int gs_sib_nclients;
static nv_u64 gs_sib_exported[GS_SIB_KEPT];	/* file ids exported into, open or kept */
static int gs_sib_nexported;
static nv_u64 gs_sib_kept[GS_SIB_KEPT];	/* of those, closed by the process: kept for the core */
static int gs_sib_nkept;
static nv_u64 gs_sib_next_reap;
static int gs_sib_no_kcmp;	/* kcmp refused once: not tried again */
/* what gs_sib_epfd is: an application that closes fds it does not own (a
 * closefrom(), a dup2() over it) takes it away, and the number may then name
 * another file, whose fdinfo lists no entries: every kept charge would look
 * released. So its identity is checked before each use, and once lost the set
 * is given up: kept charges stay until the process exits (cannot tell), and
 * later exports are not registered (their imports stay refused). */
static dev_t gs_sib_ep_dev;
static ino_t gs_sib_ep_ino;
static int gs_sib_lost;

static int gs_sib_instance_dir(char *buf, size_t len)
{
	const char *base = getenv("GPUSLICE_EXPORTS");
	int n;

	/* the name is the caller's: nothing that leaves the directory */
	if (!gs_pl.name[0] || strchr(gs_pl.name, '/') || gs_pl.name[0] == '.')
		return -1;
	n = snprintf(buf, len, "%s/%s", base && *base ? base : GS_SIB_DIR, gs_pl.name);
	return n > 0 && (size_t)n < len ? 0 : -1;
}

/*
 * mkdir of base and instance, sticky and world-writable (an instance may span
 * users); a directory that is not a real one, or is another user's and not
 * root's, is not used.
 */
static int gs_sib_dir_ok(const char *dir)
{
	struct stat st;

	if (mkdir(dir, 01777) == 0)
		chmod(dir, 01777);
	if (lstat(dir, &st) || !S_ISDIR(st.st_mode))
		return -1;
	if (st.st_uid != geteuid() && st.st_uid != 0)
		return -1;
	return access(dir, W_OK | X_OK);
}

static int gs_sib_mkdirs(const char *dir)
{
	char base[512], *slash;

	snprintf(base, sizeof(base), "%s", dir);
	slash = strrchr(base, '/');
	if (!slash)
		return -1;
	*slash = 0;
	if (gs_sib_dir_ok(base))
		return -1;
	return gs_sib_dir_ok(dir);
}

/* appends a line to this process's file; called with gs_sib_lock held */
static void gs_sib_append(const char *line)
{
	char dir[480];
	int out, n = strlen(line);

	if (!gs_sib_path[0]) {
		if (gs_sib_instance_dir(dir, sizeof(dir)) || gs_sib_mkdirs(dir))
			return;
		snprintf(gs_sib_path, sizeof(gs_sib_path), "%s/%d", dir, (int)getpid());
		unlink(gs_sib_path);	/* a dead process's with our pid */
	}
	out = open(gs_sib_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (out < 0)
		return;
	if (write(out, line, n) != n && gs_pl.debug)
		fprintf(stderr, "gpuslice: %s: short write\n", gs_sib_path);
	syscall(SYS_close, out);	/* not through our close() */
}

static int gs_sib_find_id(const nv_u64 *ids, int n, nv_u64 id)
{
	int i;

	for (i = 0; i < n; i++)
		if (ids[i] == id)
			return i;
	return -1;
}

/* is gs_sib_epfd still our epoll set? Called with gs_sib_lock held. */
static int gs_sib_epoll_ok_locked(void)
{
	struct stat st;

	if (gs_sib_lost || gs_sib_epfd < 0)
		return 0;
	if (fstat(gs_sib_epfd, &st) || st.st_dev != gs_sib_ep_dev || st.st_ino != gs_sib_ep_ino) {
		gs_sib_lost = 1;
		if (gs_pl.debug)
			fprintf(stderr, "gpuslice: the exports' epoll set (fd %d) was closed by the application\n",
				gs_sib_epfd);
		return 0;
	}
	return 1;
}

void gs_sibling_exported(int fd, nv_u64 file_id)
{
	struct epoll_event ev = { .events = 0, .data.u64 = file_id };
	char line[40];
	int known;

	if (fd < 0 || fd >= GS_SIB_FDS)
		return;
	pthread_mutex_lock(&gs_sib_lock);
	if (gs_sib_epfd < 0 && !gs_sib_lost) {
		int e = epoll_create1(EPOLL_CLOEXEC);
		struct stat st;

		if (e >= 0) {
			/* out of the way of fd numbers the application picks */
			gs_sib_epfd = fcntl(e, F_DUPFD_CLOEXEC, 512);
			if (gs_sib_epfd < 0)
				gs_sib_epfd = e;
			else
				syscall(SYS_close, e);
			if (fstat(gs_sib_epfd, &st)) {
				syscall(SYS_close, gs_sib_epfd);
				gs_sib_epfd = -1;
			} else {
				gs_sib_ep_dev = st.st_dev;
				gs_sib_ep_ino = st.st_ino;
			}
		}
	}
	/* a file that cannot be polled is not registered: its imports stay refused */
	if (!gs_sib_epoll_ok_locked() || epoll_ctl(gs_sib_epfd, EPOLL_CTL_ADD, fd, &ev))
		goto out;
	known = gs_sib_find_id(gs_sib_exported, gs_sib_nexported, file_id) >= 0;
	if (!known && gs_sib_nexported < GS_SIB_KEPT)
		gs_sib_exported[gs_sib_nexported++] = file_id;
	if (!(gs_sib_listed[fd / (8 * sizeof(unsigned long))] & 1ul << fd % (8 * sizeof(unsigned long)))) {
		snprintf(line, sizeof(line), "e %d %d\n", gs_sib_epfd, fd);
		gs_sib_append(line);
		gs_sib_listed[fd / (8 * sizeof(unsigned long))] |= 1ul << fd % (8 * sizeof(unsigned long));
	}
out:
	pthread_mutex_unlock(&gs_sib_lock);
}

void gs_sibling_shared(nv_handle client)
{
	char line[24];
	unsigned int i;

	pthread_mutex_lock(&gs_sib_lock);
	for (i = 0; i < GS_SIB_CLIENTS && gs_sib_clients[i] != client; i++)
		;
	if (i == GS_SIB_CLIENTS) {	/* once per client */
		snprintf(line, sizeof(line), "c %u\n", client);
		gs_sib_append(line);
		gs_sib_clients[gs_sib_nclients++ % GS_SIB_CLIENTS] = client;
	}
	pthread_mutex_unlock(&gs_sib_lock);
}

/*
 * The kept files whose epoll entry is gone (the file was released: RM freed
 * what its slots held) go to the core now. Called with gs_sib_lock held.
 */
static void gs_sib_reap_locked(struct gs_inst *in)
{
	char path[64], line[256];
	nv_u64 live[GS_SIB_KEPT];
	int nlive = 0, i;
	FILE *f;

	if (!gs_sib_epoll_ok_locked())
		return;		/* cannot tell: keep them */
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", gs_sib_epfd);
	f = fopen(path, "re");
	if (!f)
		return;		/* cannot tell: keep them */
	while (fgets(line, sizeof(line), f) && nlive < GS_SIB_KEPT) {
		const char *d = strstr(line, " data: ");
		unsigned long long v;

		if (!strncmp(line, "tfd:", 4) && d && sscanf(d + 7, "%llx", &v) == 1)
			live[nlive++] = v;
	}
	fclose(f);
	for (i = 0; i < gs_sib_nkept;) {
		nv_u64 id = gs_sib_kept[i];
		int j;

		if (gs_sib_find_id(live, nlive, id) >= 0) {
			i++;
			continue;
		}
		gs_sib_kept[i] = gs_sib_kept[--gs_sib_nkept];
		j = gs_sib_find_id(gs_sib_exported, gs_sib_nexported, id);
		if (j >= 0)
			gs_sib_exported[j] = gs_sib_exported[--gs_sib_nexported];
		gs_file_closed(in, id);
	}
}

int gs_sibling_closing(struct gs_inst *in, nv_u64 file_id)
{
	int kept = 0;

	pthread_mutex_lock(&gs_sib_lock);
	if (gs_sib_find_id(gs_sib_exported, gs_sib_nexported, file_id) >= 0 &&
	    gs_sib_find_id(gs_sib_kept, gs_sib_nkept, file_id) < 0 && gs_sib_nkept < GS_SIB_KEPT) {
		gs_sib_kept[gs_sib_nkept++] = file_id;
		kept = 1;
	}
	if (gs_sib_nkept)
		gs_sib_reap_locked(in);
	pthread_mutex_unlock(&gs_sib_lock);
	return kept;
}

void gs_sibling_reap(struct gs_inst *in)
{
	nv_u64 now = gs_now_ns();

	if (!__atomic_load_n(&gs_sib_nkept, __ATOMIC_RELAXED) ||
	    now < __atomic_load_n(&gs_sib_next_reap, __ATOMIC_RELAXED))
		return;
	if (pthread_mutex_trylock(&gs_sib_lock))
		return;
	gs_sib_next_reap = now + GS_SIB_REAP_NS;
	gs_sib_reap_locked(in);
	pthread_mutex_unlock(&gs_sib_lock);
}

/* is fd the file that process pid registered as "efd tfd"? -1: kcmp is refused */
static int gs_sib_same(pid_t pid, int fd, int efd, int tfd)
{
	struct kcmp_epoll_slot slot = { .efd = efd, .tfd = tfd };
	unsigned int toff;

	for (toff = 0; toff < GS_SIB_TOFF; toff++) {
		long r;

		slot.toff = toff;
		r = syscall(SYS_kcmp, getpid(), pid, KCMP_EPOLL_TFD, fd, (unsigned long)&slot);
		if (r == 0)
			return 1;
		if (r > 0)
			continue;	/* another file under that fd number: the next entry */
		if (errno == EPERM || errno == ENOSYS)
			return -1;
		break;		/* ENOENT: no entry at toff or after; EBADF, ESRCH: gone */
	}
	return 0;
}

/* does process pid's file list the file fd names (fd >= 0) or the client? */
static int gs_sib_in_file(const char *path, pid_t pid, int fd, nv_handle client)
{
	FILE *f = fopen(path, "re");
	char kind;
	int a, b, n = 0, found = 0;
	unsigned int c;

	if (!f)
		return 0;
	while (!found && n++ < GS_SIB_LINES && fscanf(f, " %c", &kind) == 1) {
		if (kind == 'e' && fscanf(f, "%d %d", &a, &b) == 2)
			found = fd >= 0 ? gs_sib_same(pid, fd, a, b) : 0;
		else if (kind == 'c' && fscanf(f, "%u", &c) == 1)
			found = fd < 0 && client && c == client;
		else
			break;
	}
	fclose(f);
	return found;
}

/* is it listed by a live process of the instance other than this one? */
static int gs_sib_find(int fd, nv_handle client)
{
	char dir[480], path[768];
	struct dirent *d;
	DIR *dh;
	int found = 0;

	if (gs_sib_instance_dir(dir, sizeof(dir)))
		return 0;
	dh = opendir(dir);
	if (!dh)
		return 0;
	while (!found && (d = readdir(dh))) {
		char *end;
		long pid = strtol(d->d_name, &end, 10);

		if (*end || pid <= 0 || pid == getpid())
			continue;	/* our own exports are the core's to know */
		snprintf(path, sizeof(path), "%s/%s", dir, d->d_name);
		if (kill((pid_t)pid, 0) && errno == ESRCH) {
			unlink(path);	/* its process is gone, and its files' entries with it */
			continue;
		}
		found = gs_sib_in_file(path, (pid_t)pid, fd, client);
	}
	closedir(dh);
	if (found < 0) {
		if (gs_pl.debug)
			fprintf(stderr, "gpuslice: kcmp refused: imports from other processes stay refused\n");
		__atomic_store_n(&gs_sib_no_kcmp, 1, __ATOMIC_RELAXED);
		found = 0;
	}
	return found;
}

int gs_sibling_file(int fd)
{
	return fd >= 0 && !__atomic_load_n(&gs_sib_no_kcmp, __ATOMIC_RELAXED) && gs_sib_find(fd, 0);
}

int gs_sibling_client(nv_handle client)
{
	return client && gs_sib_find(-1, client);
}

void gs_sibling_exit(void)
{
	if (gs_sib_path[0] && gs_pl.owner == getpid())
		unlink(gs_sib_path);
}

/* a forked child exports through its own file, and its own epoll set */
void gs_sibling_atfork_child(void)
{
	pthread_mutex_init(&gs_sib_lock, NULL);
	gs_sib_path[0] = 0;
	memset(gs_sib_listed, 0, sizeof(gs_sib_listed));
	memset(gs_sib_clients, 0, sizeof(gs_sib_clients));
	gs_sib_nclients = 0;
	gs_sib_nexported = 0;
	gs_sib_nkept = 0;	/* the child's core is new: the parent's files are not its */
	gs_sib_no_kcmp = 0;
	if (gs_sib_epfd >= 0 && !gs_sib_lost)
		syscall(SYS_close, gs_sib_epfd);	/* when lost, the number is the application's */
	gs_sib_epfd = -1;
	gs_sib_lost = 0;
}
