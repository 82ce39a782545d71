// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * registry.c - the instance's table of RM objects, keyed by (client, handle),
 * with parent links, so that freeing an object, an ancestor of it, its client
 * or the file its client lives on forgets exactly what RM forgets, and returns
 * the video memory it held.
 *
 * Everything here runs under in->lock. Events go into the caller's queue.
 */
#include "core_int.h"

static unsigned int gs_hash(const struct gs_inst *in, nv_handle client, nv_handle handle)
{
	return gs_hash_keyed(&in->hash_key, client, handle) & (GS_HASH_SIZE - 1);
}

nv_u32 gs_hash_max_chain(const struct gs_inst *in)
{
	const struct gs_obj *ob;
	nv_u32 i, n, max = 0;

	for (i = 0; i < GS_HASH_SIZE; i++) {
		for (n = 0, ob = in->hash[i]; ob; ob = ob->next)
			n++;
		if (n > max)
			max = n;
	}
	return max;
}

nv_u32 gs_obj_kind(nv_u32 klass)
{
	switch (klass) {
	case NV01_ROOT:
	case NV01_ROOT_NON_PRIV:
	case NV01_ROOT_CLIENT:
		return GPUSLICE_OBJ_CLIENT;
	case KEPLER_CHANNEL_GROUP_A:
		return GPUSLICE_OBJ_TSG;
	case AMPERE_CHANNEL_GPFIFO_A:
	case HOPPER_CHANNEL_GPFIFO_A:
	case BLACKWELL_CHANNEL_GPFIFO_A:
	case BLACKWELL_CHANNEL_GPFIFO_B:
		return GPUSLICE_OBJ_CHANNEL;
	}
	if (gs_counted_class(klass))
		return GPUSLICE_OBJ_MEMORY;
	return GPUSLICE_OBJ_OTHER;
}

struct gs_obj *gs_obj_find(struct gs_inst *in, nv_handle client, nv_handle handle)
{
	struct gs_obj *ob;

	for (ob = in->hash[gs_hash(in, client, handle)]; ob; ob = ob->next)
		if (ob->o.client == client && ob->o.handle == handle)
			return ob;
	return NULL;
}

int gs_is_client(struct gs_inst *in, nv_handle client)
{
	struct gs_obj *ob = gs_obj_find(in, client, client);

	return ob && ob->o.obj_kind == GPUSLICE_OBJ_CLIENT;
}

static int gs_pid_has_client(struct gs_inst *in, nv_u32 pid)
{
	struct gs_obj *ob;
	int i;

	for (i = 0; i < GS_HASH_SIZE; i++)
		for (ob = in->hash[i]; ob; ob = ob->next)
			if (ob->o.obj_kind == GPUSLICE_OBJ_CLIENT && ob->o.pid == pid)
				return 1;
	return 0;
}

/* does a live client belong to the process RM's replies call ns_pid? */
int gs_ns_pid_has_client(struct gs_inst *in, nv_u32 ns_pid)
{
	struct gs_obj *ob;
	int i;

	for (i = 0; i < GS_HASH_SIZE; i++)
		for (ob = in->hash[i]; ob; ob = ob->next)
			if (ob->o.obj_kind == GPUSLICE_OBJ_CLIENT && ob->ns_pid == ns_pid)
				return 1;
	return 0;
}

static void gs_obj_event(struct gs_evq *q, const struct gs_object *o, nv_u32 type)
{
	struct gs_event ev;

	memset(&ev, 0, sizeof(ev));
	ev.type = type;
	ev.obj_kind = o->obj_kind;
	ev.pid = o->pid;
	ev.gpu = o->gpu;
	ev.client = o->client;
	ev.handle = o->handle;
	ev.parent = o->parent;
	ev.klass = o->klass;
	ev.engine = o->engine;
	ev.size = o->size;
	gs_evq_push(q, &ev);
}

