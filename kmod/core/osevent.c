// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * osevent.c - the OS events an instance holds in RM, and their cap.
 *
 * NV_ESC_ALLOC_OS_EVENT adds an entry, keyed by (hClient, fd), to one list
 * for the whole host, which every allocation and free of an event searches
 * under a spinlock with interrupts off (arch/nvalloc/unix/src/osapi.c
 * allocate_os_event(), free_os_event()). RM drops an entry at
 * NV_ESC_FREE_OS_EVENT of its key, when its client is freed (escape.c
 * NV_ESC_RM_FREE: rm_client_free_os_events()), and when the file it was
 * allocated on is released (osapi.c RmFreeUnusedClients() ->
 * free_os_events(nvfp, 0)). The core keeps the same entries, at most
 * GS_MAX_OS_EVENTS per instance.
 *
 * Whatever a reply says (a sibling thread can rewrite it), an allocation
 * passed to RM is recorded (RM keeps at most one entry per key, and a
 * failed one is recorded until its key, client or file goes: never fewer
 * than RM has), and a free passed to RM drops its key (RM failing it means
 * it had no such entry).
 *
 * Everything here runs under in->lock.
 */
#include "core_int.h"

int gs_osev_spare_alloc(struct gs_call *c)
{
	c->spare_osev = NULL;
	if (c->kind == GS_FILE_UVM || c->escape != NV_ESC_ALLOC_OS_EVENT)
		return 0;
	c->spare_osev = gs_zalloc(sizeof(*c->spare_osev));
	return c->spare_osev ? 0 : -1;
}

void gs_osev_spare_free(struct gs_call *c)
{
	gs_free(c->spare_osev);
	c->spare_osev = NULL;
}

static struct gs_osev **gs_osev_find(struct gs_inst *in, nv_handle client, nv_u32 fd)
{
	struct gs_osev **pp;

	for (pp = &in->os_events; *pp; pp = &(*pp)->next)
		if ((*pp)->client == client && (*pp)->fd == fd)
			return pp;
	return NULL;
}

static void gs_osev_del(struct gs_inst *in, struct gs_osev **pp)
{
	struct gs_osev *ev = *pp;

	*pp = ev->next;
	in->nr_os_events--;
	gs_free(ev);
}

/*
 * NV_ESC_ALLOC_OS_EVENT and NV_ESC_FREE_OS_EVENT: no other call on the same
 * key, nor a free of its client, in flight (gs_busy_conflict()); a new key
 * over the cap is answered as RM answers a failed allocation.
 */
enum gs_verdict gs_osev_pre(struct gs_inst *in, struct gs_call *c)
{
	const struct nv_ioctl_alloc_os_event *p = c->arg;

	if (gs_busy_conflict(in, GS_BUSY_OSEV, p->h_client, p->fd, 0))
		return gs_busy_refuse(c, GS_ST_OS_EVENT);
	if (c->escape == NV_ESC_ALLOC_OS_EVENT && in->nr_os_events >= GS_MAX_OS_EVENTS &&
	    !gs_osev_find(in, p->h_client, p->fd))
		return gs_refuse_as(c, GS_REFUSE_LIMIT, GS_ST_OS_EVENT, NV_ERR_INSUFFICIENT_RESOURCES);
	gs_busy_add(in, c, GS_BUSY_OSEV, p->h_client, p->fd, 0);
	return GS_PASS;
}

/* RM ran NV_ESC_ALLOC_OS_EVENT or NV_ESC_FREE_OS_EVENT (checked: the block as gs_pre() saw it) */
void gs_osev_post(struct gs_inst *in, struct gs_call *c)
{
	const struct nv_ioctl_alloc_os_event *p = (const void *)c->checked;
	struct gs_osev **pp = gs_osev_find(in, p->h_client, p->fd);
	struct gs_osev *ev;

	if (c->escape == NV_ESC_FREE_OS_EVENT) {
		if (pp)
			gs_osev_del(in, pp);
		return;
	}
	ev = c->spare_osev;
	if (pp || !ev)
		return;
	c->spare_osev = NULL;
	ev->file_id = c->file_id;
	ev->client = p->h_client;
	ev->fd = p->fd;
	ev->next = in->os_events;
	in->os_events = ev;
	in->nr_os_events++;
}

/* RM freed client (and its events), or released file_id's file (0: not); both 0: all */
void gs_osev_gone(struct gs_inst *in, nv_handle client, nv_u64 file_id)
{
	struct gs_osev **pp = &in->os_events;

	while (*pp) {
		if ((!client && !file_id) || (client && (*pp)->client == client) ||
		    (file_id && (*pp)->file_id == file_id))
			gs_osev_del(in, pp);
		else
			pp = &(*pp)->next;
	}
}
