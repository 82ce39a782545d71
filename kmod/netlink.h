/* SPDX-License-Identifier: GPL-2.0 */
/*
 * netlink.h - the "gpuslice" generic netlink family (uapi/gpuslice.h).
 */
#ifndef GPUSLICE_NETLINK_H
#define GPUSLICE_NETLINK_H

#include "core.h"

struct gs_instance;

int gs_netlink_init(void);
void gs_netlink_exit(void);
/* Multicast one event to GPUSLICE_MCGRP_EVENTS; may sleep. */
void gs_netlink_event(struct gs_instance *inst, const struct gs_event *ev);

#endif /* GPUSLICE_NETLINK_H */
