// SPDX-License-Identifier: GPL-2.0
/*
 * nvstub_rm.c - RM clients, objects and handles of the nvstub TEST DOUBLE.
 *
 * Mirrors resserv (src/nvidia/src/libraries/resserv/src/rs_server.c,
 * rs_client.c) and rmapi (src/nvidia/src/kernel/rmapi/client.c, alloc_free.c):
 * a client is a tree of objects; a client belongs to the file that created it
 * (rmclientValidate compares secInfo.clientOSInfo, i.e. the nvidiactl file or
 * the one an nvidiaN file registered with REGISTER_FD); freeing an object
 * frees its subtree; closing the file frees its clients.
 */
#include <linux/fdtable.h>
#include <linux/log2.h>
#include <linux/mm.h>
#include <linux/file.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/sizes.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "nvstub.h"

#define NVSTUB_CLIENT_HANDLE_BASE	0xc1d00000	/* as seen in the traces */
#define NVSTUB_OBJECT_HANDLE_BASE	0xcaf00000	/* resserv RS_UNIQUE_HANDLE_BASE */
/* NV01_MEMORY_LOCAL_PHYSICAL is not modelled (see README): a 2 MiB granule */
#define NVSTUB_PHYS_GRANULE		SZ_2M

static DEFINE_XARRAY(nvstub_clients);	/* client handle -> struct nvstub_client */
static u32 nvstub_next_client = 0x40;

/* Which parent classes each class accepts; 0 terminates, ANY accepts all. */
#define P_ANY	0xffffffff
struct nvstub_class_info {
	u32 cls;
	u32 parents[3];
	u32 params_size;	/* bytes of pAllocParms RM reads for this class */
	u32 alloc_status;	/* NV_OK, or the status RM gives (no display) */
};

static const struct nvstub_class_info nvstub_classes[] = {
	{ NV01_DEVICE_0, { NV01_ROOT_CLIENT }, sizeof(struct nv0080_alloc_params) },
	{ NV20_SUBDEVICE_0, { NV01_DEVICE_0 }, sizeof(struct nv2080_alloc_params) },
	{ NV2081_BINAPI, { NV20_SUBDEVICE_0 }, 0 },
	{ NV01_MEMORY_SYSTEM, { NV01_DEVICE_0, NV20_SUBDEVICE_0 },
	  sizeof(struct nv_memory_allocation_params) },
	{ NV01_MEMORY_LOCAL_USER, { NV01_DEVICE_0, NV20_SUBDEVICE_0 },
	  sizeof(struct nv_memory_allocation_params) },
	{ NV01_MEMORY_LOCAL_PHYSICAL, { NV01_DEVICE_0, NV20_SUBDEVICE_0 },
	  sizeof(struct nv_memory_allocation_params) },
	{ NV01_EVENT_OS_EVENT, { P_ANY }, 0 },
	{ FERMI_VASPACE_A, { NV01_DEVICE_0, NV20_SUBDEVICE_0 }, 0 },
	{ NV50_MEMORY_VIRTUAL, { NV01_DEVICE_0, NV20_SUBDEVICE_0 }, 0 },
	{ NV50_THIRD_PARTY_P2P, { NV20_SUBDEVICE_0 }, 0 },
	/* NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS, NV_CTXSHARE_ALLOCATION_PARAMETERS (nvos.h) */
	{ KEPLER_CHANNEL_GROUP_A, { NV01_DEVICE_0 }, NVSTUB_TSG_PARAMS_SIZE },
	{ FERMI_CONTEXT_SHARE_A, { KEPLER_CHANNEL_GROUP_A }, NVSTUB_CTXSHARE_PARAMS_SIZE },
	/* NV_CHANNEL_ALLOC_PARAMS: RM reads all of it; the stand-in its head */
	{ HOPPER_CHANNEL_GPFIFO_A, { KEPLER_CHANNEL_GROUP_A },
	  sizeof(struct nv_channel_alloc_params_head) },
	{ HOPPER_COMPUTE_A, { HOPPER_CHANNEL_GPFIFO_A }, 0 },
	{ HOPPER_DMA_COPY_A, { HOPPER_CHANNEL_GPFIFO_A }, 0 },
	{ HOPPER_USERMODE_A, { NV20_SUBDEVICE_0 }, 0 },
	{ GF100_SUBDEVICE_MASTER, { NV20_SUBDEVICE_0 }, 0 },
	{ GF100_SUBDEVICE_INFOROM, { NV20_SUBDEVICE_0 }, 0 },
	{ RM_USER_SHARED_DATA, { NV20_SUBDEVICE_0 }, 0 },
	{ GT200_DEBUGGER, { NV01_DEVICE_0 }, 0 },
	{ NV_CONFIDENTIAL_COMPUTE, { NV01_ROOT_CLIENT }, 0 },
	{ AMPERE_SMC_CONFIG_SESSION, { NV01_ROOT_CLIENT }, 0 },
	{ AMPERE_SMC_MONITOR_SESSION, { NV01_ROOT_CLIENT }, 0 },
	{ NV04_DISPLAY_COMMON, { NV01_DEVICE_0 }, 0, NV_ERR_NOT_SUPPORTED },
	/* rmapi/resource_list.h: under a Subdevice, RS_REQUIRED(NV00F8_ALLOCATION_PARAMETERS) */
	{ NV_MEMORY_FABRIC, { NV20_SUBDEVICE_0 }, sizeof(struct nv00f8_alloc_params) },
	{ NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, { NV01_DEVICE_0, NV20_SUBDEVICE_0 }, 0 },
	/*
	 * Graphics and video (rmapi/resource_list.h): parents and
	 * RS_REQUIRED/RS_OPTIONAL parameter structures as listed there.
	 * NV01_MEMORY_LOCAL_PRIVILEGED (RegisterMemory, RS_NONE) is made through
	 * RM_ALLOC_MEMORY (nvstub_esc_alloc_memory()); NV01_MEMORY_VIRTUAL is
	 * also NV01_MEMORY_SYSTEM_DYNAMIC (cl0070.h, NV_MEMORY_VIRTUAL_ALLOCATION_PARAMS).
	 */
	{ NV01_MEMORY_LOCAL_PRIVILEGED, { NV01_DEVICE_0 }, 0 },
	{ NV01_MEMORY_VIRTUAL, { NV01_DEVICE_0 }, NVSTUB_MEMORY_VIRTUAL_PARAMS_SIZE },
	{ NV01_CONTEXT_DMA_FROM_MEMORY, { P_ANY }, NVSTUB_CONTEXT_DMA_PARAMS_SIZE },
	{ NV01_EVENT, { P_ANY }, sizeof(struct nv0005_alloc_params) },
	{ NV_SEMAPHORE_SURFACE, { NV20_SUBDEVICE_0 }, NVSTUB_SEMAPHORE_SURFACE_PARAMS_SIZE },
	{ NV_MEMORY_MAPPER, { NV20_SUBDEVICE_0 }, NVSTUB_MEMORY_MAPPER_PARAMS_SIZE },
	{ GF100_ZBC_CLEAR, { NV20_SUBDEVICE_0 }, 0 },
	/* KernelChannel: under a Device RM makes the channel's TSG itself (nvstub_obj_setup()) */
	{ AMPERE_CHANNEL_GPFIFO_A, { NV01_DEVICE_0, KEPLER_CHANNEL_GROUP_A },
	  sizeof(struct nv_channel_alloc_params_head) },
	/* KernelGraphicsObject, RS_OPTIONAL(NV_GR_ALLOCATION_PARAMETERS), under a KernelChannel */
	{ HOPPER_A, { HOPPER_CHANNEL_GPFIFO_A, AMPERE_CHANNEL_GPFIFO_A }, NVSTUB_GR_ALLOC_PARAMS_SIZE },
	{ FERMI_TWOD_A, { HOPPER_CHANNEL_GPFIFO_A, AMPERE_CHANNEL_GPFIFO_A }, NVSTUB_GR_ALLOC_PARAMS_SIZE },
	{ KEPLER_INLINE_TO_MEMORY_B, { HOPPER_CHANNEL_GPFIFO_A, AMPERE_CHANNEL_GPFIFO_A },
	  NVSTUB_GR_ALLOC_PARAMS_SIZE },
	/* NvdecContext, NvjpgContext, OfaContext: RS_OPTIONAL(NV_BSP/NVJPG/OFA_ALLOCATION_PARAMETERS) */
	{ NVB8B0_VIDEO_DECODER, { HOPPER_CHANNEL_GPFIFO_A, AMPERE_CHANNEL_GPFIFO_A },
	  sizeof(struct nv_video_engine_alloc_params) },
	{ NVB8D1_VIDEO_NVJPG, { HOPPER_CHANNEL_GPFIFO_A, AMPERE_CHANNEL_GPFIFO_A },
	  sizeof(struct nv_video_engine_alloc_params) },
	{ NVB8FA_VIDEO_OFA, { HOPPER_CHANNEL_GPFIFO_A, AMPERE_CHANNEL_GPFIFO_A },
	  sizeof(struct nv_video_engine_alloc_params) },
};

const u32 nvstub_class_list[] = {
	NV01_ROOT_CLIENT, NV01_DEVICE_0, NV20_SUBDEVICE_0, NV2081_BINAPI,
	NV01_MEMORY_SYSTEM, NV01_MEMORY_LOCAL_USER, NV01_MEMORY_LOCAL_PHYSICAL,
	NV01_EVENT_OS_EVENT, FERMI_VASPACE_A, NV50_MEMORY_VIRTUAL,
	NV50_THIRD_PARTY_P2P, KEPLER_CHANNEL_GROUP_A, FERMI_CONTEXT_SHARE_A,
	HOPPER_CHANNEL_GPFIFO_A, HOPPER_COMPUTE_A, HOPPER_DMA_COPY_A,
	HOPPER_USERMODE_A, GF100_SUBDEVICE_MASTER, GF100_SUBDEVICE_INFOROM,
	RM_USER_SHARED_DATA, GT200_DEBUGGER, NV_CONFIDENTIAL_COMPUTE,
	AMPERE_SMC_CONFIG_SESSION, AMPERE_SMC_MONITOR_SESSION,
	NV04_DISPLAY_COMMON, NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, NV_MEMORY_FABRIC,
	NV01_MEMORY_LOCAL_PRIVILEGED, NV01_MEMORY_VIRTUAL, NV01_CONTEXT_DMA_FROM_MEMORY,
	NV01_EVENT, NV_SEMAPHORE_SURFACE, NV_MEMORY_MAPPER, GF100_ZBC_CLEAR,
	AMPERE_CHANNEL_GPFIFO_A, HOPPER_A, FERMI_TWOD_A, KEPLER_INLINE_TO_MEMORY_B,
	NVB8B0_VIDEO_DECODER, NVB8D1_VIDEO_NVJPG, NVB8FA_VIDEO_OFA,
};
const unsigned int nvstub_class_count = ARRAY_SIZE(nvstub_class_list);

