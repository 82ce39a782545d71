// SPDX-License-Identifier: GPL-2.0
/*
 * reaper.c - a real file outlives the gpuslice file that wrapped it.
 *
 * RM frees a client, and the video memory, TSGs and channels under it, when
 * the real nvidiactl file that owns the client is released
 * (kernel-open/nvidia/nv.c nvidia_close() -> rm_cleanup_file_private()).
 * That release can come long after the gpuslice file's:
 *  - an mmap() of a gpuslice node leaves the real file in the vma
 *    (fops.c gs_mmap(), vma_set_file()) until munmap or exit;
 *  - NV_ESC_REGISTER_FD makes the real nvidia<N> file hold the real
 *    nvidiactl file until the nvidia<N> file is released (nv.c: the ctl file
 *    is fget() and kept in the nvidia<N> file's private data);
 *  - the fd-translation window of another thread's call holds it briefly
 *    (fdswap.c).
 * (dup, fork and SCM_RIGHTS share the gpuslice file itself, which is released
 * with the last of them: nothing to do for those.)
 *
 * So release() does not end the accounting. It hands the gpuslice file to the
 * reaper, which keeps the module's reference to the real file. Once that is
 * the only reference left (file_count() == 1), nothing can take another: a
 * real file is reachable only through its gpuslice file, which is gone, and
 * through vmas and driver objects, which already hold a reference each. The
 * reaper then drops it synchronously (__fput_sync(): RM has freed the clients
 * when it returns) and only then tells the core that the file's clients are
 * gone. Until then the bytes stay charged, the TSGs and channels stay
 * registered (so the scheduler keeps gating them), the instance cannot be
 * deleted (its node stays open) and the module cannot be unloaded.
 *
 * A file whose real file has no other holder at release() is reaped before
 * release() returns, so close() and exit return with the memory freed and
 * accounted, as before. The rest are polled every GS_REAP_MS.
 */
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/list.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/workqueue.h>

#include "fops.h"
#include "instance.h"
#include "reaper.h"

#define GS_REAP_MS	20

static DEFINE_MUTEX(gs_reap_lock);
static LIST_HEAD(gs_reap_list);
static void gs_reap_fn(struct work_struct *work);
static DECLARE_DELAYED_WORK(gs_reap_work, gs_reap_fn);

/* Runs in a kworker: __fput_sync() is for kernel threads only. */
static void gs_reap_one(struct gs_file *gf)
{
	struct gs_instance *inst = gf->node->inst;

	__fput_sync(gf->real);	/* the driver's release() runs here */
	gs_file_closed(inst->core, gf->id);
	gs_node_close(gf->node);
	kfree(gf);
	module_put(THIS_MODULE);
}

static void gs_reap_fn(struct work_struct *work)
{
	struct gs_file *gf, *tmp;
	LIST_HEAD(ready);
	bool again = true, left;

	/*
	 * Releasing one real file can drop the last other reference to
	 * another (an nvidia<N> file lets go of its nvidiactl file): go
	 * round until nothing more is ready.
	 */
	while (again) {
		mutex_lock(&gs_reap_lock);
		list_for_each_entry_safe(gf, tmp, &gs_reap_list, reap)
			if (file_count(gf->real) == 1)
				list_move_tail(&gf->reap, &ready);
		again = !list_empty(&ready);
		left = !list_empty(&gs_reap_list);
		mutex_unlock(&gs_reap_lock);

		list_for_each_entry_safe(gf, tmp, &ready, reap) {
			list_del(&gf->reap);
			gs_reap_one(gf);
		}
	}
	if (left)
		schedule_delayed_work(&gs_reap_work, msecs_to_jiffies(GS_REAP_MS));
}

void gs_reaper_add(struct gs_file *gf)
{
	__module_get(THIS_MODULE);
	mutex_lock(&gs_reap_lock);
	list_add_tail(&gf->reap, &gs_reap_list);
	mutex_unlock(&gs_reap_lock);
	/*
	 * The common case: nobody else holds the real file. Wait for it, so
	 * that the caller's close() or exit returns with RM's memory freed
	 * and the instance's accounting showing it.
	 */
	gs_reaper_flush();
}

void gs_reaper_flush(void)
{
	mod_delayed_work(system_wq, &gs_reap_work, 0);
	flush_delayed_work(&gs_reap_work);
}

void gs_reaper_exit(void)
{
	cancel_delayed_work_sync(&gs_reap_work);
	WARN_ON(!list_empty(&gs_reap_list));
}
