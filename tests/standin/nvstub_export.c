// SPDX-License-Identifier: GPL-2.0
/*
 * nvstub_export.c - RM objects exported to and imported from file
 * descriptors, in the nvstub TEST DOUBLE, after 580's
 * src/nvidia/arch/nvalloc/unix/src/os.c (cliresCtrlCmdOsUnix*_IMPL) and
 * src/nvidia/arch/nvalloc/unix/src/rmobjexportimport.c:
 *
 *  - RmExportObject(): the object is duplicated into RM's export client,
 *    under that client's device of the object's GPU (or its subdevice when the
 *    device is the wrong parent), made with the first export and freed with
 *    the last (RmRefObjExportImport / RmUnrefObjExportImport); the duplicate's
 *    handle is the export handle.
 *  - The handles live in slots of the nvidiactl file the control's fd names
 *    (nv_get_file_private(fd, ctl): that file, of this driver, minor 255),
 *    which frees them when it is released (osapi.c rm_cleanup_file_private).
 *  - RmImportObject(): a duplicate of the export handle's object into the
 *    caller's client, under its parent; IMPORT_OBJECTS also reports the
 *    memory's address space.
 *
 * Not modelled: MIG (gpuInstanceId is always NV_U32_MAX), fabric memory,
 * CREATE_EXPORT_OBJECT_FD (deprecated in 580).
 */
#include <linux/file.h>
#include <linux/slab.h>
#include <linux/string.h>

#include "nvstub.h"

#define NVSTUB_EXPORT_CLIENT	0xc1e00000	/* outside the user clients' range */
#define NVSTUB_NO_DEVICE	32		/* NV_MAX_DEVICES: exported without a device */

/* rmobjexportimport.c: hObjExportRmClient and objExportDeviceMap */
static struct nvstub_client *nvstub_exp_cl;
static unsigned int nvstub_exp_refs;
static struct nvstub_obj *nvstub_exp_dev[NVSTUB_MAX_GPUS];
static struct nvstub_obj *nvstub_exp_subdev[NVSTUB_MAX_GPUS];

static u32 nvstub_exp_ref(struct nvstub_file *nf)
{
	if (!nvstub_exp_refs) {
		nvstub_exp_cl = nvstub_rm_kernel_client(nf, NVSTUB_EXPORT_CLIENT);
		if (!nvstub_exp_cl)
			return NV_ERR_NO_MEMORY;
		memset(nvstub_exp_dev, 0, sizeof(nvstub_exp_dev));
		memset(nvstub_exp_subdev, 0, sizeof(nvstub_exp_subdev));
	}
	nvstub_exp_refs++;
	return NV_OK;
}

static void nvstub_exp_unref(void)
{
	if (--nvstub_exp_refs)
		return;
	nvstub_rm_kernel_client_free(nvstub_exp_cl);
	nvstub_exp_cl = NULL;
}

/* The export client's device and subdevice of @gpu, made at first use. */
static u32 nvstub_exp_device(unsigned int gpu)
{
	struct nvstub_obj *dev = nvstub_exp_dev[gpu];

	if (dev)
		return NV_OK;
	dev = nvstub_rm_kernel_obj(nvstub_exp_cl, &nvstub_exp_cl->root, NV01_DEVICE_0, gpu);
	if (!dev)
		return NV_ERR_NO_MEMORY;
	nvstub_exp_subdev[gpu] = nvstub_rm_kernel_obj(nvstub_exp_cl, dev, NV20_SUBDEVICE_0, gpu);
	if (!nvstub_exp_subdev[gpu]) {
		nvstub_rm_free_obj(dev);
		return NV_ERR_NO_MEMORY;
	}
	nvstub_exp_dev[gpu] = dev;
	return NV_OK;
}

