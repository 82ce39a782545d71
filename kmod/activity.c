// SPDX-License-Identifier: GPL-2.0
/*
 * activity.c - the module's sampler of its instances' channels: CHANNEL_WORK.
 *
 * A CUDA process in steady state makes no ioctl: it writes GPFIFO entries and
 * then GPPut in its channels' USERD, mapped into its own address space. So
 * the scheduler learns from the module which instances have work, whatever
 * their processes do while they wait (spin, sleep between polls, block), by
 * looking at USERD. What a look means and where a channel's USERD lies are
 * the decision core's (core/activity.c, shared with the user-space build's
 * sampler, preload/userd.c); this file finds the mappings and looks:
 *
 *  - RM_MAP_MEMORY names the file whose next mmap() maps the object (RM keeps
 *    the mmap context on that file, kernel-open/nvidia/nv-mmap.c): when it
 *    succeeds, gs_activity_map_memory() notes (client, object, offset,
 *    length) on that file if it is a gpuslice node of the same instance;
 *  - gs_mmap() (fops.c) hands the vma to the driver; when that succeeded,
 *    gs_activity_mmap() records the mapping: its mm (mmgrab()), address and
 *    length. nv-mmap.c maps BAR memory at mmap() time
 *    (nv_io_remap_page_range), so a USERD is present from the start;
 *  - every userd_sample_ms (module parameter, default 5; 0: off), while a
 *    netlink listener is subscribed to the events group, the instance's work
 *    item asks the core for its announced channels, finds each one's USERD
 *    in a recorded mapping, and reads the 8 bytes of GPGet | GPPut through
 *    the process's own page tables (kthread_use_mm() and
 *    copy_from_user_nofault()).
 *
 * What a hostile process can do to it, and why that holds:
 *  - the address is read in the process's own mm, never through a kernel
 *    mapping of what RM mapped: once the process unmaps or replaces its
 *    USERD the sampler reads nothing (-EFAULT) or the process's own memory,
 *    and only that process's channel's report depends on it (it could claim
 *    work anyway, by submitting);
 *  - the read never faults and never takes the mm's mmap_lock (page faults
 *    are disabled in copy_from_user_nofault()): a process that holds its
 *    mmap_lock, or maps at that address something whose fault would block
 *    (userfaultfd, a FUSE file), costs the sampler one failed read, not a
 *    wait; every instance has its own work item;
 *  - the mm is pinned with mmgrab() (the struct, not the address space) and
 *    read only after mmget_not_zero(); a mapping whose process has exited is
 *    dropped at the next tick, and mmput_async() leaves the teardown of an
 *    address space to its own worker;
 *  - the tables are bounded: GS_ACT_MAPS mappings per instance (a new one
 *    replaces the oldest that no channel's USERD is in) and GS_ACT_CHANS
 *    channels a tick. A tick compares at most GS_ACT_MAPS * GS_ACT_CHANS
 *    pairs, under this instance's activity lock only.
 *
 * The work item runs in a kernel thread (a workqueue worker), as
 * kthread_use_mm() requires. Its period is rounded up to whole jiffies.
 */
#include <linux/file.h>
#include <linux/jiffies.h>
#include <linux/kthread.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/workqueue.h>

#include "activity.h"
#include "fops.h"
#include "instance.h"
#include "netlink.h"

#define GS_ACT_MAPS		128
#define GS_ACT_CHANS		256
#define GS_ACT_IDLE_MS		100	/* the period while nobody listens */
#define GS_ACT_MAX_MS		1000

static unsigned int gs_sample_ms = 5;
module_param_named(userd_sample_ms, gs_sample_ms, uint, 0644);
MODULE_PARM_DESC(userd_sample_ms,
		 "How often each instance's channels' USERD is read for CHANNEL_WORK events, in ms (0: never, max 1000)");

struct gs_act_map {
	struct mm_struct *mm;	/* mmgrab()bed */
	unsigned long addr;	/* where the mapping starts */
	u64 length;
	u64 offset;		/* into the memory object, at addr */
	u32 client;
	u32 mem;
	bool used;		/* a channel's USERD was found in it */
};

struct gs_act_chan {
	u32 client;
	u32 handle;
	u32 mem;		/* where its USERD is (core/activity.c) */
	u64 off;
	u32 entries;
	struct gs_userd_seen seen;
	/* this tick's */
	struct mm_struct *mm;	/* mmgrab()bed; NULL: not mapped (yet) */
	unsigned long uaddr;
	bool read;		/* looked at (or its process is gone) */
	bool ok;		/* word was read */
	u64 word;
};

struct gs_activity {
	struct gs_instance *inst;
	struct delayed_work work;
	struct mutex lock;	/* maps, nr_maps, stopping, the act_note of the instance's files */
	struct gs_act_map maps[GS_ACT_MAPS];
	unsigned int nr_maps;
	bool stopping;
	/* the work item's own */
	struct gs_act_chan *chans;	/* last tick's, with what each had seen */
	struct gs_act_chan *next;
	unsigned int nr_chans;
	unsigned int nr_next;
};

