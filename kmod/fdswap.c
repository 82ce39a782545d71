// SPDX-License-Identifier: GPL-2.0
/*
 * fdswap.c - fd translation for calls into the real driver.
 *
 * The real driver resolves fds and scans fd tables of the *calling* task:
 * nv_get_file_private() fget()s an fd and checks it is a char device of major
 * 195 (kernel-open/nvidia/nv.c), nv_is_gpu_accessible() walks current->files
 * with iterate_fd() looking for its own nvidia<N> file (f_op == &nvidia_fops),
 * and nvidia-uvm fget()s uvmFd / va_space_fd and checks f_op == &uvm_fops
 * (kernel-open/nvidia-uvm/uvm.c, uvm_user_channel.c, uvm_tools.c). A caller's
 * fds name gpuslice files, which fail every one of those checks.
 *
 * So each call into the real driver runs with current->files pointing at a
 * private files_struct that is a copy of the caller's table in which every
 * gpuslice file is replaced, at the same fd number, by the real file it wraps.
 * fd numbers in arguments need no rewriting and the table scan passes. The
 * private table belongs to this one thread for this one call: the other
 * threads of the process share the original table, which never holds a real
 * file. Other ways to reach the calling thread's table while it is swapped:
 *   - pidfd_getfd() / kcmp(): they take signal->exec_update_lock for reading,
 *     which we hold for writing during the call, so they see the original
 *     table before or after, never the private one;
 *   - /proc/<pid>/task/<tid>/fd/N: a re-open goes through may_open() and the
 *     device cgroup, which denies the real major to a container.
 * See docs/fd-translation.md for the full argument.
 *
 * files_struct is built here the way fs/file.c builds init_files (dup_fd() and
 * put_files_struct() are not exported). A table larger than NR_OPEN_DEFAULT
 * gets an fdtable allocated exactly as alloc_fdtable() does, so that the
 * kernel's own free_fdtable_rcu() could free it if expand_files() replaced it
 * during the call. The private struct is freed after an RCU grace period.
 */
#include <linux/bitops.h>
#include <linux/fdtable.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/rcupdate.h>
#include <linux/sched.h>
#include <linux/sched/signal.h>
#include <linux/sched/task.h>
#include <linux/slab.h>
#include <linux/spinlock.h>

#include "driver.h"
#include "fdswap.h"
#include "fops.h"
#include "inject.h"

struct gs_fdswap {
	struct files_struct files;
	struct files_struct *saved;
	unsigned int nr_snap;
	unsigned long *snap;		/* fds copied from the caller */
	struct rcu_head rcu;
};

/* fs/file.c: BITBIT_NR/BITBIT_SIZE */
static size_t gs_bitbit_size(unsigned int nr)
{
	return BITS_TO_LONGS(BITS_TO_LONGS(nr)) * sizeof(long);
}

static struct fdtable *gs_fdtable_alloc(unsigned int nr)
{
	struct fdtable *fdt;
	void *data;

	fdt = gs_kmalloc(sizeof(*fdt), GFP_KERNEL_ACCOUNT);
	if (!fdt)
		return NULL;
	fdt->max_fds = nr;
	fdt->fd = kvcalloc(nr, sizeof(struct file *), GFP_KERNEL_ACCOUNT);
	if (!fdt->fd)
		goto err_fdt;
	data = kvzalloc(max_t(size_t, 2 * nr / BITS_PER_BYTE + gs_bitbit_size(nr),
			      L1_CACHE_BYTES), GFP_KERNEL_ACCOUNT);
	if (!data)
		goto err_fd;
	fdt->open_fds = data;
	data += nr / BITS_PER_BYTE;
	fdt->close_on_exec = data;
	data += nr / BITS_PER_BYTE;
	fdt->full_fds_bits = data;
	return fdt;

err_fd:
	kvfree(fdt->fd);
err_fdt:
	kfree(fdt);
	return NULL;
}

static void gs_fdtable_free(struct fdtable *fdt)
{
	kvfree(fdt->fd);
	kvfree(fdt->open_fds);
	kfree(fdt);
}

static void gs_fdswap_free_rcu(struct rcu_head *rcu)
{
	struct gs_fdswap *swap = container_of(rcu, struct gs_fdswap, rcu);
	struct fdtable *fdt = rcu_dereference_raw(swap->files.fdt);

	if (fdt != &swap->files.fdtab)
		gs_fdtable_free(fdt);
	kfree(swap->snap);
	kfree(swap);
}

struct gs_fdswap_copy {
	struct fdtable *dst;
	struct files_struct *src;
};

/* iterate_fd() callback, under the caller's file_lock: must not sleep. */
static int gs_fdswap_copy_one(const void *p, struct file *file, unsigned int fd)
{
	const struct gs_fdswap_copy *c = p;
	struct file *real;

	if (fd >= c->dst->max_fds)
		return 0;	/* opened by a racing thread after we sized the table */
	real = gs_fops_real(file);
	rcu_assign_pointer(c->dst->fd[fd], get_file(real ? real : file));
	__set_bit(fd, c->dst->open_fds);
	if (test_bit(fd, files_fdtable(c->src)->close_on_exec))
		__set_bit(fd, c->dst->close_on_exec);
	return 0;
}

