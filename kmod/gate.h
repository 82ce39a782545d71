/* SPDX-License-Identifier: GPL-2.0 */
/*
 * gate.h - an instance's quiesce gate: what keeps inst->core in place.
 *
 * Every use of an instance's decision core enters the gate first and leaves
 * it when it is done with the core: an interposed ioctl from before gs_pre()
 * to after gs_post() (ioctl.c, the gs_call_ops.done op), the reaper's
 * gs_file_closed(), the sampler's walk, the netlink reads and INSTANCE_SET.
 * A handover (instance.c gs_instance_handover()) closes it: the users inside
 * finish, those arriving wait until it opens again and then find the new core.
 *
 * Closing waits for the users inside at most a given time and then gives up
 * (-EBUSY), opening the gate again with nothing changed: a user can stay
 * inside as long as the real driver takes to answer its call, and a tenant can
 * make that forever (the driver reads the caller's memory, which may be a
 * userfaultfd page nobody serves). A tenant can therefore refuse the
 * handovers of its own instance, never stall them or other tenants for longer
 * than the bound. The user copies of a call (its block in and out, the nested
 * block) are outside: the gate is entered after the copies in and left before
 * the copies out.
 *
 * Entering is killable, and a closed gate is closed for at most the bound plus
 * the handover itself, so a waiting user waits that long at most. The sampler
 * does not wait: it skips a round while the gate is closed. A user must not
 * enter twice (a second entry would wait for a handover that waits for the
 * first): nothing under the gate enters again.
 *
 * One closer at a time: callers serialize (gs_instance_handover() holds the
 * instance's cfg_lock).
 */
#ifndef GPUSLICE_GATE_H
#define GPUSLICE_GATE_H

#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/wait.h>

struct gs_gate {
	spinlock_t lock;
	unsigned int users;	/* inside now */
	bool closed;
	wait_queue_head_t wq;	/* users waiting for it to open, a closer for it to drain */
};

void gs_gate_init(struct gs_gate *g);
/* 0 once inside, -EINTR on a fatal signal */
int gs_gate_enter(struct gs_gate *g);
/* the same, for kernel threads, which no signal ends */
void gs_gate_enter_wait(struct gs_gate *g);
/* false, without waiting, while the gate is closed */
bool gs_gate_tryenter(struct gs_gate *g);
void gs_gate_leave(struct gs_gate *g);
/*
 * Closes the gate and waits for the users inside, at most timeout jiffies:
 * 0 (closed, empty), -EBUSY (timed out) or -EINTR (a fatal signal), the gate
 * open again on either refusal.
 */
int gs_gate_close(struct gs_gate *g, unsigned long timeout);
void gs_gate_open(struct gs_gate *g);

#endif /* GPUSLICE_GATE_H */
