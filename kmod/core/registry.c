// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * registry.c - the instance's table of RM objects, keyed by (client, handle),
 * with parent links, so that freeing an object, an ancestor of it, its client
 * or the file its client lives on forgets exactly what RM forgets.
 *
 * The lowest layer of the core's decisions (core_int.h): it knows RM's
 * objects and nothing of what the core attaches to them. Each record it
 * forgets or invalidates goes to its owner's in->reg->release first, which
 * lets go of the record's charge and nvidia-uvm's hold (core.c).
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

static unsigned int gs_pid_bucket(nv_u32 pid)
{
	return (pid * 2654435761u) >> 24 & (GS_PID_BUCKETS - 1);
}

/* is a live client the process pid's (other than one being freed)? */
static int gs_pid_has_client(struct gs_inst *in, nv_u32 pid)
{
	const struct gs_obj *ob;

	for (ob = in->by_pid[gs_pid_bucket(pid)]; ob; ob = ob->pid_next)
		if (ob->o.pid == pid)
			return 1;
	return 0;
}

/* does a live client belong to the process RM's replies call ns_pid? */
int gs_ns_pid_has_client(struct gs_inst *in, nv_u32 ns_pid)
{
	const struct gs_obj *ob;

	for (ob = in->by_ns_pid[gs_pid_bucket(ns_pid)]; ob; ob = ob->nspid_next)
		if (ob->ns_pid == ns_pid)
			return 1;
	return 0;
}

/* ---- the tree's links: lists through sib/psib ---- */

static void gs_list_add(struct gs_obj **head, struct gs_obj *ob)
{
	ob->sib = *head;
	if (*head)
		(*head)->psib = &ob->sib;
	*head = ob;
	ob->psib = head;
}

static void gs_list_del(struct gs_obj *ob)
{
	if (!ob->psib)
		return;
	*ob->psib = ob->sib;
	if (ob->sib)
		ob->sib->psib = ob->psib;
	ob->sib = NULL;
	ob->psib = NULL;
}

static void gs_client_link(struct gs_inst *in, struct gs_obj *cl)
{
	struct gs_obj **head;

	gs_list_add(&in->clients, cl);
	head = &in->by_pid[gs_pid_bucket(cl->o.pid)];
	cl->pid_next = *head;
	if (*head)
		(*head)->pid_pprev = &cl->pid_next;
	*head = cl;
	cl->pid_pprev = head;
}

/* the ns_pid is known once the client is registered (core.c gs_post_alloc()) */
void gs_client_set_ns_pid(struct gs_inst *in, struct gs_obj *cl, nv_u32 ns_pid)
{
	struct gs_obj **head = &in->by_ns_pid[gs_pid_bucket(ns_pid)];

	cl->ns_pid = ns_pid;
	cl->nspid_next = *head;
	if (*head)
		(*head)->nspid_pprev = &cl->nspid_next;
	*head = cl;
	cl->nspid_pprev = head;
}

static void gs_client_unlink(struct gs_obj *cl)
{
	gs_list_del(cl);
	if (cl->pid_pprev) {
		*cl->pid_pprev = cl->pid_next;
		if (cl->pid_next)
			cl->pid_next->pid_pprev = cl->pid_pprev;
		cl->pid_pprev = NULL;
	}
	if (cl->nspid_pprev) {
		*cl->nspid_pprev = cl->nspid_next;
		if (cl->nspid_next)
			cl->nspid_next->nspid_pprev = cl->nspid_pprev;
		cl->nspid_pprev = NULL;
	}
}

/* is anc ob's parent, or an ancestor of it? (a forged reply must not make a cycle) */
static int gs_obj_above(const struct gs_obj *anc, const struct gs_obj *ob)
{
	int depth;

	for (depth = 0; ob && depth < GS_MAX_DEPTH; depth++, ob = ob->up)
		if (ob->up == anc)
			return 1;
	return depth >= GS_MAX_DEPTH;
}