static const struct nvstub_class_info *nvstub_class_find(u32 cls)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(nvstub_classes); i++)
		if (nvstub_classes[i].cls == cls)
			return &nvstub_classes[i];
	return NULL;
}

static bool nvstub_parent_ok(const struct nvstub_class_info *ci, u32 parent_cls)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(ci->parents) && ci->parents[i]; i++)
		if (ci->parents[i] == P_ANY || ci->parents[i] == parent_cls)
			return true;
	return false;
}

struct nvstub_client *nvstub_client_get(u32 h_client)
{
	return xa_load(&nvstub_clients, h_client);
}

/* rmclientValidate(): the client must belong to the calling file. */
struct nvstub_client *nvstub_client_validate(struct nvstub_file *nf, u32 h_client,
					     u32 *status)
{
	struct nvstub_client *cl = nvstub_client_get(h_client);

	if (!cl || cl->owner != nvstub_owner(nf)) {
		*status = NV_ERR_INVALID_CLIENT;
		return NULL;
	}
	*status = NV_OK;
	return cl;
}

struct nvstub_obj *nvstub_obj_get(struct nvstub_client *cl, u32 handle)
{
	return xa_load(&cl->objs, handle);
}

struct nvstub_obj *nvstub_obj_ancestor(struct nvstub_obj *obj, u32 cls)
{
	for (; obj; obj = obj->parent)
		if (obj->cls == cls)
			return obj;
	return NULL;
}

static void nvstub_memdesc_free(struct nvstub_memdesc *md)
{
	WARN_ON(!list_empty(&md->dups));
	nvstub_mem_uncharge(md->gpu, md->charged);
	kfree(md);
}

/*
 * mem.c memDestructCommon_IMPL: the memdesc loses a duplicate; if this
 * object owned it, ownership passes to the next duplicate on the list. The
 * pages go back to the pool with the last duplicate (memdescDestroy). When
 * the only other holders are nvidia-uvm's (nvstub_memdesc_hold), no object
 * of the stand-in is left to take ownership: in RM it would pass to UVM's
 * duplicate, an object of UVM's kernel client, which nothing here lists.
 */
static void nvstub_memdesc_put(struct nvstub_obj *obj)
{
	struct nvstub_memdesc *md = obj->md;
	struct list_head *next;

	obj->md = NULL;
	md->dup_count--;
	if (obj->md_owner && !list_is_singular(&md->dups)) {
		next = obj->dup_node.next;
		if (next == &md->dups)
			next = next->next;
		list_entry(next, struct nvstub_obj, dup_node)->md_owner = true;
	}
	list_del_init(&obj->dup_node);
	if (!md->dup_count)
		nvstub_memdesc_free(md);
}

/*
 * A reference on @md for a holder that is no RM object of the stand-in:
 * nvidia-uvm's duplicate of the memory in its own kernel client
 * (nv_gpu_ops.c dupMemory -> DupObject -> mem.c memCopyConstruct_IMPL:
 * DupCount + 1). The pages stay in the pool until it is released, however
 * many RM handles of the memory are freed. Under nvstub_lock.
 */
void nvstub_memdesc_hold(struct nvstub_memdesc *md)
{
	lockdep_assert_held(&nvstub_lock);
	md->dup_count++;
}

/* nvUvmInterfaceFreeDupedHandle: UVM's duplicate goes. Under nvstub_lock. */
void nvstub_memdesc_release(struct nvstub_memdesc *md)
{
	lockdep_assert_held(&nvstub_lock);
	if (WARN_ON(!md->dup_count))
		return;
	if (!--md->dup_count)
		nvstub_memdesc_free(md);
}

/*
 * _refRemoveAllDependencies (rs_client.c:841, rs_resource.c): @obj stops
 * depending on anything.
 */
static void nvstub_obj_drop_deps(struct nvstub_obj *obj)
{
	unsigned int i;

	for (i = 0; i < NVSTUB_MAX_DEPS; i++) {
		if (obj->deps[i])
			obj->deps[i]->nr_dependants--;
		obj->deps[i] = NULL;
	}
}

/*
 * The destructor (rs_client.c:811-851 clientFreeResource_IMPL: objDelete,
 * skipped for an object already invalidated): the object's resources go (a
 * channel leaves its TSG's runlist, memory goes back to the pool) and it
 * depends on nothing any more; it is marked invalidated (:840).
 */
static void nvstub_obj_destruct(struct nvstub_obj *obj)
{
	if (obj->invalidated)
		return;
	obj->invalidated = true;
	nvstub_obj_drop_deps(obj);
	if (obj->md)
		nvstub_memdesc_put(obj);
	if (obj->chan)
		nvstub_chan_destroy(obj);
	if (obj->tsg)
		nvstub_tsg_destroy(obj);
}

/* Destruct, detach and free one object whose children are already gone. */
static void nvstub_obj_destroy(struct nvstub_obj *obj)
{
	nvstub_obj_destruct(obj);
	list_del(&obj->sibling);
	xa_erase(&obj->client->objs, obj->handle);
	kfree(obj);
}

/* Tear a whole client down: no dependency is left to honour (nvstub_client_free()). */
static void nvstub_obj_free_tree(struct nvstub_obj *obj)
{
	struct nvstub_obj *child, *tmp;

	list_for_each_entry_safe(child, tmp, &obj->children, sibling)
		nvstub_obj_free_tree(child);
	if (obj == &obj->client->root)
		return;
	nvstub_obj_destroy(obj);
}

/* refHasAncestor (rs_resource.c): is @anc a strict ancestor of @obj? */
static bool nvstub_has_ancestor(struct nvstub_obj *obj, struct nvstub_obj *anc)
{
	for (obj = obj->parent; obj; obj = obj->parent)
		if (obj == anc)
			return true;
	return false;
}

/*
 * refAddDependant (rs_resource.c:699-716): @dep depends on @on, unless it is
 * a descendant of it already (:709). Both are objects of one client.
 */
static void nvstub_obj_add_dep(struct nvstub_obj *dep, struct nvstub_obj *on)
{
	unsigned int i;

	if (!on || on == &on->client->root || nvstub_has_ancestor(dep, on))
		return;
	for (i = 0; i < NVSTUB_MAX_DEPS; i++) {
		if (dep->deps[i] == on)
			return;
		if (!dep->deps[i]) {
			dep->deps[i] = on;
			on->nr_dependants++;
			return;
		}
	}
	WARN_ON_ONCE(1);
}

/*
 * clientUpdatePendingFreeList_IMPL (580.142 rs_server.c:930-992): @obj is
 * prepended (moved to the front if @move) to the pending list, then each of
 * its children, then each of its dependants, recursively, so that the list,
 * freed from its head, frees every object's children and dependants before
 * the object. The object being freed (@target, the only one on the free
 * stack here) is never moved (the circular-dependency guard, :944-952).
 */
static void nvstub_pending_update(struct nvstub_obj *obj, struct nvstub_obj *target, bool move,
				  struct list_head *pending)
{
	struct nvstub_obj *c;
	unsigned long h;
	unsigned int i;

	if (move) {
		if (obj == target)
			return;
		if (obj->on_pending)
			list_move(&obj->pending, pending);
		else
			list_add(&obj->pending, pending);
		obj->on_pending = true;
	} else if (!obj->on_pending) {
		list_add(&obj->pending, pending);
		obj->on_pending = true;
	}
	list_for_each_entry(c, &obj->children, sibling)
		nvstub_pending_update(c, target, true, pending);
	if (!obj->nr_dependants)
		return;
	xa_for_each(&obj->client->objs, h, c)
		for (i = 0; i < NVSTUB_MAX_DEPS; i++)
			if (c->deps[i] == obj) {
				nvstub_pending_update(c, target, true, pending);
				break;
			}
}

/*
 * RM_FREE of @obj: serverFreeResourceTree (580.142 rs_server.c:1173-1376).
 * The pending list (nvstub_pending_update()) is freed head first, @obj last
 * (:1351-1356). An entry that has @obj as an ancestor is freed outright
 * (handle gone); any other, a dependant of something freed that is not a
 * descendant of @obj, and the dependant's own children and dependants, are
 * only invalidated (:1338-1366 bInvalidateOnly; rs_client.c:855-870 skipped):
 * the destructor runs (nvstub_obj_destruct()), the handle stays in the
 * client, answers NV_ERR_RESOURCE_LOST to controls (rs_server.c:1556), dups
 * (:1703) and shares (:1815), and is refused to a new object
 * (NV_ERR_INSERT_DUPLICATE_NAME, rs_client.c:1463-1464), until the caller
 * frees it (the free succeeds and skips the destructor: rs_server.c:239-246,
 * rs_client.c:811) or the client goes. An invalidated TSG's destructor frees
 * no channel: kchangrpapiDestruct (kernel_channel_group_api.c:628-637) frees
 * the channels kchannelGetIter finds, and clientRefOrderedIterNext
 * (rs_client.c:1708) skips refs whose pResource is NULL; its channels, being
 * its children, were invalidated before it. RS_FREE_PRIORITY_HIGH
 * (client.c:521-568, the channel classes) does not change what the stand-in
 * does: no destructor here depends on another's order.
 */
static void nvstub_obj_free(struct nvstub_obj *obj)
{
	LIST_HEAD(pending);
	struct nvstub_obj *e;

	nvstub_pending_update(obj, obj, false, &pending);
	while (!list_empty(&pending)) {
		e = list_first_entry(&pending, struct nvstub_obj, pending);
		list_del(&e->pending);
		e->on_pending = false;
		if (e == obj || nvstub_has_ancestor(e, obj))
			nvstub_obj_destroy(e);
		else
			nvstub_obj_destruct(e);
		if (e == obj)
			break;
	}
	WARN_ON(!list_empty(&pending));
}

