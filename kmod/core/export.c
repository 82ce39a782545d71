// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * export.c - RM objects shared through file descriptors, within an instance.
 *
 * cuMemExportToShareableHandle(POSIX_FD), cudaIpc* on recent drivers and
 * NCCL's cuMem path hand memory to another process this way (580,
 * src/nvidia/arch/nvalloc/unix/src/os.c):
 *  - EXPORT_OBJECT_TO_FD / EXPORT_OBJECTS_TO_FD: RM duplicates the caller's
 *    object into an export client of its own (rmobjexportimport.c,
 *    RmExportObject()) and keeps that duplicate in slot N of the nvidiactl
 *    file params.fd names (nvfp->handles[N]) until that file is released
 *    (osapi.c, rm_cleanup_file_private() -> RmFreeObjExportHandle());
 *  - IMPORT_OBJECT(S)_FROM_FD: RM duplicates what slot N of params.fd holds
 *    into the caller's client (RmImportObject()), whoever exported it;
 *  - GET_EXPORT_OBJECT_INFO: what the file holds (device, metadata).
 *
 * The fd travels between processes (SCM_RIGHTS), so the file decides, not the
 * process: the glue resolves params.fd to one of its files and makes the
 * driver see exactly that file at that fd for the call (gs_call.fd_file_id,
 * kmod/ioctl.c). A file that is not a nvidiactl node of the caller's instance
 * is refused (GS_REFUSE_FOREIGN): another instance's export cannot be
 * imported, and another instance's file cannot be made to hold this one's.
 *
 * Accounting. An export holds the memory as long as its file lives, past the
 * exporter's handle and process, so each exported slot holds a reference on
 * the memory's charge (struct gs_export), dropped when the file is reaped
 * (gs_file_closed(), after RM freed its duplicate). An import shares that
 * charge, as RM_DUP_OBJECT's duplicate does. So that what RM imports is what
 * the core counted:
 *  - the reference is taken in gs_pre(), so a free racing the export cannot
 *    uncharge the memory before the export is recorded; and an export does
 *    not meet a free or a creation in flight on its handle (registry.c,
 *    gs_busy_conflict()), which RM may run first, exporting another object;
 *  - only registered counted memory is exported (anything else would leave
 *    what it holds uncounted, or come back unknown to the scheduler);
 *  - a slot is written once: an export into a slot the core holds or is
 *    filling is refused, and an import of a slot it does not hold is answered
 *    as RM answers an empty one, without the driver; an import from a file
 *    it holds no slot of is refused (in the user-space build, another
 *    process's export);
 *  - imports carry handles the caller chose that nobody holds, and name
 *    none for an empty slot (RM's rollback of a failed batch frees it);
 *  - the reply's status is not trusted to undo anything (another thread can
 *    rewrite the reply once the driver has begun writing it, kmod/shadow.c):
 *    an export that fails keeps its slot and its charge until the file goes,
 *    and an import that fails registers its handles unless they are taken.
 *    Either costs a failing caller a charge it may not need, never the limit.
 */
#include "core_int.h"

/* offsets in the controls' parameters (nvrm_abi.h, ctrl0000unix.h) */
#define GS_EXP1_FD	16	/* nv0000_export_object_to_fd_params.fd */
#define GS_EXPN_OBJECTS	76
#define GS_EXPN_NUM	2124
#define GS_IMPN_PARENT	4
#define GS_IMPN_OBJECTS	8
#define GS_IMPN_TYPES	520	/* object_types[] */
#define GS_IMPN_NUM	648
#define GS_EXPN_MAX	8	/* nv0000_export_objects_to_fd_params.max_objects */

#define GS_BITS_PER_LONG	(8 * sizeof(unsigned long))
#define GS_EXPORT_BITMAP	(NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_MAX_OBJECTS / 8)

/* the controls whose row names this file's handler (filter.c) */
int gs_export_control(nv_u32 cmd)
{
	const struct gs_control_row *row = gs_control_row(cmd);

	return row && row->handler == &gs_export_handler;
}

static nv_u32 gs_export_params_size(nv_u32 cmd)
{
	switch (cmd) {
	case NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD:
		return sizeof(struct nv0000_export_object_to_fd_params);
	case NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD:
		return sizeof(struct nv0000_import_object_from_fd_params);
	case NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO:
		/* 535's has no gpuInstanceId (76 bytes); the core reads only its fd */
		return gs_abi()->export_object_info_size;
	case NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD:
		return sizeof(struct nv0000_export_objects_to_fd_params);
	case NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD:
		return sizeof(struct nv0000_import_objects_from_fd_params);
	}
	return 0;
}

static const struct nvos54_params *gs_export_call(const struct gs_call *c)
{
	const struct nvos54_params *p = c->arg;

	if (c->kind == GS_FILE_UVM || !c->arg || NV_IOC_TYPE(c->req) != NV_IOCTL_MAGIC ||
	    NV_IOC_NR(c->req) != NV_ESC_RM_CONTROL || c->arg_size < sizeof(*p) ||
	    !gs_export_control(p->cmd))
		return NULL;
	return p;
}

static int gs_export_read(const struct gs_io *io, const struct nvos54_params *p, nv_u32 off,
			  void *dst, nv_u32 len)
{
	if (!io || !p->params || off + len > p->params_size)
		return -1;
	return io->read(io->ctx, p->params + off, dst, len) ? -1 : 0;
}

int gs_call_fd(const struct gs_call *c, const struct gs_io *io, nv_s32 *fd)
{
	const struct nvos54_params *p = gs_export_call(c);
	nv_u32 off;

	if (!p)
		return 0;
	off = p->cmd == NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD ? GS_EXP1_FD : 0;
	return gs_export_read(io, p, off, fd, sizeof(*fd)) == 0;
}

/*
 * The slots a call names: *first and how many (0: none the core records,
 * RM refuses the call or it names none). -1: the parameters are unreadable
 * or not of the control's size; -2: a slot array larger than the core allows.
 */
static int gs_export_slots(const struct gs_io *io, const struct nvos54_params *p,
			   nv_u32 *first)
{
	struct nv0000_os_unix_export_object obj;
	nv_u16 nr[2], max;
	nv_u32 flags;

	*first = 0;
	if (p->params_size != gs_export_params_size(p->cmd))
		return -1;
	switch (p->cmd) {
	case NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD:
		if (gs_export_read(io, p, 0, &obj, sizeof(obj)) ||
		    gs_export_read(io, p, GS_EXP1_FD + 4, &flags, sizeof(flags)))
			return -1;
		/* os.c: RM answers NV_ERR_INVALID_PARAMETER to these */
		if (obj.type != NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM ||
		    (flags & NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_FLAGS_EMPTY_FD))
			return 0;
		return 1;
	case NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD:
		if (gs_export_read(io, p, 4, &obj, sizeof(obj)))
			return -1;
		return obj.type == NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM;
	case NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD:
		if (gs_export_read(io, p, GS_EXPN_NUM, nr, sizeof(nr)) ||
		    gs_export_read(io, p, GS_EXPN_MAX, &max, sizeof(max)))
			return -1;
		/*
		 * maxObjects sizes the slot array RM allocates for the file
		 * (os.c _initializeExportObjectFd, up to 65535 handles, no
		 * memcg): no more than one call can fill.
		 */
		if (max > NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_MAX_OBJECTS)
			return -2;
		*first = nr[1];
		return nr[0] <= NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_MAX_OBJECTS ? nr[0] : 0;
	case NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD:
		if (gs_export_read(io, p, GS_IMPN_NUM, nr, sizeof(nr)))
			return -1;
		*first = nr[1];
		return nr[0] <= NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_TO_FD_MAX_OBJECTS ? nr[0] : 0;
	}
	return 0;
}

static int gs_is_import(nv_u32 cmd)
{
	return cmd == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD ||
	       cmd == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD;
}

void gs_export_spares_free(struct gs_call *c)
{
	struct gs_export *e;
	struct gs_obj *ob;

	while ((e = c->spare_exp)) {
		c->spare_exp = e->next;
		gs_free(e);
	}
	while ((ob = c->spare_obj)) {
		c->spare_obj = ob->next;
		gs_free(ob);
	}
}

/*
 * Before the lock: one record per slot the call names, and for an import one
 * registry entry per slot, so that what gs_post() records cannot fail to be.
 */
int gs_export_spares_alloc(struct gs_call *c, const struct gs_io *io)
{
	const struct nvos54_params *p = gs_export_call(c);
	nv_u32 first;
	int i, n;

	if (!p)
		return 0;
	n = gs_export_slots(io, p, &first);
	for (i = 0; i < n; i++) {
		struct gs_export *e = gs_zalloc(sizeof(*e));
		struct gs_obj *ob;

		if (!e)
			goto err;
		e->next = c->spare_exp;
		c->spare_exp = e;
		if (!gs_is_import(p->cmd))
			continue;
		ob = gs_zalloc(sizeof(*ob));
		if (!ob)
			goto err;
		ob->next = c->spare_obj;
		c->spare_obj = ob;
	}
	return 0;
err:
	gs_export_spares_free(c);
	return -1;
}

static void gs_export_drop(struct gs_inst *in, struct gs_export *e)
{
	if (e->mem)
		gs_mem_put(in, e->mem);
	in->nr_exports--;
	gs_free(e);
}

/*
 * The slots of [first, first + n) that the core holds on c's file, as a
 * bitmap: one walk of the list, whatever n (at most 512).
 */
static void gs_export_held(struct gs_inst *in, const struct gs_call *c, nv_u32 first, nv_u32 n,
			   unsigned long *held)
{
	const struct gs_export *e;
	nv_u32 bit;

	memset(held, 0, GS_EXPORT_BITMAP);
	for (e = in->exports; e; e = e->next) {
		if (e->file_id != c->fd_file_id || e->slot < first || e->slot - first >= n)
			continue;
		bit = e->slot - first;
		held[bit / GS_BITS_PER_LONG] |= 1ul << (bit % GS_BITS_PER_LONG);
	}
}

static int gs_bit(const unsigned long *map, nv_u32 bit)
{
	return (map[bit / GS_BITS_PER_LONG] >> (bit % GS_BITS_PER_LONG)) & 1;
}

/* Holds the slots an export fills, and their charges, from gs_pre() on. */
static enum gs_refusal gs_export_pre_export(struct gs_inst *in, struct gs_call *c,
					    const struct gs_io *io,
					    const struct nvos54_params *p, nv_u32 first,
					    nv_u32 n, nv_u32 *status)
{
	unsigned long held[GS_EXPORT_BITMAP / sizeof(unsigned long)];
	struct gs_export *e;
	nv_u32 i = 0, nr = 0;

	/* the cap first: a refused call costs no walk */
	for (e = c->spare_exp; e; e = e->next, i++) {
		nv_handle h = 0;

		if (p->cmd == NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD)
			gs_export_read(io, p, 12, &h, sizeof(h));	/* object.hObject */
		else	/* objects[i] goes to slot index + i */
			gs_export_read(io, p, GS_EXPN_OBJECTS + 4 * i, &h, sizeof(h));
		e->file_id = c->fd_file_id;
		e->slot = first + i;
		e->client = p->h_client;
		e->handle = h;
		nr += h != 0;
	}
	if (in->nr_exports + nr > GS_MAX_EXPORTS) {
		*status = NV_ERR_INSUFFICIENT_RESOURCES;
		return GS_REFUSE_LIMIT;
	}
	gs_export_held(in, c, first, n, held);
	for (e = c->spare_exp; e; e = e->next) {
		const struct gs_obj *ob;

		/* written once: RM would replace (or, for 0, clear) what it holds */
		if (gs_bit(held, e->slot - first)) {
			*status = NV_ERR_STATE_IN_USE;
			return GS_REFUSE_MALFORMED;
		}
		if (!e->handle)
			continue;	/* RM clears an empty slot: nothing to hold */
		/*
		 * Counted memory only (what shareable handles are): anything
		 * else the export would keep alive is counted by nobody (a
		 * TSG's context buffers), or would come back as an object the
		 * scheduler does not know.
		 */
		ob = gs_obj_find(in, p->h_client, e->handle);
		if (!ob || ob->o.obj_kind == GPUSLICE_OBJ_CLIENT) {
			*status = NV_ERR_INSUFFICIENT_PERMISSIONS;
			return GS_REFUSE_FOREIGN;
		}
		if (!ob->mem) {
			*status = NV_ERR_NOT_SUPPORTED;
			return GS_REFUSE_CLASS;
		}
		/* a free or creation in flight on it: RM may export what comes after */
		if (gs_busy_conflict(in, GS_BUSY_SOURCE, p->h_client, e->handle, 0)) {
			*status = NV_ERR_STATE_IN_USE;
			return GS_REFUSE_MALFORMED;
		}
	}
	while ((e = c->spare_exp)) {
		const struct gs_obj *ob;

		c->spare_exp = e->next;
		if (!e->handle) {
			gs_free(e);
			continue;
		}
		ob = gs_obj_find(in, e->client, e->handle);
		e->klass = ob->o.klass;
		e->gpu = ob->o.gpu;
		e->mem = ob->mem;
		e->mem->refs++;
		e->pending = c;
		e->next = in->exports;
		in->exports = e;
		in->nr_exports++;
	}
	return GS_REFUSE_NONE;
}

/*
 * Notes in the spare records what an import will register. Answers without
 * the driver (*status, no refusal) when a slot is being exported into, or,
 * for a single object, not held: RM's answer to an empty slot.
 */
static enum gs_refusal gs_export_pre_import(struct gs_inst *in, struct gs_call *c,
					    const struct gs_io *io,
					    const struct nvos54_params *p, nv_u32 first,
					    nv_u32 n, nv_u32 *status)
{
	struct nv0000_os_unix_export_object obj = { 0 };
	const struct gs_export *rec;
	struct gs_export *e, *e2;
	nv_handle parent = 0;
	nv_u32 i = 0, nr = 0;
	int any = 0;

	if (p->cmd == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD) {
		gs_export_read(io, p, 4, &obj, sizeof(obj));
		parent = obj.h_parent;
	} else {
		gs_export_read(io, p, GS_IMPN_PARENT, &parent, sizeof(parent));
	}
	for (e = c->spare_exp; e; e = e->next, i++) {
		nv_handle h = obj.h_object;

		if (p->cmd == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD)
			gs_export_read(io, p, GS_IMPN_OBJECTS + 4 * i, &h, sizeof(h));
		e->slot = first + i;
		e->client = p->h_client;
		e->parent = parent;
		e->handle = h;
		e->held = NULL;
	}
	/* each slot's record, in one walk of the list */
	for (rec = in->exports; rec; rec = rec->next) {
		if (rec->file_id != c->fd_file_id)
			continue;
		any = 1;
		if (rec->slot < first || rec->slot - first >= n)
			continue;
		if (rec->pending) {
			*status = NV_ERR_STATE_IN_USE;	/* being exported into: not there yet */
			return GS_REFUSE_NONE;
		}
		for (e = c->spare_exp; e && e->slot != rec->slot; e = e->next)
			;
		if (e)
			e->held = rec;
	}
	/*
	 * A file this core recorded no export on holds none that the instance
	 * made through it, unless the glue found it another process's of the
	 * instance (the user-space build: one core per process).
	 */
	if (!any && !c->fd_sibling) {
		*status = NV_ERR_INSUFFICIENT_PERMISSIONS;
		return GS_REFUSE_FOREIGN;
	}
	for (e = c->spare_exp; e; e = e->next) {
		/*
		 * Another core's slots: which are filled is RM's to say (the
		 * reply's object types); each handle named is checked as a held
		 * slot's is, and what the import made is registered uncharged.
		 */
		if (!any && e->handle)
			e->sibling = 1;
		/*
		 * RM skips an empty slot, but if a later one fails it frees the
		 * handle named for it all the same (os.c): name none there.
		 */
		if (!e->held && !e->sibling) {
			if (e->handle && p->cmd == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD) {
				*status = NV_ERR_INVALID_ARGUMENT;
				return GS_REFUSE_MALFORMED;
			}
			continue;
		}
		/*
		 * A handle the caller chose (RM's choice comes back in a reply
		 * another thread can rewrite), not registered (the import must
		 * be what registers it), once.
		 */
		if (!e->handle || gs_obj_find(in, p->h_client, e->handle)) {
			*status = e->handle ? NV_ERR_INSERT_DUPLICATE_NAME : NV_ERR_INVALID_ARGUMENT;
			return GS_REFUSE_MALFORMED;
		}
		if (gs_busy_conflict(in, GS_BUSY_CREATE, p->h_client, e->handle, e->parent)) {
			*status = NV_ERR_STATE_IN_USE;
			return GS_REFUSE_MALFORMED;
		}
		for (e2 = c->spare_exp; e2 != e; e2 = e2->next)
			if ((e2->held || e2->sibling) && e2->handle == e->handle) {
				*status = NV_ERR_INSERT_DUPLICATE_NAME;
				return GS_REFUSE_MALFORMED;
			}
		nr++;
	}
	if (p->cmd == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD && !nr) {
		*status = NV_ERR_INVALID_PARAMETER;	/* os.c: nvfp->handles[0] == 0 */
		return GS_REFUSE_NONE;
	}
	if (in->nr_objects + nr > GS_MAX_OBJECTS) {
		*status = NV_ERR_INSUFFICIENT_RESOURCES;
		return GS_REFUSE_LIMIT;
	}
	return GS_REFUSE_NONE;
}

enum gs_refusal gs_export_pre(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			      const struct nvos54_params *p, nv_u32 *status)
{
	nv_u32 first;
	int n;

	*status = NV_OK;
	n = gs_export_slots(io, p, &first);
	if (n < 0) {
		*status = n == -2 ? NV_ERR_INVALID_PARAMETER : NV_ERR_INVALID_POINTER;
		return GS_REFUSE_MALFORMED;
	}
	if (!c->fd_file_id) {
		*status = NV_ERR_INSUFFICIENT_PERMISSIONS;
		return GS_REFUSE_FOREIGN;
	}
	if (!n)
		return GS_REFUSE_NONE;	/* nothing to record: RM answers */
	if (gs_is_import(p->cmd))
		return gs_export_pre_import(in, c, io, p, first, n, status);
	return gs_export_pre_export(in, c, io, p, first, n, status);
}

/*
 * What an import from another process's file made, as RM's reply says: for a
 * batch, each slot's object type (os.c, RmImportObjects(): NONE for an empty
 * slot, which RM skips); for one object, the call's status. Registered with
 * no charge of its own: the exporting process's core charged the memory and
 * holds the charge while its export lives (the user-space build's limit is a
 * process's). The reply is the caller's memory, so a thread can rewrite it:
 * this costs no charge either way, only what the core knows of the handle.
 */
static void gs_export_post_sibling(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				   const struct nvos54_params *p, struct gs_evq *q)
{
	const struct gs_export *e;
	nv_u32 i = 0;

	for (e = c->spare_exp; e; e = e->next, i++) {
		nv_u32 klass = NV01_MEMORY_LOCAL_USER;
		struct gs_object o;
		nv_u8 type = NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_VIDMEM;

		if (!e->sibling)
			continue;
		if (p->cmd == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD) {
			type = NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_NONE;
			if (c->status != NV_OK || c->reply_lost ||
			    gs_export_read(io, p, GS_IMPN_TYPES + i, &type, sizeof(type)))
				continue;
		} else if (c->status != NV_OK) {
			continue;
		}
		if (type == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_NONE)
			continue;
		if (type == NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_SYSMEM)
			klass = NV01_MEMORY_SYSTEM;
		if (gs_obj_find(in, e->client, e->handle))
			continue;	/* registered since by a racing call RM let through */
		gs_obj_init(&o, in, c, GPUSLICE_OBJ_MEMORY, e->client, e->parent, e->handle, klass);
		gs_obj_add(in, c, &o, NULL, q);
	}
}

/* What the import made: registered, sharing the exported charge. */
static void gs_export_post_import(struct gs_inst *in, struct gs_call *c, struct gs_evq *q)
{
	const struct gs_export *e;
	int was_lost = c->reply_lost;

	/*
	 * A failed import may have made nothing; its handles were not
	 * registered at the check, and one registered since (a racing
	 * allocation RM let through) is not replaced.
	 */
	c->reply_lost = 1;
	for (e = c->spare_exp; e; e = e->next) {
		const struct gs_export *held = NULL, *rec;
		struct gs_object o;

		if (!e->held)
			continue;	/* empty at the check (e->held is not read: see below) */
		/*
		 * Looked up again: in the user-space build another thread can
		 * close the export file mid-call, and its records go with it.
		 */
		for (rec = in->exports; rec && !held; rec = rec->next)
			if (rec->file_id == c->fd_file_id && rec->slot == e->slot && !rec->pending)
				held = rec;
		if (!held)
			continue;
		gs_obj_init(&o, in, c, GPUSLICE_OBJ_MEMORY, e->client, e->parent, e->handle,
			    held->klass);
		o.gpu = held->gpu;	/* the exported memory's, not the parent's */
		held->mem->refs++;
		if (!gs_obj_add(in, c, &o, held->mem, q))
			gs_mem_put(in, held->mem);
	}
	c->reply_lost = was_lost;
}

void gs_export_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
		    const struct nvos54_params *p, nv_u32 status, struct gs_evq *q)
{
	struct gs_export *e;

	(void)status;	/* see the top of this file: a failure undoes nothing */
	if (gs_is_import(p->cmd)) {
		gs_export_post_import(in, c, q);
		gs_export_post_sibling(in, c, io, p, q);
		return;
	}
	for (e = in->exports; e; e = e->next)
		if (e->pending == c)
			e->pending = NULL;
}

