// SPDX-License-Identifier: GPL-2.0
/*
 * nvstub_ctrl.c - RM controls (NV_ESC_RM_CONTROL) of the nvstub TEST DOUBLE.
 *
 * In the order of src/nvidia/src/kernel/rmapi/control.c _rmapiRmControl and
 * src/nvidia/src/libraries/resserv/src/rs_server.c serverControl: the client
 * must exist (NV_ERR_INVALID_CLIENT); paramsSize must be the command's and
 * params non-NULL (NV_ERR_INVALID_ARGUMENT); the params are read once, before
 * any lock (bUnlockedParamCopy); then, under the lock, the client must belong
 * to the calling file (NV_ERR_INVALID_CLIENT), the object must exist
 * (NV_ERR_INVALID_OBJECT_HANDLE) and its class must export the command
 * (NV_ERR_NOT_SUPPORTED); the params are written back only on success.
 * Commands not in nvstub_ctrls[] answer NV_ERR_NOT_SUPPORTED; the list is
 * published in /proc/nvstub/implemented.
 */
#include <linux/bits.h>
#include <linux/numa.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "nvstub.h"

#define NVSTUB_CTX_BUFFER_SIZE	(2ULL << 20)	/* per channel, simulated */
#define NVSTUB_NUM_GPCS		8
#define NVSTUB_TPCS_PER_GPC	9

struct nvstub_ctrl_ctx {
	struct nvstub_file *nf;
	struct nvstub_client *cl;
	struct nvstub_obj *obj;
};

/* obj_cls of the KernelChannel controls: any channel class (HOPPER_, AMPERE_CHANNEL_GPFIFO_A) */
#define NVSTUB_ANY_CHANNEL	0xffffffff

struct nvstub_ctrl {
	u32 cmd;
	u32 obj_cls;		/* class of the object the command is issued on */
	u32 params_size;
	u32 (*fn)(struct nvstub_ctrl_ctx *ctx, void *params);
};

/* ctrl2080fb.h: sizes in KiB, computed from the pool. */
static u32 nvstub_fb_info_value(u32 index, unsigned int gpu, u32 *data)
{
	u64 total_kib = nvstub_mem_total() >> 10;
	u64 free_kib = nvstub_mem_free(gpu) >> 10;

	switch (index) {
	case NV2080_CTRL_FB_INFO_INDEX_RAM_SIZE:
	case NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE:
	case NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE:
	case NV2080_CTRL_FB_INFO_INDEX_MAPPABLE_HEAP_SIZE:
	case NV2080_CTRL_FB_INFO_INDEX_USABLE_RAM_SIZE:
		*data = total_kib;
		return NV_OK;
	case NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE:
	case NV2080_CTRL_FB_INFO_INDEX_LARGEST_FREE_REGION_SIZE_KB:
		*data = free_kib;
		return NV_OK;
	case NV2080_CTRL_FB_INFO_INDEX_FB_TAX_SIZE_KB:
		*data = 0;
		return NV_OK;
	case NV2080_CTRL_FB_INFO_INDEX_NUMA_NODE_ID:
		*data = NUMA_NO_NODE;	/* no NUMA-onlined video memory */
		return NV_OK;
	default:
		if (index > NV2080_CTRL_FB_INFO_INDEX_MAX)
			return NV_ERR_INVALID_ARGUMENT;
		*data = 0;	/* properties this stand-in does not model */
		return NV_OK;
	}
}

static u32 nvstub_ctrl_fb_get_info_v2(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv2080_ctrl_fb_get_info_v2_params *p = params;
	unsigned int i;
	u32 st;

	if (p->fb_info_list_size > NV2080_CTRL_FB_INFO_MAX_LIST_SIZE)
		return NV_ERR_INVALID_ARGUMENT;
	for (i = 0; i < p->fb_info_list_size; i++) {
		st = nvstub_fb_info_value(p->fb_info_list[i].index, ctx->obj->gpu,
					  &p->fb_info_list[i].data);
		if (st != NV_OK)
			return st;
	}
	return NV_OK;
}

/*
 * ctrl2080fifo.h DISABLE_CHANNELS: the listed (hClient, hChannel) pairs may
 * belong to any client, as measured on the H100 (docs/h100-findings.md).
 * A handle that names no channel is NV_ERR_INVALID_CHANNEL; so is an
 * invalidated channel (nvstub_rm.c nvstub_obj_free(): its destructor ran,
 * obj->chan is gone): 580.142 kernel_channel.c:1718-1740 CliGetKernelChannel
 * finds the ref but dynamicCast(pResource == NULL) fails, NV_ERR_INVALID_CHANNEL
 * (as kernel_fifo_ctrl.c:881-888 looks each pair up; on a GSP client the
 * channel's RM_FREE reached GSP with the destructor, rs_client.c:843).
 */