static unsigned long gs_act_period(bool listening)
{
	unsigned int ms = READ_ONCE(gs_sample_ms);

	if (!listening || !ms)
		ms = GS_ACT_IDLE_MS;
	return msecs_to_jiffies(min_t(unsigned int, ms, GS_ACT_MAX_MS));
}

/* Caller holds act->lock; the map's mm is returned for mmdrop() after it. */
static struct mm_struct *gs_act_map_remove(struct gs_activity *act, unsigned int i)
{
	struct mm_struct *mm = act->maps[i].mm;

	act->maps[i] = act->maps[--act->nr_maps];
	return mm;
}

/* ---- the channels: from the core, with what was seen of each kept ---- */

static int gs_act_collect(void *ctx, const struct gs_object *o)
{
	struct gs_activity *act = ctx;
	struct gs_act_chan *c;

	if (o->obj_kind != GPUSLICE_OBJ_CHANNEL || !gs_object_gateable(o) ||
	    !o->userd_mem || o->gp_entries < 2)
		return 0;
	if (act->nr_next == GS_ACT_CHANS)
		return 1;
	c = &act->next[act->nr_next++];
	memset(c, 0, sizeof(*c));
	c->client = o->client;
	c->handle = o->handle;
	c->mem = o->userd_mem;
	c->off = o->userd_off;
	c->entries = o->gp_entries;
	return 0;
}

static bool gs_act_same(const struct gs_act_chan *a, const struct gs_act_chan *b)
{
	return a->client == b->client && a->handle == b->handle && a->mem == b->mem &&
	       a->off == b->off && a->entries == b->entries;
}

/* next[] takes over what chans[] had seen (the walk's order rarely changes) */
static void gs_act_carry_seen(struct gs_activity *act)
{
	struct gs_act_chan *tmp;
	unsigned int i, j;

	for (i = 0; i < act->nr_next; i++) {
		struct gs_act_chan *c = &act->next[i];

		if (i < act->nr_chans && gs_act_same(c, &act->chans[i])) {
			c->seen = act->chans[i].seen;
			continue;
		}
		for (j = 0; j < act->nr_chans; j++) {
			if (gs_act_same(c, &act->chans[j])) {
				c->seen = act->chans[j].seen;
				break;
			}
		}
	}
	tmp = act->chans;
	act->chans = act->next;
	act->next = tmp;
	act->nr_chans = act->nr_next;
	act->nr_next = 0;
}

/* Under act->lock: where each channel's USERD is mapped; one mmgrab() each. */
static void gs_act_resolve(struct gs_activity *act)
{
	unsigned int i, j;
	u64 at;

	for (j = 0; j < act->nr_maps; j++)
		act->maps[j].used = false;
	for (i = 0; i < act->nr_chans; i++) {
		struct gs_act_chan *c = &act->chans[i];

		for (j = 0; j < act->nr_maps; j++) {
			struct gs_act_map *m = &act->maps[j];

			if (m->client != c->client || m->mem != c->mem ||
			    !gs_userd_locate(c->off, m->offset, m->length, &at))
				continue;
			m->used = true;
			c->mm = m->mm;
			c->uaddr = m->addr + at;
			mmgrab(c->mm);
			break;
		}
	}
}

/*
 * Reads every resolved channel's word, one mm at a time, in that mm. Never
 * faults, never waits for the mm's locks.
 */
static void gs_act_read(struct gs_activity *act)
{
	unsigned int i, j;

	for (i = 0; i < act->nr_chans; i++) {
		struct mm_struct *mm = act->chans[i].mm;

		if (!mm || act->chans[i].read)
			continue;
		if (!mmget_not_zero(mm)) {
			for (j = i; j < act->nr_chans; j++)
				if (act->chans[j].mm == mm)
					act->chans[j].read = true;	/* gone: nothing */
			continue;
		}
		kthread_use_mm(mm);
		for (j = i; j < act->nr_chans; j++) {
			struct gs_act_chan *c = &act->chans[j];
			u64 w;

			if (c->mm != mm || c->read)
				continue;
			c->read = true;
			/* not mapped there any more, or not present: no evidence */
			c->ok = !copy_from_user_nofault(&w, (const void __user *)c->uaddr, sizeof(w));
			c->word = c->ok ? w : 0;
		}
		kthread_unuse_mm(mm);
		mmput_async(mm);
	}
}

static void gs_act_report(struct gs_activity *act)
{
	u64 now = ktime_get_ns();
	unsigned int i;

	for (i = 0; i < act->nr_chans; i++) {
		struct gs_act_chan *c = &act->chans[i];
		struct gs_event ev = {
			.type = GPUSLICE_EV_CHANNEL_WORK,
			.obj_kind = GPUSLICE_OBJ_CHANNEL,
			.client = c->client,
			.handle = c->handle,
		};

		if (c->ok && gs_userd_seen(&c->seen, c->word, c->entries, now))
			gs_netlink_event(act->inst, &ev);
	}
}

