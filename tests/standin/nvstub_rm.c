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
#include <linux/mm.h>
#include <linux/file.h>
#include <linux/sched.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "nvstub.h"

#define NVSTUB_CLIENT_HANDLE_BASE	0xc1d00000	/* as seen in the traces */
#define NVSTUB_OBJECT_HANDLE_BASE	0xcaf00000	/* resserv RS_UNIQUE_HANDLE_BASE */
#define NVSTUB_VIDMEM_GRANULE		(2ULL << 20)	/* traces: 0x420000 -> 0x600000 */

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
	{ KEPLER_CHANNEL_GROUP_A, { NV01_DEVICE_0 }, 0 },
	{ FERMI_CONTEXT_SHARE_A, { KEPLER_CHANNEL_GROUP_A }, 0 },
	{ HOPPER_CHANNEL_GPFIFO_A, { KEPLER_CHANNEL_GROUP_A }, 0 },
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
	{ NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, { NV01_DEVICE_0, NV20_SUBDEVICE_0 }, 0 },
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
	NV04_DISPLAY_COMMON, NV01_MEMORY_SYSTEM_OS_DESCRIPTOR,
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

/* Detach and free one object whose children are already gone. */
static void nvstub_obj_destroy(struct nvstub_obj *obj)
{
	if (obj->mem_vid)
		nvstub_mem_uncharge(obj->gpu, obj->mem_size);
	if (obj->chan)
		nvstub_chan_destroy(obj);
	if (obj->tsg)
		nvstub_tsg_destroy(obj);
	list_del(&obj->sibling);
	xa_erase(&obj->client->objs, obj->handle);
	kfree(obj);
}

static void nvstub_obj_free_tree(struct nvstub_obj *obj)
{
	struct nvstub_obj *child, *tmp;

	list_for_each_entry_safe(child, tmp, &obj->children, sibling)
		nvstub_obj_free_tree(child);
	if (obj == &obj->client->root)
		return;
	nvstub_obj_destroy(obj);
}

static void nvstub_client_free(struct nvstub_client *cl)
{
	nvstub_obj_free_tree(&cl->root);
	xa_erase(&nvstub_clients, cl->root.handle);
	xa_destroy(&cl->objs);
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
	cl->pid = task_tgid_nr(current);
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
	case NV01_MEMORY_LOCAL_PHYSICAL:
		if (!mp || mp->size == 0)
			return NV_ERR_INVALID_ARGUMENT;
		if (mp->size > U64_MAX - NVSTUB_VIDMEM_GRANULE)
			return NV_ERR_NO_MEMORY;
		size = round_up(mp->size, NVSTUB_VIDMEM_GRANULE);
		st = nvstub_mem_charge(obj->gpu, size);
		if (st != NV_OK)
			return st;
		mp->size = size;
		obj->mem_size = size;
		obj->mem_vid = true;
		return NV_OK;
	case KEPLER_CHANNEL_GROUP_A:
		return nvstub_tsg_create(obj) ? NV_ERR_NO_MEMORY : NV_OK;
	case HOPPER_CHANNEL_GPFIFO_A:
		return nvstub_chan_create(obj, obj->parent) ? NV_ERR_NO_MEMORY : NV_OK;
	default:
		return NV_OK;
	}
}

/*
 * Create object @h of class @ci under @parent. Returns an NV status; on
 * NV_OK *out is the new object, linked into the tree.
 */
static u32 nvstub_obj_create(struct nvstub_client *cl, struct nvstub_obj *parent,
			     u32 *handle, const struct nvstub_class_info *ci,
			     void *params, struct nvstub_obj **out)
{
	struct nvstub_obj *obj;
	u32 h = *handle;
	u32 st;

	if (!nvstub_parent_ok(ci, parent->cls))
		return NV_ERR_INVALID_OBJECT_PARENT;
	if (ci->alloc_status != NV_OK)
		return ci->alloc_status;
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
	if (xa_insert(&cl->objs, h, obj, GFP_KERNEL)) {
		kfree(obj);
		return NV_ERR_NO_MEMORY;
	}
	list_add_tail(&obj->sibling, &parent->children);
	st = nvstub_obj_setup(obj, params);
	if (st != NV_OK) {
		nvstub_obj_destroy(obj);
		return st;
	}
	*handle = h;
	*out = obj;
	return NV_OK;
}