static u32 nvstub_ctrl_disable_channels(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv2080_ctrl_fifo_disable_channels_params *p = params;
	struct nvstub_obj *chans[NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES];
	unsigned int i;

	if (p->p_runlist_preempt_event)
		return NV_ERR_INSUFFICIENT_PERMISSIONS;
	if (p->num_channels > NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES)
		return NV_ERR_INVALID_ARGUMENT;
	for (i = 0; i < p->num_channels; i++) {
		struct nvstub_client *cl = nvstub_client_get(p->h_client_list[i]);
		struct nvstub_obj *ch = cl ? nvstub_obj_get(cl, p->h_channel_list[i]) : NULL;

		if (!cl)
			return NV_ERR_INVALID_CLIENT;
		if (!ch || !ch->chan || ch->gpu != ctx->obj->gpu)
			return NV_ERR_INVALID_CHANNEL;
		chans[i] = ch;
	}
	for (i = 0; i < p->num_channels; i++)
		nvstub_chan_set_disabled(chans[i]->chan, p->b_disable);
	return NV_OK;
}

static u32 nvstub_ctrl_gpfifo_schedule(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nva06c_ctrl_gpfifo_schedule_params *p = params;

	nvstub_tsg_schedule(ctx->obj->tsg, p->b_enable);
	return NV_OK;
}

static u32 nvstub_ctrl_set_timeslice(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nva06c_ctrl_timeslice_params *p = params;

	nvstub_tsg_set_timeslice(ctx->obj->tsg, p->timeslice_us);
	return NV_OK;
}

static u32 nvstub_ctrl_get_timeslice(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nva06c_ctrl_timeslice_params *p = params;

	p->timeslice_us = nvstub_tsg_get_timeslice(ctx->obj->tsg);
	return NV_OK;
}

/* ctrl0000client.h CLIENT_GET_ADDR_SPACE_TYPE */
static u32 nvstub_ctrl_addr_space_type(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv0000_ctrl_client_get_addr_space_type_params *p = params;
	struct nvstub_obj *mem = nvstub_obj_get(ctx->cl, p->h_object);

	if (!mem)
		return NV_ERR_INVALID_OBJECT_HANDLE;
	switch (mem->cls) {
	case NV01_MEMORY_LOCAL_USER:
	case NV01_MEMORY_LOCAL_PHYSICAL:
		p->addr_space_type = NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE_VIDMEM;
		return NV_OK;
	case NV01_MEMORY_SYSTEM:
	case NV01_MEMORY_SYSTEM_OS_DESCRIPTOR:
	case RM_USER_SHARED_DATA:
		p->addr_space_type = NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE_SYSMEM;
		return NV_OK;
	case HOPPER_USERMODE_A:
		p->addr_space_type = NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE_REGMEM;
		return NV_OK;
	default:
		return NV_ERR_INVALID_ARGUMENT;
	}
}

static u32 nvstub_ctrl_ok(struct nvstub_ctrl_ctx *ctx, void *params)
{
	return NV_OK;
}

static u32 nvstub_ctrl_num_subdevices(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv0080_ctrl_gpu_get_num_subdevices_params *p = params;

	p->num_subdevices = 1;
	return NV_OK;
}

/* ctrl2080mc.h MC_GET_ARCH_INFO: the simulated chip is a GH100. */
static u32 nvstub_ctrl_arch_info(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv2080_ctrl_mc_get_arch_info_params *p = params;

	p->architecture = NV2080_CTRL_MC_ARCH_INFO_ARCHITECTURE_GH100;
	p->implementation = NV2080_CTRL_MC_ARCH_INFO_IMPLEMENTATION_GH100;
	p->revision = NVSTUB_PCI_REVISION;
	p->sub_revision = 0;
	return NV_OK;
}

/* ctrl906f.h GET_CLASS_ENGINEID: engine of a channel's child object. */
static u32 nvstub_ctrl_class_engineid(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv906f_ctrl_get_class_engineid_params *p = params;
	struct nvstub_obj *o = nvstub_obj_get(ctx->cl, p->h_object);

	if (!o || o->parent != ctx->obj)
		return NV_ERR_INVALID_OBJECT_HANDLE;
	p->class_id = o->cls;
	p->class_engine_id = o->cls;
	if (o->cls == HOPPER_COMPUTE_A)
		p->engine_id = NV2080_ENGINE_TYPE_GR0;
	else if (o->cls == HOPPER_DMA_COPY_A)
		p->engine_id = NV2080_ENGINE_TYPE_COPY0;
	else
		return NV_ERR_INVALID_OBJECT_HANDLE;
	return NV_OK;
}

