// SPDX-License-Identifier: GPL-2.0
/*
 * nvstub_engine.c - the simulated compute engine of nvstub. A TEST DOUBLE:
 * it imitates the GPU's TSG time-slicing scheduler so that gpuslice's
 * scheduling can be measured in a VM; it executes nothing.
 *
 * Work is a duration in ns queued on a channel with NVSTUB_ESC_SUBMIT
 * (nvstub_uapi.h). One kernel thread runs the TSGs (KEPLER_CHANNEL_GROUP_A)
 * round-robin, in real time:
 *  - a TSG takes part only once NVA06C_CTRL_CMD_GPFIFO_SCHEDULE enabled it
 *    (bEnable=0 later has no effect, as measured on the H100, docs/h100-findings.md);
 *  - a turn lasts the TSG's timeslice (default 1000 us, SET_TIMESLICE
 *    changes it) or until none of its channels has enabled, pending work;
 *    an idle TSG is skipped (work-conserving);
 *  - a turn owns the engine on a continuous timeline: the thread waits in
 *    chunks of at most NVSTUB_CHUNK_NS and after each chunk charges the wall
 *    time since the last charge to the TSG's runnable channel(s), in list
 *    order, so the time the thread spends between chunks is not lost;
 *  - FIFO_DISABLE_CHANNELS on a channel of the running TSG preempts it at
 *    once, as the GPU does: the channel is charged up to the moment of the
 *    disable and the waiting thread is woken to pick the next TSG;
 *  - the next turn starts where the last one ended (or when its TSG became
 *    runnable, if later), not when the thread gets to it;
 *  - a turn that overran its timeslice (sleep wake-up latency) carries the
 *    excess, up to NVSTUB_MAX_DEBT_SLICES slices, into the TSG's next turn,
 *    so long-run shares follow the timeslice ratio (deficit round-robin); a
 *    TSG in debt gives its turn to another runnable one, never to an idle
 *    engine.
 * The thread runs SCHED_FIFO (above the daemon) and mostly sleeps.
 * /proc/nvstub/engine reports executed, pending and enabled (not disabled by
 * FIFO_DISABLE_CHANNELS) time per channel, and its TSG's debt.
 */
#include <linux/kthread.h>
#include <linux/ktime.h>
#include <linux/mm.h>
#include <linux/sched.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/wait.h>

#include "nvstub.h"
#include "nvstub_uapi.h"

#define NVSTUB_DEFAULT_TIMESLICE_US	1000
#define NVSTUB_MIN_TIMESLICE_NS		(100 * NSEC_PER_USEC)
#define NVSTUB_CHUNK_NS			(100 * NSEC_PER_USEC)
#define NVSTUB_MAX_DEBT_SLICES		8

struct nvstub_tsg {
	struct list_head node;		/* nvstub_tsgs, in round-robin order */
	struct list_head chans;
	struct nvstub_obj *obj;
	u64 timeslice_us;
	bool scheduled;
	u64 debt_ns;
};

struct nvstub_chan {
	struct list_head node;		/* tsg->chans */
	struct nvstub_obj *obj;
	struct nvstub_tsg *tsg;
	u32 id;
	pid_t pid;
	u64 executed_ns;
	u64 pending_ns;
	u64 disabled_at;	/* ktime of the last disable */
	u64 enabled_at;		/* ktime of the last enable (or of creation) */
	u64 work_at;		/* ktime its pending work last went from 0 to >0 */
	u64 enabled_ns;		/* time enabled, up to the last disable */
	bool disabled;
	/*
	 * RM's own USERD (NV_CHANNEL_ALLOC_PARAMS.hUserdMemory[0] == 0), which
	 * the client maps through the channel's handle (nvstub_mem.c); false
	 * when the client allocated its USERD (CUDA's way).
	 */
	bool rm_userd;
};