static void nvstub_client_free(struct nvstub_client *cl)
{
	struct nvstub_obj *o;
	unsigned long h;

	/* the whole client goes: its dependencies (all inside it) with it */
	xa_for_each(&cl->objs, h, o) {
		memset(o->deps, 0, sizeof(o->deps));
		o->nr_dependants = 0;
	}
	nvstub_obj_free_tree(&cl->root);
	xa_erase(&nvstub_clients, cl->root.handle);
	xa_destroy(&cl->objs);
	put_pid(cl->pid_info);		/* os-interface.c os_put_pid_info */
	kfree(cl);
}

void nvstub_file_free_clients(struct nvstub_file *nf)
{
	struct nvstub_client *cl;
	unsigned long idx;

	xa_for_each(&nvstub_clients, idx, cl)
		if (cl->owner == nf)
			nvstub_client_free(cl);
}

static u32 nvstub_client_alloc(struct nvstub_file *nf, u32 *handle)
{
	struct nvstub_client *cl;
	u32 h = *handle;
	int ret;

	if (h == 0) {
		do {
			h = NVSTUB_CLIENT_HANDLE_BASE | (nvstub_next_client++ & 0xfffff);
		} while (xa_load(&nvstub_clients, h));
	} else if (xa_load(&nvstub_clients, h)) {
		return NV_ERR_INSERT_DUPLICATE_NAME;
	}
	cl = kzalloc(sizeof(*cl), GFP_KERNEL);
	if (!cl)
		return NV_ERR_NO_MEMORY;
	cl->root.handle = h;
	cl->root.cls = NV01_ROOT_CLIENT;
	cl->root.client = cl;
	INIT_LIST_HEAD(&cl->root.children);
	INIT_LIST_HEAD(&cl->root.sibling);
	cl->owner = nvstub_owner(nf);
	/*
	 * client.c rmclientConstruct_IMPL: ProcID = osGetCurrentProcess()
	 * (current->tgid) and, for user clients, pOsPidInfo = osGetPidInfo()
	 * (os-interface.c os_get_pid_info: get_task_pid(current, PIDTYPE_TGID)).
	 */
	cl->pid = task_tgid_nr(current);
	cl->pid_info = get_task_pid(current, PIDTYPE_TGID);
	/* client.c rmclientConstruct_IMPL: cachedPrivilege (os_is_administrator: CAP_SYS_ADMIN) */
	cl->admin = capable(CAP_SYS_ADMIN);
	cl->next_handle = 1;
	xa_init(&cl->objs);
	ret = xa_insert(&cl->objs, h, &cl->root, GFP_KERNEL);
	if (ret)
		goto err_free;
	ret = xa_insert(&nvstub_clients, h, cl, GFP_KERNEL);
	if (ret)
		goto err_objs;
	*handle = h;
	return NV_OK;

err_objs:
	xa_erase(&cl->objs, h);
err_free:
	xa_destroy(&cl->objs);
	put_pid(cl->pid_info);
	kfree(cl);
	return NV_ERR_NO_MEMORY;
}

struct nvstub_gpu_match {
	unsigned int gpu;
};

/* nv.c nv_match_dev_state(): an open nvidiaN file of this driver. */
static int nvstub_match_gpu_file(const void *data, struct file *f, unsigned int fd)
{
	const struct nvstub_gpu_match *m = data;
	struct nvstub_file *nf;

	if (!f || f->f_op != &nvstub_fops || !f->private_data)
		return 0;
	nf = f->private_data;
	return !nvstub_is_ctl(nf) && nf->minor == m->gpu;
}

/* nv.c nv_is_gpu_accessible(): scan the caller's fd table. */
static bool nvstub_gpu_accessible(unsigned int gpu)
{
	struct nvstub_gpu_match m = { .gpu = gpu };

	return iterate_fd(current->files, 0, nvstub_match_gpu_file, &m) != 0;
}

/* A new memdesc for @obj, charged @charged bytes of its GPU's pool. */
static u32 nvstub_memdesc_new(struct nvstub_obj *obj, u64 charged, u64 page_size)
{
	struct nvstub_memdesc *md = kzalloc(sizeof(*md), GFP_KERNEL);
	u32 st;

	if (!md)
		return NV_ERR_NO_MEMORY;
	st = nvstub_mem_charge(obj->gpu, charged);
	if (st != NV_OK) {
		kfree(md);
		return st;
	}
	INIT_LIST_HEAD(&md->dups);
	md->dup_count = 1;		/* mem_desc.c memdescCreate: DupCount = 1 */
	md->gpu = obj->gpu;
	md->charged = charged;
	md->page_size = page_size;
	obj->md = md;
	obj->md_owner = true;		/* mem.c memConstructCommon: isMemDescOwner */
	list_add(&obj->dup_node, &md->dups);
	return NV_OK;
}

static u32 nvstub_attr_page_size(u32 attr)
{
	return (attr & NVOS32_ATTR_PAGE_SIZE_MASK) >> NVOS32_ATTR_PAGE_SIZE_SHIFT;
}

static u32 nvstub_attr2_page_size_huge(u32 attr2)
{
	return (attr2 & NVOS32_ATTR2_PAGE_SIZE_HUGE_MASK) >> NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT;
}

/*
 * The GPU page size RM picks for a user client's video memory on GH100, or 0
 * if there is none. src/nvidia/src/kernel/gpu/mem_mgr/mem_mgr.c
 * memmgrDeterminePageSize_IMPL with mem/mem.c dmaNvos32ToPageSizeAttr:
 *   DEFAULT: _memmgrPickDefaultGpuPageSize: huge pages are supported, so
 *            2 MiB if the requested size is >= RM_PAGE_SIZE_HUGE, otherwise
 *            the big page size (bClientAllocation)
 *   4KB: RM_PAGE_SIZE; BIG: kgmmuGetMaxBigPageSize_HAL, 64 KiB on GH100
 *            (g_kern_gmmu_nvoc.c defaultBigPageSize, no per-VA-space big pages)
 *   HUGE + attr2 DEFAULT/2MB: 2 MiB; + 512MB: 512 MiB (GH100 sets
 *            bPageSize512mbSupported); + 256GB: not on GH100 -> 0
 * On success the choice is written back into *attr / *attr2 as RM does.
 */
static u64 nvstub_vidmem_page_size(u64 size, u32 *attr, u32 *attr2)
{
	u32 psz, huge = NVOS32_ATTR2_PAGE_SIZE_HUGE_DEFAULT;
	u64 page;

	switch (nvstub_attr_page_size(*attr)) {
	case NVOS32_ATTR_PAGE_SIZE_DEFAULT:
		page = size >= SZ_2M ? SZ_2M : SZ_64K;
		break;
	case NVOS32_ATTR_PAGE_SIZE_4KB:
		page = SZ_4K;
		break;
	case NVOS32_ATTR_PAGE_SIZE_BIG:
		page = SZ_64K;
		break;
	default:	/* HUGE */
		switch (nvstub_attr2_page_size_huge(*attr2)) {
		case NVOS32_ATTR2_PAGE_SIZE_HUGE_DEFAULT:
		case NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB:
			page = SZ_2M;
			break;
		case NVOS32_ATTR2_PAGE_SIZE_HUGE_512MB:
			page = SZ_512M;
			break;
		default:
			return 0;
		}
	}
	switch (page) {
	case SZ_4K:
		psz = NVOS32_ATTR_PAGE_SIZE_4KB;
		break;
	case SZ_64K:
		psz = NVOS32_ATTR_PAGE_SIZE_BIG;
		break;
	case SZ_2M:
		psz = NVOS32_ATTR_PAGE_SIZE_HUGE;
		huge = NVOS32_ATTR2_PAGE_SIZE_HUGE_2MB;
		break;
	default:
		psz = NVOS32_ATTR_PAGE_SIZE_HUGE;
		huge = NVOS32_ATTR2_PAGE_SIZE_HUGE_512MB;
	}
	*attr = (*attr & ~NVOS32_ATTR_PAGE_SIZE_MASK) | (psz << NVOS32_ATTR_PAGE_SIZE_SHIFT);
	if (psz == NVOS32_ATTR_PAGE_SIZE_HUGE)
		*attr2 = (*attr2 & ~NVOS32_ATTR2_PAGE_SIZE_HUGE_MASK) |
			 (huge << NVOS32_ATTR2_PAGE_SIZE_HUGE_SHIFT);
	return page;
}

/*
 * Size and alignment for page size @page: gpu/mem_mgr/arch/maxwell/
 * mem_mgr_gm107.c memmgrAllocDetermineAlignment_GM107 (GH100 goes through
 * arch/ampere/mem_mgr_ga100.c, which only adds to it for compression). The
 * input alignment is params.alignment with ALIGNMENT_HINT/FORCE, else
 * RM_PAGE_SIZE (mem_utils.c memUtilsInitFBAllocInfo). A requested alignment
 * that is a multiple or a divisor of the page size is kept (at least the
 * page size); any other fails with ALIGNMENT_FORCE and becomes the page size
 * otherwise. The size is rounded to the page size only. *align is returned
 * as a size (align + 1, video_mem.c _vidmemQueryAlignment).
 */
static u32 nvstub_vidmem_align(u64 page, u32 flags, u64 *size, u64 *align)
{
	u64 hw = page - 1;
	u64 a = (flags & (NVOS32_ALLOC_FLAGS_ALIGNMENT_HINT |
			  NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE)) ? *align : SZ_4K;

	if (a && ((a > hw && !(a % (hw + 1))) || (a <= hw + 1 && !((hw + 1) % a)))) {
		if (a <= hw + 1)
			a = hw + 1;
	} else {
		if (a && (flags & NVOS32_ALLOC_FLAGS_ALIGNMENT_FORCE))
			return NV_ERR_INVALID_ARGUMENT;
		a = hw + 1;
	}
	*size = round_up(*size, page);
	*align = a;
	return NV_OK;
}