/*
 * Link ob, a new object of a registered client, into the tree: under its
 * parent, or, while the parent is not registered, on the client's strays;
 * and adopt the strays whose parent it is (their parent's reply came after
 * theirs: RM had made it before them).
 */
static void gs_tree_link(struct gs_inst *in, struct gs_obj *cl, struct gs_obj *ob)
{
	struct gs_obj *up = NULL, *s, *next;

	if (ob->o.parent && ob->o.parent != ob->o.client)
		up = gs_obj_find(in, ob->o.client, ob->o.parent);
	else
		up = cl;
	if (up) {
		ob->up = up;
		gs_list_add(&up->kids, ob);
	} else if (in->nr_strays < GS_MAX_STRAYS) {
		ob->up = cl;
		ob->stray = 1;
		in->nr_strays++;
		gs_list_add(&cl->strays, ob);
	} else {
		/* past the cap: freed with its client, never adopted */
		ob->up = cl;
		gs_list_add(&cl->kids, ob);
	}
	for (s = cl->strays; s; s = next) {
		next = s->sib;
		if (s == ob || s->o.parent != ob->o.handle || gs_obj_above(s, ob))
			continue;
		gs_list_del(s);
		s->stray = 0;
		in->nr_strays--;
		s->up = ob;
		gs_list_add(&ob->kids, s);
	}
}

/*
 * ob depends on the object handle names in its client (RM frees ob with it,
 * struct gs_dep). A handle the core does not know adds nothing: ob then
 * lives here until its parent or client goes, never shorter than in RM.
 */
void gs_obj_depend(struct gs_inst *in, struct gs_obj *ob, nv_handle handle)
{
	struct gs_obj *to;
	unsigned int i;

	if (!handle || handle == ob->o.handle)
		return;
	to = gs_obj_find(in, ob->o.client, handle);
	if (!to || to == ob->up)
		return;
	for (i = 0; i < GS_OBJ_DEPS; i++) {
		struct gs_dep *d = &ob->dep[i];

		if (d->to == to)
			return;
		if (d->to)
			continue;
		d->from = ob;
		d->to = to;
		d->next = to->dependants;
		if (to->dependants)
			to->dependants->pprev = &d->next;
		to->dependants = d;
		d->pprev = &to->dependants;
		return;
	}
}