static LIST_HEAD(nvstub_tsgs);
static struct nvstub_tsg *nvstub_running;	/* TSG whose turn it is */
static struct task_struct *nvstub_engine_task;
static DECLARE_WAIT_QUEUE_HEAD(nvstub_engine_wq);
static bool nvstub_engine_kick;
static bool nvstub_engine_preempt;	/* a channel of nvstub_running was disabled */
static u32 nvstub_next_chid;

static struct page *nvstub_userd_page(u32 chid);

int nvstub_tsg_create(struct nvstub_obj *obj)
{
	struct nvstub_tsg *tsg = kzalloc(sizeof(*tsg), GFP_KERNEL);

	if (!tsg)
		return -ENOMEM;
	INIT_LIST_HEAD(&tsg->chans);
	tsg->obj = obj;
	tsg->timeslice_us = NVSTUB_DEFAULT_TIMESLICE_US;
	list_add_tail(&tsg->node, &nvstub_tsgs);
	obj->tsg = tsg;
	return 0;
}

void nvstub_tsg_destroy(struct nvstub_obj *obj)
{
	struct nvstub_tsg *tsg = obj->tsg;

	WARN_ON(!list_empty(&tsg->chans));
	if (nvstub_running == tsg)
		nvstub_running = NULL;
	list_del(&tsg->node);
	kfree(tsg);
	obj->tsg = NULL;
}

int nvstub_chan_create(struct nvstub_obj *obj, struct nvstub_obj *tsg_obj,
		       const struct nv_channel_alloc_params_head *params)
{
	struct nvstub_chan *ch = kzalloc(sizeof(*ch), GFP_KERNEL);

	if (!ch)
		return -ENOMEM;
	if (!params || !params->h_userd_memory[0]) {
		if (!nvstub_userd_page(nvstub_next_chid)) {
			kfree(ch);
			return -ENOMEM;
		}
		ch->rm_userd = true;
	}
	ch->obj = obj;
	ch->tsg = tsg_obj->tsg;
	ch->id = nvstub_next_chid++;
	ch->pid = task_tgid_nr(current);
	ch->enabled_at = ktime_get_ns();
	list_add_tail(&ch->node, &ch->tsg->chans);
	obj->chan = ch;
	return 0;
}

void nvstub_chan_destroy(struct nvstub_obj *obj)
{
	list_del(&obj->chan->node);
	kfree(obj->chan);
	obj->chan = NULL;
}

u32 nvstub_chan_id(struct nvstub_chan *chan)
{
	return chan->id;
}

struct nvstub_tsg *nvstub_chan_tsg(struct nvstub_chan *chan)
{
	return chan->tsg;
}

/*
 * RM's USERDs are NV_RAMUSERD_CHAN_SIZE (512) bytes apart, by channel id
 * (kernel_fifo_gm107.c kchannelGetUserdBar1MapOffset_GM107: ChID * 512 into
 * the USERD area): a page holds 8 channels', of any client. Pages are made
 * as channel ids reach them and kept until the module goes (a CPU mapping
 * of one holds the module: nvstub_mem.c maps it with remap_pfn_range()).
 */
static DEFINE_XARRAY(nvstub_userd_pages);

static struct page *nvstub_userd_page(u32 chid)
{
	unsigned long idx = chid / (PAGE_SIZE / NVSTUB_USERD_SIZE);
	struct page *page = xa_load(&nvstub_userd_pages, idx);

	if (page)
		return page;
	page = alloc_page(GFP_KERNEL | __GFP_ZERO);
	if (!page)
		return NULL;
	if (xa_err(xa_store(&nvstub_userd_pages, idx, page, GFP_KERNEL))) {
		__free_page(page);
		return NULL;
	}
	return page;
}

void nvstub_userd_exit(void)
{
	struct page *page;
	unsigned long idx;

	xa_for_each(&nvstub_userd_pages, idx, page)
		__free_page(page);
	xa_destroy(&nvstub_userd_pages);
}