/*
 * NV01_MEMORY_LOCAL_USER on a GH100 (mem_mgr/video_mem.c vidmemConstruct_IMPL):
 * standard_mem.c stdmemValidateParams (internalflags, size, owner), the
 * location/virtual check, then _vidmemPmaAllocate: the page size (none:
 * NV_ERR_INVALID_STATE), the alignment, and the pool taken in PMA pages of
 * max(page size, 64 KiB) ("Minimum granularity of PMA is 64K"). The memdesc,
 * and so the size reported in params.size (limit = size - 1) and counted by
 * GET_PID_INFO, is the size rounded to the page size: a 4KB-page request
 * reports 4 KiB multiples but takes 64 KiB granules. PMA's alignment is
 * max(alignment, PMA page), refused unless a power of two (phys_mem_allocator.c
 * pmaAllocatePages, 580.95.05:708-714); FIXED_ADDRESS_ALLOCATE takes the range
 * padded to it at both ends, the size rounded up to it (video_mem.c
 * _vidmemPmaAllocate, 580.95.05:239-244; 535.288.01:261-266). The same rule
 * as the core's charge (kmod/core/quota.c gs_pma_size()). Not modelled:
 * compression (its page size comes from GSP; on 535 and 550 with the static
 * BAR1, 2 MiB pages), the fixed offset itself, NUMA, CC.
 */
static u32 nvstub_vidmem_alloc(struct nvstub_obj *obj, struct nv_memory_allocation_params *mp)
{
	u32 attr, attr2;
	u64 page, pma_page, pma_align, size, align, charged;
	u32 st;

	if (!mp)
		return NV_ERR_INVALID_ARGUMENT;
	if (mp->internalflags != 0 || mp->size == 0)
		return NV_ERR_INVALID_ARGUMENT;
	if (mp->owner == 0 || mp->owner == 0xffffffff ||
	    (mp->owner >= HEAP_OWNER_RM_SCRATCH_BEGIN && mp->owner <= HEAP_OWNER_RM_SCRATCH_END))
		return NV_ERR_INVALID_OWNER;
	if ((mp->attr & NVOS32_ATTR_LOCATION_MASK) >> NVOS32_ATTR_LOCATION_SHIFT !=
	    NVOS32_ATTR_LOCATION_VIDMEM || (mp->flags & NVOS32_ALLOC_FLAGS_VIRTUAL))
		return NV_ERR_INVALID_ARGUMENT;
	/* protected memory without confidential computing */
	if ((mp->attr2 & NVOS32_ATTR2_MEMORY_PROTECTION_MASK) >> NVOS32_ATTR2_MEMORY_PROTECTION_SHIFT ==
	    NVOS32_ATTR2_MEMORY_PROTECTION_PROTECTED)
		return NV_ERR_INVALID_ARGUMENT;
	attr = mp->attr;
	attr2 = mp->attr2;
	page = nvstub_vidmem_page_size(mp->size, &attr, &attr2);
	if (!page)
		return NV_ERR_INVALID_STATE;
	if (mp->size > U64_MAX - SZ_512M)
		return NV_ERR_NO_MEMORY;
	size = mp->size;
	align = mp->alignment;
	st = nvstub_vidmem_align(page, mp->flags, &size, &align);
	if (st != NV_OK)
		return st;
	pma_page = max_t(u64, page, SZ_64K);
	pma_align = max_t(u64, align, pma_page);
	if (!is_power_of_2(pma_align))
		return NV_ERR_INVALID_ARGUMENT;
	charged = size;
	if (mp->flags & NVOS32_ALLOC_FLAGS_FIXED_ADDRESS_ALLOCATE) {
		if (size > U64_MAX - (pma_align - 1))
			return NV_ERR_NO_MEMORY;
		charged = round_up(size, pma_align);
	}
	if (DIV_ROUND_UP_ULL(charged, pma_page) > U32_MAX)
		return NV_ERR_NO_MEMORY;
	charged = round_up(charged, pma_page);
	st = nvstub_memdesc_new(obj, charged, page);
	if (st != NV_OK)
		return st;
	mp->size = size;
	mp->limit = size - 1;
	mp->alignment = align;
	mp->attr = attr;
	mp->attr2 = attr2;
	obj->mem_size = size;
	obj->mem_vid = true;
	return NV_OK;
}

/*
 * NV_MEMORY_FABRIC, 580 mem_mgr/mem_fabric.c memoryfabricConstruct_IMPL: a
 * range of the fabric address space. Its page size is 2 MiB, 512 MiB or
 * 256 GiB, alignment and size multiples of it; a flexible range names no
 * memory (NV_ERR_NOT_SUPPORTED if it does); any other maps map.hVidMem, video
 * memory of the calling client on the same GPU (_memoryfabricValidatePhysMem:
 * memGetByHandle() in the call's client, NV_ERR_INVALID_ARGUMENT for memory of
 * another GPU), and holds its memdesc until the range is freed, as a
 * duplicate does (fabric memdesc's destroy callback drops the reference).
 */
static u32 nvstub_fabric_setup(struct nvstub_obj *obj, const struct nv00f8_alloc_params *fp)
{
	struct nvstub_obj *vid;

	if (!fp)
		return NV_ERR_INVALID_ARGUMENT;
	if (fp->page_size != SZ_2M && fp->page_size != SZ_512M && fp->page_size != 256ull * SZ_1G)
		return NV_ERR_INVALID_ARGUMENT;
	if (!IS_ALIGNED(fp->alignment, fp->page_size) || !IS_ALIGNED(fp->alloc_size, fp->page_size))
		return NV_ERR_INVALID_ARGUMENT;
	if (fp->alloc_flags & NV00F8_ALLOC_FLAGS_FLEXIBLE_FLA)
		return fp->map_h_vid_mem ? NV_ERR_NOT_SUPPORTED : NV_OK;
	vid = nvstub_obj_get(obj->client, fp->map_h_vid_mem);
	if (!vid)
		return NV_ERR_OBJECT_NOT_FOUND;
	if (!vid->md || !vid->mem_vid || vid->gpu != obj->gpu)
		return NV_ERR_INVALID_ARGUMENT;
	obj->md = vid->md;
	obj->md->dup_count++;
	obj->md_owner = false;
	list_add(&obj->dup_node, &vid->dup_node);
	return NV_OK;
}

/*
 * @obj keeps @src's memory (an RM duplicate in RM's own client): the pages
 * stay in the pool until @obj goes too, however many of the caller's handles
 * of them are freed. Nothing to keep for memory the pool does not back.
 */
static void nvstub_hold_memory(struct nvstub_obj *obj, struct nvstub_obj *src)
{
	if (!src->md)
		return;
	obj->md = src->md;
	obj->md->dup_count++;
	obj->md_owner = false;
	list_add(&obj->dup_node, &src->dup_node);
}

/*
 * NV_SEMAPHORE_SURFACE, 580 gpu/mem_mgr/sem_surf.c: _semsurfDupMemory
 * duplicates hSemaphoreMem (and hMaxSubmittedMem) into RM's internal client,
 * so the memory outlives the caller's handles until the surface goes. A
 * second, different memory is for 32-bit semaphores only; the H100's are
 * 64-bit (NV_ERR_INVALID_PARAMETER).
 */
static u32 nvstub_semsurf_setup(struct nvstub_obj *obj, const u32 *sp)
{
	struct nvstub_obj *mem;

	if (!sp)
		return NV_ERR_INVALID_ARGUMENT;
	mem = nvstub_obj_get(obj->client, sp[0]);
	if (!mem || !mem->mem_size)
		return NV_ERR_INVALID_OBJECT_HANDLE;
	if (sp[1] && sp[1] != sp[0])
		return NV_ERR_INVALID_PARAMETER;
	nvstub_hold_memory(obj, mem);
	return NV_OK;
}

/*
 * NV_MEMORY_MAPPER, 580 gpu/mem_mgr/mem_mapper.c: maxQueueSize must not be 0;
 * the mapper duplicates its semaphore surface (and so keeps its memory).
 */
static u32 nvstub_mapper_setup(struct nvstub_obj *obj, const u32 *mp)
{
	struct nvstub_obj *surf;

	if (!mp || !mp[1])
		return NV_ERR_INVALID_ARGUMENT;
	surf = nvstub_obj_get(obj->client, mp[0]);
	if (!surf || surf->cls != NV_SEMAPHORE_SURFACE)
		return NV_ERR_INVALID_OBJECT_HANDLE;
	nvstub_hold_memory(obj, surf);
	return NV_OK;
}

/* nvstub_esc_alloc_memory(): NV01_MEMORY_LOCAL_PHYSICAL of the whole FB */
static struct nv_memory_allocation_params nvstub_whole_fb;