/* NV_ESC_RM_ALLOC (escape.c, rmapi/alloc_free.c). */
int nvstub_esc_alloc(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvos64_params *p = arg;
	const struct nvstub_class_info *ci;
	struct nvstub_client *cl;
	struct nvstub_obj *parent, *obj;
	void __user *uparams;
	void *params = NULL;
	u32 h;

	if (size != sizeof(struct nvos64_params))
		return -EINVAL;
	if (p->h_class == NV01_ROOT || p->h_class == NV01_ROOT_NON_PRIV ||
	    p->h_class == NV01_ROOT_CLIENT) {
		if (!nvstub_is_ctl(nf))
			return -EINVAL;
		h = p->h_object_new;
		p->status = nvstub_client_alloc(nf, &h);
		if (p->status == NV_OK)
			p->h_object_new = h;
		return 0;
	}
	if (p->h_class != NV01_EVENT_OS_EVENT && !nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, p->h_root, &p->status);
	if (!cl)
		return 0;
	ci = nvstub_class_find(p->h_class);
	if (!ci) {
		p->status = NV_ERR_INVALID_CLASS;
		return 0;
	}
	parent = nvstub_obj_get(cl, p->h_object_parent);
	if (!parent) {
		p->status = NV_ERR_INVALID_OBJECT_PARENT;
		return 0;
	}
	uparams = u64_to_user_ptr(p->p_alloc_parms);
	if (ci->params_size && uparams) {
		params = kmalloc(ci->params_size, GFP_KERNEL);
		if (!params) {
			p->status = NV_ERR_NO_MEMORY;
			return 0;
		}
		if (copy_from_user(params, uparams, ci->params_size)) {
			kfree(params);
			p->status = NV_ERR_INVALID_POINTER;
			return 0;
		}
	}
	h = p->h_object_new;
	p->status = nvstub_obj_create(cl, parent, &h, ci, params, &obj);
	if (p->status == NV_OK) {
		p->h_object_new = h;
		if (params && copy_to_user(uparams, params, ci->params_size))
			p->status = NV_ERR_INVALID_POINTER;
	}
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
		nvstub_obj_free_tree(obj);
	return 0;
}

/* NV_ESC_RM_DUP_OBJECT (NVOS55). The duplicate is a new object of the same
 * class; memory stays charged to the original.
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
	if (!parent) {
		p->status = NV_ERR_INVALID_OBJECT_PARENT;
		return 0;
	}
	/* default share policy: objects of clients of the same process */
	if (src_cl->pid != cl->pid) {
		p->status = NV_ERR_INSUFFICIENT_PERMISSIONS;
		return 0;
	}
	ci = nvstub_class_find(src->cls);
	if (!ci || src->tsg || src->chan || src->cls == NV01_DEVICE_0) {
		p->status = NV_ERR_NOT_SUPPORTED;
		return 0;
	}
	h = p->h_object;
	p->status = nvstub_obj_create(cl, parent, &h, ci, NULL, &obj);
	if (p->status == NV_OK)
		p->h_object = h;
	return 0;
}

/* NV_ESC_RM_ALLOC_MEMORY (NVOS02 + fd) on an nvidiaN file (escape.c):
 * OS descriptors (0x71) and system memory; no mapping is created here.
 */
int nvstub_esc_alloc_memory(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvos02_params_with_fd *pa = arg;
	struct nvos02_params *p = &pa->params;
	const struct nvstub_class_info *ci;
	struct nvstub_client *cl;
	struct nvstub_obj *parent, *obj;
	u32 h;

	if (size != sizeof(*pa) || nvstub_is_ctl(nf))
		return -EINVAL;
	cl = nvstub_client_validate(nf, p->h_root, &p->status);
	if (!cl)
		return 0;
	if (p->h_class != NV01_MEMORY_SYSTEM_OS_DESCRIPTOR &&
	    p->h_class != NV01_MEMORY_SYSTEM) {
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
	h = p->h_object_new;
	p->status = nvstub_obj_create(cl, parent, &h, ci, NULL, &obj);
	if (p->status == NV_OK) {
		p->h_object_new = h;
		obj->mem_size = p->limit + 1;
	}
	return 0;
}

void nvstub_rm_report(struct seq_file *m)
{
	struct nvstub_client *cl;
	unsigned long idx;

	xa_for_each(&nvstub_clients, idx, cl)
		seq_printf(m, "client=0x%08x pid=%d\n", cl->root.handle, cl->pid);
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