struct page *nvstub_chan_userd(struct nvstub_chan *chan, u32 *off)
{
	if (!chan->rm_userd)
		return NULL;
	*off = (chan->id % (PAGE_SIZE / NVSTUB_USERD_SIZE)) * NVSTUB_USERD_SIZE;
	return xa_load(&nvstub_userd_pages, chan->id / (PAGE_SIZE / NVSTUB_USERD_SIZE));
}

/*
 * The channel's USERD words GPGet (byte 0x88) and GPPut (0x8c) of
 * Nvc86fControl (class/clc86f.h). The process writes GPPut after its GPFIFO
 * entries; the PBDMA fetches them while the channel is on the engine, well
 * before the work finishes (docs/h100-userd.md: GPGet == GPPut in 99.8% of
 * samples of a busy channel), and moves GPGet up to GPPut. A disabled
 * channel fetches nothing: what was submitted since stays visible.
 */
static u32 *nvstub_userd_word(struct nvstub_chan *ch, unsigned int off)
{
	u32 base;
	struct page *page = nvstub_chan_userd(ch, &base);

	return (u32 *)(page_address(page) + base + off);
}

static void nvstub_chan_fetch(struct nvstub_chan *ch)
{
	if (ch->rm_userd && !ch->disabled)
		WRITE_ONCE(*nvstub_userd_word(ch, 0x88), READ_ONCE(*nvstub_userd_word(ch, 0x8c)));
}

static void nvstub_engine_wake(void)
{
	nvstub_engine_kick = true;
	wake_up(&nvstub_engine_wq);
}

void nvstub_tsg_schedule(struct nvstub_tsg *tsg, bool enable)
{
	if (enable) {
		tsg->scheduled = true;
		nvstub_engine_wake();
	}
}

void nvstub_tsg_set_timeslice(struct nvstub_tsg *tsg, u64 us)
{
	tsg->timeslice_us = us;
}

u64 nvstub_tsg_get_timeslice(struct nvstub_tsg *tsg)
{
	return tsg->timeslice_us;
}

void nvstub_chan_set_disabled(struct nvstub_chan *chan, bool disabled)
{
	u64 now = ktime_get_ns();

	if (disabled && !chan->disabled) {
		chan->disabled_at = now;
		chan->enabled_ns += now - chan->enabled_at;
	} else if (!disabled && chan->disabled) {
		chan->enabled_at = now;
	}
	chan->disabled = disabled;
	if (!disabled) {
		nvstub_engine_wake();
	} else if (chan->tsg == nvstub_running) {
		nvstub_engine_preempt = true;
		wake_up(&nvstub_engine_wq);
	}
}

static struct nvstub_chan *nvstub_tsg_runnable_chan(struct nvstub_tsg *tsg)
{
	struct nvstub_chan *ch;

	if (!tsg->scheduled)
		return NULL;
	list_for_each_entry(ch, &tsg->chans, node)
		if (!ch->disabled && ch->pending_ns)
			return ch;
	return NULL;
}

static u64 nvstub_tsg_slice_ns(struct nvstub_tsg *tsg)
{
	u64 ns = tsg->timeslice_us * NSEC_PER_USEC;

	return max_t(u64, ns, NVSTUB_MIN_TIMESLICE_NS);
}

/*
 * Charge the engine time [@from, @to) to the TSG's channels with pending
 * work, in list order; a channel disabled inside the interval runs only up to
 * its disable. Returns the end of what was charged.
 */
static u64 nvstub_tsg_charge(struct nvstub_tsg *tsg, u64 from, u64 to)
{
	struct nvstub_chan *ch;
	u64 at = from;

	if (!tsg->scheduled)
		return at;
	list_for_each_entry(ch, &tsg->chans, node) {
		u64 end = to;
		u64 part;

		nvstub_chan_fetch(ch);

		if (ch->disabled)
			end = clamp(ch->disabled_at, from, to);
		if (!ch->pending_ns || end <= at)
			continue;
		part = min(end - at, ch->pending_ns);
		ch->pending_ns -= part;
		ch->executed_ns += part;
		at += part;
	}
	return at;
}

