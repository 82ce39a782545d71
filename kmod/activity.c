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
 *  - RM_MAP_MEMORY names the file whose mmap() maps the object (RM keeps
 *    the mmap context on that file, kernel-open/nvidia/nv-usermap.c): when
 *    it succeeds, gs_activity_map_memory() notes (client, object, offset,
 *    length, as the core checked them, and the in-page part of the address
 *    RM returned, which user space adds to what mmap() returns) on that file
 *    if it is a gpuslice node of the same instance;
 *  - gs_mmap() (fops.c) hands the vma to the driver; when that succeeded,
 *    gs_activity_mmap() records the mapping: its mm (mmgrab()), the driver's
 *    file, address and length. nv-mmap.c maps BAR memory at mmap() time
 *    (nv_io_remap_page_range), so a USERD is present from the start (until
 *    the driver revokes its mappings for a power transition or a reset:
 *    then this sees nothing until the process touches the page again);
 *  - every userd_sample_ms (module parameter, default 5; 0: off), or every
 *    SAMPLE_US of the instance when the controller set it (INSTANCE_SET:
 *    online instances beside offline ones, whose work must preempt at once),
 *    while a netlink listener is subscribed to the events group, the
 *    instance's work item takes its announced channels from the core (again only when one
 *    came or went: CHANNEL_NEW / CHANNEL_DEL, or every second), finds each
 *    one's USERD in a recorded mapping, and reads the 8 bytes of GPGet |
 *    GPPut with one load through the process's own page tables
 *    (kthread_use_mm(), __get_user() with page faults disabled), after
 *    checking under mmap_read_trylock() that the address is still in the
 *    mapping that was recorded.
 *
 * What a hostile process can do to it, and why that holds:
 *  - the address is read in the process's own mm, never through a kernel
 *    mapping of what RM mapped: once the process unmaps or replaces its
 *    USERD the sampler reads nothing (-EFAULT) or the process's own memory,
 *    and only that process's channel's report depends on it (it could claim
 *    work anyway, by submitting);
 *  - the read never faults and never waits for the mm's mmap_lock (a
 *    trylock; page faults disabled): a process that holds its mmap_lock, or
 *    maps at that address something whose fault would block (userfaultfd, a
 *    FUSE file), costs the sampler one missed look, not a wait; every
 *    instance has its own work item;
 *  - the mm is pinned with mmgrab() (the struct, not the address space) and
 *    read only after mmget_not_zero(); a mapping whose process has exited is
 *    dropped at the next tick, and mmput_async() leaves the teardown of an
 *    address space to its own worker;
 *  - the tables are bounded: GS_ACT_MAPS mappings per instance (a new one
 *    replaces the oldest that no channel's USERD is in) and GS_ACT_CHANS
 *    channels; a channel's USERD is looked for once per memory object, not
 *    once per channel;
 *  - what reaches the controller is bounded: at most one CHANNEL_WORK per
 *    instance a tick and per GS_ACT_REPEAT_NS, or per the instance's
 *    REPEAT_US (at least GPUSLICE_REPEAT_US_MIN; the controller decides per
 *    instance), so no instance can flood the events socket that carries
 *    every instance's events. Only the controller (CAP_SYS_ADMIN) sets an
 *    instance's SAMPLE_US and REPEAT_US.
 *
 * The work item runs in a kernel thread (a workqueue worker), as
 * kthread_use_mm() requires; an hrtimer queues it after each period, so
 * SAMPLE_US is not rounded to jiffies (a quarter of the period is left to
 * the timer as slack).
 */
#include <linux/file.h>
#include <linux/hrtimer.h>
#include <linux/kthread.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/workqueue.h>

#include "activity.h"
#include "fops.h"
#include "instance.h"
#include "netlink.h"

#define GS_ACT_MAPS		256
#define GS_ACT_CHANS		256
#define GS_ACT_IDLE_MS		100	/* the period while nobody listens */
#define GS_ACT_MAX_MS		1000
#define GS_ACT_RESYNC_NS	NSEC_PER_SEC	/* the channels from the core at least this often */
/*
 * An instance's CHANNEL_WORK at most this often: the controller holds an
 * instance busy for 300 ms after a report, and every listener parses every
 * report of every instance.
 */
#define GS_ACT_REPEAT_NS	(50 * NSEC_PER_MSEC)

static unsigned int gs_sample_ms = 5;
module_param_named(userd_sample_ms, gs_sample_ms, uint, 0644);
MODULE_PARM_DESC(userd_sample_ms,
		 "How often each instance's channels' USERD is read for CHANNEL_WORK events, in ms (0: never, max 1000)");

struct gs_act_map {
	struct mm_struct *mm;	/* mmgrab()bed */
	const struct file *file;	/* the driver's file the vma had (compared, never used) */
	unsigned long vm_start;
	unsigned long addr;	/* where offset of the object is */
	u64 length;		/* bytes of the object from addr */
	u64 offset;
	u32 client;
	u32 mem;
	u64 seq;		/* when recorded: the oldest goes first */
	bool used;		/* a channel's USERD was found in it, last tick */
	bool stale;		/* not in its process any more: goes at the tick's end */
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
	u64 map_seq;		/* the mapping it was found in */
	bool stale;		/* that mapping is not there any more */
	const struct file *file;
	unsigned long vm_start;
	unsigned long uaddr;
	bool read;		/* looked at (or its process is gone) */
	bool ok;		/* word was read */
	u64 word;
};

struct gs_activity {
	struct gs_instance *inst;
	struct work_struct work;
	struct hrtimer timer;	/* queues work when the period is over */
	struct mutex lock;	/* maps, nr_maps, map_seq, stopping, the act_note of the instance's files */
	struct gs_act_map maps[GS_ACT_MAPS];
	unsigned int nr_maps;
	u64 map_seq;
	bool stopping;
	atomic_t chan_gen;	/* bumped by CHANNEL_NEW / CHANNEL_DEL */
	/* the work item's own */
	int walked_gen;
	u64 walked_ns;
	u64 sent_ns;		/* the instance's last CHANNEL_WORK */
	struct gs_act_chan *chans;	/* with what each had seen */
	struct gs_act_chan *next;
	unsigned int nr_chans;
	unsigned int nr_next;
};

/* ns to the next look: the instance's SAMPLE_US, else userd_sample_ms, while someone listens */
static u64 gs_act_period_ns(struct gs_activity *act, bool listening)
{
	unsigned int ms = READ_ONCE(gs_sample_ms);
	u32 us = READ_ONCE(act->inst->sample_us);

	if (listening && us)
		return (u64)us * NSEC_PER_USEC;
	if (!listening || !ms)
		ms = GS_ACT_IDLE_MS;
	return (u64)min_t(unsigned int, ms, GS_ACT_MAX_MS) * NSEC_PER_MSEC;
}

/* CHANNEL_WORK of the instance, and of one channel, at most this often while it submits */
static u64 gs_act_repeat_ns(struct gs_activity *act, u64 dflt)
{
	u32 us = READ_ONCE(act->inst->repeat_us);

	return us ? (u64)us * NSEC_PER_USEC : dflt;
}

static enum hrtimer_restart gs_act_tick(struct hrtimer *timer)
{
	struct gs_activity *act = container_of(timer, struct gs_activity, timer);

	queue_work(system_unbound_wq, &act->work);
	return HRTIMER_NORESTART;
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

/* The core's announced channels, when they changed; each keeps what it had seen. */
static void gs_act_walk(struct gs_activity *act)
{
	int gen = atomic_read(&act->chan_gen);
	u64 now = ktime_get_ns();
	struct gs_act_chan *tmp;
	unsigned int i, j;

	if (gen == act->walked_gen && now - act->walked_ns < GS_ACT_RESYNC_NS)
		return;
	/* a handover has the gate closed: walk at the next round */
	if (!gs_gate_tryenter(&act->inst->gate))
		return;
	act->walked_gen = gen;
	act->walked_ns = now;
	act->nr_next = 0;
	gs_for_each_object(act->inst->core, gs_act_collect, act);
	gs_gate_leave(&act->inst->gate);
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

/* Under act->lock: a mapping of (client, mem) that holds USERD at off, or NULL. */
static struct gs_act_map *gs_act_find(struct gs_activity *act, const struct gs_act_chan *c, u64 *at)
{
	struct gs_act_map *found = NULL;
	unsigned int j;
	u64 where;

	/* the newest: a process that mapped it again reads its live mapping */
	for (j = 0; j < act->nr_maps; j++) {
		struct gs_act_map *m = &act->maps[j];

		if (m->client == c->client && m->mem == c->mem &&
		    gs_userd_locate(c->off, m->offset, m->length, &where) &&
		    (!found || m->seq > found->seq)) {
			found = m;
			*at = where;
		}
	}
	return found;
}

/*
 * Under act->lock: where each channel's USERD is mapped; one mmgrab() each.
 * CUDA's channels of a context share one USERD object: the mapping found for
 * the channel before serves the next one of the same object.
 */
static void gs_act_resolve(struct gs_activity *act)
{
	const struct gs_act_map *last = NULL;
	unsigned int i, j;
	u64 at;

	for (j = 0; j < act->nr_maps; j++)
		act->maps[j].used = false;
	for (i = 0; i < act->nr_chans; i++) {
		struct gs_act_chan *c = &act->chans[i];
		struct gs_act_map *m = NULL;

		if (last && last->client == c->client && last->mem == c->mem &&
		    gs_userd_locate(c->off, last->offset, last->length, &at))
			m = (struct gs_act_map *)last;
		else
			m = gs_act_find(act, c, &at);
		if (!m)
			continue;
		last = m;
		m->used = true;
		c->map_seq = m->seq;
		c->mm = m->mm;
		c->file = m->file;
		c->vm_start = m->vm_start;
		c->uaddr = m->addr + at;
		mmgrab(c->mm);
	}
}

/*
 * One 8-byte load (GPGet and GPPut together, as a GPU's USERD is read), in
 * the current mm, if the address is still in the mapping that was recorded.
 * Caller holds the mm's mmap_lock for reading. Never faults.
 */
static bool gs_act_load(struct gs_act_chan *c, u64 *w)
{
	const u64 __user *p = (const u64 __user *)c->uaddr;
	struct vm_area_struct *vma;
	int err;

	if (!IS_ALIGNED(c->uaddr, sizeof(u64)) || !access_ok(p, sizeof(*w))) {
		c->stale = true;
		return false;
	}
	vma = find_vma(current->mm, c->uaddr);
	if (!vma || vma->vm_start > c->uaddr || vma->vm_file != c->file ||
	    vma->vm_start != c->vm_start || c->uaddr + sizeof(*w) > vma->vm_end) {
		c->stale = true;	/* unmapped or replaced: the record goes */
		return false;
	}
	pagefault_disable();
	err = __get_user(*w, p);
	pagefault_enable();
	return !err;
}

/* Reads every resolved channel's word, one mm at a time, in that mm. */
static void gs_act_read(struct gs_activity *act)
{
	unsigned int i, j;

	for (i = 0; i < act->nr_chans; i++) {
		struct mm_struct *mm = act->chans[i].mm;
		bool live;

		if (!mm || act->chans[i].read)
			continue;
		live = mmget_not_zero(mm);
		if (live && !mmap_read_trylock(mm)) {
			mmput_async(mm);
			live = false;	/* busy: no look this tick */
		}
		if (live)
			kthread_use_mm(mm);
		for (j = i; j < act->nr_chans; j++) {
			struct gs_act_chan *c = &act->chans[j];

			if (c->mm != mm || c->read)
				continue;
			c->read = true;
			c->ok = live && gs_act_load(c, &c->word);
		}
		if (live) {
			kthread_unuse_mm(mm);
			mmap_read_unlock(mm);
			mmput_async(mm);
		}
		cond_resched();
	}
}

/* At most one CHANNEL_WORK per instance a tick and per GS_ACT_REPEAT_NS (or REPEAT_US). */
static void gs_act_report(struct gs_activity *act)
{
	u64 now = ktime_get_ns();
	u64 chan_repeat = gs_act_repeat_ns(act, GS_WORK_REPEAT_NS);
	struct gs_act_chan *first = NULL;
	unsigned int i;

	for (i = 0; i < act->nr_chans; i++) {
		struct gs_act_chan *c = &act->chans[i];

		/* every channel's look is judged: each keeps its own state */
		if (c->ok && gs_userd_seen_every(&c->seen, c->word, c->entries, now, chan_repeat) &&
		    !first)
			first = c;
	}
	if (first && (!act->sent_ns || now - act->sent_ns >= gs_act_repeat_ns(act, GS_ACT_REPEAT_NS))) {
		struct gs_event ev = {
			.type = GPUSLICE_EV_CHANNEL_WORK,
			.obj_kind = GPUSLICE_OBJ_CHANNEL,
			.client = first->client,
			.handle = first->handle,
		};

		act->sent_ns = now;
		gs_netlink_event(act->inst, &ev);
	}
}

/* Under act->lock: the mapping recorded as seq is not in its process any more. */
static void gs_act_mark_stale(struct gs_activity *act, u64 seq)
{
	unsigned int j;

	for (j = 0; j < act->nr_maps; j++)
		if (act->maps[j].seq == seq)
			act->maps[j].stale = true;
}

static void gs_act_work(struct work_struct *work)
{
	struct gs_activity *act = container_of(work, struct gs_activity, work);
	bool listening = READ_ONCE(gs_sample_ms) && gs_netlink_listening();
	struct mm_struct *gone[8];
	unsigned int i, nr_gone = 0;

	gs_act_walk(act);
	mutex_lock(&act->lock);
	gs_act_resolve(act);	/* also when nobody listens: which mappings to keep */
	mutex_unlock(&act->lock);
	if (listening) {
		gs_act_read(act);
		gs_act_report(act);
	}
	mutex_lock(&act->lock);
	for (i = 0; i < act->nr_chans; i++)
		if (act->chans[i].stale)
			gs_act_mark_stale(act, act->chans[i].map_seq);
	/* mappings gone from their process, or whose process is gone (a few a tick) */
	for (i = 0; i < act->nr_maps && nr_gone < ARRAY_SIZE(gone);) {
		if (act->maps[i].stale || !atomic_read(&act->maps[i].mm->mm_users))
			gone[nr_gone++] = gs_act_map_remove(act, i);
		else
			i++;
	}
	if (act->nr_maps && !act->stopping) {
		u64 ns = gs_act_period_ns(act, listening);

		hrtimer_start_range_ns(&act->timer, ns_to_ktime(ns), ns / 4, HRTIMER_MODE_REL);
	}
	mutex_unlock(&act->lock);
	for (i = 0; i < act->nr_chans; i++) {
		struct gs_act_chan *c = &act->chans[i];

		if (c->mm)
			mmdrop(c->mm);
		c->mm = NULL;
		c->read = false;
		c->ok = false;
		c->stale = false;
	}
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
	act->walked_gen = -1;
	mutex_init(&act->lock);
	INIT_WORK(&act->work, gs_act_work);
	hrtimer_init(&act->timer, CLOCK_MONOTONIC, HRTIMER_MODE_REL);
	act->timer.function = gs_act_tick;
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
	/* the timer queues the work, the work arms the timer only while not stopping */
	hrtimer_cancel(&act->timer);
	cancel_work_sync(&act->work);
	while (act->nr_maps)
		mmdrop(gs_act_map_remove(act, act->nr_maps - 1));
	mutex_destroy(&act->lock);
	kvfree(act->next);
	kvfree(act->chans);
	kfree(act);
	inst->act = NULL;
}

void gs_activity_channels_changed(struct gs_instance *inst)
{
	if (inst->act)
		atomic_inc(&inst->act->chan_gen);
}

void gs_activity_map_memory(struct gs_instance *inst, int fd, const struct gs_act_note *note)
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
		pf->act_note = *note;
		pf->act_note.valid = true;
		mutex_unlock(&act->lock);
	}
	fput(f);
}

/* Under act->lock: a free slot, making room by dropping the oldest unused. */
static struct gs_act_map *gs_act_map_slot(struct gs_activity *act, struct mm_struct **evicted)
{
	unsigned int i, old = GS_ACT_MAPS;

	if (act->nr_maps < GS_ACT_MAPS)
		return &act->maps[act->nr_maps++];
	for (i = 0; i < act->nr_maps; i++)
		if (!act->maps[i].used && (old == GS_ACT_MAPS || act->maps[i].seq < act->maps[old].seq))
			old = i;
	if (old == GS_ACT_MAPS)
		return NULL;	/* every one holds a channel's USERD */
	*evicted = act->maps[old].mm;
	return &act->maps[old];
}

void gs_activity_mmap(struct gs_file *gf, struct vm_area_struct *vma)
{
	struct gs_activity *act = gf->node->inst->act;
	struct mm_struct *evicted = NULL;
	struct gs_act_note note;
	struct gs_act_map *m;
	u64 len = vma->vm_end - vma->vm_start;
	bool first;

	if (!act)
		return;
	mutex_lock(&act->lock);
	/* RM's context stays on the file: every mmap() of it maps the same object */
	note = gf->act_note;
	if (!note.valid || act->stopping || note.inpage >= len)
		goto out;
	first = !act->nr_maps;
	m = gs_act_map_slot(act, &evicted);
	if (!m)
		goto out;
	m->mm = vma->vm_mm;
	mmgrab(m->mm);
	m->file = vma->vm_file;
	m->vm_start = vma->vm_start;
	/* the object's offset is where user space finds it: the base plus the in-page part */
	m->addr = vma->vm_start + note.inpage;
	m->offset = note.offset;
	m->length = min_t(u64, len - note.inpage, note.length);
	m->client = note.client;
	m->mem = note.mem;
	m->seq = ++act->map_seq;
	m->used = false;
	m->stale = false;
	/*
	 * The work item runs while there are mappings and queues itself: only
	 * the first one starts it (a kick per mmap() would let a process keep
	 * it running back to back).
	 */
	if (first)
		queue_work(system_unbound_wq, &act->work);
out:
	mutex_unlock(&act->lock);
	if (evicted)
		mmdrop(evicted);
}