/* RmExportObject(): *exp the export handle, *dev_inst the object's GPU. */
static u32 nvstub_export(struct nvstub_file *nf, struct nvstub_client *cl, u32 h_object,
			 u32 *exp, u32 *dev_inst)
{
	struct nvstub_obj *src = nvstub_obj_get(cl, h_object), *dev, *parent;
	u32 h = 0, st;

	if (!src || src == &cl->root)
		return NV_ERR_OBJECT_NOT_FOUND;	/* serverutilGetResourceRef */
	dev = nvstub_obj_ancestor(src, NV01_DEVICE_0);
	st = nvstub_exp_ref(nf);
	if (st != NV_OK)
		return st;
	if (dev) {
		st = nvstub_exp_device(dev->gpu);
		if (st != NV_OK)
			goto err;
		parent = nvstub_exp_dev[dev->gpu];
	} else {
		parent = &nvstub_exp_cl->root;
	}
	st = nvstub_rm_dup(nvstub_exp_cl, parent, &h, src);
	if (st == NV_ERR_INVALID_OBJECT_PARENT && dev)
		st = nvstub_rm_dup(nvstub_exp_cl, nvstub_exp_subdev[dev->gpu], &h, src);
	if (st != NV_OK)
		goto err;
	*exp = h;
	*dev_inst = dev ? dev->gpu : NVSTUB_NO_DEVICE;
	return NV_OK;
err:
	nvstub_exp_unref();
	return st;
}

/* RmFreeObjExportHandle() */
static void nvstub_export_free(u32 exp)
{
	struct nvstub_obj *obj = nvstub_obj_get(nvstub_exp_cl, exp);

	if (obj)
		nvstub_rm_free_obj(obj);
	nvstub_exp_unref();
}

/* RmImportObject(); @type NULL: not asked (IMPORT_OBJECT_FROM_FD). */
static u32 nvstub_import(struct nvstub_client *cl, u32 h_parent, u32 *h_object, u32 exp,
			 u8 *type)
{
	struct nvstub_obj *src, *parent;

	src = nvstub_exp_cl ? nvstub_obj_get(nvstub_exp_cl, exp) : NULL;
	if (!src)
		return NV_ERR_INVALID_ARGUMENT;
	if (type) {
		/* NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE on it: memory only */
		if (!src->mem_size)
			return NV_ERR_INVALID_ARGUMENT;
		*type = src->mem_vid ? NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_VIDMEM :
				       NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_SYSMEM;
	}
	parent = nvstub_obj_get(cl, h_parent);
	if (!parent)
		return NV_ERR_INVALID_OBJECT_PARENT;
	return nvstub_rm_dup(cl, parent, h_object, src);
}

/* os.c _initializeExportObjectFd() */
static u32 nvstub_export_fd_init(struct nvstub_file *ef, struct nvstub_client *cl, u32 h_device,
				 u16 max, const u8 *meta)
{
	u32 dev_inst = NVSTUB_NO_DEVICE;

	if (ef->exp_handles)
		return NV_ERR_STATE_IN_USE;
	if (h_device) {
		struct nvstub_obj *dev = nvstub_obj_get(cl, h_device);

		if (!dev)
			return NV_ERR_OBJECT_NOT_FOUND;
		if (dev->cls != NV01_DEVICE_0)
			return NV_ERR_INVALID_PARAMETER;
		dev_inst = dev->gpu;
	}
	ef->exp_handles = kcalloc(max, sizeof(u32), GFP_KERNEL);
	if (!ef->exp_handles)
		return NV_ERR_NO_MEMORY;
	ef->exp_max = max;
	ef->exp_dev_inst = dev_inst;
	if (meta)
		memcpy(ef->exp_meta, meta, sizeof(ef->exp_meta));
	return NV_OK;
}

/* nv_get_file_private(fd, NV_TRUE): a nvidiactl file of this driver */
static struct nvstub_file *nvstub_export_file(s32 fd, struct file **filp)
{
	return fd < 0 ? NULL : nvstub_get_file(fd, true, filp);
}