/* When the TSG's first runnable channel became runnable (enabled, with work). */
static u64 nvstub_tsg_ready_at(struct nvstub_tsg *tsg)
{
	struct nvstub_chan *ch = nvstub_tsg_runnable_chan(tsg);

	return ch ? max(ch->enabled_at, ch->work_at) : 0;
}

/*
 * Next TSG in round-robin order with runnable work, paying off debts: a TSG
 * that owes a slice or more gives up its turn to the next runnable one. The
 * engine never idles while a TSG is runnable (a GPU's runlist is work
 * conserving), so a lone runnable TSG pays off its debt at once; the loop
 * ends because every pass lowers a debt that is capped (nvstub_tsg_owe).
 */
static struct nvstub_tsg *nvstub_pick(u64 *budget)
{
	struct nvstub_tsg *tsg, *found;

	for (;;) {
		found = NULL;
		list_for_each_entry(tsg, &nvstub_tsgs, node) {
			if (nvstub_tsg_runnable_chan(tsg)) {
				found = tsg;
				break;
			}
		}
		if (!found)
			return NULL;
		list_move_tail(&found->node, &nvstub_tsgs);
		if (found->debt_ns < nvstub_tsg_slice_ns(found))
			break;
		found->debt_ns -= nvstub_tsg_slice_ns(found);
	}
	*budget = nvstub_tsg_slice_ns(found) - found->debt_ns;
	found->debt_ns = 0;
	return found;
}

/*
 * A turn overran its budget by @over_ns: the TSG owes it to the others, up to
 * NVSTUB_MAX_DEBT_SLICES of its slices. A GPU carries no debt at all; the cap
 * keeps long-run shares by the timeslice ratio under the thread's usual
 * lateness, while a stall of the thread itself (a TCG vCPU held off for
 * hundreds of milliseconds) does not keep the TSG off the engine for as long.
 */
static void nvstub_tsg_owe(struct nvstub_tsg *tsg, u64 over_ns)
{
	u64 cap = NVSTUB_MAX_DEBT_SLICES * nvstub_tsg_slice_ns(tsg);

	tsg->debt_ns = min(over_ns, cap);
}

/*
 * Run one turn of the picked TSG, from @start, for at most @budget ns. Called
 * unlocked. Returns when the turn ended: now if its time was up, else when its
 * last channel stopped (disabled, or out of work), however late the thread saw it.
 */
static u64 nvstub_run_turn(u64 start, u64 budget)
{
	struct nvstub_tsg *tsg;
	u64 last = start;

	for (;;) {
		u64 used = last - start;
		u64 chunk = min(budget - used, (u64)NVSTUB_CHUNK_NS);
		u64 now, end;
		bool stop, runnable;

		wait_event_interruptible_hrtimeout(nvstub_engine_wq,
						   READ_ONCE(nvstub_engine_preempt) ||
						   kthread_should_stop(),
						   ns_to_ktime(chunk));

		mutex_lock(&nvstub_lock);
		nvstub_engine_preempt = false;
		tsg = nvstub_running;
		if (!tsg) {
			mutex_unlock(&nvstub_lock);
			return last;
		}
		now = ktime_get_ns();
		end = nvstub_tsg_charge(tsg, last, now);
		last = now;
		used = last - start;
		runnable = nvstub_tsg_runnable_chan(tsg);
		stop = used >= budget || !runnable;
		if (used > budget)
			nvstub_tsg_owe(tsg, used - budget);
		if (stop)
			nvstub_running = NULL;
		mutex_unlock(&nvstub_lock);
		if (stop || kthread_should_stop())
			return runnable ? last : end;
	}
}