/* Per-class checks and side effects of an allocation. */
static u32 nvstub_obj_setup(struct nvstub_obj *obj, void *params)
{
	struct nv_memory_allocation_params *mp = params;
	u64 size;
	u32 st;

	switch (obj->cls) {
	case NV01_DEVICE_0: {
		struct nv0080_alloc_params *dp = params;
		u32 id = dp ? dp->device_id : 0;

		if (id >= nvstub_num_gpus)
			return NV_ERR_INVALID_CLASS;
		obj->gpu = id;
		/* src/nvidia/src/kernel/gpu/device.c deviceConstruct_IMPL */
		if (!nvstub_gpu_accessible(id))
			return NV_ERR_INSUFFICIENT_PERMISSIONS;
		return NV_OK;
	}
	case NV20_SUBDEVICE_0: {
		struct nv2080_alloc_params *sp = params;

		if (sp && sp->sub_device_id != 0)
			return NV_ERR_INVALID_CLASS;
		return NV_OK;
	}
	case NV01_MEMORY_SYSTEM:
		if (!mp || mp->size == 0)
			return NV_ERR_INVALID_ARGUMENT;
		mp->size = PAGE_ALIGN(mp->size);
		obj->mem_size = mp->size;
		return NV_OK;
	case NV01_MEMORY_LOCAL_USER:
		return nvstub_vidmem_alloc(obj, mp);
	case NV01_MEMORY_LOCAL_PHYSICAL:
		if (params == &nvstub_whole_fb) {
			/* RM_ALLOC_MEMORY's administrator answer: the whole FB, nothing taken */
			obj->mem_size = nvstub_mem_total();
			obj->mem_vid = true;
			return NV_OK;
		}
		if (!mp || mp->size == 0)
			return NV_ERR_INVALID_ARGUMENT;
		if (mp->size > U64_MAX - NVSTUB_PHYS_GRANULE)
			return NV_ERR_NO_MEMORY;
		size = round_up(mp->size, NVSTUB_PHYS_GRANULE);
		st = nvstub_memdesc_new(obj, size, NVSTUB_PHYS_GRANULE);
		if (st != NV_OK)
			return st;
		mp->size = size;
		obj->mem_size = size;
		obj->mem_vid = true;
		return NV_OK;
	case NV_MEMORY_FABRIC:
		return nvstub_fabric_setup(obj, params);
	case NV_SEMAPHORE_SURFACE:
		return nvstub_semsurf_setup(obj, params);
	case NV_MEMORY_MAPPER:
		return nvstub_mapper_setup(obj, params);
	case KEPLER_CHANNEL_GROUP_A:
		return nvstub_tsg_create(obj) ? NV_ERR_NO_MEMORY : NV_OK;
	case HOPPER_CHANNEL_GPFIFO_A:
	case AMPERE_CHANNEL_GPFIFO_A:
		/*
		 * kernel_channel.c kchannelConstruct_IMPL: a channel allocated
		 * under a Device gets a TSG of its own that RM allocates
		 * (bAllocatedByRm); here the channel object carries it.
		 */
		if (obj->parent->cls == NV01_DEVICE_0) {
			if (nvstub_tsg_create(obj))
				return NV_ERR_NO_MEMORY;
			return nvstub_chan_create(obj, obj, params) ? NV_ERR_NO_MEMORY : NV_OK;
		}
		return nvstub_chan_create(obj, obj->parent, params) ? NV_ERR_NO_MEMORY : NV_OK;
	case NV01_MEMORY_VIRTUAL: {
		/*
		 * NV01_MEMORY_SYSTEM_DYNAMIC with hVASpace SYSMEM_DYNAMIC
		 * (virt_mem_range.c / virtual_mem.c): no memory; limit is
		 * written back (0 here: nothing mapped)
		 */
		struct nvstub_memory_virtual_params *vp = params;

		if (!vp)
			return NV_ERR_INVALID_ARGUMENT;
		vp->limit = 0;
		return NV_OK;
	}
	case NV01_MEMORY_LOCAL_PRIVILEGED:
		/* mem_mgr/reg_mem.c regmemConstruct_IMPL: a descriptor of BAR0 */
		obj->mem_size = NVSTUB_BAR0_SIZE;
		return NV_OK;
	default:
		return NV_OK;
	}
}

/*
 * A duplicate of @src (RM_DUP_OBJECT). Memory: mem.c memCopyConstruct_IMPL:
 * both parents must be devices or both subdevices; the duplicate shares the
 * memdesc (DupCount + 1, isMemDescOwner false, inserted after the source on
 * the dup list) and its Length. Other classes are set up as if allocated
 * without params.
 */
static u32 nvstub_obj_copy(struct nvstub_obj *obj, struct nvstub_obj *src)
{
	if (!src->md && !src->mem_size)
		return nvstub_obj_setup(obj, NULL);
	if ((src->parent->cls == NV20_SUBDEVICE_0) != (obj->parent->cls == NV20_SUBDEVICE_0))
		return NV_ERR_INVALID_OBJECT_PARENT;
	obj->mem_size = src->mem_size;
	obj->mem_vid = src->mem_vid;
	if (src->md) {
		obj->md = src->md;
		obj->md->dup_count++;
		obj->md_owner = false;
		list_add(&obj->dup_node, &src->dup_node);
	}
	return NV_OK;
}

/* The release's branch (its ABI row's, "580"), 0 if unknown. */
static unsigned int nvstub_branch(void)
{
	unsigned int b;

	return kstrtouint(nvstub_abi->branch, 10, &b) ? 0 : b;
}

/* The object @h of @obj's client, if any and not the client itself. */
static struct nvstub_obj *nvstub_dep_target(struct nvstub_obj *obj, u32 h)
{
	struct nvstub_obj *t = h ? nvstub_obj_get(obj->client, h) : NULL;

	return t == &obj->client->root ? NULL : t;
}

/*
 * The dependencies a new object records (580.142 refAddDependant callers;
 * research in gpuslice's docs): whatever handle names an object of the
 * caller's client, the object depends on it, so that freeing it invalidates
 * this one (nvstub_obj_free()):
 *  - KEPLER_CHANNEL_GROUP_A on NV_CHANNEL_GROUP_ALLOCATION_PARAMETERS.hVASpace
 *    (kernel_channel_group_api.c:281-288; 535.288.01 :286);
 *  - FERMI_CONTEXT_SHARE_A on NV_CTXSHARE_ALLOCATION_PARAMETERS.hVASpace
 *    (kernel_ctxshare.c:151-159; 0: the device's default VA space, none);
 *  - a channel on NV_CHANNEL_ALLOC_PARAMS.hVASpace (kernel_channel.c:988-1001,
 *    a channel under a device: RM refuses it under a TSG, :423-430) and on
 *    hContextShare (:1008-1014); on hUserdMemory[0] if that memory is an OS
 *    descriptor (arch/volta/kernel_channel_gv100.c:246-254), from 570 on
 *    (570.195.03 has it, 550.163.01 and 535.288.01 do not);
 *  - NV_MEMORY_MAPPER on NV_MEMORY_MAPPER_ALLOCATION_PARAMS.hNotificationMemory
 *    (mem_mapper.c:386-391), where the release's parameters have it (570 on:
 *    535's are one byte, 550's end before it).
 * Not modelled, as RM-internal objects the caller never names: the channel's
 * RM-made TSG (:980-985; here the channel carries it, and it goes with the
 * channel's destructor as kchannelDestruct frees it, :1252-1257), the TSG's
 * legacy context shares and KERNEL_GRAPHICS_CONTEXT (:1016-1026). Nor the
 * lookups' failures for a handle that names nothing (the stand-in then
 * records nothing), nor the classes no core decision rests on (virtual
 * memory, context DMA, P2P).
 */
static void nvstub_obj_record_deps(struct nvstub_obj *obj, const void *params)
{
	const struct nv_channel_alloc_params_head *cp = params;
	const u32 *w = params;
	struct nvstub_obj *t;

	if (!params)
		return;
	switch (obj->cls) {
	case KEPLER_CHANNEL_GROUP_A:
		nvstub_obj_add_dep(obj, nvstub_dep_target(obj, w[2]));	/* hVASpace @8 */
		break;
	case FERMI_CONTEXT_SHARE_A:
		nvstub_obj_add_dep(obj, nvstub_dep_target(obj, w[0]));	/* hVASpace @0 */
		break;
	case HOPPER_CHANNEL_GPFIFO_A:
	case AMPERE_CHANNEL_GPFIFO_A:
		if (obj->parent->cls == NV01_DEVICE_0)
			nvstub_obj_add_dep(obj, nvstub_dep_target(obj, cp->h_va_space));
		nvstub_obj_add_dep(obj, nvstub_dep_target(obj, cp->h_context_share));
		t = nvstub_dep_target(obj, cp->h_userd_memory[0]);
		if (t && t->cls == NV01_MEMORY_SYSTEM_OS_DESCRIPTOR && nvstub_branch() >= 570)
			nvstub_obj_add_dep(obj, t);
		break;
	case NV_MEMORY_MAPPER:
		if (nvstub_abi->memory_mapper_alloc_size >= 3 * sizeof(u32))
			nvstub_obj_add_dep(obj, nvstub_dep_target(obj, w[2]));	/* @8 */
		break;
	}
}

/*
 * Create object @h of class @ci under @parent. Returns an NV status; on
 * NV_OK *out is the new object, linked into the tree.
 */
static u32 nvstub_obj_create(struct nvstub_client *cl, struct nvstub_obj *parent,
			     u32 *handle, const struct nvstub_class_info *ci,
			     void *params, struct nvstub_obj *src, struct nvstub_obj **out)
{
	struct nvstub_obj *obj;
	u32 h = *handle;
	u32 st;

	if (!nvstub_parent_ok(ci, parent->cls))
		return NV_ERR_INVALID_OBJECT_PARENT;
	if (ci->alloc_status != NV_OK)
		return ci->alloc_status;
	/*
	 * Under an invalidated parent the constructors' ancestor lookups fail
	 * (rs_resource.c:500 refFindAncestorOfType: NV_ERR_OBJECT_NOT_FOUND);
	 * the stand-in answers that for every class.
	 */
	if (parent->invalidated)
		return NV_ERR_OBJECT_NOT_FOUND;
	if (h == 0) {
		do {
			h = NVSTUB_OBJECT_HANDLE_BASE | (cl->next_handle++ & 0xfffff);
		} while (xa_load(&cl->objs, h));
	} else if (xa_load(&cl->objs, h)) {
		return NV_ERR_INSERT_DUPLICATE_NAME;
	}
	obj = kzalloc(sizeof(*obj), GFP_KERNEL);
	if (!obj)
		return NV_ERR_NO_MEMORY;
	obj->handle = h;
	obj->cls = ci->cls;
	obj->client = cl;
	obj->parent = parent;
	obj->gpu = parent->gpu;
	INIT_LIST_HEAD(&obj->children);
	INIT_LIST_HEAD(&obj->sibling);
	INIT_LIST_HEAD(&obj->dup_node);
	if (xa_insert(&cl->objs, h, obj, GFP_KERNEL)) {
		kfree(obj);
		return NV_ERR_NO_MEMORY;
	}
	list_add_tail(&obj->sibling, &parent->children);
	st = src ? nvstub_obj_copy(obj, src) : nvstub_obj_setup(obj, params);
	if (st != NV_OK) {
		nvstub_obj_destroy(obj);
		return st;
	}
	if (!src)
		nvstub_obj_record_deps(obj, params);
	*handle = h;
	*out = obj;
	return NV_OK;
}

/*
 * NV_ESC_RM_ALLOC (escape.c RmIoctl, rs_server.c serverAllocResource).
 * Called without nvstub_lock. As RM does, the params block is read once,
 * sized by the class (alloc_free.c serverAllocApiCopyIn, from the class
 * table, not from the caller's paramsSize), before any lock is taken and
 * before the client is looked at; a fault there is NV_ERR_INVALID_ADDRESS
 * (os-interface.c os_memcpy_from_user). It is written back only if the
 * allocation succeeded (serverAllocApiCopyOut, after the locks).
 */
