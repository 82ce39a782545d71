// SPDX-License-Identifier: GPL-2.0
/*
 * gate.c - an instance's quiesce gate (gate.h).
 *
 * A count of users and a closed flag under a spinlock, and one wait queue for
 * both sides: users wait on it for the gate to open, the closer for the count
 * to reach 0. Both conditions are read under the lock, so a wake-up between
 * the test and the sleep is not lost (wait_event tests after queueing).
 */
#include <linux/sched.h>

#include "gate.h"

void gs_gate_init(struct gs_gate *g)
{
	spin_lock_init(&g->lock);
	g->users = 0;
	g->closed = false;
	init_waitqueue_head(&g->wq);
}

bool gs_gate_tryenter(struct gs_gate *g)
{
	bool in;

	spin_lock(&g->lock);
	in = !g->closed;
	if (in)
		g->users++;
	spin_unlock(&g->lock);
	return in;
}

int gs_gate_enter(struct gs_gate *g)
{
	/* the condition enters: true once, and then the wait ends */
	return wait_event_killable(g->wq, gs_gate_tryenter(g)) ? -EINTR : 0;
}

void gs_gate_enter_wait(struct gs_gate *g)
{
	wait_event(g->wq, gs_gate_tryenter(g));
}

void gs_gate_leave(struct gs_gate *g)
{
	bool wake;

	spin_lock(&g->lock);
	WARN_ON_ONCE(!g->users);
	wake = !--g->users && g->closed;
	spin_unlock(&g->lock);
	if (wake)
		wake_up_all(&g->wq);
}

static bool gs_gate_drained(struct gs_gate *g)
{
	bool empty;

	spin_lock(&g->lock);
	empty = !g->users;
	spin_unlock(&g->lock);
	return empty;
}

int gs_gate_close(struct gs_gate *g, unsigned long timeout)
{
	long left;

	spin_lock(&g->lock);
	WARN_ON_ONCE(g->closed);
	g->closed = true;
	spin_unlock(&g->lock);
	left = wait_event_killable_timeout(g->wq, gs_gate_drained(g), timeout);
	if (left > 0)
		return 0;
	gs_gate_open(g);
	return left ? -EINTR : -EBUSY;
}

void gs_gate_open(struct gs_gate *g)
{
	spin_lock(&g->lock);
	g->closed = false;
	spin_unlock(&g->lock);
	wake_up_all(&g->wq);
}
