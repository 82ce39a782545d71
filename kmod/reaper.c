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
 *
 * Each instance has its own reaper (struct gs_reaper in struct gs_instance):
 * a list, its lock and a delayed work item on gs_reap_wq, an unbound
 * workqueue that runs the instances' items side by side. A close() waits only
 * for its own instance's item, so one instance's slow teardown (RM releasing
 * a file with many clients, the core walking a big object table) never holds
 * up another instance's close() or exit.
 *
 * Instances can hold each other's real files: REGISTER_FD on one instance's
 * nvidia<N> file may name another instance's nvidiactl file (the fd swap puts
 * every gpuslice file of the caller's table, of any instance, in the driver's
 * view; the core lets GPU files have REGISTER_FD). Reaping such a GPU file
 * drops the other instance's file to its last reference; that instance's
 * item polls while its list is not empty, and is kicked at once too.
 *
 * Lifetime: a file on an instance's list keeps the instance's node open
 * (nr_open), so the instance is not deleted, and holds the module. The
 * instance's release cancels its item (gs_reaper_teardown()), which may still
 * be running after it closed the last node; module exit releases every
 * instance before it destroys gs_reap_wq.
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

static struct workqueue_struct *gs_reap_wq;

/* Runs in a kworker: __fput_sync() is for kernel threads only. */
static void gs_reap_one(struct gs_file *gf)
{
	struct gs_instance *inst = gf->node->inst;

	__fput_sync(gf->real);	/* the driver's release() runs here */
	gs_gate_enter_wait(&inst->gate);	/* a handover closes it for a bounded time */
	gs_file_closed(inst->core, gf->id);
	gs_gate_leave(&inst->gate);
	gs_node_close(gf->node);	/* the instance may be deleted from here on */
	kfree(gf);
	module_put(THIS_MODULE);
}

/*
 * A GPU file just reaped may have held another instance's nvidiactl file
 * (REGISTER_FD): let the instances with files pending look now rather than at
 * their next poll. Listed instances are not released; queueing never waits.
 */
static void gs_reaper_kick_others(struct gs_reaper *self)
{
	struct gs_instance *inst;

	mutex_lock(&gs_instances_lock);
	list_for_each_entry(inst, &gs_instances, list)
		if (&inst->reaper != self && !list_empty_careful(&inst->reaper.list))
			mod_delayed_work(gs_reap_wq, &inst->reaper.work, 0);
	mutex_unlock(&gs_instances_lock);
}

static void gs_reap_fn(struct work_struct *work)
{
	struct gs_reaper *r = container_of(to_delayed_work(work), struct gs_reaper, work);
	struct gs_file *gf, *tmp;
	LIST_HEAD(ready);
	bool again = true, kick = false, left;

	/*
	 * Releasing one real file can drop the last other reference to
	 * another (an nvidia<N> file lets go of its nvidiactl file): go
	 * round until nothing more is ready.
	 */
	while (again) {
		mutex_lock(&r->lock);
		list_for_each_entry_safe(gf, tmp, &r->list, reap)
			if (file_count(gf->real) == 1)
				list_move_tail(&gf->reap, &ready);
		again = !list_empty(&ready);
		left = !list_empty(&r->list);
		mutex_unlock(&r->lock);

		list_for_each_entry_safe(gf, tmp, &ready, reap) {
			list_del(&gf->reap);
			kick |= gf->node->kind == GS_FILE_GPU;
			gs_reap_one(gf);
		}
	}
	if (left)
		queue_delayed_work(gs_reap_wq, &r->work, msecs_to_jiffies(GS_REAP_MS));
	if (kick)
		gs_reaper_kick_others(r);
}

void gs_reaper_setup(struct gs_reaper *r)
{
	mutex_init(&r->lock);
	INIT_LIST_HEAD(&r->list);
	INIT_DELAYED_WORK(&r->work, gs_reap_fn);
}

void gs_reaper_teardown(struct gs_reaper *r)
{
	/* the item may still run: it closed the last node, then looks again */
	cancel_delayed_work_sync(&r->work);
	WARN_ON(!list_empty(&r->list));
	mutex_destroy(&r->lock);
}

void gs_reaper_add(struct gs_file *gf)
{
	struct gs_instance *inst = gf->node->inst;
	struct gs_reaper *r = &inst->reaper;

	/*
	 * gf keeps the node open, so the instance is listed and referenced
	 * now; once gf is on the list, the item may reap it and the instance
	 * be deleted before the flush below: hold it until then.
	 */
	kref_get(&inst->ref);
	__module_get(THIS_MODULE);
	mutex_lock(&r->lock);
	list_add_tail(&gf->reap, &r->list);
	mutex_unlock(&r->lock);
	/*
	 * The common case: nobody else holds the real file. Wait for it, so
	 * that the caller's close() or exit returns with RM's memory freed
	 * and the instance's accounting showing it.
	 */
	gs_reaper_flush(r);
	gs_instance_put(inst);
}

void gs_reaper_flush(struct gs_reaper *r)
{
	mod_delayed_work(gs_reap_wq, &r->work, 0);
	flush_delayed_work(&r->work);
}

int gs_reaper_init(void)
{
	gs_reap_wq = alloc_workqueue("gpuslice_reap", WQ_UNBOUND, 0);
	return gs_reap_wq ? 0 : -ENOMEM;
}

/* Every instance, and with it its item, is gone: each pending file holds the module. */
void gs_reaper_exit(void)
{
	destroy_workqueue(gs_reap_wq);
}
