/* SPDX-License-Identifier: GPL-2.0 */
/*
 * netlink.h - the "gpuslice" generic netlink family (uapi/gpuslice.h).
 */
#ifndef GPUSLICE_NETLINK_H
#define GPUSLICE_NETLINK_H

#include <linux/spinlock.h>
#include <linux/types.h>

#include "core.h"

struct gs_instance;

/* Token bucket for one instance's refusal events (netlink.c). */
struct gs_nl_ratelimit {
	spinlock_t lock;
	u64 credit_ns;		/* sending time earned, at most the burst's */
	u64 last_ns;
	u64 suppressed;		/* events not sent, since the instance was made */
};

void gs_nl_ratelimit_init(struct gs_nl_ratelimit *rl);
u64 gs_nl_ratelimit_suppressed(struct gs_nl_ratelimit *rl);

int gs_netlink_init(void);
void gs_netlink_exit(void);
/* Multicast one event to GPUSLICE_MCGRP_EVENTS (refusals rate-limited); may sleep. */
void gs_netlink_event(struct gs_instance *inst, const struct gs_event *ev);
bool gs_netlink_listening(void);

#endif /* GPUSLICE_NETLINK_H */
