/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * core_int.h - what the decision core's files share with each other and with
 * nobody else: the instance, the object table, the per-call event queue.
 *
 * The files are layered. Each calls into its own layer and the layers below
 * it, never above (tests/test_core_layers.py checks it):
 *
 *   call      call.c: one ioctl, gs_pre() to gs_post(), for the glue
 *   snapshot  snapshot.c: an instance's state as bytes and back, for a new
 *             core to take over (reads the records of every layer below)
 *   dispatch  core.c (the instance, gs_pre(), gs_post()), filter.c,
 *             legacy.c, osevent.c, export.c, engines.c, virt.c: the
 *             decisions of the escapes, classes and controls, which name
 *             each other through their tables
 *   uvm       uvm.c: what nvidia-uvm holds for the caller
 *   quota     quota.c: the memory limit, the charges and their references
 *   registry  registry.c: RM's objects as RM keeps them, the calls in flight
 *   base      event.c, abi.c, nvrm_tables.c, names.c, activity.c
 *
 * What a lower layer must tell a higher one goes through a table the higher
 * one fills: the registry hands each record it forgets, or that RM
 * invalidated, to in->reg->release (struct gs_reg_ops, core.c), which gives
 * back the record's charge (quota.c) and nvidia-uvm's hold on it (uvm.c).
 */
#ifndef GPUSLICE_CORE_INT_H
#define GPUSLICE_CORE_INT_H

#include "core.h"
#include "../uapi/gpuslice.h"

#define GS_HASH_SIZE	1024	/* buckets of the object table, a power of two */
#define GS_EVQ_INLINE	4	/* events a call queues before it needs the heap */
#define GS_MAX_DEPTH	64	/* longest parent chain followed */
/*
 * Caps per instance. RM allocates framebuffer of its own for each channel
 * (instance block, USERD, GR context: memdescAlloc, not counted by RM per
 * process nor here), so their number bounds what that can take; objects
 * bound the registry (its walks and the lock hold they cost).
 */
#define GS_MAX_CHANNELS	1024	/* a CUDA context makes 20 (traces) */
#define GS_MAX_OBJECTS	65536
/*
 * TSG ids come from a pool per runlist that every tenant of the GPU shares
 * (kernel/gpu/fifo: kfifoChidMgrAllocChannelGroupHwID), whether or not the
 * TSG has channels: a CUDA context makes 4 TSGs (traces), so the channel cap
 * is reached long before this one (51 contexts, 205 TSGs).
 */
#define GS_MAX_TSGS	256
/*
 * NV_ESC_ALLOC_OS_EVENT appends to one list for the whole host, searched
 * under a spinlock with interrupts off at every allocation and free
 * (arch/nvalloc/unix/src/osapi.c allocate_os_event(), free_os_events()): a
 * CUDA process makes 9 (traces).
 */
#define GS_MAX_OS_EVENTS	1024
#define GS_MAX_UVM_RECS	65536	/* what nvidia-uvm holds for an instance (uvm.c) */
#define GS_MAX_UVM_REGIONS	1024	/* of those, ranges UVM backs with page tables alone */
#define GS_MAX_EXPORTS	4096	/* objects exported to fds (CUDA: one per shareable handle) */
/* the most RM's reported size of an allocation exceeds its page-rounded size (traces) */
#define GS_RM_PAD_MAX	(2ull << 20)

/* gs_obj_gpu()'s answer for an object without a device above it that we know */
#define GS_GPU_UNKNOWN	0xffffffffu

/*
 * Counted memory, shared by an object and the handles RM_DUP_OBJECT made of
 * it; or charged to a client without a handle (gs_obj.orphans).
 */
struct gs_mem {
	struct gs_mem *next;	/* a client's orphans */
	nv_u64 size;
	nv_u32 refs;
	nv_u32 gpu;		/* video memory: its GPU, < GPUSLICE_MAX_GPUS */
	int sys;		/* pinned system memory (NV01_MEMORY_SYSTEM) */
	nv_u32 uvm_maps;	/* nvidia-uvm mappings of it the core holds (uvm.c) */
	nv_u32 snap_idx;	/* snapshot.c's, under in->lock: its index + 1, 0 none */
};

