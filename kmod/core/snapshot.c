// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * snapshot.c - an instance's state as bytes, and an instance made from them,
 * so that a new core can take over from an old one with nothing lost: the
 * limits, capability set and flags, every charge and the references on it,
 * the registry with its links, what is parked or orphaned on clients, the
 * exports, nvidia-uvm's records and the OS events.
 *
 * The unit is one instance (struct gs_inst): every record the core keeps
 * hangs off it, keyed by the files it came through. What is not carried:
 * the calls in flight (a snapshot needs none: -EBUSY), the hash key (the
 * reader keeps its own: object walks may list in another order), and the
 * glue's event callback. The bytes are read only by a core of the same
 * driver ABI row and GPU count (-ENOEXEC), and are never for user space.
 *
 * Format (GS_SNAPSHOT_VERSION 1, core.h): little-endian, fixed-width fields,
 * u32 unless named otherwise; NONE is 0xffffffff; records of a table follow
 * each other without gaps, the tables in this order.
 *
 *   header, 96 bytes
 *     0 magic 0x504e5347 ("GSNP")   4 version            8 crc32 (IEEE, of
 *     all total_len bytes with this field 0)            12 total_len
 *    16 char[8] the ABI row's branch, NUL padded   24 char[24] its first
 *       release   48 nr_gpus (GPUSLICE_MAX_GPUS)   52 nr_hist
 *       (GPUSLICE_LOCK_HIST_BUCKETS)   56 mems   60 objs   64 edges
 *    68 orphans   72 parked   76 exports   80 uvm   84 uvm_gpus (uuids of
 *       all uvm records)   88 os_events   92 0
 *   instance, 72 + 32 * nr_gpus + 8 * (6 + 2 * nr_hist) bytes
 *     0 flags   4 caps   8 gpus (mask)   12 gpu_ids_set   16 u64 limit
 *    24 u64 used   32 u64 peak   40 u64 sys_used   48 u64 nr_ioctls
 *    56 u64 nr_refused_quota   64 u64 nr_refused_filter
 *    72 per GPU: u64 limit, u64 used, u64 peak, gpu_id, 0
 *       then the lock's figures: u64 acquired, contended, hold_ns, wait_ns,
 *       hold_max_ns, wait_max_ns, hold_hist[nr_hist], wait_hist[nr_hist]
 *   mems, 24 bytes each: a charge (struct gs_mem)
 *     0 u64 size   8 refs   12 gpu   16 uvm_maps   20 flags (1: system memory)
 *   objs, 104 bytes each: a registry record (struct gs_obj)
 *     0 obj_kind   4 class   8 client   12 handle   16 parent   20 pid
 *    24 ns_pid   28 gpu   32 engine   36 flags (GS_OBJ_*)   40 gp_entries
 *    44 userd_mem   48 u64 file_id   56 u64 size   64 u64 userd_off
 *    72 up (the record of its parent or, a stray's, its client; NONE for a
 *       client)   76 mem (NONE: none)   80 dep[4] (records it depends on,
 *       by slot, NONE: slot unused)   96 state (1 stray, 2 registered with
 *       nvidia-uvm, 4 on the ns_pid index)   100 0
 *   edges, 12 bytes each: to's dependants, in list order
 *     0 to   4 from   8 slot (from's dep[] slot)
 *   orphans, 8 bytes each: memory charged to a client without a handle
 *     0 client's record   4 mem
 *   parked, 8 bytes each: references a client holds without a handle
 *     0 client's record   4 mem
 *   exports, 40 bytes each: slots of nvidiactl files (struct gs_export)
 *     0 u64 file_id   8 slot   12 client   16 parent   20 handle   24 class
 *    28 gpu   32 mem   36 flags (1: from another core's file)
 *   uvm, 56 bytes each and 16 per GPU uuid after it (struct gs_uvm_rec)
 *     0 u64 file_id   8 u64 start   16 u64 end   24 kind (enum gs_uvm_kind)
 *    28 client   32 handle   36 orphan   40 mem   44 pt (page tables' charge)
 *    48 nr_gpus   52 0
 *   os_events, 16 bytes each
 *     0 u64 file_id   8 client   12 fd
 *
 * Every list keeps its order. The writer puts the clients first, in their
 * list's order, then the others breadth first (each record's kids, then its
 * strays), so that a record's parent comes before it; mems are numbered by
 * their first reference in table order (objs, orphans, parked, exports, uvm's
 * mem then pt). The reader takes only that canonical order, so that what it
 * accepts a writer gives back byte for byte (the lock's figures aside).
 *
 * The reader checks everything before it changes anything: lengths and
 * checksum, counts (each cap, doubled: calls in flight may pass a cap
 * together), every index and link in range and of the right kind, parents
 * before children (no cycle), each dependency edge once, every reference a
 * charge's count says it has and no other, a charge owned by one client or
 * one record of page tables held by nothing else, and charges that add up to
 * used, per GPU and in all.
 */
#include "core_int.h"

#define GS_SNAP_MAGIC	0x504e5347u
#define GS_SNAP_NONE	0xffffffffu

#define GS_SNAP_HDR	96
#define GS_SNAP_INST	72
#define GS_SNAP_GPU	32
#define GS_SNAP_MEM	24
#define GS_SNAP_OBJ	104
#define GS_SNAP_EDGE	12
#define GS_SNAP_OWNED	8
#define GS_SNAP_EXPORT	40
#define GS_SNAP_UVM	56
#define GS_SNAP_UUID	16
#define GS_SNAP_OSEV	16

#define GS_SNAP_BRANCH	8
#define GS_SNAP_RELEASE	24

/* header */
#define GS_SH_VERSION	4
#define GS_SH_CRC	8
#define GS_SH_LEN	12
#define GS_SH_BRANCH	16
#define GS_SH_RELEASE	24
#define GS_SH_GPUS	48
#define GS_SH_HIST	52
#define GS_SH_COUNTS	56
#define GS_SH_ZERO	92

/* objs */
#define GS_SO_KIND	0
#define GS_SO_KLASS	4
#define GS_SO_CLIENT	8
#define GS_SO_HANDLE	12
#define GS_SO_PARENT	16
#define GS_SO_PID	20
#define GS_SO_NS_PID	24
#define GS_SO_GPU	28
#define GS_SO_ENGINE	32
#define GS_SO_FLAGS	36
#define GS_SO_GP	40
#define GS_SO_USERD	44
#define GS_SO_FILE	48
#define GS_SO_SIZE	56
#define GS_SO_USERD_OFF	64
#define GS_SO_UP	72
#define GS_SO_MEM	76
#define GS_SO_DEP	80
#define GS_SO_STATE	96
#define GS_SO_ZERO	100

#define GS_SNAP_STRAY	0x1
#define GS_SNAP_UVM_REG	0x2
#define GS_SNAP_NS_PID	0x4

/* what a charge's references may be (struct gs_mem.snap_idx while reading) */
#define GS_SNAP_OWN	0x1	/* a client's orphan or a record's page tables: the only one */
#define GS_SNAP_SHARE	0x2	/* any other */

/* calls in flight may each pass a cap before any of them registers */
#define GS_SNAP_SLACK	2

struct gs_snap_counts {
	nv_u32 mems, objs, edges, orphans, parked, exports, uvm, uvm_gpus, osev;
};

/* where each table starts */
struct gs_snap_layout {
	struct gs_snap_counts n;
	nv_u64 inst, mems, objs, edges, orphans, parked, exports, uvm, osev, end;
};

static void gs_snap_layout(struct gs_snap_layout *l)
{
	const struct gs_snap_counts *n = &l->n;

	l->inst = GS_SNAP_HDR;
	l->mems = l->inst + GS_SNAP_INST + GS_SNAP_GPU * GPUSLICE_MAX_GPUS +
		  8 * (6 + 2 * GPUSLICE_LOCK_HIST_BUCKETS);
	l->objs = l->mems + (nv_u64)n->mems * GS_SNAP_MEM;
	l->edges = l->objs + (nv_u64)n->objs * GS_SNAP_OBJ;
	l->orphans = l->edges + (nv_u64)n->edges * GS_SNAP_EDGE;
	l->parked = l->orphans + (nv_u64)n->orphans * GS_SNAP_OWNED;
	l->exports = l->parked + (nv_u64)n->parked * GS_SNAP_OWNED;
	l->uvm = l->exports + (nv_u64)n->exports * GS_SNAP_EXPORT;
	l->osev = l->uvm + (nv_u64)n->uvm * GS_SNAP_UVM + (nv_u64)n->uvm_gpus * GS_SNAP_UUID;
	l->end = l->osev + (nv_u64)n->osev * GS_SNAP_OSEV;
}

/* CRC-32 (IEEE 802.3, zlib's), four bits at a time */
static nv_u32 gs_crc32(nv_u32 crc, const nv_u8 *p, nv_u64 len)
{
	static const nv_u32 tab[16] = {
		0x00000000, 0x1db71064, 0x3b6e20c8, 0x26d930ac,
		0x76dc4190, 0x6b6b51f4, 0x4db26158, 0x5005713c,
		0xedb88320, 0xf00f9344, 0xd6d6a3e8, 0xcb61b38c,
		0x9b64c2b0, 0x86d3d2d4, 0xa00ae278, 0xbdbdf21c,
	};

	while (len--) {
		crc ^= *p++;
		crc = (crc >> 4) ^ tab[crc & 15];
		crc = (crc >> 4) ^ tab[crc & 15];
	}
	return crc;
}

/* the checksum of a snapshot, its own field read as 0 */
static nv_u32 gs_snap_crc(const nv_u8 *p, nv_u64 len)
{
	static const nv_u8 zero[4];
	nv_u32 crc = ~0u;

	crc = gs_crc32(crc, p, GS_SH_CRC);
	crc = gs_crc32(crc, zero, sizeof(zero));
	crc = gs_crc32(crc, p + GS_SH_CRC + 4, len - GS_SH_CRC - 4);
	return ~crc;
}

static nv_u32 gs_get32(const nv_u8 *p)
{
	return p[0] | (nv_u32)p[1] << 8 | (nv_u32)p[2] << 16 | (nv_u32)p[3] << 24;
}

static nv_u64 gs_get64(const nv_u8 *p)
{
	return gs_get32(p) | (nv_u64)gs_get32(p + 4) << 32;
}

/* ---- writing ---- */

struct gs_snap_out {
	nv_u8 *p;
	nv_u64 off;
};

static void gs_put32(struct gs_snap_out *w, nv_u32 v)
{
	nv_u8 *b = w->p + w->off;

	b[0] = v;
	b[1] = v >> 8;
	b[2] = v >> 16;
	b[3] = v >> 24;
	w->off += 4;
}

static void gs_put64(struct gs_snap_out *w, nv_u64 v)
{
	gs_put32(w, (nv_u32)v);
	gs_put32(w, (nv_u32)(v >> 32));
}

/* s in a field of n bytes, NUL padded (at least one NUL) */
static void gs_put_str(struct gs_snap_out *w, const char *s, nv_u32 n)
{
	nv_u32 i, len = strlen(s);

	for (i = 0; i < n; i++)
		w->p[w->off + i] = i < len && i < n - 1 ? s[i] : 0;
	w->off += n;
}

/*
 * No call between gs_pre() and gs_post(): none counted in flight (a call
 * may hold nothing else while RM runs it: an import, a schedule, a client's
 * allocation, nvidia-uvm's channel registration or unmap), nothing
 * reserved, pending or being freed.
 */
static int gs_snap_quiet(const struct gs_inst *in)
{
	const struct gs_export *e;
	unsigned int g;

	if (in->nr_inflight || in->busy || in->sys_reserved)
		return -EBUSY;
	for (g = 0; g < GPUSLICE_MAX_GPUS; g++)
		if (in->gpu_reserved[g])
			return -EBUSY;
	for (e = in->exports; e; e = e->next)
		if (e->pending || e->held)
			return -EBUSY;
	return 0;
}

static void gs_snap_enqueue(struct gs_obj *ob, struct gs_obj ***tail, nv_u32 *n)
{
	ob->snap_idx = (*n)++;
	ob->kill = NULL;
	**tail = ob;
	*tail = &ob->kill;
}

/*
 * The records in the format's order, through ->kill (free between calls),
 * from in->clients; each numbered (snap_idx). Returns how many.
 */
static nv_u32 gs_snap_order(struct gs_inst *in)
{
	struct gs_obj *head = NULL, **tail = &head, *ob, *k;
	nv_u32 n = 0;

	for (ob = in->clients; ob; ob = ob->sib)
		gs_snap_enqueue(ob, &tail, &n);
	for (ob = head; ob; ob = ob->kill) {
		for (k = ob->kids; k; k = k->sib)
			gs_snap_enqueue(k, &tail, &n);
		for (k = ob->strays; k; k = k->sib)
			gs_snap_enqueue(k, &tail, &n);
	}
	return n;
}

/* the kinds of walk over the charges' references, in the format's order */
enum gs_snap_pass {
	GS_SNAP_NUMBER,		/* number each charge at its first reference */
	GS_SNAP_EMIT,		/* write each at its first reference */
	GS_SNAP_CLEAR,		/* forget the numbers */
};

struct gs_snap_walk {
	enum gs_snap_pass pass;
	nv_u32 n;
	struct gs_snap_out *w;
};

static void gs_snap_mem(struct gs_snap_walk *sw, struct gs_mem *m)
{
	switch (sw->pass) {
	case GS_SNAP_NUMBER:
		if (!m->snap_idx)
			m->snap_idx = ++sw->n;
		break;
	case GS_SNAP_EMIT:
		if (m->snap_idx != sw->n + 1)
			break;
		sw->n++;
		gs_put64(sw->w, m->size);
		gs_put32(sw->w, m->refs);
		gs_put32(sw->w, m->gpu);
		gs_put32(sw->w, m->uvm_maps);
		gs_put32(sw->w, m->sys ? 1 : 0);
		break;
	case GS_SNAP_CLEAR:
		m->snap_idx = 0;
		break;
	}
}

/* a charged record of page tables (one with refs 0 was never charged) */
static struct gs_mem *gs_snap_pt(const struct gs_uvm_rec *r)
{
	return r->pt && r->pt->refs ? r->pt : NULL;
}

static void gs_snap_mems(struct gs_inst *in, struct gs_snap_walk *sw)
{
	struct gs_export *e;
	struct gs_uvm_rec *r;
	struct gs_memref *ref;
	struct gs_obj *ob;
	struct gs_mem *m;

	for (ob = in->clients; ob; ob = ob->kill)
		if (ob->mem)
			gs_snap_mem(sw, ob->mem);
	for (ob = in->clients; ob; ob = ob->sib)
		for (m = ob->orphans; m; m = m->next)
			gs_snap_mem(sw, m);
	for (ob = in->clients; ob; ob = ob->sib)
		for (ref = ob->held; ref; ref = ref->next)
			gs_snap_mem(sw, ref->mem);
	for (e = in->exports; e; e = e->next)
		if (e->mem)
			gs_snap_mem(sw, e->mem);
	for (r = in->uvm_recs; r; r = r->next) {
		if (r->mem)
			gs_snap_mem(sw, r->mem);
		if (gs_snap_pt(r))
			gs_snap_mem(sw, r->pt);
	}
}

static nv_u32 gs_snap_idx(const struct gs_mem *m)
{
	return m ? m->snap_idx - 1 : GS_SNAP_NONE;
}

/*
 * Numbers the records and counts the tables; -EIO if a record is off the
 * tree or a charge is where only a client's may be (the writer's own state
 * is wrong: nothing to hand over).
 */
static int gs_snap_count(struct gs_inst *in, struct gs_snap_counts *n)
{
	struct gs_snap_walk sw = { .pass = GS_SNAP_NUMBER };
	const struct gs_export *e;
	const struct gs_uvm_rec *r;
	const struct gs_memref *ref;
	const struct gs_osev *ev;
	const struct gs_obj *ob;
	const struct gs_mem *m;
	unsigned int i;

	memset(n, 0, sizeof(*n));
	n->objs = gs_snap_order(in);
	for (ob = in->clients; ob; ob = ob->kill) {
		if (ob->o.obj_kind != GPUSLICE_OBJ_CLIENT && (ob->orphans || ob->held))
			return -EIO;
		for (i = 0; i < GS_OBJ_DEPS; i++)
			n->edges += ob->dep[i].to != NULL;
	}
	if (n->objs != in->nr_objects)
		return -EIO;
	for (ob = in->clients; ob; ob = ob->sib) {
		for (m = ob->orphans; m; m = m->next)
			n->orphans++;
		for (ref = ob->held; ref; ref = ref->next)
			n->parked++;
	}
	for (e = in->exports; e; e = e->next)
		n->exports++;
	for (r = in->uvm_recs; r; r = r->next) {
		n->uvm++;
		n->uvm_gpus += r->nr_gpus;
	}
	for (ev = in->os_events; ev; ev = ev->next)
		n->osev++;
	gs_snap_mems(in, &sw);
	n->mems = sw.n;
	return 0;
}

/* undoes gs_snap_count()'s marks */
static void gs_snap_uncount(struct gs_inst *in)
{
	struct gs_snap_walk sw = { .pass = GS_SNAP_CLEAR };
	struct gs_obj *ob, *next;

	gs_snap_mems(in, &sw);
	for (ob = in->clients; ob; ob = next) {
		next = ob->kill;
		ob->kill = NULL;
	}
}

static void gs_snap_put_inst(struct gs_snap_out *w, const struct gs_inst *in)
{
	const struct gs_lock_stats *st = &in->lock.st;
	unsigned int g;

	gs_put32(w, in->flags);
	gs_put32(w, in->caps);
	gs_put32(w, in->gpus);
	gs_put32(w, in->gpu_ids_set ? 1 : 0);
	gs_put64(w, in->limit);
	gs_put64(w, in->used);
	gs_put64(w, in->peak);
	gs_put64(w, in->sys_used);
	gs_put64(w, in->nr_ioctls);
	gs_put64(w, in->nr_refused_quota);
	gs_put64(w, in->nr_refused_filter);
	for (g = 0; g < GPUSLICE_MAX_GPUS; g++) {
		gs_put64(w, in->gpu_limit[g]);
		gs_put64(w, in->gpu_used[g]);
		gs_put64(w, in->gpu_peak[g]);
		gs_put32(w, in->gpu_ids[g]);
		gs_put32(w, 0);
	}
	gs_put64(w, st->acquired);
	gs_put64(w, st->contended);
	gs_put64(w, st->hold_ns);
	gs_put64(w, st->wait_ns);
	gs_put64(w, st->hold_max_ns);
	gs_put64(w, st->wait_max_ns);
	for (g = 0; g < GPUSLICE_LOCK_HIST_BUCKETS; g++)
		gs_put64(w, st->hold_hist[g]);
	for (g = 0; g < GPUSLICE_LOCK_HIST_BUCKETS; g++)
		gs_put64(w, st->wait_hist[g]);
}

static void gs_snap_put_obj(struct gs_snap_out *w, const struct gs_obj *ob)
{
	const struct gs_object *o = &ob->o;
	int client = o->obj_kind == GPUSLICE_OBJ_CLIENT;
	unsigned int i;

	gs_put32(w, o->obj_kind);
	gs_put32(w, o->klass);
	gs_put32(w, o->client);
	gs_put32(w, o->handle);
	gs_put32(w, o->parent);
	gs_put32(w, o->pid);
	gs_put32(w, ob->ns_pid);
	gs_put32(w, o->gpu);
	gs_put32(w, o->engine);
	gs_put32(w, o->flags);
	gs_put32(w, o->gp_entries);
	gs_put32(w, o->userd_mem);
	gs_put64(w, o->file_id);
	gs_put64(w, o->size);
	gs_put64(w, o->userd_off);
	gs_put32(w, client || !ob->up ? GS_SNAP_NONE : ob->up->snap_idx);
	gs_put32(w, gs_snap_idx(ob->mem));
	for (i = 0; i < GS_OBJ_DEPS; i++)
		gs_put32(w, ob->dep[i].to ? ob->dep[i].to->snap_idx : GS_SNAP_NONE);
	gs_put32(w, (ob->stray ? GS_SNAP_STRAY : 0) | (ob->uvm_registered ? GS_SNAP_UVM_REG : 0) |
		    (client && ob->nspid_pprev ? GS_SNAP_NS_PID : 0));
	gs_put32(w, 0);
}

static void gs_snap_put_tables(struct gs_snap_out *w, struct gs_inst *in)
{
	struct gs_snap_walk sw = { .pass = GS_SNAP_EMIT, .w = w };
	const struct gs_export *e;
	const struct gs_uvm_rec *r;
	const struct gs_memref *ref;
	const struct gs_osev *ev;
	const struct gs_obj *ob;
	const struct gs_mem *m;
	const struct gs_dep *d;
	nv_u32 i;

	gs_snap_mems(in, &sw);
	for (ob = in->clients; ob; ob = ob->kill)
		gs_snap_put_obj(w, ob);
	for (ob = in->clients; ob; ob = ob->kill) {
		for (d = ob->dependants; d; d = d->next) {
			gs_put32(w, ob->snap_idx);
			gs_put32(w, d->from->snap_idx);
			gs_put32(w, (nv_u32)(d - d->from->dep));
		}
	}
	for (ob = in->clients; ob; ob = ob->sib) {
		for (m = ob->orphans; m; m = m->next) {
			gs_put32(w, ob->snap_idx);
			gs_put32(w, gs_snap_idx(m));
		}
	}
	for (ob = in->clients; ob; ob = ob->sib) {
		for (ref = ob->held; ref; ref = ref->next) {
			gs_put32(w, ob->snap_idx);
			gs_put32(w, gs_snap_idx(ref->mem));
		}
	}
	for (e = in->exports; e; e = e->next) {
		gs_put64(w, e->file_id);
		gs_put32(w, e->slot);
		gs_put32(w, e->client);
		gs_put32(w, e->parent);
		gs_put32(w, e->handle);
		gs_put32(w, e->klass);
		gs_put32(w, e->gpu);
		gs_put32(w, gs_snap_idx(e->mem));
		gs_put32(w, e->sibling ? 1 : 0);
	}
	for (r = in->uvm_recs; r; r = r->next) {
		const struct nv_processor_uuid *uuid = (const void *)(r + 1);	/* as uvm.c has them */

		gs_put64(w, r->file_id);
		gs_put64(w, r->start);
		gs_put64(w, r->end);
		gs_put32(w, r->kind);
		gs_put32(w, r->client);
		gs_put32(w, r->handle);
		gs_put32(w, r->orphan ? 1 : 0);
		gs_put32(w, gs_snap_idx(r->mem));
		gs_put32(w, gs_snap_idx(gs_snap_pt(r)));
		gs_put32(w, r->nr_gpus);
		gs_put32(w, 0);
		for (i = 0; i < r->nr_gpus; i++) {
			memcpy(w->p + w->off, uuid[i].uuid, GS_SNAP_UUID);
			w->off += GS_SNAP_UUID;
		}
	}
	for (ev = in->os_events; ev; ev = ev->next) {
		gs_put64(w, ev->file_id);
		gs_put32(w, ev->client);
		gs_put32(w, ev->fd);
	}
}

static void gs_snap_put_header(struct gs_snap_out *w, const struct gs_snap_layout *l)
{
	const struct nvrm_table *abi = gs_abi();

	gs_put32(w, GS_SNAP_MAGIC);
	gs_put32(w, GS_SNAPSHOT_VERSION);
	gs_put32(w, 0);		/* the checksum, once the rest is written */
	gs_put32(w, (nv_u32)l->end);
	gs_put_str(w, abi->branch, GS_SNAP_BRANCH);
	gs_put_str(w, abi->versions[0], GS_SNAP_RELEASE);
	gs_put32(w, GPUSLICE_MAX_GPUS);
	gs_put32(w, GPUSLICE_LOCK_HIST_BUCKETS);
	gs_put32(w, l->n.mems);
	gs_put32(w, l->n.objs);
	gs_put32(w, l->n.edges);
	gs_put32(w, l->n.orphans);
	gs_put32(w, l->n.parked);
	gs_put32(w, l->n.exports);
	gs_put32(w, l->n.uvm);
	gs_put32(w, l->n.uvm_gpus);
	gs_put32(w, l->n.osev);
	gs_put32(w, 0);
}

/* under in->lock: the snapshot's size, and with buf, the snapshot in it */
static long gs_snap_write_locked(struct gs_inst *in, nv_u8 *buf, unsigned long len)
{
	struct gs_snap_out w = { .p = buf };
	struct gs_snap_layout l;
	long ret;

	ret = gs_snap_quiet(in);
	if (ret)
		return ret;
	ret = gs_snap_count(in, &l.n);
	if (ret)
		goto out;
	gs_snap_layout(&l);
	ret = -EFBIG;
	if (l.end > 0xffffffffu || l.end > (nv_u64)(~0ul >> 1) ||
	    (nv_u64)l.n.orphans + l.n.parked > GS_SNAP_SLACK * GS_MAX_OBJECTS)
		goto out;
	ret = (long)l.end;
	if (!buf)
		goto out;
	ret = -ENOSPC;
	if (len < l.end)
		goto out;
	gs_snap_put_header(&w, &l);
	gs_snap_put_inst(&w, in);
	gs_snap_put_tables(&w, in);
	w.off = GS_SH_CRC;
	gs_put32(&w, gs_snap_crc(buf, l.end));
	ret = (long)l.end;
out:
	gs_snap_uncount(in);
	return ret;
}

long gs_snapshot_size(struct gs_inst *in)
{
	long ret;

	gs_lock(&in->lock);
	ret = gs_snap_write_locked(in, NULL, 0);
	gs_unlock(&in->lock);
	return ret;
}

long gs_snapshot_write(struct gs_inst *in, void *buf, unsigned long len)
{
	long ret;

	gs_lock(&in->lock);
	ret = gs_snap_write_locked(in, buf, len);
	gs_unlock(&in->lock);
	return ret;
}

/* ---- reading ---- */

struct gs_snap_in {
	const nv_u8 *p;
	struct gs_snap_layout l;
	nv_u32 nr_clients;
};

static const nv_u8 *gs_snap_obj(const struct gs_snap_in *s, nv_u32 i)
{
	return s->p + s->l.objs + (nv_u64)i * GS_SNAP_OBJ;
}

static const nv_u8 *gs_snap_memrec(const struct gs_snap_in *s, nv_u32 i)
{
	return s->p + s->l.mems + (nv_u64)i * GS_SNAP_MEM;
}

static nv_u32 gs_snap_o32(const struct gs_snap_in *s, nv_u32 i, nv_u32 field)
{
	return gs_get32(gs_snap_obj(s, i) + field);
}

/* a string field: NUL terminated, zero after it; 0, or -EBADMSG */
static int gs_snap_str(const nv_u8 *p, nv_u32 n)
{
	nv_u32 i = 0;

	while (i < n && p[i])
		i++;
	if (i == n)
		return -EBADMSG;
	for (; i < n; i++)
		if (p[i])
			return -EBADMSG;
	return 0;
}

static int gs_snap_header(struct gs_snap_in *s, const nv_u8 *p, unsigned long len)
{
	const struct nvrm_table *abi = gs_abi();
	struct gs_snap_counts *n = &s->l.n;

	if (len < 8 || gs_get32(p) != GS_SNAP_MAGIC)
		return -EBADMSG;
	if (gs_get32(p + GS_SH_VERSION) != GS_SNAPSHOT_VERSION)
		return -EPROTONOSUPPORT;
	if (len < GS_SNAP_HDR || gs_get32(p + GS_SH_LEN) != len ||
	    gs_snap_crc(p, len) != gs_get32(p + GS_SH_CRC) || gs_get32(p + GS_SH_ZERO) ||
	    gs_snap_str(p + GS_SH_BRANCH, GS_SNAP_BRANCH) ||
	    gs_snap_str(p + GS_SH_RELEASE, GS_SNAP_RELEASE))
		return -EBADMSG;
	if (strcmp((const char *)p + GS_SH_BRANCH, abi->branch) ||
	    strcmp((const char *)p + GS_SH_RELEASE, abi->versions[0]) ||
	    gs_get32(p + GS_SH_GPUS) != GPUSLICE_MAX_GPUS ||
	    gs_get32(p + GS_SH_HIST) != GPUSLICE_LOCK_HIST_BUCKETS)
		return -ENOEXEC;
	n->mems = gs_get32(p + GS_SH_COUNTS);
	n->objs = gs_get32(p + GS_SH_COUNTS + 4);
	n->edges = gs_get32(p + GS_SH_COUNTS + 8);
	n->orphans = gs_get32(p + GS_SH_COUNTS + 12);
	n->parked = gs_get32(p + GS_SH_COUNTS + 16);
	n->exports = gs_get32(p + GS_SH_COUNTS + 20);
	n->uvm = gs_get32(p + GS_SH_COUNTS + 24);
	n->uvm_gpus = gs_get32(p + GS_SH_COUNTS + 28);
	n->osev = gs_get32(p + GS_SH_COUNTS + 32);
	if (n->objs > GS_SNAP_SLACK * GS_MAX_OBJECTS ||
	    n->edges > (nv_u64)n->objs * GS_OBJ_DEPS ||
	    n->exports > GS_SNAP_SLACK * GS_MAX_EXPORTS ||
	    n->uvm > GS_SNAP_SLACK * GS_MAX_UVM_RECS ||
	    n->uvm_gpus > (nv_u64)n->uvm * abi->uvm_gpus ||
	    n->osev > GS_SNAP_SLACK * GS_MAX_OS_EVENTS)
		return -EBADMSG;
	/*
	 * Orphans and parked references come from objects (a reply naming no
	 * handle): no more than the objects' cap, doubled; and each charge has
	 * a reference, so no more charges than references. Refused before the
	 * staging allocates for them.
	 */
	if ((nv_u64)n->orphans + n->parked > GS_SNAP_SLACK * GS_MAX_OBJECTS ||
	    n->mems > (nv_u64)n->objs + n->orphans + n->parked + n->exports + 2ull * n->uvm)
		return -EBADMSG;
	gs_snap_layout(&s->l);
	if (s->l.end != len)
		return -EBADMSG;
	s->p = p;
	return 0;
}

/* u64 sum with overflow: -1 */
static int gs_snap_add(nv_u64 *sum, nv_u64 v)
{
	if (*sum > ~0ull - v)
		return -1;
	*sum += v;
	return 0;
}

static int gs_snap_check_lock(const nv_u8 *p)
{
	nv_u64 acquired = gs_get64(p), contended = gs_get64(p + 8), hold = 0, wait = 0;
	unsigned int b;

	p += 8 * 6;
	for (b = 0; b < GPUSLICE_LOCK_HIST_BUCKETS; b++) {
		if (gs_snap_add(&hold, gs_get64(p + 8 * b)) ||
		    gs_snap_add(&wait, gs_get64(p + 8 * (GPUSLICE_LOCK_HIST_BUCKETS + b))))
			return -EBADMSG;
	}
	return contended <= acquired && hold == acquired && wait == acquired ? 0 : -EBADMSG;
}

/* the instance, and the charges adding up to what it says is used */
static int gs_snap_check_inst(const struct gs_snap_in *s)
{
	const nv_u8 *p = s->p + s->l.inst;
	nv_u64 gpu_sum[GPUSLICE_MAX_GPUS], sys_sum = 0, used = 0;
	nv_u32 i, g;

	if ((gs_get32(p) & ~GS_INST_ALLOW_TEST_ESCAPES) || (gs_get32(p + 4) & ~GS_CAPS_ALL) ||
	    gs_get32(p + 12) > 1 || gs_get64(p + 32) < gs_get64(p + 24))
		return -EBADMSG;
	memset(gpu_sum, 0, sizeof(gpu_sum));
	for (i = 0; i < s->l.n.mems; i++) {
		const nv_u8 *m = gs_snap_memrec(s, i);
		nv_u64 size = gs_get64(m);
		nv_u32 refs = gs_get32(m + 8), gpu = gs_get32(m + 12), flags = gs_get32(m + 20);

		if (!refs || gpu >= GPUSLICE_MAX_GPUS || gs_get32(m + 16) > refs || (flags & ~1u))
			return -EBADMSG;
		if (gs_snap_add(flags ? &sys_sum : &gpu_sum[gpu], size))
			return -EBADMSG;
	}
	if (sys_sum != gs_get64(p + 40))
		return -EBADMSG;
	for (g = 0; g < GPUSLICE_MAX_GPUS; g++) {
		const nv_u8 *q = p + GS_SNAP_INST + g * GS_SNAP_GPU;

		if (gs_get64(q + 8) != gpu_sum[g] || gs_get64(q + 16) < gpu_sum[g] ||
		    gs_get32(q + 28) || gs_snap_add(&used, gpu_sum[g]))
			return -EBADMSG;
	}
	if (used != gs_get64(p + 24))
		return -EBADMSG;
	return gs_snap_check_lock(p + GS_SNAP_INST + GS_SNAP_GPU * GPUSLICE_MAX_GPUS);
}

/* record i's kind, class, up and whether a stray */
static nv_u32 gs_snap_kind(const struct gs_snap_in *s, nv_u32 i)
{
	return gs_snap_o32(s, i, GS_SO_KIND);
}

static nv_u32 gs_snap_klass(const struct gs_snap_in *s, nv_u32 i)
{
	return gs_snap_o32(s, i, GS_SO_KLASS);
}

/*
 * Could the live core have made record i depend on record to? Only as
 * core.c gs_post_deps() does: a TSG, a subcontext or a channel (the classes
 * of gs_dep_fields[]) on a target gs_dep_placed() takes: a VA space of its
 * own device (a subcontext's: its TSG's device), or a channel's subcontext
 * in the channel's own TSG; neither a stray. So no record depends on a VA
 * space's dependant, nor on its own ancestor or descendant: no cycle.
 */
static int gs_snap_dep_placed(const struct gs_snap_in *s, nv_u32 i, nv_u32 to)
{
	nv_u32 kind = gs_snap_kind(s, i), klass = gs_snap_klass(s, i);
	nv_u32 dev = gs_snap_o32(s, i, GS_SO_UP);

	if ((gs_snap_o32(s, i, GS_SO_STATE) | gs_snap_o32(s, to, GS_SO_STATE)) & GS_SNAP_STRAY)
		return 0;
	if (kind != GPUSLICE_OBJ_TSG && kind != GPUSLICE_OBJ_CHANNEL && klass != FERMI_CONTEXT_SHARE_A)
		return 0;
	switch (gs_snap_klass(s, to)) {
	case FERMI_VASPACE_A:
		if (klass == FERMI_CONTEXT_SHARE_A)
			dev = gs_snap_kind(s, dev) == GPUSLICE_OBJ_TSG ? gs_snap_o32(s, dev, GS_SO_UP) :
									 GS_SNAP_NONE;
		return dev != GS_SNAP_NONE && gs_snap_klass(s, dev) == NV01_DEVICE_0 &&
		       gs_snap_o32(s, to, GS_SO_UP) == dev;
	case FERMI_CONTEXT_SHARE_A:
		return kind == GPUSLICE_OBJ_CHANNEL && gs_snap_kind(s, dev) == GPUSLICE_OBJ_TSG &&
		       gs_snap_o32(s, to, GS_SO_UP) == dev;
	}
	return 0;
}

/*
 * record i's dependencies: other records of its client, live, not its
 * parent, each once, and placed as the live core places them
 */
static int gs_snap_check_deps(const struct gs_snap_in *s, nv_u32 i, nv_u32 *edges)
{
	nv_u32 k, j, to, up = gs_snap_o32(s, i, GS_SO_UP);

	for (k = 0; k < GS_OBJ_DEPS; k++) {
		to = gs_snap_o32(s, i, GS_SO_DEP + 4 * k);
		if (to == GS_SNAP_NONE)
			continue;
		if (to >= s->l.n.objs || to == i || to == up ||
		    gs_snap_o32(s, to, GS_SO_CLIENT) != gs_snap_o32(s, i, GS_SO_CLIENT) ||
		    (gs_snap_o32(s, to, GS_SO_FLAGS) & GS_OBJ_LOST) || !gs_snap_dep_placed(s, i, to))
			return -EBADMSG;
		for (j = 0; j < k; j++)
			if (gs_snap_o32(s, i, GS_SO_DEP + 4 * j) == to)
				return -EBADMSG;
		(*edges)++;
	}
	return 0;
}

/*
 * The registry: clients first, then the others in the writer's order (each
 * after its parent: no cycle), each under a record of its own client as
 * gs_tree_link() puts it, a stray on its client's strays.
 */
static int gs_snap_check_objs(struct gs_snap_in *s)
{
	nv_u32 i, prev_up = 0, prev_stray = 0, edges = 0;

	for (i = 0; i < s->l.n.objs; i++) {
		nv_u32 kind = gs_snap_o32(s, i, GS_SO_KIND);
		nv_u32 client = gs_snap_o32(s, i, GS_SO_CLIENT);
		nv_u32 handle = gs_snap_o32(s, i, GS_SO_HANDLE);
		nv_u32 parent = gs_snap_o32(s, i, GS_SO_PARENT);
		nv_u32 flags = gs_snap_o32(s, i, GS_SO_FLAGS);
		nv_u32 up = gs_snap_o32(s, i, GS_SO_UP);
		nv_u32 mem = gs_snap_o32(s, i, GS_SO_MEM);
		nv_u32 state = gs_snap_o32(s, i, GS_SO_STATE);
		nv_u32 stray = state & GS_SNAP_STRAY;
		nv_u64 size = gs_get64(gs_snap_obj(s, i) + GS_SO_SIZE);

		if (kind > GPUSLICE_OBJ_OTHER || (flags & ~(GS_OBJ_SCHEDULED | GS_OBJ_LOST)) ||
		    (state & ~(GS_SNAP_STRAY | GS_SNAP_UVM_REG | GS_SNAP_NS_PID)) ||
		    gs_snap_o32(s, i, GS_SO_ZERO) ||
		    ((state & GS_SNAP_UVM_REG) && kind != GPUSLICE_OBJ_CHANNEL))
			return -EBADMSG;
		if (kind == GPUSLICE_OBJ_CLIENT) {
			if (i != s->nr_clients || up != GS_SNAP_NONE || handle != client || stray ||
			    mem != GS_SNAP_NONE)
				return -EBADMSG;
			s->nr_clients++;
		} else {
			nv_u32 up_client = up < i ? gs_snap_o32(s, up, GS_SO_KIND) == GPUSLICE_OBJ_CLIENT : 0;

			if (up >= i || handle == client || (state & GS_SNAP_NS_PID) ||
			    gs_snap_o32(s, up, GS_SO_CLIENT) != client)
				return -EBADMSG;
			if (stray ? !up_client || !parent || parent == client :
			    !up_client && gs_snap_o32(s, up, GS_SO_HANDLE) != parent)
				return -EBADMSG;
			/* breadth first: by parent, each one's kids before its strays */
			if (i > s->nr_clients &&
			    (up < prev_up || (up == prev_up && stray < prev_stray)))
				return -EBADMSG;
			prev_up = up;
			prev_stray = stray;
		}
		if (mem != GS_SNAP_NONE &&
		    (mem >= s->l.n.mems || size != gs_get64(gs_snap_memrec(s, mem))))
			return -EBADMSG;
		if (flags & GS_OBJ_LOST) {
			nv_u32 k;

			if (mem != GS_SNAP_NONE || size)
				return -EBADMSG;
			for (k = 0; k < GS_OBJ_DEPS; k++)
				if (gs_snap_o32(s, i, GS_SO_DEP + 4 * k) != GS_SNAP_NONE)
					return -EBADMSG;
		}
		if (kind == GPUSLICE_OBJ_CLIENT) {
			nv_u32 k;

			for (k = 0; k < GS_OBJ_DEPS; k++)
				if (gs_snap_o32(s, i, GS_SO_DEP + 4 * k) != GS_SNAP_NONE)
					return -EBADMSG;
		}
		if (gs_snap_check_deps(s, i, &edges))
			return -EBADMSG;
	}
	return edges == s->l.n.edges ? 0 : -EBADMSG;
}

/* the other tables' fields, one record at a time */
static int gs_snap_check_tables(const struct gs_snap_in *s)
{
	const struct gs_snap_layout *l = &s->l;
	const nv_u8 *p;
	nv_u32 i, prev = 0, gpus = 0;

	for (i = 0, p = s->p + l->edges; i < l->n.edges; i++, p += GS_SNAP_EDGE) {
		nv_u32 to = gs_get32(p), from = gs_get32(p + 4), slot = gs_get32(p + 8);

		if (to >= l->n.objs || from >= l->n.objs || slot >= GS_OBJ_DEPS || to < prev ||
		    gs_snap_o32(s, from, GS_SO_DEP + 4 * slot) != to)
			return -EBADMSG;
		prev = to;
	}
	/* orphans, then parked: a client's, grouped by client */
	for (i = 0, prev = 0, p = s->p + l->orphans; i < l->n.orphans + l->n.parked; i++, p += GS_SNAP_OWNED) {
		nv_u32 cl = gs_get32(p);

		if (i == l->n.orphans)
			prev = 0;
		if (cl >= s->nr_clients || cl < prev || gs_get32(p + 4) >= l->n.mems)
			return -EBADMSG;
		prev = cl;
	}
	for (i = 0, p = s->p + l->exports; i < l->n.exports; i++, p += GS_SNAP_EXPORT) {
		nv_u32 mem = gs_get32(p + 32);

		if ((mem != GS_SNAP_NONE && mem >= l->n.mems) || gs_get32(p + 36) > 1)
			return -EBADMSG;
	}
	for (i = 0, p = s->p + l->uvm; i < l->n.uvm; i++) {
		nv_u64 start = gs_get64(p + 8), end = gs_get64(p + 16);
		nv_u32 kind = gs_get32(p + 24), orphan = gs_get32(p + 36);
		nv_u32 mem = gs_get32(p + 40), pt = gs_get32(p + 44), n = gs_get32(p + 48);

		if ((mem != GS_SNAP_NONE && mem >= l->n.mems) || (pt != GS_SNAP_NONE && pt >= l->n.mems) ||
		    orphan > 1 || gs_get32(p + 52) || n > gs_abi()->uvm_gpus || n > l->n.uvm_gpus - gpus)
			return -EBADMSG;
		switch (kind) {
		case GS_UVM_MAP:
			if (mem == GS_SNAP_NONE || !n || orphan || start > end)
				return -EBADMSG;
			break;
		case GS_UVM_CHANNEL:
			if (mem != GS_SNAP_NONE || pt != GS_SNAP_NONE || n > 1)
				return -EBADMSG;
			break;
		case GS_UVM_REGION:
			if (mem != GS_SNAP_NONE || n || orphan || start > end)
				return -EBADMSG;
			break;
		default:
			return -EBADMSG;
		}
		gpus += n;
		p += GS_SNAP_UVM + (nv_u64)n * GS_SNAP_UUID;
	}
	return gpus == l->n.uvm_gpus ? 0 : -EBADMSG;
}

/* the records, made and linked among themselves, before the instance takes them */
struct gs_snap_stage {
	struct gs_obj **objs;
	struct gs_mem **mems;
	struct gs_obj **hash;	/* a table of its own, to find a handle given twice */
	nv_u32 hash_mask;
	nv_u32 next_mem;	/* mems are numbered by first reference */
	struct gs_export *exports;
	struct gs_uvm_rec *uvm;
	struct gs_osev *osev;
};

static void gs_snap_stage_free(struct gs_snap_stage *st, nv_u32 nr_objs, nv_u32 nr_mems)
{
	nv_u32 i;

	for (i = 0; st->objs && i < nr_objs; i++) {
		struct gs_obj *ob = st->objs[i];

		while (ob && ob->held) {
			struct gs_memref *ref = ob->held;

			ob->held = ref->next;
			gs_free(ref);
		}
		gs_free(ob);
	}
	for (i = 0; st->mems && i < nr_mems; i++)
		gs_free(st->mems[i]);
	while (st->exports) {
		struct gs_export *e = st->exports;

		st->exports = e->next;
		gs_free(e);
	}
	while (st->uvm) {
		struct gs_uvm_rec *r = st->uvm;

		st->uvm = r->next;
		gs_free(r);
	}
	while (st->osev) {
		struct gs_osev *ev = st->osev;

		st->osev = ev->next;
		gs_free(ev);
	}
	gs_free_array(st->objs);
	gs_free_array(st->mems);
	gs_free_array(st->hash);
}

/*
 * The charge a reference names, counted: mems come numbered by their first
 * reference, and one a client owns as an orphan, or a record as its page
 * tables (own), has no other reference. NULL for NONE; -EBADMSG in *err.
 */
static struct gs_mem *gs_snap_take(struct gs_snap_stage *st, nv_u32 idx, int own, int *err)
{
	struct gs_mem *m;

	if (idx == GS_SNAP_NONE)
		return NULL;
	m = st->mems[idx];
	if (!m->refs) {
		if (idx != st->next_mem)
			*err = -EBADMSG;
		st->next_mem++;
	}
	if ((m->snap_idx & GS_SNAP_OWN) || (own && m->refs))
		*err = -EBADMSG;
	m->snap_idx |= own ? GS_SNAP_OWN : GS_SNAP_SHARE;
	m->refs++;
	return m;
}

static int gs_snap_stage_mems(struct gs_snap_stage *st, const struct gs_snap_in *s)
{
	nv_u32 i;

	for (i = 0; i < s->l.n.mems; i++) {
		const nv_u8 *p = gs_snap_memrec(s, i);
		struct gs_mem *m = gs_zalloc(sizeof(*m));

		if (!m)
			return -ENOMEM;
		m->size = gs_get64(p);
		m->gpu = gs_get32(p + 12);
		m->sys = gs_get32(p + 20) & 1;
		st->mems[i] = m;
	}
	return 0;
}

/* 0, or -EBADMSG for a handle given twice in one client */
static int gs_snap_hash_add(struct gs_snap_stage *st, const struct gs_inst *in, struct gs_obj *ob)
{
	struct gs_obj **b, *o;

	b = &st->hash[gs_hash_keyed(&in->hash_key, ob->o.client, ob->o.handle) & st->hash_mask];
	for (o = *b; o; o = o->next)
		if (o->o.client == ob->o.client && o->o.handle == ob->o.handle)
			return -EBADMSG;
	ob->next = *b;
	*b = ob;
	return 0;
}

static int gs_snap_stage_objs(struct gs_snap_stage *st, const struct gs_snap_in *s,
			      const struct gs_inst *in)
{
	int err = 0;
	nv_u32 i, k;

	for (i = 0; i < s->l.n.objs; i++) {
		const nv_u8 *p = gs_snap_obj(s, i);
		struct gs_obj *ob = gs_zalloc(sizeof(*ob));
		struct gs_object *o;

		if (!ob)
			return -ENOMEM;
		st->objs[i] = ob;
		o = &ob->o;
		o->obj_kind = gs_get32(p + GS_SO_KIND);
		o->klass = gs_get32(p + GS_SO_KLASS);
		o->client = gs_get32(p + GS_SO_CLIENT);
		o->handle = gs_get32(p + GS_SO_HANDLE);
		o->parent = gs_get32(p + GS_SO_PARENT);
		o->pid = gs_get32(p + GS_SO_PID);
		ob->ns_pid = gs_get32(p + GS_SO_NS_PID);
		o->gpu = gs_get32(p + GS_SO_GPU);
		o->engine = gs_get32(p + GS_SO_ENGINE);
		o->flags = gs_get32(p + GS_SO_FLAGS);
		o->gp_entries = gs_get32(p + GS_SO_GP);
		o->userd_mem = gs_get32(p + GS_SO_USERD);
		o->file_id = gs_get64(p + GS_SO_FILE);
		o->size = gs_get64(p + GS_SO_SIZE);
		o->userd_off = gs_get64(p + GS_SO_USERD_OFF);
		ob->uvm_registered = !!(gs_get32(p + GS_SO_STATE) & GS_SNAP_UVM_REG);
		ob->mem = gs_snap_take(st, gs_get32(p + GS_SO_MEM), 0, &err);
		if (err || gs_snap_hash_add(st, in, ob))
			return -EBADMSG;
	}
	/* what each depends on; the edges put each slot on its target's list once */
	for (i = 0; i < s->l.n.objs; i++) {
		for (k = 0; k < GS_OBJ_DEPS; k++) {
			nv_u32 to = gs_snap_o32(s, i, GS_SO_DEP + 4 * k);

			if (to != GS_SNAP_NONE)
				st->objs[i]->dep[k].to = st->objs[to];
		}
	}
	for (i = s->l.n.edges; i-- > 0;) {
		const nv_u8 *p = s->p + s->l.edges + (nv_u64)i * GS_SNAP_EDGE;
		struct gs_obj *from = st->objs[gs_get32(p + 4)], *to = st->objs[gs_get32(p)];
		struct gs_dep *d = &from->dep[gs_get32(p + 8)];

		if (d->from)
			return -EBADMSG;
		d->from = from;
		d->next = to->dependants;
		if (to->dependants)
			to->dependants->pprev = &d->next;
		to->dependants = d;
		d->pprev = &to->dependants;
	}
	return 0;
}

/* orphans and parked references, on their clients in order */
static int gs_snap_stage_owned(struct gs_snap_stage *st, const struct gs_snap_in *s)
{
	const nv_u8 *p = s->p + s->l.orphans;
	struct gs_memref **rtail = NULL;
	struct gs_mem **mtail = NULL;
	nv_u32 i, cur = GS_SNAP_NONE;
	int err = 0;

	for (i = 0; i < s->l.n.orphans; i++, p += GS_SNAP_OWNED) {
		struct gs_obj *cl = st->objs[gs_get32(p)];
		struct gs_mem *m = gs_snap_take(st, gs_get32(p + 4), 1, &err);

		if (err)
			return err;
		if (gs_get32(p) != cur) {
			cur = gs_get32(p);
			mtail = &cl->orphans;
		}
		m->next = NULL;
		*mtail = m;
		mtail = &m->next;
	}
	for (i = 0, cur = GS_SNAP_NONE; i < s->l.n.parked; i++, p += GS_SNAP_OWNED) {
		struct gs_obj *cl = st->objs[gs_get32(p)];
		struct gs_memref *ref = gs_zalloc(sizeof(*ref));

		if (!ref)
			return -ENOMEM;
		if (gs_get32(p) != cur) {
			cur = gs_get32(p);
			rtail = &cl->held;
		}
		*rtail = ref;
		rtail = &ref->next;
		ref->mem = gs_snap_take(st, gs_get32(p + 4), 0, &err);
		if (err)
			return err;
	}
	return 0;
}

static int gs_snap_stage_lists(struct gs_snap_stage *st, const struct gs_snap_in *s)
{
	struct gs_export **etail = &st->exports;
	struct gs_uvm_rec **rtail = &st->uvm;
	struct gs_osev **vtail = &st->osev;
	const nv_u8 *p;
	int err = 0;
	nv_u32 i;

	for (i = 0, p = s->p + s->l.exports; i < s->l.n.exports; i++, p += GS_SNAP_EXPORT) {
		struct gs_export *e = gs_zalloc(sizeof(*e));

		if (!e)
			return -ENOMEM;
		*etail = e;
		etail = &e->next;
		e->file_id = gs_get64(p);
		e->slot = gs_get32(p + 8);
		e->client = gs_get32(p + 12);
		e->parent = gs_get32(p + 16);
		e->handle = gs_get32(p + 20);
		e->klass = gs_get32(p + 24);
		e->gpu = gs_get32(p + 28);
		e->sibling = gs_get32(p + 36);
		e->mem = gs_snap_take(st, gs_get32(p + 32), 0, &err);
		if (err)
			return err;
	}
	for (i = 0, p = s->p + s->l.uvm; i < s->l.n.uvm; i++) {
		nv_u32 n = gs_get32(p + 48);
		struct gs_uvm_rec *r;

		/* as uvm.c allocates them: the uuids after the record, at least one */
		r = gs_zalloc(sizeof(*r) + (n ? n : 1) * sizeof(struct nv_processor_uuid));
		if (!r)
			return -ENOMEM;
		*rtail = r;
		rtail = &r->next;
		r->file_id = gs_get64(p);
		r->start = gs_get64(p + 8);
		r->end = gs_get64(p + 16);
		r->kind = (enum gs_uvm_kind)gs_get32(p + 24);
		r->client = gs_get32(p + 28);
		r->handle = gs_get32(p + 32);
		r->orphan = gs_get32(p + 36);
		r->nr_gpus = n;
		r->mem = gs_snap_take(st, gs_get32(p + 40), 0, &err);
		if (r->mem)
			r->mem->uvm_maps++;
		r->pt = gs_snap_take(st, gs_get32(p + 44), 1, &err);
		if (err)
			return err;
		memcpy(r + 1, p + GS_SNAP_UVM, (nv_u64)n * GS_SNAP_UUID);
		p += GS_SNAP_UVM + (nv_u64)n * GS_SNAP_UUID;
	}
	for (i = 0, p = s->p + s->l.osev; i < s->l.n.osev; i++, p += GS_SNAP_OSEV) {
		struct gs_osev *ev = gs_zalloc(sizeof(*ev));

		if (!ev)
			return -ENOMEM;
		*vtail = ev;
		vtail = &ev->next;
		ev->file_id = gs_get64(p);
		ev->client = gs_get32(p + 8);
		ev->fd = gs_get32(p + 12);
	}
	return 0;
}

/* every charge has the references its count says, and the mappings */
static int gs_snap_stage_refs(struct gs_snap_stage *st, const struct gs_snap_in *s)
{
	nv_u32 i;

	if (st->next_mem != s->l.n.mems)
		return -EBADMSG;
	for (i = 0; i < s->l.n.mems; i++) {
		const nv_u8 *p = gs_snap_memrec(s, i);
		struct gs_mem *m = st->mems[i];

		if (m->refs != gs_get32(p + 8) || m->uvm_maps != gs_get32(p + 16) ||
		    ((m->snap_idx & GS_SNAP_OWN) && m->refs != 1))
			return -EBADMSG;
		m->snap_idx = 0;
	}
	return 0;
}

static int gs_snap_stage(struct gs_snap_stage *st, const struct gs_snap_in *s,
			 const struct gs_inst *in)
{
	nv_u32 buckets = 1024;
	int err;

	while (buckets < s->l.n.objs)
		buckets <<= 1;
	st->hash_mask = buckets - 1;
	st->hash = gs_zalloc_array(buckets, sizeof(*st->hash));
	st->objs = gs_zalloc_array(s->l.n.objs + 1, sizeof(*st->objs));
	st->mems = gs_zalloc_array(s->l.n.mems + 1, sizeof(*st->mems));
	if (!st->hash || !st->objs || !st->mems)
		return -ENOMEM;
	err = gs_snap_stage_mems(st, s);
	if (!err)
		err = gs_snap_stage_objs(st, s, in);
	if (!err)
		err = gs_snap_stage_owned(st, s);
	if (!err)
		err = gs_snap_stage_lists(st, s);
	if (!err)
		err = gs_snap_stage_refs(st, s);
	return err;
}

/* made by gs_inst_new() and holding nothing yet */
static int gs_snap_empty(const struct gs_inst *in)
{
	return !in->nr_objects && !in->clients && !in->exports && !in->uvm_recs &&
	       !in->os_events && !in->busy && !in->nr_inflight && !in->used && !in->sys_used && !in->sys_reserved;
}

/* under in->lock: the instance takes the staged records; cannot fail */
static void gs_snap_install(struct gs_inst *in, const struct gs_snap_in *s,
			    struct gs_snap_stage *st)
{
	const nv_u8 *p = s->p + s->l.inst;
	struct gs_lock_stats *ls = &in->lock.st;
	const struct gs_uvm_rec *r;
	nv_u32 i, g;

	in->flags = gs_get32(p);
	in->caps = gs_get32(p + 4);
	in->gpus = gs_get32(p + 8);
	in->gpu_ids_set = gs_get32(p + 12);
	in->limit = gs_get64(p + 16);
	in->used = gs_get64(p + 24);
	in->peak = gs_get64(p + 32);
	in->sys_used = gs_get64(p + 40);
	in->nr_ioctls = gs_get64(p + 48);
	in->nr_refused_quota = gs_get64(p + 56);
	in->nr_refused_filter = gs_get64(p + 64);
	for (g = 0, p += GS_SNAP_INST; g < GPUSLICE_MAX_GPUS; g++, p += GS_SNAP_GPU) {
		in->gpu_limit[g] = gs_get64(p);
		in->gpu_used[g] = gs_get64(p + 8);
		in->gpu_peak[g] = gs_get64(p + 16);
		in->gpu_ids[g] = gs_get32(p + 24);
	}
	ls->acquired = gs_get64(p);
	ls->contended = gs_get64(p + 8);
	ls->hold_ns = gs_get64(p + 16);
	ls->wait_ns = gs_get64(p + 24);
	ls->hold_max_ns = gs_get64(p + 32);
	ls->wait_max_ns = gs_get64(p + 40);
	for (g = 0, p += 48; g < GPUSLICE_LOCK_HIST_BUCKETS; g++) {
		ls->hold_hist[g] = gs_get64(p + 8 * g);
		ls->wait_hist[g] = gs_get64(p + 8 * (GPUSLICE_LOCK_HIST_BUCKETS + g));
	}
	/* the lists add at their head: last record first */
	for (i = s->l.n.objs; i-- > 0;) {
		nv_u32 up = gs_snap_o32(s, i, GS_SO_UP), state = gs_snap_o32(s, i, GS_SO_STATE);

		gs_obj_restore(in, st->objs[i], up == GS_SNAP_NONE ? NULL : st->objs[up],
			       state & GS_SNAP_STRAY, state & GS_SNAP_NS_PID);
	}
	in->exports = st->exports;
	in->nr_exports = s->l.n.exports;
	in->uvm_recs = st->uvm;
	for (r = in->uvm_recs; r; r = r->next) {
		in->nr_uvm_recs++;
		in->nr_uvm_regions += r->kind == GS_UVM_REGION;
		in->nr_uvm_channels += r->orphan;
	}
	in->os_events = st->osev;
	in->nr_os_events = s->l.n.osev;
	st->exports = NULL;
	st->uvm = NULL;
	st->osev = NULL;
}

int gs_snapshot_read(struct gs_inst *in, const void *buf, unsigned long len)
{
	struct gs_snap_stage st;
	struct gs_snap_in s;
	int err;

	memset(&s, 0, sizeof(s));
	memset(&st, 0, sizeof(st));
	err = gs_snap_header(&s, buf, len);
	if (!err)
		err = gs_snap_check_inst(&s);
	if (!err)
		err = gs_snap_check_objs(&s);
	if (!err)
		err = gs_snap_check_tables(&s);
	if (err)
		return err;
	err = gs_snap_stage(&st, &s, in);
	if (err)
		goto free;
	gs_lock(&in->lock);
	if (!gs_snap_empty(in)) {
		gs_unlock(&in->lock);
		err = -EBUSY;
		goto free;
	}
	gs_snap_install(in, &s, &st);
	gs_unlock(&in->lock);
	/* the records are the instance's now: only the staging tables go */
	gs_free_array(st.objs);
	gs_free_array(st.mems);
	gs_free_array(st.hash);
	return 0;
free:
	gs_snap_stage_free(&st, s.l.n.objs, s.l.n.mems);
	return err;
}