/* ctrlc36f.h GPFIFO_GET_WORK_SUBMIT_TOKEN: the channel's id. */
static u32 nvstub_ctrl_submit_token(struct nvstub_ctrl_ctx *ctx, void *params)
{
	u32 *token = params;

	*token = nvstub_chan_id(ctx->obj->chan);
	return NV_OK;
}

/* ctrl503c.h: third-party P2P registrations are checked, not recorded. */
static u32 nvstub_ctrl_p2p_register_va_space(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv503c_ctrl_register_va_space_params *p = params;
	struct nvstub_obj *va = nvstub_obj_get(ctx->cl, p->h_va_space);

	if (!va || va->cls != FERMI_VASPACE_A)
		return NV_ERR_INVALID_OBJECT_HANDLE;
	p->va_space_token = ((u64)ctx->cl->root.handle << 32) | va->handle;
	return NV_OK;
}

static bool nvstub_is_vidmem(const struct nvstub_obj *o)
{
	return o && o->mem_vid;
}

static u32 nvstub_ctrl_p2p_register_vidmem(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv503c_ctrl_register_vidmem_params *p = params;
	struct nvstub_obj *mem = nvstub_obj_get(ctx->cl, p->h_memory);

	if (!nvstub_is_vidmem(mem))
		return NV_ERR_INVALID_OBJECT_HANDLE;
	if (p->offset > mem->mem_size || p->size > mem->mem_size - p->offset)
		return NV_ERR_INVALID_ARGUMENT;
	p->address = 0x200000000000ULL + ((u64)mem->handle << 24) + p->offset;
	return NV_OK;
}

static u32 nvstub_ctrl_p2p_unregister_vidmem(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv503c_ctrl_unregister_vidmem_params *p = params;

	if (!nvstub_is_vidmem(nvstub_obj_get(ctx->cl, p->h_memory)))
		return NV_ERR_INVALID_OBJECT_HANDLE;
	return NV_OK;
}

/* ctrl0080fifo.h GET_CHANNELLIST: channel handles in, channel ids out. */
static u32 nvstub_ctrl_channellist(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv0080_ctrl_fifo_get_channellist_params *p = params;
	u32 __user *handles = u64_to_user_ptr(p->p_channel_handle_list);
	u32 __user *ids = u64_to_user_ptr(p->p_channel_list);
	unsigned int i;

	if (!p->num_channels || !handles || !ids)
		return NV_ERR_INVALID_ARGUMENT;
	for (i = 0; i < p->num_channels; i++) {
		struct nvstub_obj *ch;
		u32 h;

		if (get_user(h, &handles[i]))
			return NV_ERR_INVALID_POINTER;
		ch = nvstub_obj_get(ctx->cl, h);
		if (!ch || !ch->chan || nvstub_obj_ancestor(ch, NV01_DEVICE_0) != ctx->obj)
			return NV_ERR_INVALID_CHANNEL;
		if (put_user(nvstub_chan_id(ch->chan), &ids[i]))
			return NV_ERR_INVALID_POINTER;
	}
	return NV_OK;
}

/* ctrl0000gpu.h: the GPUs, by RM gpuId; all are attached and none excluded. */
static u32 nvstub_ctrl_attached_ids(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv0000_ctrl_gpu_get_attached_ids_params *p = params;
	unsigned int i;

	for (i = 0; i < NV0000_CTRL_GPU_MAX_ATTACHED_GPUS; i++)
		p->gpu_ids[i] = i < nvstub_num_gpus ? nvstub_gpu_id(i) : NV0000_CTRL_GPU_INVALID_ID;
	return NV_OK;
}

static u32 nvstub_ctrl_probed_ids(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv0000_ctrl_gpu_get_probed_ids_params *p = params;
	unsigned int i;

	for (i = 0; i < NV0000_CTRL_GPU_MAX_PROBED_GPUS; i++) {
		p->gpu_ids[i] = i < nvstub_num_gpus ? nvstub_gpu_id(i) : NV0000_CTRL_GPU_INVALID_ID;
		p->excluded_gpu_ids[i] = NV0000_CTRL_GPU_INVALID_ID;
		p->gpu_flags[i] = 0;
	}
	return NV_OK;
}

static u32 nvstub_ctrl_id_info_v2(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv0000_ctrl_gpu_get_id_info_v2_params *p = params;
	unsigned int i;

	for (i = 0; i < nvstub_num_gpus; i++) {
		if (p->gpu_id != nvstub_gpu_id(i))
			continue;
		p->gpu_flags = 0;
		p->device_instance = i;
		p->sub_device_instance = 0;
		p->sli_status = NV0000_CTRL_SLI_STATUS_GPU_NOT_SUPPORTED |
				NV0000_CTRL_SLI_STATUS_INVALID_GPU_COUNT;
		p->board_id = p->gpu_id;
		p->gpu_instance = i;
		p->numa_id = NUMA_NO_NODE;
		return NV_OK;
	}
	return NV_ERR_INVALID_ARGUMENT;
}