/*
 * An RM object exported to a nvidiactl file (export.c): RM keeps a duplicate
 * of it in its own export client, alive until that file is released, so its
 * memory stays charged (mem->refs) until then. A slot, once exported, does not
 * change until the file goes. Also, in gs_call.spare_exp, what an export or
 * import call will record.
 */
struct gs_export {
	struct gs_export *next;
	nv_u64 file_id;		/* the nvidiactl file holding it (RM: nvfp->handles[]) */
	nv_u32 slot;		/* its index there */
	const struct gs_call *pending;	/* the export call between its gs_pre() and gs_post() */
	nv_handle client;	/* exported: the object; imported: where it goes */
	nv_handle parent;
	nv_handle handle;
	nv_u32 klass;
	nv_u32 gpu;
	struct gs_mem *mem;	/* the exported memory's charge */
	const struct gs_export *held;	/* an import's: the record of its slot */
	nv_u8 sibling;		/* an import's: from another core's file (gs_call.fd_sibling) */
};

/*
 * A reference on a charge that a client holds without a handle (gs_park()):
 * RM may hold the memory through an object the core could not register.
 */
struct gs_memref {
	struct gs_memref *next;
	struct gs_mem *mem;
};

/*
 * What nvidia-uvm holds for the caller, per nvidia-uvm file (uvm.c): a
 * mapping of counted memory (UVM_MAP_EXTERNAL_ALLOCATION: UVM duplicates the
 * memory per GPU; the record holds a reference on its charge), a registered
 * channel (UVM_REGISTER_CHANNEL: UVM retains the channel and its TSG; once
 * the caller freed the channel the record counts it against the channel
 * cap), or a range UVM backs with page tables of its own (a dynamic
 * parallelism region, a semaphore pool: capped in number). Kept until UVM is
 * known to have let go. The uuids of the GPUs still mapped follow the record.
 */
enum gs_uvm_kind {
	GS_UVM_MAP,
	GS_UVM_CHANNEL,
	GS_UVM_REGION,
};

struct gs_uvm_rec {
	struct gs_uvm_rec *next;
	nv_u64 file_id;		/* the nvidia-uvm file (its VA space) */
	enum gs_uvm_kind kind;
	nv_u64 start;		/* MAP, REGION: the range, inclusive */
	nv_u64 end;
	struct gs_mem *mem;	/* MAP */
	struct gs_mem *pt;	/* MAP, REGION: the page tables charged for it, or NULL */
	nv_handle client;	/* CHANNEL */
	nv_handle handle;
	nv_u8 orphan;		/* CHANNEL: freed by the caller, counted here */
	nv_u32 nr_gpus;
};

/*
 * One object RM frees together with another that is not its parent: resserv
 * frees an object's dependants with it, as it frees its children
 * (libraries/resserv/src/rs_client.c clientUpdatePendingFreeList_IMPL, which
 * walks pResourceRef->depRefMap; dependants are added by refAddDependant(),
 * rs_resource.c). An edge from the dependant (from) to what it depends on
 * (to), on to's list of dependants. The classes that make them: core.c
 * gs_dep_fields[].
 */
struct gs_dep {
	struct gs_obj *from;
	struct gs_obj *to;	/* NULL: slot unused */
	struct gs_dep *next;	/* on to->dependants */
	struct gs_dep **pprev;
};

#define GS_OBJ_DEPS	GS_CALL_DEPS

/*
 * A tracked RM object. The registry mirrors RM's tree with pointers: up is
 * the parent (NULL for a client, which is on gs_inst.clients), kids its
 * children; an object whose parent is not registered (its parent's reply is
 * still to come, or was never seen) is a stray, on its client's strays until
 * the parent is registered. Frees walk what they free and nothing else.
 */