/*
 * The engine goes from one turn to the next without a gap: the next turn
 * starts where the last one ended, or when the picked TSG became runnable if
 * that is later (the time the thread spends waking up, picking, or waiting for
 * nvstub_lock while /proc/nvstub/engine is read is the new turn's, as on a GPU
 * that does not wait for its driver's thread).
 */
static int nvstub_engine_thread(void *unused)
{
	u64 turn_end = 0;

	/*
	 * A GPU does not wait for a CPU: run above every user task (the gpuctl
	 * daemon runs SCHED_FIFO 10), or a preemption and the pick of the next
	 * TSG would wait until the daemon that disabled the channel sleeps.
	 */
	sched_set_fifo(current);
	while (!kthread_should_stop()) {
		struct nvstub_tsg *tsg;
		u64 budget = 0;
		u64 start = 0;

		mutex_lock(&nvstub_lock);
		tsg = nvstub_pick(&budget);
		nvstub_running = tsg;
		nvstub_engine_kick = false;
		nvstub_engine_preempt = false;
		if (tsg)
			start = max(turn_end, nvstub_tsg_ready_at(tsg));
		mutex_unlock(&nvstub_lock);
		if (!tsg) {
			wait_event_interruptible_timeout(nvstub_engine_wq,
							 READ_ONCE(nvstub_engine_kick) ||
							 kthread_should_stop(),
							 HZ / 10);
			continue;
		}
		turn_end = nvstub_run_turn(start, budget);
	}
	return 0;
}

/* NVSTUB_ESC_SUBMIT: queue simulated work on a channel of the caller. */
int nvstub_esc_submit(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvstub_submit *p = arg;
	struct nvstub_client *cl;
	struct nvstub_obj *ch;

	if (size != sizeof(*p) || !nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, p->h_client, &p->status);
	if (!cl)
		return 0;
	ch = nvstub_obj_get(cl, p->h_channel);
	if (!ch || !ch->chan) {
		p->status = NV_ERR_INVALID_OBJECT_HANDLE;
		return 0;
	}
	if (!ch->chan->pending_ns && p->work_ns)
		ch->chan->work_at = ktime_get_ns();
	ch->chan->pending_ns += p->work_ns;
	nvstub_engine_wake();
	p->status = NV_OK;
	return 0;
}

void nvstub_engine_report(struct seq_file *m)
{
	struct nvstub_tsg *tsg;
	struct nvstub_chan *ch;

	list_for_each_entry(tsg, &nvstub_tsgs, node) {
		list_for_each_entry(ch, &tsg->chans, node) {
			u64 enabled = ch->enabled_ns;

			if (!ch->disabled)
				enabled += ktime_get_ns() - ch->enabled_at;
			seq_printf(m, "client=0x%08x channel=0x%08x tsg=0x%08x pid=%d executed_ns=%llu pending_ns=%llu disabled=%d timeslice_us=%llu enabled_ns=%llu debt_ns=%llu engine=0x%x",
				   tsg->obj->client->root.handle, ch->obj->handle,
				   tsg->obj->handle, ch->pid, ch->executed_ns,
				   ch->pending_ns, ch->disabled, tsg->timeslice_us,
				   enabled, tsg->debt_ns, ch->obj->engine_type);
			if (ch->rm_userd)
				seq_printf(m, " gp_get=%u gp_put=%u",
					   READ_ONCE(*nvstub_userd_word(ch, 0x88)),
					   READ_ONCE(*nvstub_userd_word(ch, 0x8c)));
			seq_putc(m, '\n');
		}
	}
}

int nvstub_engine_start(void)
{
	struct task_struct *t;

	t = kthread_run(nvstub_engine_thread, NULL, "nvstub-engine");
	if (IS_ERR(t))
		return PTR_ERR(t);
	nvstub_engine_task = t;
	return 0;
}

void nvstub_engine_stop(void)
{
	kthread_stop(nvstub_engine_task);
}