/* ctrl2080gpu.h GET_NAME_STRING: the simulated board's name. */
static u32 nvstub_ctrl_name_string(struct nvstub_ctrl_ctx *ctx, void *params)
{
	static const char name[] = "NVIDIA H100 80GB HBM3 (nvstub)";
	struct nv2080_ctrl_gpu_get_name_string_params *p = params;
	unsigned int i;

	memset(&p->gpu_name_string, 0, sizeof(p->gpu_name_string));
	switch (p->gpu_name_string_flags) {
	case NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_ASCII:
		strscpy(p->gpu_name_string.ascii, name, sizeof(p->gpu_name_string.ascii));
		return NV_OK;
	case NV2080_CTRL_GPU_GET_NAME_STRING_FLAGS_TYPE_UNICODE:
		for (i = 0; i < sizeof(name) - 1; i++)
			p->gpu_name_string.unicode[i] = name[i];
		return NV_OK;
	default:
		return NV_ERR_INVALID_ARGUMENT;
	}
}

/*
 * ctrl2080gpu.h GET_GID_INFO, the GPU's UUID (subdevice_ctrl_gpu_kernel.c
 * subdeviceCtrlCmdGpuGetGidInfo_IMPL -> gpu.c gpuGetGidInfo_IMPL): only the
 * SHA-1 type (else NV_ERR_INVALID_FLAGS); FORMAT_BINARY gives the 16 bytes,
 * any other format the ASCII "GPU-%08x-%04x-%04x-%04x-%012x" with its NUL
 * (gpu_uuid.c transformGidToUserFriendlyString, NV_UUID_STR_LEN). length is
 * what was written; the rest of data is left as it came. index is ignored.
 */
static u32 nvstub_ctrl_gid_info(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nvstub_gid_info_params *p = params;
	u8 u[NVSTUB_UUID_LEN];

	if (p->flags & NVSTUB_GID_FLAGS_TYPE_MASK)
		return NV_ERR_INVALID_FLAGS;
	nvstub_gpu_uuid(ctx->obj->gpu, u);
	if ((p->flags & NVSTUB_GID_FLAGS_FORMAT_MASK) == NVSTUB_GID_FLAGS_FORMAT_BINARY) {
		memcpy(p->data, u, sizeof(u));
		p->length = sizeof(u);
		return NV_OK;
	}
	snprintf((char *)p->data, NVSTUB_GID_STR_LEN,
		 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
		 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
		 u[12], u[13], u[14], u[15]);
	p->length = NVSTUB_GID_STR_LEN;
	return NV_OK;
}

/* ctrl2080gr.h GET_CTX_BUFFER_SIZE: a channel's context buffers (modelled size). */
static u32 nvstub_ctrl_ctx_buffer_size(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv2080_ctrl_gr_get_ctx_buffer_size_params *p = params;
	struct nvstub_obj *ch = nvstub_obj_get(ctx->cl, p->h_channel);

	if (!ch || !ch->chan)
		return NV_ERR_INVALID_CHANNEL;
	p->total_buffer_size = NVSTUB_CTX_BUFFER_SIZE;
	return NV_OK;
}

/* ctrl2080gr.h GPC/TPC masks of the simulated chip: a full GH100 die. */
static u32 nvstub_ctrl_gpc_mask(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv2080_ctrl_gr_get_gpc_mask_params *p = params;

	p->gpc_mask = GENMASK(NVSTUB_NUM_GPCS - 1, 0);
	return NV_OK;
}

static u32 nvstub_ctrl_tpc_mask(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv2080_ctrl_gr_get_tpc_mask_params *p = params;

	if (p->gpc_id >= NVSTUB_NUM_GPCS)
		return NV_ERR_INVALID_ARGUMENT;
	p->tpc_mask = GENMASK(NVSTUB_TPCS_PER_GPC - 1, 0);
	return NV_OK;
}

/* ctrl2080bus.h GET_PCI_INFO: the identity CARD_INFO reports. */
static u32 nvstub_ctrl_pci_info(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv2080_ctrl_bus_get_pci_info_params *p = params;

	p->pci_device_id = (NVSTUB_PCI_DEVICE << 16) | NVSTUB_PCI_VENDOR;
	p->pci_sub_system_id = 0;
	p->pci_revision_id = NVSTUB_PCI_REVISION;
	p->pci_ext_device_id = NVSTUB_PCI_DEVICE;
	return NV_OK;
}