static void gs_fdswap_init_files(struct files_struct *files)
{
	atomic_set(&files->count, 1);
	init_waitqueue_head(&files->resize_wait);
	spin_lock_init(&files->file_lock);
	files->fdtab.max_fds = NR_OPEN_DEFAULT;
	files->fdtab.fd = files->fd_array;
	files->fdtab.close_on_exec = files->close_on_exec_init;
	files->fdtab.open_fds = files->open_fds_init;
	files->fdtab.full_fds_bits = files->full_fds_bits_init;
	RCU_INIT_POINTER(files->fdt, &files->fdtab);
}

int gs_fdswap_enter(struct gs_fdswap **out, int pin_fd, struct file *pin)
{
	struct files_struct *files = current->files;
	struct gs_fdswap_copy copy;
	struct gs_fdswap *swap;
	struct fdtable *fdt;
	unsigned int nr, i;
	int err;

	if (!files)
		return -EBADF;
	err = down_write_killable(&current->signal->exec_update_lock);
	if (err)
		return err;

	swap = gs_kzalloc(sizeof(*swap), GFP_KERNEL_ACCOUNT);
	if (!swap) {
		err = -ENOMEM;
		goto err_unlock;
	}
	gs_fdswap_init_files(&swap->files);
	rcu_read_lock();
	nr = files_fdtable(files)->max_fds;
	rcu_read_unlock();
	fdt = &swap->files.fdtab;
	if (nr > NR_OPEN_DEFAULT) {
		fdt = gs_fdtable_alloc(nr);
		if (!fdt) {
			err = -ENOMEM;
			goto err_free;
		}
		rcu_assign_pointer(swap->files.fdt, fdt);
	}
	/* the fd was open when the caller checked it, and tables only grow */
	if (pin && (pin_fd < 0 || pin_fd >= fdt->max_fds)) {
		err = -EBADF;
		goto err_free;
	}
	swap->nr_snap = fdt->max_fds;
	swap->snap = kcalloc(BITS_TO_LONGS(swap->nr_snap), sizeof(long), GFP_KERNEL_ACCOUNT);
	if (!swap->snap) {
		err = -ENOMEM;
		goto err_free;
	}

	/* iterate_fd() holds the caller's file_lock around each callback. */
	copy.dst = fdt;
	copy.src = files;
	iterate_fd(files, 0, gs_fdswap_copy_one, &copy);
	/*
	 * Another thread may have closed or dup2()ed over pin_fd since the
	 * check: the driver resolves the fd in this table, so it finds the
	 * checked file there, and nothing the caller did meanwhile.
	 */
	if (pin) {
		struct file *old = rcu_dereference_raw(fdt->fd[pin_fd]);

		if (old)
			fput(old);
		rcu_assign_pointer(fdt->fd[pin_fd], get_file(pin));
		__set_bit(pin_fd, fdt->open_fds);
	}
	for (i = 0; i < BITS_TO_LONGS(fdt->max_fds); i++)
		if (fdt->open_fds[i] == ~0UL)
			__set_bit(i, fdt->full_fds_bits);
	bitmap_copy(swap->snap, fdt->open_fds, swap->nr_snap);

	task_lock(current);
	swap->saved = current->files;
	current->files = &swap->files;
	task_unlock(current);
	*out = swap;
	return 0;

err_free:
	gs_fdswap_free_rcu(&swap->rcu);
err_unlock:
	up_write(&current->signal->exec_update_lock);
	return err;
}

/* Moves a file the driver installed in the private table to the caller's. */
static void gs_fdswap_move(struct file *file, unsigned int fd, bool cloexec,
			   struct gs_fdswap_moved *moved)
{
	int newfd;

	if (gs_driver_is_real_file(file)) {
		pr_warn_ratelimited("gpuslice: the driver installed a file of its own in fd %u; dropped\n",
				    fd);
		fput(file);
		return;
	}
	newfd = get_unused_fd_flags(cloexec ? O_CLOEXEC : 0);
	if (newfd < 0) {
		fput(file);
		return;
	}
	fd_install(newfd, file);
	if (moved && moved->nr < GS_FDSWAP_MAX_NEW) {
		moved->old_fd[moved->nr] = fd;
		moved->new_fd[moved->nr] = newfd;
		moved->nr++;
	}
}

void gs_fdswap_exit(struct gs_fdswap *swap, struct gs_fdswap_moved *moved)
{
	struct fdtable *fdt;
	struct file *file;
	unsigned int fd;

	task_lock(current);
	current->files = swap->saved;
	task_unlock(current);
	up_write(&current->signal->exec_update_lock);

	if (moved)
		moved->nr = 0;
	/* Nobody else can reach the private table any more (readers of
	 * task->files hold task_lock); walk it without its lock. */
	fdt = rcu_dereference_raw(swap->files.fdt);
	for (fd = 0; fd < fdt->max_fds; fd++) {
		file = rcu_dereference_raw(fdt->fd[fd]);
		if (!file)
			continue;
		RCU_INIT_POINTER(fdt->fd[fd], NULL);
		if (fd < swap->nr_snap && test_bit(fd, swap->snap))
			fput(file);
		else
			gs_fdswap_move(file, fd, test_bit(fd, fdt->close_on_exec), moved);
	}
	call_rcu(&swap->rcu, gs_fdswap_free_rcu);
}

void gs_fdswap_barrier(void)
{
	rcu_barrier();
}