static void gs_act_work(struct work_struct *work)
{
	struct gs_activity *act = container_of(to_delayed_work(work), struct gs_activity, work);
	struct mm_struct *gone[8];
	unsigned int i, nr_gone = 0;
	bool listening = gs_netlink_listening() && READ_ONCE(gs_sample_ms);
	bool again;

	if (listening) {
		act->nr_next = 0;
		gs_for_each_object(act->inst->core, gs_act_collect, act);
		gs_act_carry_seen(act);
		mutex_lock(&act->lock);
		gs_act_resolve(act);
		mutex_unlock(&act->lock);
		gs_act_read(act);
		gs_act_report(act);
		for (i = 0; i < act->nr_chans; i++) {
			if (act->chans[i].mm)
				mmdrop(act->chans[i].mm);
			act->chans[i].mm = NULL;
			act->chans[i].read = false;
			act->chans[i].ok = false;
		}
	}

	/* mappings of processes that are gone (a few a tick) */
	mutex_lock(&act->lock);
	for (i = 0; i < act->nr_maps && nr_gone < ARRAY_SIZE(gone);) {
		if (!atomic_read(&act->maps[i].mm->mm_users))
			gone[nr_gone++] = gs_act_map_remove(act, i);
		else
			i++;
	}
	again = act->nr_maps && !act->stopping;
	if (again)
		queue_delayed_work(system_unbound_wq, &act->work, gs_act_period(listening));
	mutex_unlock(&act->lock);
	for (i = 0; i < nr_gone; i++)
		mmdrop(gone[i]);
}

int gs_activity_new(struct gs_instance *inst)
{
	struct gs_activity *act;

	act = kzalloc(sizeof(*act), GFP_KERNEL);
	if (!act)
		return -ENOMEM;
	act->chans = kvcalloc(GS_ACT_CHANS, sizeof(*act->chans), GFP_KERNEL);
	act->next = kvcalloc(GS_ACT_CHANS, sizeof(*act->next), GFP_KERNEL);
	if (!act->chans || !act->next) {
		kvfree(act->next);
		kvfree(act->chans);
		kfree(act);
		return -ENOMEM;
	}
	act->inst = inst;
	mutex_init(&act->lock);
	INIT_DELAYED_WORK(&act->work, gs_act_work);
	inst->act = act;
	return 0;
}

void gs_activity_free(struct gs_instance *inst)
{
	struct gs_activity *act = inst->act;

	if (!act)
		return;
	mutex_lock(&act->lock);
	act->stopping = true;
	mutex_unlock(&act->lock);
	cancel_delayed_work_sync(&act->work);
	while (act->nr_maps)
		mmdrop(gs_act_map_remove(act, act->nr_maps - 1));
	mutex_destroy(&act->lock);
	kvfree(act->next);
	kvfree(act->chans);
	kfree(act);
	inst->act = NULL;
}

void gs_activity_map_memory(struct gs_instance *inst, int fd, u32 client, u32 mem,
			    u64 offset, u64 length)
{
	struct gs_activity *act = inst->act;
	struct file *f;
	struct gs_file *pf;

	if (!act || fd < 0)
		return;
	f = fget(fd);
	if (!f)
		return;
	pf = f->f_op == &gs_fops ? f->private_data : NULL;
	if (pf && pf->node->inst == inst) {
		mutex_lock(&act->lock);
		pf->act_note.valid = true;
		pf->act_note.client = client;
		pf->act_note.mem = mem;
		pf->act_note.offset = offset;
		pf->act_note.length = length;
		mutex_unlock(&act->lock);
	}
	fput(f);
}

void gs_activity_mmap(struct gs_file *gf, struct vm_area_struct *vma)
{
	struct gs_activity *act = gf->node->inst->act;
	struct mm_struct *evicted = NULL;
	struct gs_act_note note;
	struct gs_act_map *m;
	unsigned int i;

	if (!act)
		return;
	mutex_lock(&act->lock);
	note = gf->act_note;
	gf->act_note.valid = false;	/* one mapping per RM_MAP_MEMORY */
	if (!note.valid || act->stopping)
		goto out;
	if (act->nr_maps == GS_ACT_MAPS) {
		for (i = 0; i < act->nr_maps && act->maps[i].used; i++)
			;
		if (i == act->nr_maps)
			goto out;	/* every one holds a channel's USERD */
		evicted = gs_act_map_remove(act, i);
	}
	m = &act->maps[act->nr_maps++];
	m->mm = vma->vm_mm;
	mmgrab(m->mm);
	m->addr = vma->vm_start;
	/* nv-mmap.c maps whole pages: the object's offset rounded down is at vm_start */
	m->offset = note.offset & PAGE_MASK;
	m->length = min_t(u64, vma->vm_end - vma->vm_start,
			  PAGE_ALIGN(note.length + offset_in_page(note.offset)));
	m->client = note.client;
	m->mem = note.mem;
	m->used = false;
	queue_delayed_work(system_unbound_wq, &act->work, 0);
out:
	mutex_unlock(&act->lock);
	if (evicted)
		mmdrop(evicted);
}