static void gs_obj_unlink(struct gs_inst *in, struct gs_obj *ob)
{
	struct gs_obj **pp = &in->hash[gs_hash(in, ob->o.client, ob->o.handle)];

	while (*pp && *pp != ob)
		pp = &(*pp)->next;
	if (*pp)
		*pp = ob->next;
}

/* the tracked parent of ob, if any (objects being destroyed are unlinked already) */
static struct gs_obj *gs_obj_parent(struct gs_inst *in, const struct gs_obj *ob)
{
	if (!ob->o.parent || ob->o.parent == ob->o.handle)
		return NULL;
	return gs_obj_find(in, ob->o.client, ob->o.parent);
}

/* forget one object that is already unlinked; returns its memory if last */
static void gs_obj_destroy(struct gs_inst *in, struct gs_obj *ob, struct gs_evq *q)
{
	struct gs_obj *up = gs_obj_parent(in, ob);

	if (up && up->nchild)
		up->nchild--;
	if (ob->mem) {
		gs_mem_put(in, ob->mem);
		ob->mem = NULL;
	}
	gs_orphan_put(in, ob);
	switch (ob->o.obj_kind) {
	case GPUSLICE_OBJ_TSG:
		gs_obj_event(q, &ob->o, GPUSLICE_EV_TSG_DEL);
		break;
	case GPUSLICE_OBJ_CHANNEL:
		if (gs_object_gateable(&ob->o))	/* the controller never heard of it else */
			gs_obj_event(q, &ob->o, GPUSLICE_EV_CHANNEL_DEL);
		break;
	case GPUSLICE_OBJ_CLIENT:
		if (!gs_pid_has_client(in, ob->o.pid))
			gs_obj_event(q, &ob->o, GPUSLICE_EV_PROC_DETACH);
		break;
	}
	if (ob->o.obj_kind == GPUSLICE_OBJ_CHANNEL) {
		in->nr_channels--;
		if (ob->uvm_registered)
			gs_uvm_channel_freed(in, ob);
	}
	in->nr_objects--;
	gs_free(ob);
}

/*
 * Registers o with c's spare record (gs_pre() allocated it before the
 * driver ran); NULL when there is none, or when the handle is registered
 * and RM's answer was not seen (c->reply_lost).
 */
struct gs_obj *gs_obj_add(struct gs_inst *in, struct gs_call *c,
			  const struct gs_object *o, struct gs_mem *mem,
			  struct gs_evq *q)
{
	struct gs_obj *ob = c->spare_obj, *up;
	unsigned int b;

	if (!ob)
		return NULL;
	/*
	 * RM never makes an object under a live handle (it answers
	 * NV_ERR_INSERT_DUPLICATE_NAME): a success under a registered handle is
	 * a reply another thread rewrote, or a call whose answer we assumed,
	 * or RM freed the registered object without the core seeing it (a free
	 * whose reply was lost). The registered object stays, with what it is
	 * charged and its place in the scheduler: replacing it would forget a
	 * live object for a forged status. The caller keeps the new one's
	 * charge another way (gs_park(), the client's orphans).
	 */
	if (gs_obj_find(in, o->client, o->handle))
		return NULL;
	c->spare_obj = ob->next;	/* an import of several has one each */

	ob->o = *o;
	ob->mem = mem;
	if (mem)
		ob->o.size = mem->size;
	if (o->obj_kind == GPUSLICE_OBJ_CLIENT && !gs_pid_has_client(in, o->pid))
		gs_obj_event(q, o, GPUSLICE_EV_PROC_ATTACH);
	b = gs_hash(in, o->client, o->handle);
	ob->next = in->hash[b];
	in->hash[b] = ob;
	in->nr_objects++;
	if (o->obj_kind == GPUSLICE_OBJ_CHANNEL)
		in->nr_channels++;
	up = gs_obj_parent(in, ob);
	if (up)
		up->nchild++;
	if (o->obj_kind == GPUSLICE_OBJ_CHANNEL && up && up->o.obj_kind == GPUSLICE_OBJ_TSG &&
	    (up->o.flags & GS_OBJ_SCHEDULED))
		ob->o.flags |= GS_OBJ_SCHEDULED;
	if (o->obj_kind == GPUSLICE_OBJ_TSG)
		gs_obj_event(q, &ob->o, GPUSLICE_EV_TSG_NEW);
	else if (o->obj_kind == GPUSLICE_OBJ_CHANNEL && gs_object_gateable(&ob->o))
		gs_obj_event(q, &ob->o, GPUSLICE_EV_CHANNEL_NEW);
	return ob;
}