struct gs_obj {
	struct gs_obj *next;	/* hash chain */
	struct gs_obj *kill;	/* list of objects a free removes */
	struct gs_obj *up;	/* parent; a stray's: its client */
	struct gs_obj *kids;	/* children */
	struct gs_obj *strays;	/* clients: objects whose parent is not registered */
	struct gs_obj *sib;	/* next on up's kids or strays, or gs_inst.clients */
	struct gs_obj **psib;	/* where this object is linked there */
	struct gs_obj *pid_next;	/* clients: gs_inst.by_pid[] */
	struct gs_obj **pid_pprev;
	struct gs_obj *nspid_next;	/* clients: gs_inst.by_ns_pid[] */
	struct gs_obj **nspid_pprev;
	struct gs_dep dep[GS_OBJ_DEPS];	/* what this object depends on */
	struct gs_dep *dependants;	/* edges to this object */
	struct gs_object o;
	struct gs_mem *mem;	/* video memory, NULL for the rest */
	nv_u32 ns_pid;		/* clients: gs_call.ns_pid of the caller that made it */
	struct gs_mem *orphans;	/* clients: memory charged without a handle */
	struct gs_memref *held;	/* clients: references on charges without a handle */
	nv_u8 uvm_registered;	/* channels: UVM_REGISTER_CHANNEL named it (uvm.c) */
	nv_u8 stray;		/* on its client's strays */
	nv_u8 dying;		/* collected by a free (registry.c) */
	nv_u32 snap_idx;	/* snapshot.c's, under in->lock: its record's index */
};

/*
 * Objects whose parent registers after them (its reply is still to come): a
 * program racing its own calls has a few. Each registration looks through
 * them; past the cap an object is freed with its client only.
 */
#define GS_MAX_STRAYS	256

#define GS_PID_BUCKETS	256	/* gs_inst.by_pid[], by_ns_pid[], a power of two */

/*
 * What the registry tells the instance's owner. release: RM destroyed what
 * ob stands for (ob is freed, or invalidated and kept, lost); the owner lets
 * go of what it attached to ob (mem, orphans, held; a channel UVM retains).
 * Called once per record, under in->lock, before the record is freed.
 */
struct gs_reg_ops {
	void (*release)(struct gs_inst *in, struct gs_obj *ob);
};

struct gs_inst {
	struct gs_mutex lock;
	struct gs_inst_ops ops;
	const struct gs_reg_ops *reg;	/* core.c gs_reg_ops */
	nv_u32 flags;
	nv_u32 caps;		/* GS_CAP_*: the rows it may use, gs_inst_set_caps() */
	nv_u64 limit;		/* of a GPU without a limit of its own */
	nv_u32 gpus;		/* the instance's GPUs (device instances), gs_inst_set_gpus() */
	nv_u32 gpu_ids[GPUSLICE_MAX_GPUS];	/* their RM gpuIds, gs_inst_set_gpu_ids() */
	int gpu_ids_set;
	nv_u64 used;		/* video memory: the sum of gpu_used[] */
	nv_u64 peak;		/* of used */
	/* per GPU (RM's device instance) */
	nv_u64 gpu_limit[GPUSLICE_MAX_GPUS];	/* 0: limit */
	nv_u64 gpu_used[GPUSLICE_MAX_GPUS];	/* sum of live gs_mem sizes */
	nv_u64 gpu_reserved[GPUSLICE_MAX_GPUS];	/* allocations between gs_pre() and gs_post() */
	nv_u64 gpu_peak[GPUSLICE_MAX_GPUS];
	nv_u64 sys_used;	/* pinned system memory, capped at limit too */
	nv_u64 sys_reserved;
	nv_u64 nr_ioctls;
	nv_u64 nr_refused_quota;
	nv_u64 nr_refused_filter;
	nv_u32 nr_objects;
	nv_u32 nr_channels;
	nv_u32 nr_tsgs;
	nv_u32 nr_strays;	/* objects waiting for their parent to register (registry.c) */
	nv_u32 nr_mappers;	/* NV_MEMORY_MAPPER objects (core.c) */
	nv_u32 nr_os_events;	/* NV_ESC_ALLOC_OS_EVENT, less the frees (legacy.c) */
	struct gs_busy *busy;		/* handles of the calls between gs_pre() and gs_post() */
	nv_u32 nr_inflight;	/* calls gs_pre() passed whose gs_post() has not run (snapshot.c) */
	struct gs_export *exports;	/* export.c */
	nv_u32 nr_exports;
	struct gs_uvm_rec *uvm_recs;	/* uvm.c */
	nv_u32 nr_uvm_recs;
	nv_u32 nr_uvm_regions;
	nv_u32 nr_uvm_channels;	/* channels freed by the caller that UVM retains */
	struct gs_obj *hash[GS_HASH_SIZE];
	struct gs_obj *clients;		/* client objects, through sib */
	struct gs_osev *os_events;	/* osevent.c */
	struct gs_obj *by_pid[GS_PID_BUCKETS];	/* client objects by o.pid */
	struct gs_obj *by_ns_pid[GS_PID_BUCKETS];	/* and by ns_pid */
	struct gs_hash_key hash_key;	/* secret: handles are the caller's to pick */
};

