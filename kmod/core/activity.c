// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * activity.c - whether a channel has submitted work, from its USERD.
 *
 * A process submits by writing GPFIFO entries and then its channel's GPPut
 * in the channel's USERD (Nvc86fControl, src/common/sdk/nvidia/inc/class/
 * clc86f.h, branch 580: GPGet at byte 0x88, GPPut at 0x8c), which it maps
 * into its own address space; no ioctl is made. GPGet is the PBDMA's fetch
 * pointer. So, for one 8-byte load per channel (about 1 us over BAR1 on an
 * H100, docs/h100-userd.md):
 *
 *   submitted = GPPut moved since the last look, or GPGet != GPPut
 *
 * This is a submission signal, not a "running" one; the controller holds an
 * instance busy for a while after its last report (pyctl/gpuslice/sched/probes.py,
 * SubmitProbe). Both samplers use it: the user-space build's reporter thread
 * (preload/userd.c) and the module's (kmod/activity.c). The word is what the
 * process wrote: it decides only its own channel's report.
 *
 * Where USERD is: the channel's NV_CHANNEL_ALLOC_PARAMS name a memory object
 * (hUserdMemory[0]) and an offset into it (userdOffset[0]); hUserdMemory[0]
 * == 0 is RM's own USERD, which a client maps through the channel's handle
 * at offset 0 (kernel_channel.c kchannelMap_IMPL). gs_post_alloc() records
 * the pair on the channel's object (struct gs_object userd_mem, userd_off).
 */
#include "core_int.h"

int gs_userd_locate(nv_u64 ch_off, nv_u64 map_off, nv_u64 map_len, nv_u64 *at)
{
	if (ch_off < map_off || ch_off - map_off > map_len ||
	    map_len - (ch_off - map_off) < GS_USERD_SIZE)
		return 0;
	*at = ch_off - map_off + GS_USERD_GPGET;
	return 1;
}

int gs_userd_seen(struct gs_userd_seen *s, nv_u64 word, nv_u32 entries, nv_u64 now)
{
	return gs_userd_seen_every(s, word, entries, now, GS_WORK_REPEAT_NS);
}

int gs_userd_seen_every(struct gs_userd_seen *s, nv_u64 word, nv_u32 entries, nv_u64 now,
			nv_u64 repeat_ns)
{
	nv_u32 get = (nv_u32)word, put = (nv_u32)(word >> 32);

	if (get >= entries || put >= entries)
		return 0;	/* not a USERD we understand: no evidence */
	if (!s->primed) {
		s->primed = 1;	/* the first look sets where GPPut was */
		s->last_put = put;
		return 0;
	}
	if (put == s->last_put && get == put) {
		s->sent_ns = 0;
		return 0;
	}
	s->last_put = put;
	if (s->sent_ns && now - s->sent_ns < repeat_ns)
		return 0;
	s->sent_ns = now ? now : 1;
	return 1;
}