static void gs_channel_scheduled(struct gs_obj *ch, struct gs_evq *q)
{
	if (ch->o.flags & GS_OBJ_SCHEDULED)
		return;
	ch->o.flags |= GS_OBJ_SCHEDULED;
	gs_obj_event(q, &ch->o, GPUSLICE_EV_CHANNEL_NEW);
}

/*
 * RM bound the channel (client, handle) to engine (NVA06F_CTRL_CMD_BIND: how
 * the video libraries and OpenGL pick a channel's engine). A channel the
 * controller knows already is announced again with it (a NEW may repeat).
 */
void gs_obj_engine_set(struct gs_inst *in, nv_handle client, nv_handle handle, nv_u32 engine,
		       struct gs_evq *q)
{
	struct gs_obj *ob = gs_obj_find(in, client, handle);

	if (!ob || ob->o.obj_kind != GPUSLICE_OBJ_CHANNEL || ob->o.engine == engine)
		return;
	ob->o.engine = engine;
	if (gs_object_gateable(&ob->o))
		gs_obj_event(q, &ob->o, GPUSLICE_EV_CHANNEL_NEW);
}

/*
 * RM accepted a schedule or bind of (client, handle), a TSG or a channel:
 * its channels can be gated from now on (GS_OBJ_SCHEDULED).
 */
void gs_obj_scheduled(struct gs_inst *in, nv_handle client, nv_handle handle,
		      struct gs_evq *q)
{
	struct gs_obj *ob = gs_obj_find(in, client, handle), *ch;
	unsigned int b;

	if (!ob)
		return;
	if (ob->o.obj_kind == GPUSLICE_OBJ_CHANNEL) {
		gs_channel_scheduled(ob, q);
		return;
	}
	if (ob->o.obj_kind != GPUSLICE_OBJ_TSG || (ob->o.flags & GS_OBJ_SCHEDULED))
		return;
	ob->o.flags |= GS_OBJ_SCHEDULED;
	if (!ob->nchild)
		return;
	for (b = 0; b < GS_HASH_SIZE; b++)
		for (ch = in->hash[b]; ch; ch = ch->next)
			if (ch->o.obj_kind == GPUSLICE_OBJ_CHANNEL && ch->o.client == client &&
			    ch->o.parent == handle)
				gs_channel_scheduled(ch, q);
}

/*
 * The GPU of a new object under parent: the device instance (deviceId of
 * NV0080_ALLOC_PARAMETERS) of its nearest NV01_DEVICE_0 ancestor. CUDA makes
 * its RM calls on nvidiactl, whose minor (255) names no GPU; subdevices,
 * TSGs, channels and memory all hang below a device. Without a tracked device
 * ancestor the glue's minor (dflt) stays.
 */
nv_u32 gs_obj_gpu(struct gs_inst *in, nv_handle client, nv_handle parent, nv_u32 dflt)
{
	int depth;

	for (depth = 0; depth < GS_MAX_DEPTH && parent; depth++) {
		const struct gs_obj *up = gs_obj_find(in, client, parent);

		if (!up)
			break;
		if (up->o.klass == NV01_DEVICE_0)
			return up->o.gpu;
		if (up->o.parent == up->o.handle)
			break;
		parent = up->o.parent;
	}
	return dflt;
}