/* event.c: events collected under the lock and delivered after it is dropped */
struct gs_evq {
	struct gs_event ev[GS_EVQ_INLINE];
	struct gs_event *heap;
	int n;
	int cap;		/* capacity of heap */
	int dropped;
};

void gs_evq_init(struct gs_evq *q);
void gs_evq_push(struct gs_evq *q, const struct gs_event *ev);
void gs_evq_flush(struct gs_inst *in, struct gs_evq *q);

/* registry.c, all under in->lock */
struct gs_obj *gs_obj_find(struct gs_inst *in, nv_handle client, nv_handle handle);
nv_u32 gs_hash_max_chain(const struct gs_inst *in);
struct gs_obj *gs_obj_add(struct gs_inst *in, struct gs_call *c,
			  const struct gs_object *o, struct gs_mem *mem,
			  struct gs_evq *q);
void gs_obj_free_tree(struct gs_inst *in, nv_handle client, nv_handle handle,
		      struct gs_evq *q);
void gs_obj_engine_set(struct gs_inst *in, nv_handle client, nv_handle handle, nv_u32 engine,
		       struct gs_evq *q);
void gs_obj_scheduled(struct gs_inst *in, nv_handle client, nv_handle handle,
		      struct gs_evq *q);
void gs_obj_free_file(struct gs_inst *in, nv_u64 file_id, struct gs_evq *q);
void gs_obj_free_all(struct gs_inst *in);
void gs_obj_depend(struct gs_inst *in, struct gs_obj *ob, nv_handle handle);
void gs_client_set_ns_pid(struct gs_inst *in, struct gs_obj *cl, nv_u32 ns_pid);
void gs_obj_restore(struct gs_inst *in, struct gs_obj *ob, struct gs_obj *up, int stray,
		    int ns_linked);
int gs_is_client(struct gs_inst *in, nv_handle client);
/* what a call in flight does to a handle (struct gs_busy) */
#define GS_BUSY_CREATE	1	/* RM_ALLOC, RM_ALLOC_MEMORY, a dup's or an import's new handle */
#define GS_BUSY_FREE	2	/* RM_FREE: the handle and all below it */
#define GS_BUSY_SOURCE	3	/* a dup's source (exports: their pending records) */
#define GS_BUSY_DEP	4	/* what a new object will depend on (core.c gs_dep_fields) */
#define GS_BUSY_OSEV	5	/* an OS event's key (client, fd) allocated or freed (osevent.c) */
int gs_busy_conflict(struct gs_inst *in, nv_u32 role, nv_handle client, nv_handle handle,
		     nv_handle parent);
void gs_busy_add(struct gs_inst *in, struct gs_call *c, nv_u32 role, nv_handle client,
		 nv_handle handle, nv_handle parent);
void gs_busy_done(struct gs_inst *in, struct gs_call *c);
int gs_ns_pid_has_client(struct gs_inst *in, nv_u32 ns_pid);
nv_u32 gs_obj_gpu(struct gs_inst *in, nv_handle client, nv_handle parent, nv_u32 dflt);
void gs_obj_init(struct gs_object *o, struct gs_inst *in, const struct gs_call *c,
		 nv_u32 kind, nv_handle client, nv_handle parent, nv_handle handle,
		 nv_u32 klass);

/* quota.c */
int gs_vidmem_class(nv_u32 klass);	/* 1 counted, -1 refused, 0 not video memory */
int gs_counted_class(nv_u32 klass);	/* video memory or pinned system memory */
nv_u64 gs_mem_bound(nv_u32 klass, const struct nv_memory_allocation_params *mp);
nv_u64 gs_pma_size(const struct nv_memory_allocation_params *mp, nv_u64 reported);
/*
 * A request for counted memory, whichever call makes it (RM_ALLOC of a
 * counted class; the vid-heap allocations, vidheap.c): its client, parent
 * and handle (0: RM chooses), the class RM allocates, and the parameters
 * RM allocates by (size, attr, attr2).
 */