u32 nvstub_ctrl_export_object(struct nvstub_file *nf, struct nvstub_client *cl, void *params)
{
	struct nv0000_export_object_to_fd_params *p = params;
	struct nvstub_file *ef;
	struct file *filp;
	u32 exp, dev_inst, st;

	if (p->flags & NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TO_FD_FLAGS_EMPTY_FD)
		return NV_ERR_INVALID_PARAMETER;
	if (p->object.type != NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM || p->fd == -1)
		return NV_ERR_INVALID_PARAMETER;
	st = nvstub_export(nf, cl, p->object.h_object, &exp, &dev_inst);
	if (st != NV_OK)
		return st;
	ef = nvstub_export_file(p->fd, &filp);
	if (!ef) {
		st = NV_ERR_INVALID_PARAMETER;
		goto err;
	}
	st = nvstub_export_fd_init(ef, cl, p->object.h_device, 1, NULL);
	if (st == NV_OK)
		ef->exp_handles[0] = exp;
	fput(filp);
	if (st == NV_OK)
		return NV_OK;
err:
	nvstub_export_free(exp);
	return st;
}

u32 nvstub_ctrl_export_objects(struct nvstub_file *nf, struct nvstub_client *cl, void *params)
{
	struct nv0000_export_objects_to_fd_params *p = params;
	struct nvstub_file *ef;
	struct file *filp;
	bool setup = false;
	u32 *exp = NULL, dev_inst, st = NV_OK, i;

	ef = nvstub_export_file(p->fd, &filp);
	if (!ef)
		return NV_ERR_INVALID_PARAMETER;
	if (!ef->exp_handles) {
		if (!p->max_objects) {
			st = NV_ERR_INVALID_PARAMETER;
			goto out;
		}
		st = nvstub_export_fd_init(ef, cl, p->h_device, p->max_objects, p->metadata);
		if (st != NV_OK)
			goto out;
		setup = true;
	}
	if (p->num_objects > NV0000_CTRL_OS_UNIX_EXPORT_OBJECTS_TO_FD_MAX_OBJECTS) {
		st = NV_ERR_INVALID_PARAMETER;
		goto out;
	}
	if ((u32)p->num_objects + p->index > ef->exp_max) {
		st = NV_ERR_OUT_OF_RANGE;
		goto out;
	}
	exp = kcalloc(max_t(u32, p->num_objects, 1), sizeof(u32), GFP_KERNEL);
	if (!exp) {
		st = NV_ERR_NO_MEMORY;
		goto out;
	}
	for (i = 0; i < p->num_objects; i++) {
		if (!p->objects[i])
			continue;
		st = nvstub_export(nf, cl, p->objects[i], &exp[i], &dev_inst);
		if (st != NV_OK)
			goto out;
		if (dev_inst != ef->exp_dev_inst) {
			st = NV_ERR_INVALID_PARAMETER;
			goto out;
		}
	}
	for (i = 0; i < p->num_objects; i++) {
		u32 *slot = &ef->exp_handles[p->index + i];

		if (*slot)
			nvstub_export_free(*slot);	/* replaced */
		*slot = exp[i];
	}
out:
	if (st != NV_OK && exp)
		for (i = 0; i < p->num_objects; i++)
			if (exp[i])
				nvstub_export_free(exp[i]);
	kfree(exp);
	if (st != NV_OK && setup) {
		kfree(ef->exp_handles);
		ef->exp_handles = NULL;
		ef->exp_max = 0;
	}
	fput(filp);
	return st;
}

