// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * quota.c - the video memory limit, and the cap on pinned system memory.
 *
 * RM_ALLOC of a counted class reserves, in gs_pre(), the most RM can
 * allocate for the request (gs_mem_bound(): what PMA takes with the largest
 * page size the attributes allow) and is refused the way RM
 * itself refuses (ioctl 0, status NV_ERR_NO_MEMORY) when used + reserved +
 * that bound would pass the limit. So concurrent requests that RM rounds up
 * (a 4 KiB request with the 512 MiB page attribute takes 512 MiB) never add
 * up past the limit. gs_post() charges what RM says it allocated (RM writes
 * the rounded size back: 4224 KiB came back as 6144 KiB in the traces) when
 * that is at least the size that was checked, and the whole reservation when
 * the reply is lower or unreadable: the reply is in user memory, and a lower
 * one can only be another thread's rewrite. Either way never less than
 * what PMA takes from the framebuffer for the request as checked
 * (gs_pma_size(): 4 KiB pages in 64 KiB units, a fixed address padded to
 * its alignment), which RM does not report.
 *
 * What this cannot see: a thread that rewrites the request between the check
 * and the moment RM reads it (RM copies the parameters from user memory
 * after we did). The limit is then held by reconciling against RM's own
 * per-process accounting (pyctl/gpuslice/sched/reconcile.py, docs/isolation.md).
 *
 * Which classes hold video memory on 580 (src/nvidia/src/kernel/mem_mgr/):
 * NV01_MEMORY_LOCAL_USER (0x40) is what cuMemAlloc and cuMemCreate use
 * (video_mem.c, NV_MEMORY_ALLOCATION_PARAMS, size at offset 64 in and out).
 * NV01_MEMORY_LOCAL_PRIVILEGED (0x3f) is privileged; NV01_MEMORY_LOCAL_PHYSICAL
 * (0xc2, phys_mem.c) reports its size only on the way out;
 * NV_MEMORY_MULTICAST_FABRIC (0xfd) takes memory attached by controls from
 * several GPUs and nodes; NV01_MEMORY_LIST_FBMEM (0x82) names existing
 * framebuffer pages. None of them appears in the traces: all are refused
 * (gs_vidmem_class() < 0) rather than left uncounted. NV_ESC_RM_VID_HEAP_CONTROL
 * is refused by the escape filter. NV_MEMORY_FABRIC (0xf8) allocates no
 * memory: it maps video memory the caller already holds into the fabric
 * address space (mem_fabric.c), and keeps it alive, so it shares that
 * memory's charge (core.c, gs_pre_fabric()).
 *
 * NV01_MEMORY_SYSTEM (0x3e, system_mem.c) pins host pages for the GPU,
 * outside the container's memory cgroup: it is counted the same way on a
 * counter of its own, capped at the instance's memory limit too.
 *
 * Video memory is limited per GPU (kmod/uapi/gpuslice.h: GPU_MEM_LIMIT). The
 * GPU of an allocation is its parent's device (gs_obj_gpu()): RM takes
 * NV01_MEMORY_LOCAL_USER only under a Device or Subdevice
 * (src/nvidia/src/kernel/rmapi/resource_list.h), on that device's GPU. A
 * parent with no device above it that we know is refused as over the
 * limit: every device the instance made is in the registry unless RM chose
 * its handle and the reply was rewritten before we read it, and memory
 * under such a device would be charged to no GPU's limit (nor is the
 * node the call came through any guide: RM_ALLOC works on any nvidia file).
 * The charge goes to the GPU the allocation was checked against. A device
 * freed and made again under the same handle on another GPU while the call
 * is in flight can put the memory on that other GPU: each GPU then holds
 * at most its own limit plus what the instance's other GPUs' limits leave,
 * and the instance never more than the sum (charging where the parent
 * points after RM's answer instead would let such races pile memory on
 * one GPU with no check at all).
 *
 * A device is on the GPU its checked parameters name (core.c,
 * gs_pre_other_clients(): one of the instance's GPUs, gs_inst_set_gpus());
 * a GPU that is not the instance's has a limit of 0.
 */
#include "core_int.h"

int gs_vidmem_class(nv_u32 klass)
{
	switch (klass) {
	case NV01_MEMORY_LOCAL_USER:
		return 1;
	case NV01_MEMORY_LOCAL_PRIVILEGED:
	case NV01_MEMORY_LOCAL_PHYSICAL:
	case NV01_MEMORY_LIST_FBMEM:
	case NV_MEMORY_MULTICAST_FABRIC:
		return -1;
	}
	return 0;
}

int gs_counted_class(nv_u32 klass)
{
	return gs_vidmem_class(klass) > 0 || klass == NV01_MEMORY_SYSTEM;
}

#define GS_SIZE_OFF	64	/* offsetof(struct nv_memory_allocation_params, size) */
#define GS_KIB		1024ull
#define GS_MIB		(1024ull * GS_KIB)

/*
 * What RM takes from the framebuffer for a video memory allocation is not
 * always what it reports back. Branch 580 (580.95.05), the PMA path every
 * client allocation of NV01_MEMORY_LOCAL_USER takes (mem_mgr/video_mem.c
 * vidmemConstruct_IMPL :683 -> _vidmemPmaAllocate :120):
 *
 *  - page: the GPU page size (mem_mgr.c memmgrDeterminePageSize_IMPL):
 *    attr 4KB: 4 KiB; BIG: the big page, 64 KiB (kgmmuGetMaxBigPageSize:
 *    128 KiB only with per-VA-space big pages, Maxwell or a registry key);
 *    HUGE: 2 MiB, or 512 MiB / 256 GiB by attr2; DEFAULT: 2 MiB when the
 *    requested size is at least 2 MiB, else the big page
 *    (_memmgrPickDefaultGpuPageSize :1750, :1768: huge pages exist from
 *    Pascal on; a user client always gets at least the big page, :1775).
 *  - the size is rounded up to that page, and a requested alignment
 *    (ALIGNMENT_HINT/FORCE) is kept when it is a multiple of the page
 *    (gpu/mem_mgr/arch/maxwell/mem_mgr_gm107.c
 *    memmgrAllocDetermineAlignment_GM107 :153, :239; else the page, :253, or
 *    a refusal with FORCE, :245), via _vidmemQueryAlignment (:59, :81).
 *  - PMA's unit is the page, at least 64 KiB: "Minimum granularity of PMA
 *    is 64K" (video_mem.c :195), so 4 KiB pages are taken 64 KiB at a time.
 *  - FIXED_ADDRESS_ALLOCATE takes the range from the offset rounded down to
 *    max(alignment, unit) up to the end rounded up to it (:239-:244): the
 *    size rounded up to max(alignment, unit). Without it the alignment only
 *    places the range (PMA takes allocationCount pages whatever the
 *    alignment, gpu/mem_mgr/phys_mem_allocator/phys_mem_allocator.c :752);
 *    PMA refuses one that is not a power of two (:708-:714).
 *  - PMA takes ceil(size / unit) units (video_mem.c :282, allocSize :308).
 *
 * RM reports the memdesc's size (video_mem.c :852, :1076: mem_utils.c
 * memmgrAllocResources :1620, the size rounded to the page), so a 4 KiB
 * request with the 4KB attribute reports 4 KiB and takes 64 KiB, and a fixed
 * address allocation reports less than its padding. The same on 535
 * (535.288.01 video_mem.c :212, :261-:266, :296; mem_mgr_gm107.c :148), 550,
 * 570 and 575. Also on 535 and 550, compressed memory is put in 2 MiB pages
 * when the static BAR1 is on (535.288.01 video_mem.c :175; 550.163.01
 * video_mem.c :559), which the core cannot see: the reservation allows for
 * it and RM reports that rounding itself. Compression otherwise rounds the
 * size to the compression page (mem_mgr_gm107.c :215; its size comes from
 * GSP), also reported, as is a 128 KiB big page. A NUMA GPU (onlined
 * coherent memory) takes contiguous memory from the kernel in powers of
 * two (phys_mem_allocator/numa.c), which is not modelled.
 */
#define GS_PMA_UNIT	(64 * GS_KIB)

/* v rounded up to unit, a power of two; 0 if that does not fit in 64 bits */
static nv_u64 gs_round_up(nv_u64 v, nv_u64 unit)
{
	if (v > ~0ull - (unit - 1))
		return 0;
	return (v + unit - 1) & ~(unit - 1);
}

/* the GPU page sizes RM may pick for mp, smallest and largest (see above) */
static nv_u64 gs_page(const struct nv_memory_allocation_params *mp, int largest)
{
	nv_u32 psz = (mp->attr >> NVOS32_ATTR_PAGE_SIZE_SHIFT) & 3;
	nv_u32 huge = (mp->attr2 >> NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT) & 3;
	int compr = ((mp->attr & NVOS32_ATTR_COMPR_MASK) >> NVOS32_ATTR_COMPR_SHIFT) !=
		    NVOS32_ATTR_COMPR_NONE;
	const char *branch = gs_abi()->branch;

	switch (psz) {
	case NVOS32_ATTR_PAGE_SIZE_4KB:
	case NVOS32_ATTR_PAGE_SIZE_BIG:
		/* 535, 550: compressed memory in 2 MiB pages with the static BAR1 */
		if (largest && compr && (!strcmp(branch, "535") || !strcmp(branch, "550")))
			return 2 * GS_MIB;
		return psz == NVOS32_ATTR_PAGE_SIZE_4KB ? 4 * GS_KIB : 64 * GS_KIB;
	case NVOS32_ATTR_PAGE_SIZE_HUGE:
		if (huge == NVOS32_ATTR2_PAGE_SIZE_HUGE_512MB)
			return 512 * GS_MIB;
		if (huge == NVOS32_ATTR2_PAGE_SIZE_HUGE_256GB)
			return 256 * 1024 * GS_MIB;
		return 2 * GS_MIB;
	default:
		return largest || mp->size >= 2 * GS_MIB ? 2 * GS_MIB : 64 * GS_KIB;
	}
}

/*
 * What PMA takes for mp in GPU pages of page bytes (see above), or 0 if that
 * does not fit in 64 bits. An alignment PMA refuses (not a power of two) is
 * rounded up to one: an allocation RM refuses is charged nothing, and this
 * only reserves.
 */
static nv_u64 gs_pma_take(const struct nv_memory_allocation_params *mp, nv_u64 page)
{
	nv_u64 unit = page < GS_PMA_UNIT ? GS_PMA_UNIT : page;
	nv_u64 align = page;

	if (mp->flags & NVOS32_ALLOC_FLAGS_FIXED_ADDRESS_ALLOCATE) {
		if ((mp->flags & (NVOS32_ALLOC_FLAGS_ALIGNMENT_HINT | NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE)) &&
		    mp->alignment > page && !(mp->alignment & (page - 1)))
			align = mp->alignment;
		while (unit < align) {
			if (unit >> 63)
				return 0;
			unit <<= 1;
		}
	}
	return gs_round_up(mp->size, unit);
}

/*
 * The bytes of framebuffer RM's PMA takes for the video memory allocation
 * mp, and at least reported (what RM said it allocated): the charge. 0 if
 * that does not fit in 64 bits.
 */
nv_u64 gs_pma_size(const struct nv_memory_allocation_params *mp, nv_u64 reported)
{
	nv_u64 take = gs_pma_take(mp, gs_page(mp, 0));

	if (!take)
		return 0;
	return take > reported ? take : reported;
}

/*
 * The most RM allocates for this request: what PMA takes with the largest
 * page the attributes allow (RM adds nothing for an alignment without a
 * fixed address), never less than gs_pma_size(); 0 if that does not fit in 64
 * bits (refused as over any limit). System memory comes in host pages.
 */
nv_u64 gs_mem_bound(nv_u32 klass, const struct nv_memory_allocation_params *mp)
{
	nv_u64 most, least;

	if (klass == NV01_MEMORY_SYSTEM)
		return gs_round_up(mp->size, 4 * GS_KIB);
	most = gs_pma_take(mp, gs_page(mp, 1));
	least = gs_pma_size(mp, 0);
	if (!most || !least)
		return 0;
	return most > least ? most : least;
}

static void gs_refused_event(struct gs_inst *in, struct gs_call *c,
			     const struct gs_mem_req *r, struct gs_evq *q)
{
	struct gs_event ev;

	memset(&ev, 0, sizeof(ev));
	ev.type = GPUSLICE_EV_ALLOC_REFUSED;
	ev.obj_kind = GPUSLICE_OBJ_MEMORY;
	ev.pid = c->pid;
	ev.gpu = gs_obj_gpu(in, r->root, r->parent, c->gpu_minor);
	ev.client = r->root;
	ev.handle = r->handle;
	ev.parent = r->parent;
	ev.klass = r->klass;
	ev.size = r->mp.size;
	ev.status = NV_ERR_NO_MEMORY;
	ev.cmd = c->escape;
	gs_evq_push(q, &ev);
}

nv_u64 gs_gpu_limit(const struct gs_inst *in, nv_u32 gpu)
{
	if (!(in->gpus >> gpu & 1))
		return 0;	/* not the instance's GPU */
	return in->gpu_limit[gpu] ? in->gpu_limit[gpu] : in->limit;
}

static void gs_charge(struct gs_inst *in, int sys, nv_u32 slot, nv_u64 size)
{
	if (sys) {
		in->sys_used += size;
		return;
	}
	in->gpu_used[slot] += size;
	in->used += size;
	if (in->gpu_used[slot] > in->gpu_peak[slot])
		in->gpu_peak[slot] = in->gpu_used[slot];
	if (in->used > in->peak)
		in->peak = in->used;
}

static void gs_uncharge(struct gs_inst *in, int sys, nv_u32 slot, nv_u64 size)
{
	if (sys) {
		in->sys_used -= size;
		return;
	}
	in->gpu_used[slot] -= size;
	in->used -= size;
}

/* called with in->lock held; p is the glue's copy of the argument block */
/*
 * Charges size bytes of video memory on gpu to m (a new record, refs 1), if
 * the GPU's limit has room: memory the driver allocates for the caller with
 * no object of its own to count (nvidia-uvm's page tables, uvm.c). 0, or -1.
 */
int gs_charge_extra(struct gs_inst *in, struct gs_mem *m, nv_u32 gpu, nv_u64 size)
{
	nv_u64 limit;

	if (gpu >= GPUSLICE_MAX_GPUS)
		return -1;
	limit = gs_gpu_limit(in, gpu);
	if (size > limit || in->gpu_used[gpu] + in->gpu_reserved[gpu] > limit - size)
		return -1;
	m->size = size;
	m->gpu = gpu;
	m->sys = 0;
	m->refs = 1;
	gs_charge(in, 0, gpu, size);
	return 0;
}

/* the instance's first GPU: where what belongs to no GPU of its own is charged */
nv_u32 gs_first_gpu(const struct gs_inst *in)
{
	nv_u32 gpu;

	for (gpu = 0; gpu < GPUSLICE_MAX_GPUS; gpu++)
		if (in->gpus >> gpu & 1)
			return gpu;
	return 0;
}

/*
 * Reserves the most RM can allocate for r, or refuses it the way RM refuses
 * (GS_REPLY, c->status NV_ERR_NO_MEMORY: the caller puts it in its block).
 */
enum gs_verdict gs_quota_check(struct gs_inst *in, struct gs_call *c,
			       const struct gs_mem_req *r, struct gs_evq *q)
{
	int sys = r->klass == NV01_MEMORY_SYSTEM;
	nv_u32 slot = sys ? 0 : gs_obj_gpu(in, r->root, r->parent, GS_GPU_UNKNOWN);
	int known = slot < GPUSLICE_MAX_GPUS;
	nv_u64 *used, *reserved, limit, bound;

	if (!known)
		slot = 0;	/* refused below: no GPU's limit would hold it */
	used = sys ? &in->sys_used : &in->gpu_used[slot];
	reserved = sys ? &in->sys_reserved : &in->gpu_reserved[slot];
	limit = sys ? in->limit : gs_gpu_limit(in, slot);
	bound = gs_mem_bound(r->klass, &r->mp);
	if (!known || !bound || bound > limit || *used + *reserved > limit - bound) {
		c->refusal = GS_REFUSE_QUOTA;
		c->status = NV_ERR_NO_MEMORY;
		in->nr_refused_quota++;
		gs_refused_event(in, c, r, q);
		return GS_REPLY;
	}
	*reserved += bound;
	c->reserved = bound;
	c->quota.held = 1;
	c->quota.asked = r->mp.size;
	c->quota.sys = sys;
	/* what PMA takes for the request as checked: the least charged for it */
	c->quota.least = sys ? 0 : gs_pma_size(&r->mp, 0);
	c->quota.gpu = slot;
	return GS_PASS;
}

enum gs_verdict gs_quota_pre(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			     struct nvos64_params *p, struct gs_evq *q)
{
	struct gs_mem_req r;
	enum gs_verdict v;

	memset(&r, 0, sizeof(r));
	/* 535's parameters end before numaNode, which the core does not read */
	if (!io || io->read(io->ctx, p->p_alloc_parms, &r.mp,
			    gs_abi()->memory_alloc_size < sizeof(r.mp) ?
			    gs_abi()->memory_alloc_size : sizeof(r.mp))) {
		c->refusal = GS_REFUSE_MALFORMED;
		c->status = NV_ERR_INVALID_POINTER;
		p->status = c->status;
		return GS_REPLY;
	}
	r.root = p->h_root;
	r.parent = p->h_object_parent;
	r.handle = p->h_object_new;
	r.klass = p->h_class;
	v = gs_quota_check(in, c, &r, q);
	if (v == GS_REPLY)
		p->status = c->status;
	return v;
}

void gs_quota_release(struct gs_inst *in, struct gs_call *c)
{
	if (c->quota.held) {
		if (c->quota.sys)
			in->sys_reserved -= c->reserved;
		else
			in->gpu_reserved[c->quota.gpu] -= c->reserved;
		c->reserved = 0;
		c->quota.held = 0;
	}
}

/*
 * Memory charged to a client without a handle (gs_quota_post), and the
 * references it holds without one (gs_park), go with it.
 */
void gs_orphan_put(struct gs_inst *in, struct gs_obj *ob)
{
	while (ob->orphans) {
		struct gs_mem *mem = ob->orphans;

		ob->orphans = mem->next;
		gs_uncharge(in, mem->sys, mem->gpu, mem->size);
		gs_free(mem);
	}
	while (ob->held) {
		struct gs_memref *ref = ob->held;

		ob->held = ref->next;
		gs_mem_put(in, ref->mem);
		gs_free(ref);
	}
}

/*
 * A reference on a charge that RM may hold through an object the core could
 * not register: the reply says the call failed, or names no new handle, or a
 * handle that is registered already, and a sibling thread can write all of
 * these after the driver's copy-out (kmod/shadow.c). The client holds it
 * until it goes: never less than RM holds. Without the client (RM freed it,
 * and everything under it), the reference goes. Takes mem's reference.
 */
void gs_park(struct gs_inst *in, struct gs_call *c, nv_handle client, struct gs_mem *mem)
{
	struct gs_obj *cl = gs_obj_find(in, client, client);
	struct gs_memref *ref = c->spare_ref;

	if (!cl || !ref) {
		gs_mem_put(in, mem);
		return;
	}
	c->spare_ref = NULL;
	ref->mem = mem;
	ref->next = cl->held;
	cl->held = ref;
}

/* one handle of counted memory went away (core.c gs_obj_released(), export.c) */
void gs_mem_put(struct gs_inst *in, struct gs_mem *mem)
{
	if (--mem->refs)
		return;
	gs_uncharge(in, mem->sys, mem->gpu, mem->size);
	gs_free(mem);
}

/*
 * Called with in->lock held, after RM answered: r is the request as checked
 * (r->handle 0: RM chose it, and replied names it), status RM's answer (NV_OK
 * when the reply was lost), size what the reply says RM allocated (0: it
 * could not be read).
 */
void gs_quota_charge(struct gs_inst *in, struct gs_call *c, const struct gs_mem_req *r,
		     nv_handle replied, nv_u64 size, nv_u32 status, struct gs_evq *q)
{
	nv_u64 reserved = c->reserved, asked = c->quota.asked;
	nv_u64 least = c->quota.least;
	int sys = c->quota.sys;
	nv_u32 slot = c->quota.gpu;	/* the GPU it was checked against */
	struct gs_object o;
	struct gs_mem *mem;
	struct gs_obj *cl;
	nv_handle h;

	gs_quota_release(in, c);
	if (status != NV_OK)
		return;
	/*
	 * RM writes back the size it allocated: at least what was asked, at
	 * most the reservation plus RM's padding. A lower reply is not RM's
	 * (the reply is in a page another thread can write once the driver has
	 * started writing it: kmod/shadow.c): the reservation is charged. A
	 * higher one is charged at the most RM could have allocated, which
	 * also keeps a forged 2^64 - x from wrapping the counter.
	 */
	if (c->reply_lost || size < asked)
		size = reserved;
	else if (size > reserved + GS_RM_PAD_MAX)
		size = reserved + GS_RM_PAD_MAX;
	/*
	 * And never less than PMA took: gs_pma_size() of the request as checked
	 * (the 64 KiB units of 4 KiB pages, a fixed address's alignment), which
	 * RM does not report. The reservation covers it (gs_mem_bound()).
	 */
	if (size < least)
		size = least;
	/* an RM-chosen handle that is registered already is a rewritten reply */
	h = r->handle ? r->handle : (c->reply_lost ? 0 : replied);
	if (!r->handle && h && gs_obj_find(in, r->root, h))
		h = 0;
	/*
	 * A handle that holds counted memory already: RM refused the call
	 * (NV_ERR_INSERT_DUPLICATE_NAME) and another thread rewrote its status,
	 * or RM freed the old object without the core seeing it. Either way the
	 * registered charge stays, and this one goes to the client (never less
	 * than RM holds; replacing would uncharge a live object for a forged
	 * status).
	 */
	if (h) {
		const struct gs_obj *old = gs_obj_find(in, r->root, h);

		if (old && old->mem)
			h = 0;
	}
	/* gs_pre() allocated the record: with a handle, adding cannot fail */
	mem = c->spare_mem;
	if (!mem)
		return;		/* cannot be: gs_pre() refuses a call without it */
	c->spare_mem = NULL;
	mem->size = size;
	mem->refs = 1;
	mem->gpu = slot;
	mem->sys = sys;
	gs_charge(in, sys, slot, size);
	if (h) {
		gs_obj_init(&o, in, c, GPUSLICE_OBJ_MEMORY, r->root, r->parent, h, r->klass);
		if (gs_obj_add(in, c, &o, mem, q))
			return;
	}
	/* no handle to free it by: it goes when its client goes */
	cl = gs_obj_find(in, r->root, r->root);
	if (cl) {
		mem->next = cl->orphans;
		cl->orphans = mem;
		return;
	}
	gs_uncharge(in, sys, slot, size);	/* no client: RM allocated nothing */
	gs_free(mem);
}

void gs_quota_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
		   const struct nvos64_params *p, nv_u32 status, struct gs_evq *q)
{
	const struct nvos64_params *rep = c->arg;
	struct gs_mem_req r;
	nv_u64 size = 0;

	memset(&r, 0, sizeof(r));
	r.root = p->h_root;
	r.parent = p->h_object_parent;
	r.handle = p->h_object_new;
	r.klass = p->h_class;
	if (c->reply_lost || !io ||
	    io->read(io->ctx, p->p_alloc_parms + GS_SIZE_OFF, &size, sizeof(size)))
		size = 0;
	gs_quota_charge(in, c, &r, rep->h_object_new, size, status, q);
}