struct gs_mem_req {
	nv_handle root, parent, handle;
	nv_u32 klass;
	struct nv_memory_allocation_params mp;
};
enum gs_verdict gs_quota_check(struct gs_inst *in, struct gs_call *c,
			       const struct gs_mem_req *r, struct gs_evq *q);
void gs_quota_charge(struct gs_inst *in, struct gs_call *c, const struct gs_mem_req *r,
		     nv_handle replied, nv_u64 size, nv_u32 status, struct gs_evq *q);
enum gs_verdict gs_quota_pre(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			     struct nvos64_params *p, struct gs_evq *q);
void gs_quota_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
		   const struct nvos64_params *p, nv_u32 status, struct gs_evq *q);
void gs_quota_release(struct gs_inst *in, struct gs_call *c);
void gs_mem_put(struct gs_inst *in, struct gs_mem *mem);
void gs_orphan_put(struct gs_inst *in, struct gs_obj *ob);
void gs_park(struct gs_inst *in, struct gs_call *c, nv_handle client, struct gs_mem *mem);
nv_u64 gs_gpu_limit(const struct gs_inst *in, nv_u32 gpu);
int gs_charge_extra(struct gs_inst *in, struct gs_mem *m, nv_u32 gpu, nv_u64 size);
nv_u32 gs_first_gpu(const struct gs_inst *in);

/*
 * Where RM writes the status of each escape's block (nvrm_abi.h, whose
 * layouts tests/test_nvrm_tables.py checks against NVIDIA's headers for
 * every supported release); GS_ST_NONE: the block has none.
 */
#define GS_ST_NVOS00	((nv_u32)offsetof(struct nvos00_params, status))	/* RM_FREE */
#define GS_ST_NVOS64	((nv_u32)offsetof(struct nvos64_params, status))	/* RM_ALLOC */
#define GS_ST_NVOS54	((nv_u32)offsetof(struct nvos54_params, status))	/* RM_CONTROL */
#define GS_ST_NVOS55	((nv_u32)offsetof(struct nvos55_params, status))	/* RM_DUP_OBJECT */
#define GS_ST_NVOS57	((nv_u32)offsetof(struct nvos57_params, status))	/* RM_SHARE */
#define GS_ST_NVOS02	((nv_u32)offsetof(struct nvos02_params, status))	/* RM_ALLOC_MEMORY */
#define GS_ST_NVOS33	((nv_u32)offsetof(struct nvos33_params, status))	/* RM_MAP_MEMORY */
#define GS_ST_NVOS34	((nv_u32)offsetof(struct nvos34_params, status))	/* RM_UNMAP_MEMORY */
#define GS_ST_NVOS56	((nv_u32)offsetof(struct nvos56_params, status))	/* UPDATE_DEVICE_MAPPING_INFO */
#define GS_ST_OS_EVENT	((nv_u32)offsetof(struct nv_ioctl_alloc_os_event, status))
#define GS_ST_NONE	0xffffffffu

/*
 * One escape the core decides on (core.c gs_escapes[]): the block it reads
 * (size; 0: the step checks it), its status offset, flags, the capabilities
 * it is for (GS_CAP_*: nvproxy's, gs_pre_caps()), and the steps before RM
 * (pre, under in->lock; NULL: the common checks alone) and after it (post,
 * with c->status RM's; NULL: nothing to account for).
 */
#define GS_ESC_CLIENT_FIRST	0x1	/* the block starts with a client of the instance's */
#define GS_ESC_CREATES		0x2	/* may register an object (gs_call.spare_obj) */
#define GS_ESC_CHARGES		0x4	/* may charge memory (gs_call.spare_mem) */

struct gs_escape_row {
	nv_u32 escape;
	nv_u32 size;
	nv_u32 status_off;
	nv_u32 flags;
	nv_u32 caps;
	enum gs_verdict (*pre)(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			       struct gs_evq *q);
	void (*post)(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
		     struct gs_evq *q);
};

/* core.c: what the escapes' decisions share */
nv_u32 gs_obj_kind(nv_u32 klass);
void gs_put_status(struct gs_call *c, nv_u32 off, nv_u32 status);
enum gs_verdict gs_refuse_as(struct gs_call *c, enum gs_refusal r, nv_u32 status_off,
			     nv_u32 status);