/*
 * Fill @o for an object the caller of @c allocated: @handle of class @klass
 * under @parent in @client, on the GPU its parent chain names (the caller's
 * GPU when there is no parent, as for a client).
 */
void gs_obj_init(struct gs_object *o, struct gs_inst *in, const struct gs_call *c,
		 nv_u32 kind, nv_handle client, nv_handle parent, nv_handle handle,
		 nv_u32 klass)
{
	memset(o, 0, sizeof(*o));
	o->obj_kind = kind;
	o->file_id = c->file_id;
	o->pid = c->pid;
	o->client = client;
	o->parent = parent;
	o->handle = handle;
	o->klass = klass;
	o->gpu = gs_obj_gpu(in, client, parent, c->gpu_minor);
}

/* is ob (handle) or one of its ancestors within its client equal to handle? */
static int gs_under(struct gs_inst *in, const struct gs_obj *ob, nv_handle handle)
{
	nv_handle h = ob->o.handle;
	nv_handle parent = ob->o.parent;
	int depth;

	for (depth = 0; depth < GS_MAX_DEPTH; depth++) {
		const struct gs_obj *up;

		if (h == handle)
			return 1;
		if (!parent || parent == h)
			return 0;
		up = gs_obj_find(in, ob->o.client, parent);
		if (!up)
			return parent == handle;
		h = up->o.handle;
		parent = up->o.parent;
	}
	return 0;
}

/*
 * Remove the objects on the kill list: channels before TSGs before clients,
 * so that DEL events come children first and PROC_DETACH last.
 */
static void gs_kill_list(struct gs_inst *in, struct gs_obj *kill, struct gs_evq *q)
{
	static const nv_u32 order[] = {
		GPUSLICE_OBJ_CHANNEL, GPUSLICE_OBJ_TSG, GPUSLICE_OBJ_MEMORY,
		GPUSLICE_OBJ_OTHER, GPUSLICE_OBJ_CLIENT,
	};
	unsigned int k;

	for (k = 0; k < ARRAY_SIZE(order); k++) {
		struct gs_obj **pp = &kill;

		while (*pp) {
			struct gs_obj *ob = *pp;

			if (ob->o.obj_kind != order[k]) {
				pp = &ob->kill;
				continue;
			}
			*pp = ob->kill;
			gs_obj_destroy(in, ob, q);
		}
	}
}

void gs_obj_free_tree(struct gs_inst *in, nv_handle client, nv_handle handle,
		      struct gs_evq *q)
{
	struct gs_obj *kill = NULL;
	struct gs_obj *ob, *next;
	int i;

	/* a leaf (most frees: memory) goes alone, without a walk of the table */
	ob = handle != client ? gs_obj_find(in, client, handle) : NULL;
	if (ob && !ob->nchild) {
		gs_obj_unlink(in, ob);
		ob->kill = NULL;
		gs_kill_list(in, ob, q);
		return;
	}
	/* collect first: removing breaks the parent chains we follow */
	for (i = 0; i < GS_HASH_SIZE; i++)
		for (ob = in->hash[i]; ob; ob = ob->next)
			if (ob->o.client == client &&
			    (handle == client || gs_under(in, ob, handle))) {
				ob->kill = kill;
				kill = ob;
			}
	for (ob = kill; ob; ob = next) {
		next = ob->kill;
		gs_obj_unlink(in, ob);
	}
	gs_kill_list(in, kill, q);
}

/* 1 if handle is anc or below it (or anc is the client) */
static int gs_is_below(struct gs_inst *in, nv_handle client, nv_handle handle, nv_handle anc)
{
	const struct gs_obj *ob;
	nv_handle h;
	int depth;

	if (anc == client)
		return 1;
	for (h = handle, depth = 0; h && depth < GS_MAX_DEPTH; depth++) {
		if (h == anc)
			return 1;
		ob = gs_obj_find(in, client, h);
		if (!ob || ob->o.obj_kind == GPUSLICE_OBJ_CLIENT)
			break;
		h = ob->o.parent;
	}
	return 0;
}