u32 nvstub_ctrl_import_object(struct nvstub_file *nf, struct nvstub_client *cl, void *params)
{
	struct nv0000_import_object_from_fd_params *p = params;
	struct nvstub_file *ef;
	struct file *filp;
	u32 st;

	if (p->object.type != NV0000_CTRL_OS_UNIX_EXPORT_OBJECT_TYPE_RM || p->fd == -1)
		return NV_ERR_INVALID_PARAMETER;
	ef = nvstub_export_file(p->fd, &filp);
	if (!ef)
		return NV_ERR_INVALID_PARAMETER;
	if (!ef->exp_handles || !ef->exp_handles[0] || ef->exp_max < 1)
		st = NV_ERR_INVALID_PARAMETER;
	else
		st = nvstub_import(cl, p->object.h_parent, &p->object.h_object,
				   ef->exp_handles[0], NULL);
	fput(filp);
	return st;
}

u32 nvstub_ctrl_import_objects(struct nvstub_file *nf, struct nvstub_client *cl, void *params)
{
	struct nv0000_import_objects_from_fd_params *p = params;
	struct nvstub_file *ef;
	struct file *filp;
	u32 st = NV_OK, i = 0;

	ef = nvstub_export_file(p->fd, &filp);
	if (!ef)
		return NV_ERR_INVALID_PARAMETER;
	if (!ef->exp_handles ||
	    p->num_objects > NV0000_CTRL_OS_UNIX_IMPORT_OBJECTS_TO_FD_MAX_OBJECTS) {
		st = NV_ERR_INVALID_PARAMETER;
		goto out;
	}
	if ((u32)p->num_objects + p->index > ef->exp_max) {
		st = NV_ERR_OUT_OF_RANGE;
		goto out;
	}
	for (i = 0; i < p->num_objects; i++) {
		u32 exp = ef->exp_handles[i + p->index];

		if (!exp) {
			p->object_types[i] = NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_TYPE_NONE;
			continue;
		}
		st = nvstub_import(cl, p->h_parent, &p->objects[i], exp, &p->object_types[i]);
		if (st != NV_OK)
			break;
	}
	/*
	 * os.c frees objects[j] for each j before the failure that is not 0,
	 * whether slot j was imported or empty (it frees the handle the caller
	 * named there): so does this.
	 */
	while (st != NV_OK && i > 0) {
		struct nvstub_obj *obj;

		i--;
		obj = p->objects[i] ? nvstub_obj_get(cl, p->objects[i]) : NULL;
		if (obj && obj != &cl->root)
			nvstub_rm_free_obj(obj);
	}
out:
	fput(filp);
	return st;
}

u32 nvstub_ctrl_export_info(struct nvstub_file *nf, struct nvstub_client *cl, void *params)
{
	struct nv0000_get_export_object_info_params *p = params;
	struct nvstub_export_info_535 *old = params;
	bool v535 = nvstub_abi->export_object_info_size == sizeof(*old);
	struct nvstub_file *ef;
	struct file *filp;
	u32 st = NV_OK;

	if (p->fd < 0)
		return NV_ERR_INVALID_PARAMETER;
	ef = nvstub_export_file(p->fd, &filp);
	if (!ef)
		return NV_ERR_INVALID_PARAMETER;
	if (!ef->exp_handles) {
		st = NV_ERR_INVALID_PARAMETER;
	} else if (v535) {
		old->max_objects = ef->exp_max;
		old->device_instance = ef->exp_dev_inst;
		memcpy(old->metadata, ef->exp_meta, sizeof(old->metadata));
	} else {
		p->max_objects = ef->exp_max;
		p->device_instance = ef->exp_dev_inst;
		p->gpu_instance_id = 0xffffffff;
		memcpy(p->metadata, ef->exp_meta, sizeof(p->metadata));
	}
	fput(filp);
	return st;
}

/* osapi.c rm_cleanup_file_private(): the file's export handles go with it. */
void nvstub_export_file_release(struct nvstub_file *nf)
{
	unsigned int i;

	if (!nf->exp_handles)
		return;
	for (i = 0; i < nf->exp_max; i++)
		if (nf->exp_handles[i])
			nvstub_export_free(nf->exp_handles[i]);
	kfree(nf->exp_handles);
	nf->exp_handles = NULL;
}