enum gs_verdict gs_refuse(struct gs_call *c, enum gs_refusal r, nv_u32 status_off);
enum gs_verdict gs_pre_caps(struct gs_inst *in, struct gs_call *c, nv_u32 caps,
			    nv_u32 status_off, nv_u32 status);
enum gs_verdict gs_fail(struct gs_call *c, enum gs_refusal r, int err);
enum gs_verdict gs_busy_refuse(struct gs_call *c, nv_u32 status_off);
int gs_short(const struct gs_call *c, nv_u32 need);
enum gs_verdict gs_pre_client_first(struct gs_inst *in, struct gs_call *c, nv_u32 size,
				    nv_u32 st);
nv_u32 gs_create_conflict(struct gs_inst *in, nv_handle client, nv_handle handle,
			  nv_handle parent);
enum gs_verdict gs_pre_free_handle(struct gs_inst *in, struct gs_call *c, nv_handle client,
				   nv_handle handle, nv_u32 st);

/* filter.c */
/*
 * The container capabilities a row is for: GS_CAP_* (core.h), as
 * libnvidia-container (NVIDIA_DRIVER_CAPABILITIES) and gVisor's nvproxy name
 * them. A row passes only for an instance whose set (gs_inst_set_caps())
 * holds at least one of them.
 */

/*
 * What the core does with a control beyond letting it through: pre decides
 * before RM (GS_PASS, or GS_REPLY with *status the answer; it sets
 * c->refusal for a refusal), post accounts for or rewrites RM's reply
 * (c->status is RM's; c->reply_lost says whether it could be read back).
 * Both run with in->lock held; p is the block as checked.
 */
struct gs_control_handler {
	enum gs_verdict (*pre)(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			       const struct nvos54_params *p, nv_u32 *status);
	void (*post)(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
		     const struct nvos54_params *p, struct gs_evq *q);
};

extern const struct gs_control_handler gs_export_handler;	/* export.c */
extern const struct gs_control_handler gs_virt_handler;		/* virt.c */
extern const struct gs_control_handler gs_disable_handler;	/* core.c */
extern const struct gs_control_handler gs_timeslice_handler;	/* core.c */
extern const struct gs_control_handler gs_schedule_handler;	/* core.c */
extern const struct gs_control_handler gs_zcull_handler;	/* engines.c */
extern const struct gs_control_handler gs_bind_handler;		/* engines.c */
extern const struct gs_control_handler gs_preempt_handler;	/* engines.c */

/*
 * One control: its capability, why it is allowed or refused, and refused,
 * the status the caller gets (RM's own answer to an unprivileged client, or
 * to a client without the feature); handler: what the core does with it
 * (NULL: passed, or refused, as it stands).
 */
struct gs_control_row {
	nv_u32 cmd;
	nv_u32 caps;
	const char *why;
	enum gs_refusal refusal;	/* GS_REFUSE_NONE: allowed */
	nv_u32 status;
	const struct gs_control_handler *handler;
};

/* the classes whose parameters' size differs between driver versions (struct nvrm_table) */
enum gs_abi_size {
	GS_ABI_SIZE_FIXED,		/* params_size on every supported version */
	GS_ABI_SIZE_MEMORY_ALLOC,	/* nvrm_table.memory_alloc_size */
	GS_ABI_SIZE_CHANNEL_ALLOC,	/* nvrm_table.channel_alloc_size */
	GS_ABI_SIZE_MEMORY_MAPPER,	/* nvrm_table.memory_mapper_alloc_size */
};

/*
 * One allocation class, likewise; pre: the class's own decision once the
 * common checks passed (core.c gs_pre_alloc()); params_size: the bytes of
 * its parameters RM reads (rmapiGetClassAllocParamSize) that the core reads
 * too, staged (the driver reads the checked copy) when stage is set.
 */
struct gs_class_row {
	nv_u32 klass;
	nv_u32 caps;
	const char *why;
	enum gs_refusal refusal;
	nv_u32 status;
	enum gs_verdict (*pre)(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			       struct nvos64_params *p, struct gs_evq *q);
	nv_u32 params_size;	/* the newest branch's; abi_size: the running driver's */
	nv_u8 stage;
	enum gs_abi_size abi_size;
};

/* the bytes of a class's parameters RM reads on the running driver */
nv_u32 gs_class_params_size(const struct gs_class_row *row);