/* ctrl0080gpu.h GET_VIRTUALIZATION_MODE: a bare-metal, non-GRID driver. */
static u32 nvstub_ctrl_virt_mode(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv0080_ctrl_gpu_get_virtualization_mode_params *p = params;

	p->virtualization_mode = NV0080_CTRL_GPU_VIRTUALIZATION_MODE_NONE;
	p->is_grid_build = 0;
	return NV_OK;
}

/*
 * ctrl2080gpu.h GET_PIDS (subdevice_ctrl_gpu_kernel.c
 * subdeviceCtrlCmdGpuGetPids_IMPL; no MIG): the processes with objects of a
 * kind on this GPU, see nvstub_rm_get_pids(). Non-privileged
 * (g_subdevice_nvoc.c flags 0x8): any client with a subdevice may ask.
 */
static u32 nvstub_ctrl_get_pids(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv2080_ctrl_gpu_get_pids_params *p = params;

	return nvstub_rm_get_pids(ctx->obj->gpu, p->id_type, p->id, p->pid_tbl,
				  &p->pid_tbl_count);
}

/*
 * ctrl2080gpu.h GET_PID_INFO (subdevice_ctrl_gpu_kernel.c
 * subdeviceCtrlCmdGpuGetPidInfo_IMPL; no MIG): a count of 0 or over 200 fails
 * the call; otherwise each entry gets invalid partition ids and a result of
 * its own: VIDEO_MEMORY_USAGE zeroes data and fills it (pid 0:
 * NV_ERR_INVALID_ARGUMENT from gpuFindClientInfoWithPidIterator's assert),
 * any other index is NV_ERR_INVALID_ARGUMENT with data untouched.
 */
static u32 nvstub_ctrl_get_pid_info(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nv2080_ctrl_gpu_get_pid_info_params *p = params;
	struct nv2080_ctrl_gpu_pid_info *e;
	unsigned int i;

	if (p->pid_info_list_count == 0 ||
	    p->pid_info_list_count > NV2080_CTRL_GPU_GET_PID_INFO_MAX_COUNT)
		return NV_ERR_INVALID_ARGUMENT;
	for (i = 0; i < p->pid_info_list_count; i++) {
		e = &p->pid_info_list[i];
		e->compute_instance_id = NV2080_CTRL_GPU_PARTITION_ID_INVALID;
		e->gpu_instance_id = NV2080_CTRL_GPU_PARTITION_ID_INVALID;
		if (e->index != NV2080_CTRL_GPU_PID_INFO_INDEX_VIDEO_MEMORY_USAGE) {
			e->result = NV_ERR_INVALID_ARGUMENT;
			continue;
		}
		memset(e->data, 0, sizeof(e->data));
		if (!e->pid)
			e->result = NV_ERR_INVALID_ARGUMENT;
		else
			e->result = nvstub_rm_pid_vidmem(ctx->obj->gpu, e->pid, e->data);
	}
	return NV_OK;
}

/*
 * NVA06F_CTRL_CMD_BIND on a channel (fifo/kernel_channel.c
 * kchannelCtrlCmdBind_IMPL): the engine type is translated to an engine
 * (gpuXlateClientEngineIdToEngDesc: NV_ERR_INVALID_ARGUMENT for one the GPU
 * does not have) and the channel bound to its runlist. The H100's engines
 * (NV2080_ENGINE_TYPE_*, cl2080_notification.h): GR0, COPY0-9, NVDEC0-6,
 * NVJPG0-6, OFA0. Recorded on the channel (/proc/nvstub/engine).
 */
static bool nvstub_h100_engine(u32 t)
{
	return t == 0x01 || (t >= 0x09 && t <= 0x12) || (t >= 0x13 && t <= 0x19) ||
	       (t >= 0x2b && t <= 0x31) || t == 0x33;
}

static u32 nvstub_ctrl_chan_bind(struct nvstub_ctrl_ctx *ctx, void *params)
{
	u32 engine = *(u32 *)params;

	if (!nvstub_h100_engine(engine))
		return NV_ERR_INVALID_ARGUMENT;
	ctx->obj->engine_type = engine;
	return NV_OK;
}

/*
 * NVA06F_CTRL_CMD_GPFIFO_SCHEDULE on a channel (kchannelCtrlCmdGpFifoSchedule_IMPL,
 * forwarded to GSP): schedules the channel's TSG, as NVA06C's does for a TSG
 * (bEnable=0: no effect, as measured for the TSG's control).
 */
static u32 nvstub_ctrl_chan_schedule(struct nvstub_ctrl_ctx *ctx, void *params)
{
	struct nva06c_ctrl_gpfifo_schedule_params *p = params;

	if (p->b_enable)
		nvstub_tsg_schedule(nvstub_chan_tsg(ctx->obj->chan), true);
	return NV_OK;
}