/*
 * The bytes of a class's parameters the release's RM copies: the memory
 * classes' NV_MEMORY_ALLOCATION_PARAMS ends before numaNode on 535 (nvos.h);
 * the rest are the same on every supported release.
 */
static u32 nvstub_class_params_size(const struct nvstub_class_info *ci)
{
	switch (ci->cls) {
	case NV01_MEMORY_SYSTEM:
	case NV01_MEMORY_LOCAL_USER:
	case NV01_MEMORY_LOCAL_PHYSICAL:
		return nvstub_abi->memory_alloc_size;
	}
	return ci->params_size;
}

int nvstub_esc_alloc(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvos64_params *p = arg;
	const struct nvstub_class_info *ci;
	struct nvstub_client *cl;
	struct nvstub_obj *parent, *obj;
	void __user *uparams;
	void *params = NULL;
	u32 h, st, usize;

	if (size != sizeof(struct nvos64_params))
		return -EINVAL;
	if (p->h_class == NV01_ROOT || p->h_class == NV01_ROOT_NON_PRIV ||
	    p->h_class == NV01_ROOT_CLIENT) {
		if (!nvstub_is_ctl(nf))
			return -EINVAL;
		h = p->h_object_new;
		mutex_lock(&nvstub_lock);
		p->status = nvstub_client_alloc(nf, &h);
		mutex_unlock(&nvstub_lock);
		if (p->status == NV_OK)
			p->h_object_new = h;
		return 0;
	}
	if (p->h_class != NV01_EVENT_OS_EVENT && !nvstub_is_ctl(nf))
		return -EINVAL;
	/* param_copy.c rmapiParamsCopyInit -> rmapiGetClassAllocParamSize */
	ci = nvstub_class_find(p->h_class);
	if (!ci) {
		p->status = NV_ERR_INVALID_CLASS;
		return 0;
	}
	uparams = u64_to_user_ptr(p->p_alloc_parms);
	usize = nvstub_class_params_size(ci);
	if (ci->params_size && uparams) {
		params = kzalloc(ci->params_size, GFP_KERNEL);
		if (!params) {
			p->status = NV_ERR_INSUFFICIENT_RESOURCES;
			return 0;
		}
		nvstub_race_delay();	/* TEST ONLY, see nvstub_main.c */
		if (copy_from_user(params, uparams, usize)) {
			kfree(params);
			p->status = NV_ERR_INVALID_ADDRESS;
			return 0;
		}
	}
	mutex_lock(&nvstub_lock);
	cl = nvstub_client_validate(nf, p->h_root, &st);
	if (!cl)
		goto unlock;
	parent = nvstub_obj_get(cl, p->h_object_parent);
	if (!parent) {
		st = NV_ERR_INVALID_OBJECT_PARENT;
		goto unlock;
	}
	h = p->h_object_new;
	st = nvstub_obj_create(cl, parent, &h, ci, params, NULL, &obj);
	if (st == NV_OK)
		p->h_object_new = h;
unlock:
	mutex_unlock(&nvstub_lock);
	if (st == NV_OK && params && copy_to_user(uparams, params, usize))
		st = NV_ERR_INVALID_ADDRESS;
	p->status = st;
	kfree(params);
	return 0;
}

/* NV_ESC_RM_FREE: rs_server.c serverFreeResourceTree (compat mode: a
 * handle that does not exist in a valid client frees nothing, NV_OK).
 */
int nvstub_esc_free(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvos00_params *p = arg;
	struct nvstub_client *cl;
	struct nvstub_obj *obj;

	if (size != sizeof(*p) || !nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, p->h_root, &p->status);
	if (!cl)
		return 0;
	if (p->h_object_old == p->h_root) {
		nvstub_client_free(cl);
		nvstub_client_free_os_events(p->h_root);	/* escape.c */
		return 0;
	}
	obj = nvstub_obj_get(cl, p->h_object_old);
	if (obj)
		nvstub_obj_free(obj);
	return 0;
}

/*
 * May cl duplicate src (of src_cl)? The default policy lets clients of the
 * same process (RS_SHARE_TYPE_PID, client_resource.c); an RM_SHARE policy on
 * the object adds RS_SHARE_TYPE_ALL (any client) or RS_SHARE_TYPE_CLIENT
 * (its target), as resShareCallback_IMPL (resserv/src/rs_resource.c) does.
 * Not modelled: OS_SECURITY_TOKEN, SMC_PARTITION, GPU, composed lists.
 */
static bool nvstub_share_allows(struct nvstub_client *src_cl, struct nvstub_obj *src,
				struct nvstub_client *cl)
{
	if (src_cl->pid == cl->pid)
		return true;
	switch (src->share_type) {
	case RS_SHARE_TYPE_ALL:
		return true;
	case RS_SHARE_TYPE_CLIENT:
		return src->share_target == cl->root.handle;
	}
	return false;
}

/*
 * May nvidia-uvm duplicate @src into its kernel client for the calling
 * process? nvGpuOpsDupMemory passes NV04_DUP_HANDLE_FLAGS_REJECT_KERNEL_DUP_PRIVILEGE,
 * so rs_client.c clientCopyResource_IMPL checks RS_ACCESS_DUP_OBJECT like
 * for a user client (rs_access_map.c rsAccessCheckRights). The default
 * policy, RS_SHARE_TYPE_PID (sharing.c serverInitGlobalSharePolicies), with
 * a kernel destination compares the source client's ProcID with the calling
 * process (client_resource.c cliresShareCallback_IMPL), not with UVM's
 * client; an RM_SHARE policy RS_SHARE_TYPE_ALL lets anyone. A
 * RS_SHARE_TYPE_CLIENT policy names a client handle, never UVM's.
 */
static bool nvstub_share_allows_uvm(struct nvstub_client *src_cl, struct nvstub_obj *src)
{
	return src_cl->pid == task_tgid_nr(current) || src->share_type == RS_SHARE_TYPE_ALL;
}

/* Is @cls a Memory in RM (dynamicCast(pResource, Memory) succeeds)? */
static bool nvstub_is_memory(u32 cls)
{
	switch (cls) {
	case NV01_MEMORY_SYSTEM:
	case NV01_MEMORY_LOCAL_USER:
	case NV01_MEMORY_LOCAL_PHYSICAL:
	case NV01_MEMORY_SYSTEM_OS_DESCRIPTOR:
	case NV50_MEMORY_VIRTUAL:
	case NV_MEMORY_FABRIC:
	case HOPPER_USERMODE_A:
	case RM_USER_SHARED_DATA:
		return true;
	}
	return false;
}

/*
 * nvUvmInterfaceDupMemory for nvidia-uvm (580 src/nvidia/src/kernel/rmapi/
 * nv_gpu_ops.c dupMemory), in its order:
 *  - nvGpuOpsGetMemoryByHandle: the client must exist, in any file of any
 *    process (rs_server.c _serverFindClient: NV_ERR_INVALID_OBJECT_HANDLE);
 *    the handle must name an object of it (rs_client.c clientGetResourceRef:
 *    NV_ERR_OBJECT_NOT_FOUND) that is a Memory (mem.c memGetByHandle_IMPL:
 *    NV_ERR_INVALID_OBJECT_HANDLE);
 *  - its address space must be FBMEM, SYSMEM or fabric (NV_ERR_NOT_SUPPORTED):
 *    video memory (0x40, 0xc2) and system memory (0x3e, 0x71) pass; virtual
 *    memory (0x50a0) and USERMODE (0xc661, register space) are refused as RM
 *    refuses them; fabric memory (0xf8) and RM_USER_SHARED_DATA (0xde) are
 *    not modelled and refused the same way;
 *  - DupObject into UVM's client: nvstub_share_allows_uvm() or
 *    NV_ERR_INSUFFICIENT_PERMISSIONS.
 * On NV_OK the memdesc (video memory) is held for UVM until
 * nvstub_rm_uvm_free_dup(); @info describes the memory as
 * nvGpuOpsFillGpuMemoryInfo does: size (memdescGetSize, the Length), GPU
 * page size (system memory: 4 KiB), owning GPU, sysmem.
 */
u32 nvstub_rm_uvm_dup_memory(u32 h_client, u32 h_memory, struct nvstub_uvm_mem_info *info)
{
	struct nvstub_client *cl;
	struct nvstub_obj *obj;
	u32 st = NV_OK;

	mutex_lock(&nvstub_lock);
	cl = nvstub_client_get(h_client);
	if (!cl) {
		st = NV_ERR_INVALID_OBJECT_HANDLE;
		goto out;
	}
	obj = nvstub_obj_get(cl, h_memory);
	if (!obj) {
		st = NV_ERR_OBJECT_NOT_FOUND;
		goto out;
	}
	if (!nvstub_is_memory(obj->cls)) {
		st = NV_ERR_INVALID_OBJECT_HANDLE;
		goto out;
	}
	switch (obj->cls) {
	case NV01_MEMORY_LOCAL_USER:
	case NV01_MEMORY_LOCAL_PHYSICAL:
		info->sysmem = false;
		info->page_size = obj->md->page_size;
		break;
	case NV01_MEMORY_SYSTEM:
	case NV01_MEMORY_SYSTEM_OS_DESCRIPTOR:
		info->sysmem = true;
		info->page_size = SZ_4K;
		break;
	default:
		st = NV_ERR_NOT_SUPPORTED;
		goto out;
	}
	if (!nvstub_share_allows_uvm(cl, obj)) {
		st = NV_ERR_INSUFFICIENT_PERMISSIONS;
		goto out;
	}
	info->md = obj->md;
	if (info->md)
		nvstub_memdesc_hold(info->md);
	info->gpu = obj->gpu;
	info->size = obj->mem_size;
out:
	mutex_unlock(&nvstub_lock);
	return st;
}

/* nvUvmInterfaceFreeDupedHandle: UVM lets its duplicate go. */
void nvstub_rm_uvm_free_dup(struct nvstub_memdesc *md)
{
	if (!md)
		return;
	mutex_lock(&nvstub_lock);
	nvstub_memdesc_release(md);
	mutex_unlock(&nvstub_lock);
}