/* Drops the records of c's pending export (c) or of a file (file_id). */
static void gs_export_drop_if(struct gs_inst *in, const struct gs_call *c, nv_u64 file_id)
{
	struct gs_export **pp = &in->exports, *e;

	while ((e = *pp)) {
		if (c ? e->pending == c : e->file_id == file_id) {
			*pp = e->next;
			gs_export_drop(in, e);
		} else {
			pp = &e->next;
		}
	}
}

/* The driver did not run c (its ioctl failed): the slots it held are free. */
void gs_export_abort(struct gs_inst *in, struct gs_call *c)
{
	gs_export_drop_if(in, c, 0);
}

/* The file was released and RM freed what it held (gs_file_closed()). */
void gs_export_free_file(struct gs_inst *in, nv_u64 file_id)
{
	gs_export_drop_if(in, NULL, file_id);
}

static enum gs_verdict gs_export_handler_pre(struct gs_inst *in, struct gs_call *c,
					     const struct gs_io *io, const struct nvos54_params *p,
					     nv_u32 *status)
{
	enum gs_refusal r = gs_export_pre(in, c, io, p, status);

	if (r == GS_REFUSE_NONE && *status == NV_OK)
		return GS_PASS;
	c->refusal = r;
	return GS_REPLY;
}

static void gs_export_handler_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				   const struct nvos54_params *p, struct gs_evq *q)
{
	gs_export_post(in, c, io, p, c->status, q);
}

const struct gs_control_handler gs_export_handler = {
	.pre = gs_export_handler_pre,
	.post = gs_export_handler_post,
};
