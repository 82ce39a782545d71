/* SPDX-License-Identifier: GPL-2.0 */
/*
 * trace.h - gpuslice tracepoints (events gpuslice:gpuslice_ioctl and
 * gpuslice:gpuslice_refusal). Tools (tools/ bcc scripts) read the fields by
 * these exact names; change them only together with the tools.
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM gpuslice

#if !defined(_GPUSLICE_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define _GPUSLICE_TRACE_H

#include <linux/tracepoint.h>
#include <linux/version.h>

/* __assign_str() takes the source from __string() alone from 6.10 */
#ifndef gs_assign_str
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 10, 0)
#define gs_assign_str(field, src) __assign_str(field)
#else
#define gs_assign_str(field, src) __assign_str(field, src)
#endif
#endif

/*
 * Every interposed ioctl: drv_ns inside the real driver, total_ns in all.
 * file_kind is enum gs_file_kind (core/core.h): escape is the _IOC_NR of an
 * RM call on nvidiactl/nvidia<N> but the whole request of an nvidia-uvm call,
 * and the two number spaces overlap.
 */
TRACE_EVENT(gpuslice_ioctl,
	TP_PROTO(u32 inst_id, const char *inst, u32 pid, u32 file_kind, u32 escape,
		 u32 what, u32 status, u32 refusal, u64 drv_ns, u64 total_ns),
	TP_ARGS(inst_id, inst, pid, file_kind, escape, what, status, refusal, drv_ns,
		total_ns),
	TP_STRUCT__entry(
		__field(u32, inst_id)
		__string(inst, inst)
		__field(u32, pid)
		__field(u32, file_kind)
		__field(u32, escape)
		__field(u32, what)
		__field(u32, status)
		__field(u32, refusal)
		__field(u64, drv_ns)
		__field(u64, total_ns)
	),
	TP_fast_assign(
		__entry->inst_id = inst_id;
		gs_assign_str(inst, inst);
		__entry->pid = pid;
		__entry->file_kind = file_kind;
		__entry->escape = escape;
		__entry->what = what;
		__entry->status = status;
		__entry->refusal = refusal;
		__entry->drv_ns = drv_ns;
		__entry->total_ns = total_ns;
	),
	TP_printk("inst=%u/%s pid=%u kind=%u escape=0x%x what=0x%x status=0x%x refusal=%u drv_ns=%llu total_ns=%llu",
		  __entry->inst_id, __get_str(inst), __entry->pid,
		  __entry->file_kind, __entry->escape,
		  __entry->what, __entry->status, __entry->refusal,
		  __entry->drv_ns, __entry->total_ns)
);

/* Every call the core refused (enum gs_refusal in core/core.h). */
TRACE_EVENT(gpuslice_refusal,
	TP_PROTO(u32 inst_id, const char *inst, u32 pid, u32 file_kind, u32 escape,
		 u32 what, u32 refusal, u32 status, u64 size),
	TP_ARGS(inst_id, inst, pid, file_kind, escape, what, refusal, status, size),
	TP_STRUCT__entry(
		__field(u32, inst_id)
		__string(inst, inst)
		__field(u32, pid)
		__field(u32, file_kind)
		__field(u32, escape)
		__field(u32, what)
		__field(u32, refusal)
		__field(u32, status)
		__field(u64, size)
	),
	TP_fast_assign(
		__entry->inst_id = inst_id;
		gs_assign_str(inst, inst);
		__entry->pid = pid;
		__entry->file_kind = file_kind;
		__entry->escape = escape;
		__entry->what = what;
		__entry->refusal = refusal;
		__entry->status = status;
		__entry->size = size;
	),
	TP_printk("inst=%u/%s pid=%u kind=%u escape=0x%x what=0x%x refusal=%u status=0x%x size=%llu",
		  __entry->inst_id, __get_str(inst), __entry->pid,
		  __entry->file_kind, __entry->escape,
		  __entry->what, __entry->refusal, __entry->status, __entry->size)
);

#endif /* _GPUSLICE_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE trace
#include <trace/define_trace.h>
