// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * virt.c - replies rewritten so that an instance sees its own memory.
 *
 * cuMemGetInfo / cudaMemGetInfo / torch.cuda.mem_get_info read total and free
 * from NV2080_CTRL_CMD_FB_GET_INFO_V2 (ctrl2080fb.h): in the traces CUDA asks
 * for HEAP_FREE (0x16), HEAP_SIZE (0x9) and FB_TAX (0x10) right before and
 * after its allocations, and nvidia-smi for HEAP_FREE, TOTAL_RAM_SIZE (0x8)
 * and HEAP_SIZE. The values are KiB. Sizes become min(real, limit); free
 * becomes min(real free, limit - used), never more than the GPU really has.
 */
#include "core_int.h"

static nv_u32 gs_min_kib(nv_u32 real, nv_u64 bytes)
{
	nv_u64 kib = bytes >> 10;

	return kib < real ? (nv_u32)kib : real;
}

/* called with in->lock held */
void gs_virt_control_post(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
			  const struct nvos54_params *p)
{
	struct nv2080_ctrl_fb_get_info_v2_params *fp;
	nv_u64 room = in->used < in->limit ? in->limit - in->used : 0;
	nv_u32 i, n, len;

	if (!io || p->cmd != NV2080_CTRL_CMD_FB_GET_INFO_V2 || p->status != NV_OK)
		return;
	if (p->params_size < sizeof(nv_u32) || !p->params)
		return;
	fp = gs_zalloc(sizeof(*fp));
	if (!fp)
		return;
	len = p->params_size < sizeof(*fp) ? p->params_size : sizeof(*fp);
	if (io->read(io->ctx, p->params, fp, len))
		goto out;
	n = fp->fb_info_list_size;
	if (n > (len - sizeof(nv_u32)) / sizeof(fp->fb_info_list[0]))
		n = (len - sizeof(nv_u32)) / sizeof(fp->fb_info_list[0]);
	for (i = 0; i < n; i++) {
		struct nv2080_ctrl_fb_info *e = &fp->fb_info_list[i];

		switch (e->index) {
		case NV2080_CTRL_FB_INFO_INDEX_RAM_SIZE:
		case NV2080_CTRL_FB_INFO_INDEX_TOTAL_RAM_SIZE:
		case NV2080_CTRL_FB_INFO_INDEX_HEAP_SIZE:
		case NV2080_CTRL_FB_INFO_INDEX_USABLE_RAM_SIZE:
		case NV2080_CTRL_FB_INFO_INDEX_MAPPABLE_HEAP_SIZE:
			e->data = gs_min_kib(e->data, in->limit);
			break;
		case NV2080_CTRL_FB_INFO_INDEX_HEAP_FREE:
		case NV2080_CTRL_FB_INFO_INDEX_LARGEST_FREE_REGION_SIZE_KB:
			e->data = gs_min_kib(e->data, room);
			break;
		}
	}
	io->write(io->ctx, p->params, fp, len);
	c->priv[1] = 1;		/* rewritten, for tracing */
out:
	gs_free(fp);
}