/* nvstub_export.c: the NV0000 OS_UNIX export and import controls */
static u32 nvstub_ctrl_exp1(struct nvstub_ctrl_ctx *ctx, void *params)
{
	return nvstub_ctrl_export_object(ctx->nf, ctx->cl, params);
}

static u32 nvstub_ctrl_expn(struct nvstub_ctrl_ctx *ctx, void *params)
{
	return nvstub_ctrl_export_objects(ctx->nf, ctx->cl, params);
}

static u32 nvstub_ctrl_imp1(struct nvstub_ctrl_ctx *ctx, void *params)
{
	return nvstub_ctrl_import_object(ctx->nf, ctx->cl, params);
}

static u32 nvstub_ctrl_impn(struct nvstub_ctrl_ctx *ctx, void *params)
{
	return nvstub_ctrl_import_objects(ctx->nf, ctx->cl, params);
}

static u32 nvstub_ctrl_expinfo(struct nvstub_ctrl_ctx *ctx, void *params)
{
	return nvstub_ctrl_export_info(ctx->nf, ctx->cl, params);
}

static const struct nvstub_ctrl nvstub_ctrls[] = {
	{ NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECT_TO_FD, NV01_ROOT_CLIENT,
	  sizeof(struct nv0000_export_object_to_fd_params), nvstub_ctrl_exp1 },
	{ NV0000_CTRL_CMD_OS_UNIX_EXPORT_OBJECTS_TO_FD, NV01_ROOT_CLIENT,
	  sizeof(struct nv0000_export_objects_to_fd_params), nvstub_ctrl_expn },
	{ NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECT_FROM_FD, NV01_ROOT_CLIENT,
	  sizeof(struct nv0000_import_object_from_fd_params), nvstub_ctrl_imp1 },
	{ NV0000_CTRL_CMD_OS_UNIX_IMPORT_OBJECTS_FROM_FD, NV01_ROOT_CLIENT,
	  sizeof(struct nv0000_import_objects_from_fd_params), nvstub_ctrl_impn },
	{ NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO, NV01_ROOT_CLIENT,
	  sizeof(struct nv0000_get_export_object_info_params), nvstub_ctrl_expinfo },
	{ NV2080_CTRL_CMD_FB_GET_INFO_V2, NV20_SUBDEVICE_0,
	  sizeof(struct nv2080_ctrl_fb_get_info_v2_params), nvstub_ctrl_fb_get_info_v2 },
	{ NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, NV20_SUBDEVICE_0,
	  sizeof(struct nv2080_ctrl_fifo_disable_channels_params),
	  nvstub_ctrl_disable_channels },
	{ NVA06C_CTRL_CMD_GPFIFO_SCHEDULE, KEPLER_CHANNEL_GROUP_A,
	  sizeof(struct nva06c_ctrl_gpfifo_schedule_params), nvstub_ctrl_gpfifo_schedule },
	{ NVA06C_CTRL_CMD_SET_TIMESLICE, KEPLER_CHANNEL_GROUP_A,
	  sizeof(struct nva06c_ctrl_timeslice_params), nvstub_ctrl_set_timeslice },
	{ NVA06C_CTRL_CMD_GET_TIMESLICE, KEPLER_CHANNEL_GROUP_A,
	  sizeof(struct nva06c_ctrl_timeslice_params), nvstub_ctrl_get_timeslice },
	{ NV0000_CTRL_CMD_CLIENT_GET_ADDR_SPACE_TYPE, NV01_ROOT_CLIENT,
	  sizeof(struct nv0000_ctrl_client_get_addr_space_type_params),
	  nvstub_ctrl_addr_space_type },
	{ NV0000_CTRL_CMD_CLIENT_SET_INHERITED_SHARE_POLICY, NV01_ROOT_CLIENT,
	  NV0000_CTRL_CLIENT_SET_INHERITED_SHARE_POLICY_PARAMS_SIZE, nvstub_ctrl_ok },
	{ NV0080_CTRL_CMD_GPU_GET_NUM_SUBDEVICES, NV01_DEVICE_0,
	  sizeof(struct nv0080_ctrl_gpu_get_num_subdevices_params),
	  nvstub_ctrl_num_subdevices },
	{ NV2080_CTRL_CMD_MC_GET_ARCH_INFO, NV20_SUBDEVICE_0,
	  sizeof(struct nv2080_ctrl_mc_get_arch_info_params), nvstub_ctrl_arch_info },
	{ NV906F_CTRL_CMD_GET_CLASS_ENGINEID, NVSTUB_ANY_CHANNEL,
	  sizeof(struct nv906f_ctrl_get_class_engineid_params),
	  nvstub_ctrl_class_engineid },
	{ NVC36F_CTRL_CMD_GPFIFO_GET_WORK_SUBMIT_TOKEN, NVSTUB_ANY_CHANNEL,
	  sizeof(u32), nvstub_ctrl_submit_token },
	{ NV503C_CTRL_CMD_REGISTER_VA_SPACE, NV50_THIRD_PARTY_P2P,
	  sizeof(struct nv503c_ctrl_register_va_space_params),
	  nvstub_ctrl_p2p_register_va_space },
	{ NV503C_CTRL_CMD_REGISTER_VIDMEM, NV50_THIRD_PARTY_P2P,
	  sizeof(struct nv503c_ctrl_register_vidmem_params),
	  nvstub_ctrl_p2p_register_vidmem },
	{ NV503C_CTRL_CMD_UNREGISTER_VIDMEM, NV50_THIRD_PARTY_P2P,
	  sizeof(struct nv503c_ctrl_unregister_vidmem_params),
	  nvstub_ctrl_p2p_unregister_vidmem },
	{ NV0000_CTRL_CMD_GPU_GET_ATTACHED_IDS, NV01_ROOT_CLIENT,
	  sizeof(struct nv0000_ctrl_gpu_get_attached_ids_params), nvstub_ctrl_attached_ids },
	{ NV0000_CTRL_CMD_GPU_GET_PROBED_IDS, NV01_ROOT_CLIENT,
	  sizeof(struct nv0000_ctrl_gpu_get_probed_ids_params), nvstub_ctrl_probed_ids },
	{ NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2, NV01_ROOT_CLIENT,
	  sizeof(struct nv0000_ctrl_gpu_get_id_info_v2_params), nvstub_ctrl_id_info_v2 },
	{ NV2080_CTRL_CMD_GPU_GET_NAME_STRING, NV20_SUBDEVICE_0,
	  sizeof(struct nv2080_ctrl_gpu_get_name_string_params), nvstub_ctrl_name_string },
	{ NV2080_CTRL_CMD_GPU_GET_GID_INFO, NV20_SUBDEVICE_0,
	  sizeof(struct nvstub_gid_info_params), nvstub_ctrl_gid_info },
	{ NV2080_CTRL_CMD_GR_GET_CTX_BUFFER_SIZE, NV20_SUBDEVICE_0,
	  sizeof(struct nv2080_ctrl_gr_get_ctx_buffer_size_params),
	  nvstub_ctrl_ctx_buffer_size },
	{ NV2080_CTRL_CMD_GR_GET_GPC_MASK, NV20_SUBDEVICE_0,
	  sizeof(struct nv2080_ctrl_gr_get_gpc_mask_params), nvstub_ctrl_gpc_mask },
	{ NV2080_CTRL_CMD_GR_GET_TPC_MASK, NV20_SUBDEVICE_0,
	  sizeof(struct nv2080_ctrl_gr_get_tpc_mask_params), nvstub_ctrl_tpc_mask },
	{ NV2080_CTRL_CMD_BUS_GET_PCI_INFO, NV20_SUBDEVICE_0,
	  sizeof(struct nv2080_ctrl_bus_get_pci_info_params), nvstub_ctrl_pci_info },
	{ NV0080_CTRL_CMD_GPU_GET_VIRTUALIZATION_MODE, NV01_DEVICE_0,
	  sizeof(struct nv0080_ctrl_gpu_get_virtualization_mode_params), nvstub_ctrl_virt_mode },
	{ NV0080_CTRL_CMD_FIFO_GET_CHANNELLIST, NV01_DEVICE_0,
	  sizeof(struct nv0080_ctrl_fifo_get_channellist_params),
	  nvstub_ctrl_channellist },
	{ NV2080_CTRL_CMD_GPU_GET_PIDS, NV20_SUBDEVICE_0,
	  sizeof(struct nv2080_ctrl_gpu_get_pids_params), nvstub_ctrl_get_pids },
	{ NV2080_CTRL_CMD_GPU_GET_PID_INFO, NV20_SUBDEVICE_0,
	  sizeof(struct nv2080_ctrl_gpu_get_pid_info_params), nvstub_ctrl_get_pid_info },
	/* ctrla06fgpfifo.h, on any channel class (NVSTUB_ANY_CHANNEL) */
	{ NVA06F_CTRL_CMD_BIND, NVSTUB_ANY_CHANNEL, sizeof(u32), nvstub_ctrl_chan_bind },
	{ NVA06F_CTRL_CMD_GPFIFO_SCHEDULE, NVSTUB_ANY_CHANNEL, NVSTUB_A06F_SCHEDULE_PARAMS_SIZE,
	  nvstub_ctrl_chan_schedule },
	/*
	 * ctrl9096.h on GF100_ZBC_CLEAR: the ZBC table writes, exported
	 * NON_PRIVILEGED and routed to physical RM (g_zbc_api_nvoc.c flags
	 * 0x10248 / 0x48): any client's write is taken. The stand-in keeps no table.
	 */
	{ NV9096_CTRL_CMD_SET_ZBC_COLOR_CLEAR, GF100_ZBC_CLEAR, 40, nvstub_ctrl_ok },
	{ NV9096_CTRL_CMD_SET_ZBC_DEPTH_CLEAR, GF100_ZBC_CLEAR, 12, nvstub_ctrl_ok },
	{ NV9096_CTRL_CMD_SET_ZBC_CLEAR_TABLE, GF100_ZBC_CLEAR, 60, nvstub_ctrl_ok },
	{ NV9096_CTRL_CMD_SET_ZBC_STENCIL_CLEAR, GF100_ZBC_CLEAR, 12, nvstub_ctrl_ok },
};