/*
 * NV_ESC_RM_SHARE (NVOS57, rmapiShare -> serverShareResourceAccess): a share
 * policy on an object of the caller's client, consulted when another client
 * duplicates it; REVOKE takes it back. Modelled: the last policy granted.
 */
int nvstub_esc_share(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvos57_params *p = arg;
	struct nvstub_client *cl;
	struct nvstub_obj *obj;

	if (size != sizeof(*p) || !nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, p->h_client, &p->status);
	if (!cl)
		return 0;
	obj = nvstub_obj_get(cl, p->h_object);
	if (!obj || obj == &cl->root) {
		p->status = NV_ERR_INVALID_OBJECT_HANDLE;
		return 0;
	}
	if (obj->invalidated) {		/* rs_server.c:1815-1818 serverShareResourceAccess */
		p->status = NV_ERR_RESOURCE_LOST;
		return 0;
	}
	if (p->share_type >= RS_SHARE_TYPE_MAX) {
		p->status = NV_ERR_INVALID_ARGUMENT;
		return 0;
	}
	if (p->share_action & RS_SHARE_ACTION_FLAG_REVOKE) {
		obj->share_type = 0;
	} else {
		obj->share_type = p->share_type;
		obj->share_target = p->share_target;
	}
	p->status = NV_OK;
	return 0;
}

/* NV_ESC_RM_DUP_OBJECT (NVOS55). The duplicate is a new object of the same
 * class; memory is shared (nvstub_obj_copy) and stays in the pool until the
 * last duplicate goes.
 */
int nvstub_esc_dup(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvos55_params *p = arg;
	const struct nvstub_class_info *ci;
	struct nvstub_client *cl, *src_cl;
	struct nvstub_obj *parent, *src, *obj;
	u32 h;

	if (size != sizeof(*p) || !nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, p->h_client, &p->status);
	if (!cl)
		return 0;
	src_cl = nvstub_client_get(p->h_client_src);
	if (!src_cl) {
		p->status = NV_ERR_INVALID_CLIENT;
		return 0;
	}
	src = nvstub_obj_get(src_cl, p->h_object_src);
	parent = nvstub_obj_get(cl, p->h_parent);
	if (!src || src == &src_cl->root) {
		p->status = NV_ERR_INVALID_OBJECT_HANDLE;
		return 0;
	}
	/* rs_server.c:1703-1706 serverCopyResource, before the parent's lookup */
	if (src->invalidated) {
		p->status = NV_ERR_RESOURCE_LOST;
		return 0;
	}
	if (!parent) {
		p->status = NV_ERR_INVALID_OBJECT_PARENT;
		return 0;
	}
	if (!nvstub_share_allows(src_cl, src, cl)) {
		p->status = NV_ERR_INSUFFICIENT_PERMISSIONS;
		return 0;
	}
	ci = nvstub_class_find(src->cls);
	if (!ci || src->tsg || src->chan || src->cls == NV01_DEVICE_0) {
		p->status = NV_ERR_NOT_SUPPORTED;
		return 0;
	}
	h = p->h_object;
	p->status = nvstub_obj_create(cl, parent, &h, ci, NULL, src, &obj);
	if (p->status == NV_OK)
		p->h_object = h;
	return 0;
}

/*
 * A duplicate of @src under @parent of @cl, as RM_DUP_OBJECT makes one once
 * its checks passed (RM's internal DupObject, used by the fd export/import
 * of nvstub_export.c).
 */
u32 nvstub_rm_dup(struct nvstub_client *cl, struct nvstub_obj *parent, u32 *h,
		  struct nvstub_obj *src)
{
	const struct nvstub_class_info *ci = nvstub_class_find(src->cls);
	struct nvstub_obj *obj;

	if (src->invalidated)		/* rs_server.c:1703-1706 */
		return NV_ERR_RESOURCE_LOST;
	if (!ci || src->tsg || src->chan || src->cls == NV01_DEVICE_0)
		return NV_ERR_NOT_SUPPORTED;
	return nvstub_obj_create(cl, parent, h, ci, NULL, src, &obj);
}

void nvstub_rm_free_obj(struct nvstub_obj *obj)
{
	nvstub_obj_free(obj);
}

/*
 * A kernel client (RM's own, no file's, no process's: GET_PIDS skips pid 0),
 * such as the export client of nvstub_export.c.
 */
struct nvstub_client *nvstub_rm_kernel_client(struct nvstub_file *nf, u32 h)
{
	struct nvstub_client *cl;

	if (nvstub_client_alloc(nf, &h) != NV_OK)
		return NULL;
	cl = nvstub_client_get(h);
	cl->owner = NULL;
	cl->pid = 0;
	put_pid(cl->pid_info);
	cl->pid_info = NULL;
	return cl;
}

void nvstub_rm_kernel_client_free(struct nvstub_client *cl)
{
	nvstub_client_free(cl);
}

/* A device or subdevice of a kernel client, made without a caller's checks. */
struct nvstub_obj *nvstub_rm_kernel_obj(struct nvstub_client *cl, struct nvstub_obj *parent,
					u32 cls, unsigned int gpu)
{
	struct nvstub_obj *obj = kzalloc(sizeof(*obj), GFP_KERNEL);
	u32 h;

	if (!obj)
		return NULL;
	do {
		h = NVSTUB_OBJECT_HANDLE_BASE | (cl->next_handle++ & 0xfffff);
	} while (xa_load(&cl->objs, h));
	obj->handle = h;
	obj->cls = cls;
	obj->client = cl;
	obj->parent = parent;
	obj->gpu = gpu;
	INIT_LIST_HEAD(&obj->children);
	INIT_LIST_HEAD(&obj->sibling);
	INIT_LIST_HEAD(&obj->dup_node);
	if (xa_insert(&cl->objs, h, obj, GFP_KERNEL)) {
		kfree(obj);
		return NULL;
	}
	list_add_tail(&obj->sibling, &parent->children);
	return obj;
}

/*
 * RmAlloc and RmFree as RM's deprecated wrappers call them
 * (interface/deprecated/: pContext->RmAlloc, pContext->RmFree), from a
 * kernel copy of the parameters, under nvstub_lock. *h 0: RM makes the handle.
 */
u32 nvstub_rm_alloc_locked(struct nvstub_client *cl, u32 h_parent, u32 *h, u32 cls, void *params)
{
	const struct nvstub_class_info *ci = nvstub_class_find(cls);
	struct nvstub_obj *parent, *obj;

	if (!ci)
		return NV_ERR_INVALID_CLASS;
	parent = nvstub_obj_get(cl, h_parent);
	if (!parent)
		return NV_ERR_INVALID_OBJECT_PARENT;
	return nvstub_obj_create(cl, parent, h, ci, params, NULL, &obj);
}

/* rs_server.c serverFreeResourceTree, as nvstub_esc_free() (a missing handle: NV_OK) */
u32 nvstub_rm_free_locked(struct nvstub_client *cl, u32 h)
{
	struct nvstub_obj *obj;

	if (h == cl->root.handle) {
		nvstub_client_free(cl);
		nvstub_client_free_os_events(h);	/* escape.c */
		return NV_OK;
	}
	obj = nvstub_obj_get(cl, h);
	if (obj)
		nvstub_obj_free(obj);
	return NV_OK;
}

/* NVOS02 flags (nvos.h): LOCATION 11:8 (PCI 0), ALLOC 17:16 (NONE 1) */
#define NVSTUB_OS02_LOCATION(f)		(((f) >> 8) & 0xf)
#define NVSTUB_OS02_ALLOC(f)		(((f) >> 16) & 0x3)
#define NVSTUB_OS02_ALLOC_NONE		1

/*
 * The heap size RM reports to a client that may not see the whole FB
 * (rmapi_deprecated_allocmemory.c _rmAllocGetHeapSize: FB_GET_INFO_V2
 * TOTAL_RAM_SIZE, in KiB, << 10).
 */
static u64 nvstub_heap_size(void)
{
	return (nvstub_mem_total() >> 10) << 10;
}

/*
 * NV_ESC_RM_ALLOC_MEMORY (NVOS02 + fd) on an nvidiaN file (escape.c), as
 * interface/deprecated/rmapi_deprecated_allocmemory.c RmDeprecatedAllocMemory
 * turns each class into an RmAlloc (no mapping is created here):
 *  - NV01_MEMORY_SYSTEM (_rmAllocMemorySystem): LOCATION must be PCI and
 *    ALLOC not NONE (NV_ERR_INVALID_FLAGS); limit + 1 bytes;
 *  - NV01_MEMORY_SYSTEM_DYNAMIC (_rmAllocMemorySystemDynamic): an RmAlloc
 *    of the class with hVASpace SYSMEM_DYNAMIC; limit is what it returns;
 *  - NV01_MEMORY_LOCAL_USER (_rmAllocMemoryLocalUser): NV01_MEMORY_LOCAL_PHYSICAL
 *    of the whole FB for an administrator (limit = memSize - 1; not taken
 *    from the pool: it describes the FB, it does not allocate it); for
 *    anyone else that fails with NV_ERR_INSUFFICIENT_PERMISSIONS and RM
 *    answers the heap size in limit and a NV01_MEMORY_SYSTEM_DYNAMIC object;
 *  - NV01_MEMORY_LOCAL_PRIVILEGED (_rmAllocMemoryLocalPrivileged): ALLOC
 *    must be NONE (NV_ERR_INVALID_FLAGS), limit 0xFFFFFFFF, an RmAlloc of
 *    register memory with no parameters;
 *  - NV01_MEMORY_SYSTEM_OS_DESCRIPTOR (0x71), as before.
 * Another class: NV_ERR_INVALID_CLASS.
 */