const struct gs_control_row *gs_control_row(nv_u32 cmd);
const struct gs_class_row *gs_class_row(nv_u32 klass);
enum gs_refusal gs_filter_disable_channels(struct gs_inst *in, const struct gs_io *io,
					   const struct nvos54_params *p);

enum gs_verdict gs_filter_escape(struct gs_inst *in, struct gs_call *c);
enum gs_verdict gs_filter_uvm(struct gs_inst *in, struct gs_call *c);
enum gs_refusal gs_filter_alloc_memory_class(nv_u32 klass, nv_u32 *status);

/* osevent.c: one entry RM keeps for NV_ESC_ALLOC_OS_EVENT, keyed by (client, fd) */
struct gs_osev {
	struct gs_osev *next;
	nv_u64 file_id;
	nv_handle client;
	nv_u32 fd;
};

int gs_osev_spare_alloc(struct gs_call *c);
void gs_osev_spare_free(struct gs_call *c);
enum gs_verdict gs_osev_pre(struct gs_inst *in, struct gs_call *c);
void gs_osev_post(struct gs_inst *in, struct gs_call *c);
void gs_osev_gone(struct gs_inst *in, nv_handle client, nv_u64 file_id);

/* export.c */
int gs_export_control(nv_u32 cmd);
int gs_export_spares_alloc(struct gs_call *c, const struct gs_io *io);
void gs_export_spares_free(struct gs_call *c);
enum gs_refusal gs_export_pre(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			      const struct nvos54_params *p, nv_u32 *status);
void gs_export_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
		    const struct nvos54_params *p,
		    nv_u32 status, struct gs_evq *q);
void gs_export_abort(struct gs_inst *in, struct gs_call *c);
void gs_export_free_file(struct gs_inst *in, nv_u64 file_id);

/* uvm.c */
int gs_uvm_spares_alloc(struct gs_call *c);
void gs_uvm_spares_free(struct gs_call *c);
enum gs_verdict gs_uvm_pre(struct gs_inst *in, struct gs_call *c);
void gs_uvm_post(struct gs_inst *in, struct gs_call *c, int ret);
void gs_uvm_abort(struct gs_inst *in, struct gs_call *c);
void gs_uvm_free_file(struct gs_inst *in, nv_u64 file_id);
void gs_uvm_free_all(struct gs_inst *in);
void gs_uvm_channel_freed(struct gs_inst *in, const struct gs_obj *ob);

/* core.c: the classes' own decisions (struct gs_class_row.pre) */
enum gs_verdict gs_pre_device(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			      struct nvos64_params *p, struct gs_evq *q);
enum gs_verdict gs_pre_other_clients(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				     struct nvos64_params *p, struct gs_evq *q);
enum gs_verdict gs_pre_fabric(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			      struct nvos64_params *p, struct gs_evq *q);
enum gs_verdict gs_pre_memory_mapper(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				     struct nvos64_params *p, struct gs_evq *q);
enum gs_verdict gs_pre_semaphore_surface(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
					 struct nvos64_params *p, struct gs_evq *q);
/*
 * The most a call may have RM wait on the GPU for the caller
 * (NV_ESC_RM_IDLE_CHANNELS' timeout, NVA06C_CTRL_CMD_PREEMPT's), in
 * microseconds, 0 meaning RM's default for IDLE_CHANNELS: 100 ms. RM answers
 * a longer wait NV_ERR_TIMEOUT, which the caller meets as a timeout of its
 * own, and the scheduler's and other tenants' RM calls wait behind it at
 * most that long.
 */
#define GS_WAIT_MAX_US	100000

/* engines.c */
int gs_engine_video(nv_u32 engine);
void gs_engine_object_made(struct gs_inst *in, nv_handle client, nv_handle channel,
			   nv_u32 klass, struct gs_evq *q);
enum gs_verdict gs_pre_video_engine(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				    struct nvos64_params *p, struct gs_evq *q);
/* legacy.c: the escapes before RM_ALLOC that OpenGL, Vulkan and the video libraries use */
int gs_legacy_escape(nv_u32 escape);
enum gs_verdict gs_legacy_pre(struct gs_inst *in, struct gs_call *c, struct gs_evq *q);
void gs_legacy_post(struct gs_inst *in, struct gs_call *c, struct gs_evq *q);

#endif /* GPUSLICE_CORE_INT_H */