static void gs_deps_unlink(struct gs_obj *ob)
{
	unsigned int i;

	for (i = 0; i < GS_OBJ_DEPS; i++) {
		struct gs_dep *d = &ob->dep[i];

		if (!d->to)
			continue;
		*d->pprev = d->next;
		if (d->next)
			d->next->pprev = d->pprev;
		d->to = NULL;
	}
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

/*
 * The instance's counts of what its caps bound (core.c gs_pre_alloc()): a
 * lost object's record still counts as an object, no longer as a channel,
 * TSG or memory mapper (RM destroyed those).
 */
static void gs_obj_count(struct gs_inst *in, const struct gs_obj *ob, int d)
{
	in->nr_objects += d;
	if (ob->o.flags & GS_OBJ_LOST)
		return;
	if (ob->o.obj_kind == GPUSLICE_OBJ_CHANNEL)
		in->nr_channels += d;
	else if (ob->o.obj_kind == GPUSLICE_OBJ_TSG)
		in->nr_tsgs += d;
	if (ob->o.klass == NV_MEMORY_MAPPER)
		in->nr_mappers += d;
}

static void gs_obj_unlink(struct gs_inst *in, struct gs_obj *ob)
{
	struct gs_obj **pp = &in->hash[gs_hash(in, ob->o.client, ob->o.handle)];

	while (*pp && *pp != ob)
		pp = &(*pp)->next;
	if (*pp)
		*pp = ob->next;
}

/* what RM destroyed of ob, whose record stays (lost) or goes (destroy) */
static void gs_obj_release(struct gs_inst *in, struct gs_obj *ob, struct gs_evq *q)
{
	in->reg->release(in, ob);
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
}

/* forget one object that is already unlinked */
static void gs_obj_destroy(struct gs_inst *in, struct gs_obj *ob, struct gs_evq *q)
{
	if (!(ob->o.flags & GS_OBJ_LOST))
		gs_obj_release(in, ob, q);
	gs_obj_count(in, ob, -1);
	gs_free(ob);
}

/*
 * RM destroyed ob with an object it depended on, and keeps its handle
 * (resserv invalidates a dependant that is not a descendant of what is
 * freed, and its children: rs_server.c:1358-1366, rs_client.c:840; the
 * handle goes at the caller's RM_FREE of it, rs_server.c:239-246, or with
 * its client). The record stays, so that the handle is still refused for a
 * new object as RM refuses it, without its memory or its place in the
 * scheduler; it depends on nothing any more.
 */
static void gs_obj_lose(struct gs_inst *in, struct gs_obj *ob, struct gs_evq *q)
{
	gs_deps_unlink(ob);
	gs_obj_release(in, ob, q);
	gs_obj_count(in, ob, -1);
	ob->o.flags |= GS_OBJ_LOST;
	ob->o.size = 0;
	gs_obj_count(in, ob, 1);
	ob->dying = 0;
}

/*
 * Registers o with c's spare record (gs_pre() allocated it before the
 * driver ran); NULL when there is none, when the handle is registered, or
 * when o is not a client and its client is not registered.
 */
struct gs_obj *gs_obj_add(struct gs_inst *in, struct gs_call *c,
			  const struct gs_object *o, struct gs_mem *mem,
			  struct gs_evq *q)
{
	struct gs_obj *ob = c->spare_obj, *cl = NULL;
	unsigned int b;

	if (!ob)
		return NULL;
	/*
	 * RM never makes an object under a live handle (it answers
	 * NV_ERR_INSERT_DUPLICATE_NAME), and gs_pre() refuses a new handle the
	 * core has registered: a success under a registered handle is a reply
	 * another thread rewrote, or a call whose answer we assumed, or RM
	 * freed the registered object without the core seeing it (a free whose
	 * reply was rewritten to a failure). The registered object stays, with
	 * what it is charged and its place in the scheduler: replacing it would
	 * forget a live object for a forged status. The caller keeps the new
	 * one's charge another way (gs_park(), the client's orphans).
	 */
	if (gs_obj_find(in, o->client, o->handle))
		return NULL;
	if (o->obj_kind != GPUSLICE_OBJ_CLIENT) {
		cl = gs_obj_find(in, o->client, o->client);
		if (!cl || cl->o.obj_kind != GPUSLICE_OBJ_CLIENT)
			return NULL;
	}
	c->spare_obj = ob->next;	/* an import of several has one each */
	memset(ob, 0, sizeof(*ob));

	ob->o = *o;
	ob->mem = mem;
	if (mem)
		ob->o.size = mem->size;
	if (o->obj_kind == GPUSLICE_OBJ_CLIENT && !gs_pid_has_client(in, o->pid))
		gs_obj_event(q, o, GPUSLICE_EV_PROC_ATTACH);
	b = gs_hash(in, o->client, o->handle);
	ob->next = in->hash[b];
	in->hash[b] = ob;
	gs_obj_count(in, ob, 1);
	if (o->obj_kind == GPUSLICE_OBJ_CLIENT)
		gs_client_link(in, ob);
	else
		gs_tree_link(in, cl, ob);
	if (o->obj_kind == GPUSLICE_OBJ_CHANNEL && ob->up && ob->up->o.obj_kind == GPUSLICE_OBJ_TSG &&
	    (ob->up->o.flags & GS_OBJ_SCHEDULED))
		ob->o.flags |= GS_OBJ_SCHEDULED;
	if (o->obj_kind == GPUSLICE_OBJ_TSG)
		gs_obj_event(q, &ob->o, GPUSLICE_EV_TSG_NEW);
	else if (o->obj_kind == GPUSLICE_OBJ_CHANNEL && gs_object_gateable(&ob->o))
		gs_obj_event(q, &ob->o, GPUSLICE_EV_CHANNEL_NEW);
	return ob;
}

/*
 * ob, a record read from a snapshot (snapshot.c), linked as gs_obj_add() left
 * it: a client (up NULL) on the clients list and by its pid, and by its
 * ns_pid if gs_client_set_ns_pid() had linked it (ns_linked); any other
 * object under up, on its kids or, a stray, on its strays. The lists add at
 * their head: called for each list's members last to first, they come out in
 * the snapshot's order. No events: the objects are not new to RM.
 */
void gs_obj_restore(struct gs_inst *in, struct gs_obj *ob, struct gs_obj *up, int stray,
		    int ns_linked)
{
	unsigned int b = gs_hash(in, ob->o.client, ob->o.handle);

	ob->next = in->hash[b];
	in->hash[b] = ob;
	gs_obj_count(in, ob, 1);
	if (!up) {
		gs_client_link(in, ob);
		if (ns_linked)
			gs_client_set_ns_pid(in, ob, ob->ns_pid);
		return;
	}
	ob->up = up;
	if (stray) {
		ob->stray = 1;
		in->nr_strays++;
		gs_list_add(&up->strays, ob);
	} else {
		gs_list_add(&up->kids, ob);
	}
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

	if (!ob || ob->o.obj_kind != GPUSLICE_OBJ_CHANNEL || ob->o.engine == engine ||
	    (ob->o.flags & GS_OBJ_LOST))
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

	if (!ob || (ob->o.flags & GS_OBJ_LOST))
		return;
	if (ob->o.obj_kind == GPUSLICE_OBJ_CHANNEL) {
		gs_channel_scheduled(ob, q);
		return;
	}
	if (ob->o.obj_kind != GPUSLICE_OBJ_TSG || (ob->o.flags & GS_OBJ_SCHEDULED))
		return;
	ob->o.flags |= GS_OBJ_SCHEDULED;
	for (ch = ob->kids; ch; ch = ch->sib)
		if (ch->o.obj_kind == GPUSLICE_OBJ_CHANNEL && !(ch->o.flags & GS_OBJ_LOST))
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

/* put ob on the list that ends at *tail, once */
static void gs_collect(struct gs_obj *ob, struct gs_obj ***tail)
{
	if (ob->dying)
		return;
	ob->dying = 1;
	ob->kill = NULL;
	**tail = ob;
	*tail = &ob->kill;
}

/*
 * What RM frees with root (resserv: serverFreeResourceTree ->
 * clientUpdatePendingFreeList_IMPL, rs_server.c:930-992, which adds
 * pResourceRef's children and depRefMap recursively): root's descendants,
 * removed (*kill; a client's strays go with it), and the dependants of
 * anything freed that are not descendants of root, with their children and
 * their own dependants, which RM only invalidates (*lost). Each object once;
 * the walk visits what it frees and nothing else.
 */
static void gs_collect_tree(struct gs_obj *root, struct gs_obj **kill, struct gs_obj **lost)
{
	struct gs_obj **ktail = kill, **ltail = lost, *ob, *k;
	struct gs_dep *d;

	*kill = NULL;
	*lost = NULL;
	gs_collect(root, &ktail);
	for (ob = *kill; ob; ob = ob->kill) {
		for (k = ob->kids; k; k = k->sib)
			gs_collect(k, &ktail);
		for (k = ob->strays; k; k = k->sib)
			gs_collect(k, &ktail);
	}
	for (ob = *kill; ob; ob = ob->kill)
		for (d = ob->dependants; d; d = d->next)
			gs_collect(d->from, &ltail);
	for (ob = *lost; ob; ob = ob->kill) {
		for (k = ob->kids; k; k = k->sib)
			gs_collect(k, &ltail);
		for (d = ob->dependants; d; d = d->next)
			gs_collect(d->from, &ltail);
	}
}

/* take the removed objects out of the table and the tree and forget them; mark the lost */
static void gs_free_collected(struct gs_inst *in, struct gs_obj *kill, struct gs_obj *lost,
			      struct gs_evq *q)
{
	struct gs_obj *ob, *next;

	for (ob = kill; ob; ob = ob->kill) {
		gs_obj_unlink(in, ob);
		gs_deps_unlink(ob);
		if (ob->o.obj_kind == GPUSLICE_OBJ_CLIENT)
			gs_client_unlink(ob);
		else
			gs_list_del(ob);
		if (ob->stray)
			in->nr_strays--;
	}
	for (ob = lost; ob; ob = next) {
		next = ob->kill;
		if (!(ob->o.flags & GS_OBJ_LOST))
			gs_obj_lose(in, ob, q);
		ob->dying = 0;
	}
	gs_kill_list(in, kill, q);
}

static void gs_free_root(struct gs_inst *in, struct gs_obj *root, struct gs_evq *q)
{
	struct gs_obj *kill, *lost;

	gs_collect_tree(root, &kill, &lost);
	gs_free_collected(in, kill, lost, q);
}

/*
 * RM freed handle in client (RM_FREE; handle == client: the client), and
 * with it everything gs_collect_tree() finds. A handle the core does not
 * know may still be the parent of strays.
 */
void gs_obj_free_tree(struct gs_inst *in, nv_handle client, nv_handle handle,
		      struct gs_evq *q)
{
	struct gs_obj *ob = gs_obj_find(in, client, handle), *cl, *s, *next;

	if (ob && (handle == client) == (ob->o.obj_kind == GPUSLICE_OBJ_CLIENT)) {
		gs_free_root(in, ob, q);
		return;
	}
	cl = gs_obj_find(in, client, client);
	if (!cl || handle == client)
		return;
	for (s = cl->strays; s; s = next) {
		next = s->sib;
		if (s->o.parent != handle)
			continue;
		/* next may go with s (a dependant of s): start again */
		gs_free_root(in, s, q);
		next = cl->strays;
	}
}

/* 1 if handle is anc or below it (or anc is the client) */
static int gs_is_below(struct gs_inst *in, nv_handle client, nv_handle handle, nv_handle anc)
{
	const struct gs_obj *ob;
	int depth;

	if (anc == client || handle == anc)
		return 1;
	ob = gs_obj_find(in, client, handle);
	for (depth = 0; ob && depth < GS_MAX_DEPTH; depth++) {
		if (ob->o.handle == anc)
			return 1;
		if (ob->stray)
			return ob->o.parent == anc;
		ob = ob->up;
		if (ob && ob->o.obj_kind == GPUSLICE_OBJ_CLIENT)
			break;
	}
	return 0;
}

/*
 * RM runs the calls in flight in an order of its own, and the core hears of
 * them, in gs_post(), in another: what a handle names can change between a
 * call's check and RM's work on it. So among the calls between their
 * gs_pre() and gs_post(), these do not meet, the later one being answered
 * NV_ERR_STATE_IN_USE (a program does this only racing its own frees):
 *  - taking from a handle (a dup's source, an export) and freeing it or an
 *    ancestor of it: RM may free first and make another object there;
 *  - making an object that depends on a handle (GS_BUSY_DEP) and freeing
 *    that handle or an ancestor, in either order: RM may also make the
 *    dependant first and invalidate it with what it depends on before the
 *    core has registered it (the core would then keep it live);
 *  - taking from a handle and creating under it: the same, the other way;
 *  - creating one handle twice: RM makes one, and the core could register
 *    the other (its refusal's reply rewritten to a success), under another
 *    parent than RM's object;
 *  - creating a handle, or creating under a parent, and freeing that handle
 *    or an ancestor of the parent: RM may make the object first and free it
 *    with its ancestor, before the core has registered it (then kept for
 *    good), or free first and the core register the new object before it
 *    forgets the old, then forget both.
 *  - allocating or freeing an OS event and doing either to the same key, or
 *    freeing its client: RM may run them in the other order, and the core
 *    would forget an entry RM keeps (osevent.c).
 * parent: a creation's parent (0 for the other roles). Exports pending
 * (export.c) take from their handles.
 */
int gs_busy_conflict(struct gs_inst *in, nv_u32 role, nv_handle client, nv_handle handle,
		     nv_handle parent)
{
	const struct gs_busy *b;
	const struct gs_export *e;

	for (b = in->busy; b; b = b->next) {
		if (b->client != client)
			continue;
		switch (role) {
		case GS_BUSY_SOURCE:
		case GS_BUSY_DEP:
			if ((b->role == GS_BUSY_FREE && gs_is_below(in, client, handle, b->handle)) ||
			    (b->role == GS_BUSY_CREATE && b->handle == handle))
				return 1;
			break;
		case GS_BUSY_CREATE:
			if ((b->role == GS_BUSY_SOURCE || b->role == GS_BUSY_DEP ||
			     b->role == GS_BUSY_CREATE) && b->handle == handle)
				return 1;
			if (b->role == GS_BUSY_FREE &&
			    (b->handle == handle || (parent && gs_is_below(in, client, parent, b->handle))))
				return 1;
			break;
		case GS_BUSY_OSEV:
			if ((b->role == GS_BUSY_OSEV && b->handle == handle) ||
			    (b->role == GS_BUSY_FREE && b->handle == client))
				return 1;
			break;
		case GS_BUSY_FREE:
			if (b->role == GS_BUSY_OSEV && handle == client)
				return 1;
			if (b->role == GS_BUSY_CREATE &&
			    (b->handle == handle || (b->parent && gs_is_below(in, client, b->parent, handle))))
				return 1;
			if (b->role == GS_BUSY_DEP && gs_is_below(in, client, b->handle, handle))
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
		 nv_handle handle, nv_handle parent)
{
	struct gs_busy *b;

	/* an OS event's key may be fd 0; every other role names a handle */
	if ((!handle && role != GS_BUSY_OSEV) || c->nr_busy >= sizeof(c->busy) / sizeof(c->busy[0]))
		return;
	b = &c->busy[c->nr_busy++];
	b->role = role;
	b->client = client;
	b->handle = handle;
	b->parent = parent;
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

/* RM frees the clients of a released file (nv.c nvidia_close() -> RmFreeUnusedClients) */
void gs_obj_free_file(struct gs_inst *in, nv_u64 file_id, struct gs_evq *q)
{
	struct gs_obj *cl, *next;

	for (cl = in->clients; cl; cl = next) {
		next = cl->sib;
		if (cl->o.file_id != file_id)
			continue;
		gs_free_root(in, cl, q);
		/* a client's tree holds no other client: next is still linked */
	}
}

void gs_obj_free_all(struct gs_inst *in)
{
	int i;

	for (i = 0; i < GS_HASH_SIZE; i++) {
		while (in->hash[i]) {
			struct gs_obj *ob = in->hash[i];

			in->hash[i] = ob->next;
			if (!(ob->o.flags & GS_OBJ_LOST))
				in->reg->release(in, ob);
			gs_obj_count(in, ob, -1);
			gs_free(ob);
		}
	}
	in->clients = NULL;
	in->nr_strays = 0;
	memset(in->by_pid, 0, sizeof(in->by_pid));
	memset(in->by_ns_pid, 0, sizeof(in->by_ns_pid));
}