/*
 * RM runs the calls in flight in an order of its own, and the core hears of
 * them, in gs_post(), in another: what a handle names can change between a
 * call's check and RM's work on it. So among the calls between their
 * gs_pre() and gs_post(), these do not meet on one handle, the later one
 * being answered NV_ERR_STATE_IN_USE (a program does this only racing its
 * own frees):
 *  - taking from a handle (a dup's source, an export) and freeing it or an
 *    ancestor of it: RM may free first and make another object there;
 *  - taking from a handle and creating under it: the same, the other way;
 *  - creating a handle and freeing it: RM may free first and the core
 *    register the new object before it forgets the old, then forget both.
 * Exports pending (export.c) take from their handles.
 */
int gs_busy_conflict(struct gs_inst *in, nv_u32 role, nv_handle client, nv_handle handle)
{
	const struct gs_busy *b;
	const struct gs_export *e;

	for (b = in->busy; b; b = b->next) {
		if (b->client != client)
			continue;
		switch (role) {
		case GS_BUSY_SOURCE:
			if ((b->role == GS_BUSY_FREE && gs_is_below(in, client, handle, b->handle)) ||
			    (b->role == GS_BUSY_CREATE && b->handle == handle))
				return 1;
			break;
		case GS_BUSY_CREATE:
			if ((b->role == GS_BUSY_FREE || b->role == GS_BUSY_SOURCE) && b->handle == handle)
				return 1;
			break;
		case GS_BUSY_FREE:
			if (b->role == GS_BUSY_CREATE && b->handle == handle)
				return 1;
			break;
		}
	}
	if (role == GS_BUSY_CREATE)
		for (e = in->exports; e; e = e->next)
			if (e->pending && e->client == client && e->handle == handle)
				return 1;
	return 0;
}

void gs_busy_add(struct gs_inst *in, struct gs_call *c, nv_u32 role, nv_handle client,
		 nv_handle handle)
{
	struct gs_busy *b;

	if (!handle || c->nr_busy >= sizeof(c->busy) / sizeof(c->busy[0]))
		return;
	b = &c->busy[c->nr_busy++];
	b->role = role;
	b->client = client;
	b->handle = handle;
	b->next = in->busy;
	in->busy = b;
}

void gs_busy_done(struct gs_inst *in, struct gs_call *c)
{
	struct gs_busy **pp = &in->busy;

	while (*pp) {
		if (*pp >= c->busy && *pp < c->busy + c->nr_busy)
			*pp = (*pp)->next;
		else
			pp = &(*pp)->next;
	}
	c->nr_busy = 0;
}

void gs_obj_free_file(struct gs_inst *in, nv_u64 file_id, struct gs_evq *q)
{
	int again = 1;

	/* free one client at a time: each free rewrites the chains */
	while (again) {
		struct gs_obj *ob;
		int i;

		again = 0;
		for (i = 0; i < GS_HASH_SIZE && !again; i++)
			for (ob = in->hash[i]; ob; ob = ob->next)
				if (ob->o.obj_kind == GPUSLICE_OBJ_CLIENT &&
				    ob->o.file_id == file_id) {
					gs_obj_free_tree(in, ob->o.client, ob->o.client, q);
					again = 1;
					break;
				}
	}
}

void gs_obj_free_all(struct gs_inst *in)
{
	int i;

	for (i = 0; i < GS_HASH_SIZE; i++) {
		while (in->hash[i]) {
			struct gs_obj *ob = in->hash[i];

			in->hash[i] = ob->next;
			if (ob->mem)
				gs_mem_put(in, ob->mem);
			gs_orphan_put(in, ob);
			if (ob->o.obj_kind == GPUSLICE_OBJ_CHANNEL)
				in->nr_channels--;
			in->nr_objects--;
			gs_free(ob);
		}
	}
}