const unsigned int nvstub_ctrl_count = ARRAY_SIZE(nvstub_ctrls);

u32 nvstub_ctrl_cmd(unsigned int i)
{
	return nvstub_ctrls[i].cmd;
}

static const struct nvstub_ctrl *nvstub_ctrl_find(u32 cmd)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(nvstub_ctrls); i++)
		if (nvstub_ctrls[i].cmd == cmd)
			return &nvstub_ctrls[i];
	return NULL;
}

/*
 * NV_ESC_RM_CONTROL (NVOS54). Called without nvstub_lock: the params are read
 * before it is taken (see the top of this file); a fault reading or writing
 * them is NV_ERR_INVALID_ADDRESS (os-interface.c os_memcpy_from/to_user).
 */
int nvstub_esc_control(struct nvstub_file *nf, void *arg, u32 size)
{
	struct nvos54_params *p = arg;
	const struct nvstub_ctrl *c;
	struct nvstub_ctrl_ctx ctx = { .nf = nf };
	void __user *uparams;
	void *params;
	u32 st, psize;

	if (size != sizeof(*p) || !nvstub_is_ctl(nf))
		return -EINVAL;
	/* serverutilGetClientUnderLock: does the client exist at all? */
	if (!nvstub_client_get(p->h_client)) {
		p->status = NV_ERR_INVALID_CLIENT;
		return 0;
	}
	c = nvstub_ctrl_find(p->cmd);
	if (!c) {
		p->status = NV_ERR_NOT_SUPPORTED;	/* not modelled */
		return 0;
	}
	uparams = u64_to_user_ptr(p->params);
	/* 535's GET_EXPORT_OBJECT_INFO is shorter (struct nvstub_table) */
	psize = p->cmd == NV0000_CTRL_CMD_OS_UNIX_GET_EXPORT_OBJECT_INFO ?
		nvstub_abi->export_object_info_size : c->params_size;
	if (p->params_size != psize || !uparams) {
		p->status = NV_ERR_INVALID_ARGUMENT;
		return 0;
	}
	params = kzalloc(c->params_size, GFP_KERNEL);
	if (!params) {
		p->status = NV_ERR_INSUFFICIENT_RESOURCES;
		return 0;
	}
	nvstub_race_delay();	/* TEST ONLY, see nvstub_main.c */
	if (copy_from_user(params, uparams, psize)) {
		p->status = NV_ERR_INVALID_ADDRESS;
		goto out;
	}
	mutex_lock(&nvstub_lock);
	ctx.cl = nvstub_client_validate(nf, p->h_client, &st);
	if (!ctx.cl)
		goto unlock;
	ctx.obj = nvstub_obj_get(ctx.cl, p->h_object);
	if (!ctx.obj) {
		st = NV_ERR_INVALID_OBJECT_HANDLE;
		goto unlock;
	}
	/*
	 * An object invalidated as a dependant of a freed one (nvstub_rm.c
	 * nvstub_obj_free()): 580.142 rs_server.c:1556-1559 serverControl,
	 * before the command's lookup in the object's class.
	 */
	if (ctx.obj->invalidated) {
		st = NV_ERR_RESOURCE_LOST;
		goto unlock;
	}
	if (c->obj_cls != ctx.obj->cls &&
	    !(c->obj_cls == NVSTUB_ANY_CHANNEL && ctx.obj->chan)) {
		st = NV_ERR_NOT_SUPPORTED;
		goto unlock;
	}
	st = c->fn(&ctx, params);
unlock:
	mutex_unlock(&nvstub_lock);
	if (st == NV_OK && copy_to_user(uparams, params, psize))
		st = NV_ERR_INVALID_ADDRESS;
	p->status = st;
out:
	kfree(params);
	return 0;
}