int nvstub_esc_alloc_memory(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvos02_params_with_fd *pa = arg;
	struct nvos02_params *p = &pa->params;
	struct nvstub_memory_virtual_params vp = { .h_va_space = NVSTUB_SYSMEM_DYNAMIC_HVASPACE };
	const struct nvstub_class_info *ci;
	struct nvstub_client *cl;
	struct nvstub_obj *parent, *obj;
	u32 h;

	if (size != sizeof(*pa) || nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, p->h_root, &p->status);
	if (!cl)
		return 0;
	h = p->h_object_new;
	switch (p->h_class) {
	case NV01_MEMORY_SYSTEM_DYNAMIC:
		p->status = nvstub_rm_alloc_locked(cl, p->h_object_parent, &h, NV01_MEMORY_SYSTEM_DYNAMIC, &vp);
		p->limit = vp.limit;
		goto out;
	case NV01_MEMORY_LOCAL_USER:
		parent = nvstub_obj_get(cl, p->h_object_parent);
		if (!parent) {
			p->status = NV_ERR_INVALID_OBJECT_PARENT;
			return 0;
		}
		if (cl->admin) {
			/* physical_mem.c: the whole FB, privileged */
			ci = nvstub_class_find(NV01_MEMORY_LOCAL_PHYSICAL);
			p->status = nvstub_obj_create(cl, parent, &h, ci, &nvstub_whole_fb, NULL, &obj);
			if (p->status == NV_OK)
				p->limit = obj->mem_size - 1;
			goto out;
		}
		p->limit = nvstub_heap_size() - 1;
		p->status = nvstub_rm_alloc_locked(cl, p->h_object_parent, &h, NV01_MEMORY_SYSTEM_DYNAMIC, &vp);
		goto out;
	case NV01_MEMORY_LOCAL_PRIVILEGED:
		if (NVSTUB_OS02_ALLOC(p->flags) != NVSTUB_OS02_ALLOC_NONE) {
			p->status = NV_ERR_INVALID_FLAGS;
			return 0;
		}
		p->limit = 0xFFFFFFFF;
		p->status = nvstub_rm_alloc_locked(cl, p->h_object_parent, &h, NV01_MEMORY_LOCAL_PRIVILEGED, NULL);
		goto out;
	case NV01_MEMORY_SYSTEM:
		if (NVSTUB_OS02_LOCATION(p->flags) != 0 ||
		    NVSTUB_OS02_ALLOC(p->flags) == NVSTUB_OS02_ALLOC_NONE) {
			p->status = NV_ERR_INVALID_FLAGS;
			return 0;
		}
		break;
	case NV01_MEMORY_SYSTEM_OS_DESCRIPTOR:
		break;
	default:
		p->status = NV_ERR_INVALID_CLASS;
		return 0;
	}
	ci = nvstub_class_find(p->h_class);
	parent = nvstub_obj_get(cl, p->h_object_parent);
	if (!parent) {
		p->status = NV_ERR_INVALID_OBJECT_PARENT;
		return 0;
	}
	if (p->limit == U64_MAX) {
		p->status = NV_ERR_INVALID_LIMIT;
		return 0;
	}
	p->status = nvstub_obj_create(cl, parent, &h, ci, NULL, NULL, &obj);
	if (p->status == NV_OK)
		obj->mem_size = p->limit + 1;
out:
	if (p->status == NV_OK)
		p->h_object_new = h;
	return 0;
}

/*
 * gpu_rmapi.c _gpuConvertPid: the client's pid as the caller's pid namespace
 * sees it (os-interface.c os_find_ns_pid: pid_vnr(); 0 = not visible, which
 * RM reports as NV_ERR_OBJECT_NOT_FOUND). Without pid info: ProcID.
 */
static u32 nvstub_client_ns_pid(struct nvstub_client *cl)
{
	return cl->pid_info ? pid_vnr(cl->pid_info) : cl->pid;
}

/* device.c deviceGetByGpu: the client's first device on @gpu. */
static struct nvstub_obj *nvstub_client_device(struct nvstub_client *cl, unsigned int gpu)
{
	struct nvstub_obj *o;

	list_for_each_entry(o, &cl->root.children, sibling)
		if (o->cls == NV01_DEVICE_0 && o->gpu == gpu)
			return o;
	return NULL;
}

enum nvstub_pid_kind { NVSTUB_PIDS_SUBDEVICE, NVSTUB_PIDS_CHANNEL_DESCENDANT, NVSTUB_PIDS_NONE };

/* Does @o count for GET_PIDS (gpu_rmapi.c gpuGetProcWithObject_IMPL)? */
static bool nvstub_pids_match(struct nvstub_obj *o, enum nvstub_pid_kind kind, u32 id,
			      struct nvstub_obj *dev)
{
	switch (kind) {
	case NVSTUB_PIDS_SUBDEVICE:	/* classId(Subdevice), anywhere in the client */
		return o->cls == NV20_SUBDEVICE_0;
	case NVSTUB_PIDS_CHANNEL_DESCENDANT:
		/* a ChannelDescendant (an object whose parent is a channel) of
		 * external class @id whose channel is on the device found */
		return o->cls == id && o->cls != NV01_EVENT_OS_EVENT && o->parent &&
		       o->parent->chan && nvstub_obj_ancestor(o->parent, NV01_DEVICE_0) == dev;
	default:	/* MpsApi, KernelHostVgpuDeviceApi: not modelled, none exist */
		return false;
	}
}

/*
 * NV2080_CTRL_CMD_GPU_GET_PIDS on a subdevice of @gpu
 * (subdevice_ctrl_gpu_kernel.c subdeviceCtrlCmdGpuGetPids_IMPL ->
 * gpu_rmapi.c gpuGetProcWithObject_IMPL): every client (no kernel clients
 * exist here) that has a device on the GPU and an object of the asked kind,
 * by its pid in the caller's namespace; a pid already in the table (compared
 * as the raw ProcID, as RM does) is skipped; at most
 * NV2080_CTRL_GPU_GET_PIDS_MAX_COUNT. Entries past the count are left as the
 * caller wrote them. Clients are visited in handle order.
 */
u32 nvstub_rm_get_pids(unsigned int gpu, u32 id_type, u32 id, u32 *tbl, u32 *count)
{
	enum nvstub_pid_kind kind;
	struct nvstub_client *cl;
	struct nvstub_obj *dev, *o;
	unsigned long idx, h;
	u32 n = 0, i;
	bool saved;

	if (id_type == NV2080_CTRL_GPU_GET_PIDS_ID_TYPE_CLASS) {
		if (id == NV20_SUBDEVICE_0)
			kind = NVSTUB_PIDS_SUBDEVICE;
		else if (id == MPS_COMPUTE)
			kind = NVSTUB_PIDS_NONE;
		else
			kind = NVSTUB_PIDS_CHANNEL_DESCENDANT;
	} else if (id_type == NV2080_CTRL_GPU_GET_PIDS_ID_TYPE_VGPU_GUEST) {
		kind = NVSTUB_PIDS_NONE;
	} else {
		return NV_ERR_INVALID_ARGUMENT;
	}
	xa_for_each(&nvstub_clients, idx, cl) {
		for (saved = false, i = 0; i < n && !saved; i++)
			saved = tbl[i] == (u32)cl->pid;	/* _gpuiIsPidSavedAlready */
		if (saved)
			continue;
		dev = nvstub_client_device(cl, gpu);
		if (!dev)
			continue;
		xa_for_each(&cl->objs, h, o) {
			if (!nvstub_pids_match(o, kind, id, dev))
				continue;
			tbl[n] = nvstub_client_ns_pid(cl);
			if (tbl[n])
				n++;
			break;
		}
		if (n == NV2080_CTRL_GPU_GET_PIDS_MAX_COUNT)
			break;
	}
	*count = n;
	return NV_OK;
}

/*
 * NV2080_CTRL_GPU_PID_INFO_INDEX_VIDEO_MEMORY_USAGE of @pid on @gpu
 * (gpu_rmapi.c gpuFindClientInfoWithPidIterator_IMPL -> _gpuCollectMemInfo):
 * for every client whose pid in the caller's namespace is @pid and every
 * device of it on the GPU, every NV01_MEMORY_LOCAL_USER object of the client
 * under that device counts its Length (the reported size): into memPrivate
 * (data[0]) if its memdesc has one duplicate, memSharedOwned (data[1]) if it
 * owns a shared memdesc, memSharedDuped (data[2]) otherwise. The protected
 * counters (data[3..5]) stay 0 (no confidential computing). A pid without
 * clients gets zeros and NV_OK.
 */
u32 nvstub_rm_pid_vidmem(unsigned int gpu, u32 pid, u64 *data)
{
	struct nvstub_client *cl;
	struct nvstub_obj *dev, *o;
	unsigned long idx, h;

	xa_for_each(&nvstub_clients, idx, cl) {
		if (nvstub_client_ns_pid(cl) != pid)	/* _gpuMatchClientPid */
			continue;
		list_for_each_entry(dev, &cl->root.children, sibling) {
			if (dev->cls != NV01_DEVICE_0 || dev->gpu != gpu)
				continue;
			xa_for_each(&cl->objs, h, o) {
				if (o->cls != NV01_MEMORY_LOCAL_USER || !o->md ||
				    nvstub_obj_ancestor(o, NV01_DEVICE_0) != dev)
					continue;
				if (o->md->dup_count == 1)
					data[0] += o->mem_size;
				else if (o->md_owner)
					data[1] += o->mem_size;
				else
					data[2] += o->mem_size;
			}
		}
	}
	return NV_OK;
}

/*
 * /proc/nvstub/clients, one line per client: its handle, the global tgid that
 * made it, and vidmem, the pool bytes of the memdescs it owns (pool pages, as
 * charged; a shared memdesc counts for the client of its owner). The vidmem
 * of all clients adds up to the pools' used bytes (/proc/nvstub/pool), less
 * the memory that only nvidia-uvm's duplicates still hold (UVM's own kernel
 * client, which would own it in RM, is not listed).
 */
void nvstub_rm_report(struct seq_file *m)
{
	struct nvstub_client *cl;
	struct nvstub_obj *o;
	unsigned long idx, h;
	u64 vidmem;

	xa_for_each(&nvstub_clients, idx, cl) {
		vidmem = 0;
		xa_for_each(&cl->objs, h, o)
			if (o->md && o->md_owner)
				vidmem += o->md->charged;
		seq_printf(m, "client=0x%08x pid=%d vidmem=%llu\n", cl->root.handle, cl->pid,
			   vidmem);
	}
}

int nvstub_rm_init(void)
{
	return 0;
}

void nvstub_rm_exit(void)
{
	WARN_ON(!xa_empty(&nvstub_clients));
	xa_destroy(&nvstub_clients);
}
