// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * filter.c - what a process in an instance may ask RM for, as tables.
 *
 * Deny by default. A container must not reach what it does not need, and the
 * RM interface is large (about 1400 controls on 580) and grows with every
 * driver: a control added by NVIDIA tomorrow must not become reachable before
 * someone has looked at it. So every control and class the core knows is a
 * row here (nvproxy's version.go is the model): the container capability it
 * is for (compute, utility, graphics, video: libnvidia-container's names), why
 * it is allowed or refused, for a refusal the status the caller gets, and the
 * handler that decides and accounts for it beyond that (core.c, export.c,
 * virt.c). core.c's dispatcher looks the call up here and does what the row
 * says, so a control's or class's whole story is its row and its handler.
 *
 * Where the allowed rows come from: what CUDA, PyTorch and nvidia-smi issue in
 * the three recorded traces (tests/traces: d = cuda-driver-alloc,
 * s = nvidia-smi-q, t = torch-matmul), plus (h) what runs on the H100 showed
 * missing (docs/real-gpu.md, docs/compat.md) and (p) peer access between an
 * instance's GPUs, from the 580 source and nvproxy's compute set
 * (docs/multigpu.md); g and v: what headless OpenGL (EGL) and Vulkan (g), and
 * NVDEC and NVJPG decoding (v) issue on the H100 (tests/traces/
 * render-video-h100.jsonl, docs/render-video.md), each reviewed against the
 * 580 source.
 *
 * A refusal is answered the way RM answers when the feature is absent or not
 * permitted, so that libraries take the fallback they take without us
 * (docs/compat.md): a control on no row NV_ERR_NOT_SUPPORTED (RM's answer for
 * a control the object does not have), a class on no row NV_ERR_INVALID_CLASS
 * (a class RM does not have), a refused row its own status. Every refusal is
 * counted and reported in the events, so a workload that needs more is seen at
 * once and the tables grow by review. tests/test_filter_lists.py checks every
 * row against NVIDIA's 580 source (it exists; no allowed control carries
 * RMCTRL_FLAGS_PRIVILEGED) and that the rows still cover the traces.
 *
 * Escapes that core.c does not decode itself pass only from gs_plain_escapes;
 * the rest fail with EPERM (GS_REFUSE_ESCAPE), among them IOCTL_XFER_CMD, which
 * wraps another escape whose block the core would not see, and the legacy
 * EXPORT/IMPORT escapes (the OS_UNIX controls are the way, export.c).
 */
#include "core_int.h"

/*
 * Each row: what it is, which container capability needs it (the names of
 * libnvidia-container and nvproxy: compute, utility, graphics, video), and why
 * it is allowed or refused. Where the letters come from: the header comment.
 * Sorted by cmd (gs_control_row() searches it).
 */
static const struct gs_control_row gs_allowed_controls[] = {
	{ 0x00000101, GS_CAP_COMPUTE, "dst: NV0000_SYSTEM_GET_BUILD_VERSION: driver build/version strings; read-only, host-wide constant", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000102, GS_CAP_GRAPHICS, "g: NV0000_SYSTEM_GET_CPU_INFO: host CPU type and features; read-only, host-wide constant", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000127, GS_CAP_COMPUTE, "p: NV0000_SYSTEM_GET_P2P_CAPS: read-only, peer access between the instance's GPUs", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x0000012b, GS_CAP_COMPUTE, "p: NV0000_SYSTEM_GET_P2P_CAPS_V2: read-only, as above", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x0000013a, GS_CAP_COMPUTE, "dt: NV0000_SYSTEM_GET_P2P_CAPS_MATRIX: P2P capability matrix between GPU pairs; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x000001f0, GS_CAP_COMPUTE, "dt: NV0000_SYSTEM_GET_FEATURES: system feature bits; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000201, GS_CAP_COMPUTE, "dst: NV0000_GPU_GET_ATTACHED_IDS: ids of attached GPUs; read-only (lists every attached GPU, not only the instance's)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000202, GS_CAP_COMPUTE, "dst: NV0000_GPU_GET_ID_INFO: id/minor/flags of one GPU id; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000204, GS_CAP_GRAPHICS, "g: NV0000_GPU_GET_DEVICE_IDS: PCI device ids of the attached GPUs; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000205, GS_CAP_COMPUTE, "dst: NV0000_GPU_GET_ID_INFO_V2: same, v2 (maps device instance to minor); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000214, GS_CAP_COMPUTE, "dst: NV0000_GPU_GET_PROBED_IDS: ids of probed GPUs; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000215, GS_CAP_COMPUTE, "dst: NV0000_GPU_ATTACH_IDS: attaches (initialises) GPUs in RM; what opening a device does anyway; idempotent", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000216, GS_CAP_UTILITY, "s: NV0000_GPU_DETACH_IDS: no-op on Linux in 580 (only validates the ids; client_resource.c)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x0000021b, GS_CAP_COMPUTE, "st: NV0000_GPU_GET_PCI_INFO: PCI ids of a GPU; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000275, GS_CAP_GRAPHICS, "g: NV0000_GPU_GET_UUID_FROM_GPU_ID: the UUID of a GPU id; read-only (as GET_GID_INFO)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000279, GS_CAP_COMPUTE, "st: NV0000_GPU_QUERY_DRAIN_STATE: reads drain state; read-only (MODIFY_DRAIN_STATE refused as GLOBAL)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x0000027b, GS_CAP_COMPUTE, "dt: NV0000_GPU_GET_MEMOP_ENABLE: memop enable flag; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000288, GS_CAP_COMPUTE, "dt: NV0000_GPU_GET_ACTIVE_DEVICE_IDS: active device ids; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000289, GS_CAP_COMPUTE, "st: NV0000_GPU_ASYNC_ATTACH_ID: starts an asynchronous attach, as ATTACH_IDS", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000301, GS_CAP_GRAPHICS, "g: NV0000_GSYNC_GET_ATTACHED_IDS: ids of attached G-Sync boards (none on the H100); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000a04, GS_CAP_COMPUTE, "dt: NV0000_SYNC_GPU_BOOST_GROUP_INFO: SLI/boost group info; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000b02, GS_CAP_UTILITY, "s: NV0000_GPUACCT_GET_ACCOUNTING_STATE: whether accounting mode is on; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000d01, GS_CAP_COMPUTE, "dst: NV0000_CLIENT_GET_ADDR_SPACE_TYPE: address-space type of a handle of the caller's own client; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00000d04, GS_CAP_COMPUTE, "dt: NV0000_CLIENT_SET_INHERITED_SHARE_POLICY: share policy of the caller's own client (CUDA shares DUP and DEBUG with same-PID clients only, decoded from the traces)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00003d05, GS_CAP_COMPUTE, "h: NV0000_OS_UNIX_EXPORT_OBJECT_TO_FD: cuMemExportToShareableHandle; the fd must be a nvidiactl node of the caller's instance (export.c)", GS_REFUSE_NONE, NV_OK, &gs_export_handler },
	{ 0x00003d06, GS_CAP_COMPUTE, "h: NV0000_OS_UNIX_IMPORT_OBJECT_FROM_FD: cuMemImportFromShareableHandle, from a file of the caller's instance (export.c)", GS_REFUSE_NONE, NV_OK, &gs_export_handler },
	{ 0x00003d08, GS_CAP_COMPUTE, "h: NV0000_OS_UNIX_GET_EXPORT_OBJECT_INFO: what a file of the caller's instance holds (export.c)", GS_REFUSE_NONE, NV_OK, &gs_export_handler },
	{ 0x00003d0b, GS_CAP_COMPUTE, "h: NV0000_OS_UNIX_EXPORT_OBJECTS_TO_FD: NCCL's cuMem path, as EXPORT_OBJECT_TO_FD (export.c)", GS_REFUSE_NONE, NV_OK, &gs_export_handler },
	{ 0x00003d0c, GS_CAP_COMPUTE, "h: NV0000_OS_UNIX_IMPORT_OBJECTS_FROM_FD: as IMPORT_OBJECT_FROM_FD (export.c)", GS_REFUSE_NONE, NV_OK, &gs_export_handler },
	{ 0x00410110, GS_CAP_COMPUTE, "h: NV0041_GET_SURFACE_INFO: cuMemImportFromShareableHandle on the H100; a read-only query of the caller's memory object (attributes, size, page size, aperture), non-privileged, in nvproxy's compute set", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00800201, GS_CAP_VIDEO, "v: NV0080_GPU_GET_CLASSLIST: class list of the device (v1); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00800280, GS_CAP_COMPUTE, "dt: NV0080_GPU_GET_NUM_SUBDEVICES: number of subdevices; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00800288, GS_CAP_UTILITY, "s: NV0080_GPU_QUERY_SW_STATE_PERSISTENCE: reads persistence mode; read-only (MODIFY refused as GLOBAL)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00800289, GS_CAP_COMPUTE, "dst: NV0080_GPU_GET_VIRTUALIZATION_MODE: virtualization mode; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00800292, GS_CAP_COMPUTE, "dst: NV0080_GPU_GET_CLASSLIST_V2: class list of the device; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801102, GS_CAP_GRAPHICS, "g: NV0080_GR_GET_CAPS: graphics caps; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801104, GS_CAP_GRAPHICS, "g: NV0080_GR_GET_INFO: graphics info table; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801109, GS_CAP_VIDEO, "v: NV0080_GR_GET_CAPS_V2: graphics caps v2; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801301, GS_CAP_GRAPHICS, "g: NV0080_FB_GET_CAPS: FB caps (v1); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801307, GS_CAP_COMPUTE, "dt: NV0080_FB_GET_CAPS_V2: FB caps; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801402, GS_CAP_COMPUTE, "dt: NV0080_HOST_GET_CAPS_V2: host caps; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801701, GS_CAP_GRAPHICS, "g: NV0080_FIFO_GET_CAPS: FIFO caps (v1); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801707, GS_CAP_GRAPHICS, "g: NV0080_FIFO_GET_ENGINE_CONTEXT_PROPERTIES: context buffer sizes per engine; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x0080170d, GS_CAP_COMPUTE, "dt: NV0080_FIFO_GET_CHANNELLIST: channel ids for handles of the caller's own client; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801713, GS_CAP_VIDEO, "v: NV0080_FIFO_GET_CAPS_V2: FIFO caps; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801806, GS_CAP_GRAPHICS, "g: NV0080_DMA_ADV_SCHED_GET_VA_CAPS: VA space caps; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x0080180d, GS_CAP_GRAPHICS, "g: NV0080_DMA_GET_CAPS: DMA caps; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801909, GS_CAP_COMPUTE, "dt: NV0080_PERF_CUDA_LIMIT_SET_CONTROL: GPU-wide 'CUDA running' perf limit, but refcounted per device object and dropped when it is freed (kern_cuda_limit.c); every CUDA context issues it", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801c02, GS_CAP_GRAPHICS | GS_CAP_VIDEO, "v: NV0080_BSP_GET_CAPS_V2: video decoder caps (Vulkan asks too: NOT_SUPPORTED where there is no NVDEC); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00801f02, GS_CAP_VIDEO, "v: NV0080_NVJPG_GET_CAPS_V2: JPEG engine caps; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00da0002, GS_CAP_GRAPHICS, "g: NV_SEMAPHORE_SURFACE_BIND_CHANNEL: binds a channel of the caller's client (RM looks hChannel up there) to the caller's own semaphore surface", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00da0006, GS_CAP_GRAPHICS, "g: NV_SEMAPHORE_SURFACE_UNBIND_CHANNEL: undoes BIND_CHANNEL", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x00de0001, GS_CAP_UTILITY, "s: NV00DE_REQUEST_DATA_POLL: asks RM to refresh the caller's user-shared-data page (read-only telemetry)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800102, GS_CAP_COMPUTE, "dst: NV2080_GPU_GET_INFO_V2: GPU info table; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800110, GS_CAP_COMPUTE, "dst: NV2080_GPU_GET_NAME_STRING: GPU name; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800111, GS_CAP_COMPUTE, "dt: NV2080_GPU_GET_SHORT_NAME_STRING: short name; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800119, GS_CAP_COMPUTE, "dt: NV2080_GPU_GET_SIMULATION_INFO: simulation info; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800123, GS_CAP_GRAPHICS, "g: NV2080_GPU_GET_ENGINES: engine list (v1); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080012f, GS_CAP_COMPUTE, "dst: NV2080_GPU_QUERY_ECC_STATUS: ECC status/counters; read-only, GPU-wide", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800131, GS_CAP_COMPUTE, "dst: NV2080_GPU_QUERY_COMPUTE_MODE_RULES: reads compute mode; read-only (SET refused as GLOBAL)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800133, GS_CAP_UTILITY, "s: NV2080_GPU_QUERY_ECC_CONFIGURATION: reads ECC config; read-only (SET refused as GLOBAL)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080013f, GS_CAP_UTILITY, "s: NV2080_GPU_GET_OEM_BOARD_INFO: OEM board info; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800142, GS_CAP_GRAPHICS, "g: NV2080_GPU_GET_ID: the GPU id of the subdevice; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800145, GS_CAP_COMPUTE, "dt: NV2080_GPU_ACQUIRE_COMPUTE_MODE_RESERVATION: ACQUIRE_COMPUTE_MODE_RESERVATION: records the caller's client as holder; no effect in DEFAULT compute mode, first-caller-wins in EXCLUSIVE modes (GPU-wide); a shared GPU must stay in DEFAULT (SET_COMPUTE_MODE_RULES refused)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800146, GS_CAP_VIDEO, "v: NV2080_GPU_RELEASE_COMPUTE_MODE_RESERVATION: releases the caller's own ACQUIRE_COMPUTE_MODE_RESERVATION", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800147, GS_CAP_GRAPHICS, "g: NV2080_GPU_GET_ENGINE_PARTNERLIST: which engines can share a channel; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080014a, GS_CAP_COMPUTE, "dst: NV2080_GPU_GET_GID_INFO: GPU UUID; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080014b, GS_CAP_UTILITY, "s: NV2080_GPU_GET_INFOROM_OBJECT_VERSION: InfoROM object version; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800156, GS_CAP_UTILITY, "s: NV2080_GPU_GET_INFOROM_IMAGE_VERSION: InfoROM image version; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800157, GS_CAP_UTILITY, "s: NV2080_GPU_QUERY_INFOROM_ECC_SUPPORT: InfoROM ECC support; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080016d, GS_CAP_UTILITY, "s: NV2080_GPU_GET_NVENC_SW_SESSION_STATS: GET_NVENC_SW_SESSION_STATS: aggregate encoder-session counts of the GPU; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800170, GS_CAP_COMPUTE, "dt: NV2080_GPU_GET_ENGINES_V2: engine list; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080017b, GS_CAP_UTILITY, "s: NV2080_GPU_GET_NVFBC_SW_SESSION_STATS: GET_NVFBC_SW_SESSION_STATS: aggregate NvFBC counts; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080018d, GS_CAP_UTILITY, "s: NV2080_GPU_GET_PIDS: pids using the GPU: reaches other clients' pids, so virt.c rewrites the reply to the instance's own", GS_REFUSE_NONE, NV_OK, &gs_virt_handler },
	{ 0x2080018e, GS_CAP_UTILITY, "h: NV2080_GPU_GET_PID_INFO: NVML on PyTorch's OOM path", GS_REFUSE_NONE, NV_OK, &gs_virt_handler },
	{ 0x20800195, GS_CAP_COMPUTE, "dt: NV2080_GPU_GET_COMPUTE_POLICY_CONFIG: compute policy config; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x208001a3, GS_CAP_COMPUTE, "dst: NV2080_GET_GPU_FABRIC_PROBE_INFO: fabric probe state; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x208001a4, GS_CAP_UTILITY, "s: NV2080_GPU_GET_CHIP_DETAILS: chip details; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x208001b2, GS_CAP_UTILITY, "s: NV2080_GPU_GET_RECOVERY_ACTION: recommended recovery action; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800301, GS_CAP_GRAPHICS, "g: NV2080_EVENT_SET_NOTIFICATION: arms the caller's own event objects on its subdevice", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800403, GS_CAP_GRAPHICS, "g: NV2080_TIMER_GET_TIME: the GPU's timer; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800406, GS_CAP_COMPUTE, "st: NV2080_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO: GPU/CPU timestamp correlation; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20800802, GS_CAP_UTILITY, "s: NV2080_BIOS_GET_INFO: VBIOS info (legacy, converted by RM); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801201, GS_CAP_COMPUTE, "dt: NV2080_GR_GET_INFO: GR info table; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801206, GS_CAP_GRAPHICS, "g: NV2080_GR_GET_ZCULL_INFO: zcull geometry; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801208, GS_CAP_GRAPHICS, "g: NV2080_GR_CTXSW_ZCULL_BIND: zcull mode of a channel: its hClient must be the caller's (engines.c)", GS_REFUSE_NONE, NV_OK, &gs_zcull_handler },
	{ 0x20801210, GS_CAP_COMPUTE, "dt: NV2080_GR_SET_CTXSW_PREEMPTION_MODE: preemption mode of the caller's own channel/context", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801218, GS_CAP_COMPUTE, "dt: NV2080_GR_GET_CTX_BUFFER_SIZE: context buffer sizes; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080121b, GS_CAP_COMPUTE, "dt: NV2080_GR_GET_GLOBAL_SM_ORDER: SM ordering; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801227, GS_CAP_COMPUTE, "dt: NV2080_GR_GET_CAPS_V2: GR caps; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080122a, GS_CAP_COMPUTE, "dt: NV2080_GR_GET_GPC_MASK: GPC mask; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080122b, GS_CAP_COMPUTE, "dt: NV2080_GR_GET_TPC_MASK: TPC mask; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801230, GS_CAP_COMPUTE, "dt: NV2080_GR_GET_SM_ISSUE_RATE_MODIFIER: SM issue-rate modifiers; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801301, GS_CAP_GRAPHICS, "g: NV2080_FB_GET_INFO: FB sizes (v1); OpenGL and Vulkan do not start without it. RM's figures for the whole GPU reach the caller: the list is behind a pointer inside the parameters, which the core cannot reach to rewrite as it rewrites V2's (docs/isolation.md)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801303, GS_CAP_COMPUTE, "dst: NV2080_FB_GET_INFO_V2: FB sizes; virtualized by virt.c (total/free capped at the instance limit)", GS_REFUSE_NONE, NV_OK, &gs_virt_handler },
	{ 0x20801315, GS_CAP_GRAPHICS, "g: NV2080_FB_GET_GPU_CACHE_INFO: L2 configuration; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801320, GS_CAP_GRAPHICS, "g: NV2080_FB_GET_FB_REGION_INFO: the FB's static region layout (not its use); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801322, GS_CAP_UTILITY, "s: NV2080_FB_GET_OFFLINED_PAGES: offlined (retired) pages; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801352, GS_CAP_GRAPHICS, "g: NV2080_FB_GET_SEMAPHORE_SURFACE_LAYOUT: semaphore surface layout; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801357, GS_CAP_UTILITY, "s: NV2080_FB_QUERY_DRAM_ENCRYPTION_INFOROM_SUPPORT: DRAM-encryption InfoROM support; read-only (RM answers NOT_SUPPORTED on H100)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801701, GS_CAP_COMPUTE, "dst: NV2080_MC_GET_ARCH_INFO: architecture/implementation ids; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801702, GS_CAP_COMPUTE, "h: NV2080_MC_SERVICE_INTERRUPTS: CUDA, channels stalled", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801801, GS_CAP_COMPUTE, "dst: NV2080_BUS_GET_PCI_INFO: PCI ids; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801802, GS_CAP_UTILITY, "s: NV2080_BUS_GET_INFO: bus info (legacy, converted by RM); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801803, GS_CAP_COMPUTE, "dt: NV2080_BUS_GET_PCI_BAR_INFO: BAR sizes; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801813, GS_CAP_UTILITY, "s: NV2080_BUS_GET_PEX_COUNTERS: PCIe error counters (GPU-wide aggregate); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801819, GS_CAP_UTILITY, "s: NV2080_BUS_GET_PEX_UTIL_COUNTERS: PCIe utilization counters (GPU-wide aggregate); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801823, GS_CAP_COMPUTE, "dt: NV2080_BUS_GET_INFO_V2: bus info v2; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801829, GS_CAP_UTILITY, "s: NV2080_BUS_GET_PCIE_REQ_ATOMICS_CAPS: PCIe requester atomics caps; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080182a, GS_CAP_COMPUTE, "dt: NV2080_BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS: supported GPU atomics over PCIe; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080182b, GS_CAP_COMPUTE, "dst: NV2080_BUS_GET_C2C_INFO: C2C link info; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20801830, GS_CAP_UTILITY, "s: NV2080_BUS_GET_PCIE_CPL_ATOMICS_CAPS: PCIe completer atomics caps; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080200a, GS_CAP_COMPUTE, "dt: NV2080_PERF_BOOST: clock-boost request of bounded duration: GPU clocks, but held per subdevice and dropped on free; every CUDA context issues it", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080220c, GS_CAP_COMPUTE, "dt: NV2080_RC_RELEASE_WATCHDOG_REQUESTS: drops the caller's own watchdog requests", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20802210, GS_CAP_COMPUTE, "dt: NV2080_RC_SOFT_DISABLE_WATCHDOG: soft-disables the RC watchdog: GPU-wide, but counted per client request and released with it; every CUDA context issues it", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20802a02, GS_CAP_GRAPHICS, "g: NV2080_CE_GET_CE_PCE_MASK: copy-engine mapping; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20802a03, GS_CAP_GRAPHICS, "g: NV2080_CE_GET_CAPS_V2: copy-engine caps; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20802a0a, GS_CAP_COMPUTE, "dt: NV2080_CE_GET_ALL_CAPS: copy-engine caps; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20803001, GS_CAP_COMPUTE, "h: NV2080_NVLINK_GET_NVLINK_CAPS: refused for a workload on the H100; read-only, non-privileged, in nvproxy's compute set (docs/allowlist.md)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20803002, GS_CAP_COMPUTE, "dt: NV2080_NVLINK_GET_NVLINK_STATUS: NVLink link state; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20803083, GS_CAP_UTILITY, "s: NV2080_NVLINK_GET_PLATFORM_INFO: NVLink platform info; read-only (RM flags: non-privileged)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20803404, GS_CAP_UTILITY, "s: NV2080_ECC_GET_REPAIR_STATUS: ECC row-remapping/repair status; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20803406, GS_CAP_UTILITY, "s: NV2080_ECC_GET_UNREPAIRABLE_MEMORY_FLAG: ECC_GET_UNREPAIRABLE_MEMORY_FLAG (named in the 590 SDK; absent from 580.142's tables, answered OK by 580.159); read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20803601, GS_CAP_COMPUTE, "dst: NV2080_GSP_GET_FEATURES: GSP feature bits; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20803801, GS_CAP_COMPUTE, "dt: NV2080_GRMGR_GET_GR_FS_INFO: GR floorsweeping info; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20803d07, GS_CAP_GRAPHICS, "g: NV2080_OS_UNIX_VIDMEM_PERSISTENCE_STATUS: whether video memory survives suspend; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20808159, GS_CAP_COMPUTE, "dt: (undocumented) NV2080 GPU legacy, msg 0x59: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20808162, GS_CAP_COMPUTE, "dt: (undocumented) NV2080 GPU legacy, msg 0x62: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20808165, GS_CAP_VIDEO, "v: (undocumented) NV2080 GPU legacy, msg 0x65: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080852a, GS_CAP_UTILITY, "s: (undocumented) NV2080 THERMAL legacy, msg 0x2a: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080852b, GS_CAP_UTILITY, "s: (undocumented) NV2080 THERMAL legacy, msg 0x2b: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080852e, GS_CAP_UTILITY, "s: (undocumented) NV2080 THERMAL legacy, msg 0x2e: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080852f, GS_CAP_UTILITY, "s: (undocumented) NV2080 THERMAL legacy, msg 0x2f: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20808536, GS_CAP_UTILITY, "s: (undocumented) NV2080 THERMAL legacy, msg 0x36: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080853a, GS_CAP_UTILITY, "s: (undocumented) NV2080 THERMAL legacy, msg 0x3a: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20808542, GS_CAP_UTILITY, "s: (undocumented) NV2080 THERMAL legacy, msg 0x42: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20808546, GS_CAP_UTILITY, "s: (undocumented) NV2080 THERMAL legacy, msg 0x46: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20809001, GS_CAP_COMPUTE, "t: (undocumented) NV2080 CLK legacy, msg 0x01: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20809009, GS_CAP_COMPUTE, "st: (undocumented) NV2080 CLK legacy, msg 0x09: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20809019, GS_CAP_UTILITY, "s: (undocumented) NV2080 CLK legacy, msg 0x19: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20809038, GS_CAP_COMPUTE, "dst: (undocumented) NV2080 CLK legacy, msg 0x38: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20809064, GS_CAP_COMPUTE, "st: (undocumented) NV2080 CLK legacy, msg 0x64: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a026, GS_CAP_COMPUTE, "t: (undocumented) NV2080 PERF legacy, msg 0x26: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a028, GS_CAP_VIDEO, "v: (undocumented) NV2080 PERF legacy, msg 0x28: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a060, GS_CAP_UTILITY, "s: (undocumented) NV2080 PERF legacy, msg 0x60: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a06e, GS_CAP_UTILITY, "s: (undocumented) NV2080 PERF legacy, msg 0x6e: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a06f, GS_CAP_UTILITY, "s: (undocumented) NV2080 PERF legacy, msg 0x6f: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a080, GS_CAP_UTILITY, "s: (undocumented) NV2080 PERF legacy, msg 0x80: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a084, GS_CAP_COMPUTE, "t: (undocumented) NV2080 PERF legacy, msg 0x84: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a0a4, GS_CAP_UTILITY, "s: (undocumented) NV2080 PERF legacy, msg 0xa4: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a0a6, GS_CAP_UTILITY, "s: (undocumented) NV2080 PERF legacy, msg 0xa6: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a0a7, GS_CAP_UTILITY, "s: (undocumented) NV2080 PERF legacy, msg 0xa7: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a0a8, GS_CAP_UTILITY, "s: (undocumented) NV2080 PERF legacy, msg 0xa8: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a0d1, GS_CAP_GRAPHICS, "g: (undocumented) NV2080 PERF legacy, msg 0xd1: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a0f2, GS_CAP_UTILITY, "s: (undocumented) NV2080 PERF legacy, msg 0xf2: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a612, GS_CAP_UTILITY, "s: (undocumented) NV2080 PMGR legacy, msg 0x12: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a618, GS_CAP_UTILITY, "s: (undocumented) NV2080 PMGR legacy, msg 0x18: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x2080a63c, GS_CAP_UTILITY, "s: (undocumented) NV2080 PMGR legacy, msg 0x3c: GSS-legacy, non-privileged range (0x8000 set, 0x4000 clear), forwarded to GSP; not decodable from the source", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20810107, GS_CAP_GRAPHICS, "g: (undocumented) NV2081_BINAPI msg 0x0107: undocumented control on the caller's own NV2081_BINAPI object, forwarded to GSP (binapiControl)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20810108, GS_CAP_COMPUTE, "dst: (undocumented) NV2081_BINAPI msg 0x0108: undocumented control on the caller's own NV2081_BINAPI object, forwarded to GSP (binapiControl); issued by CUDA, PyTorch and nvidia-smi", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20810110, GS_CAP_UTILITY, "s: (undocumented) NV2081_BINAPI msg 0x0110: undocumented control on the caller's own NV2081_BINAPI object, forwarded to GSP (binapiControl); issued by nvidia-smi -q", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x20810111, GS_CAP_UTILITY, "s: (undocumented) NV2081_BINAPI msg 0x0111: undocumented control on the caller's own NV2081_BINAPI object, forwarded to GSP (binapiControl); issued by nvidia-smi -q", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x503c0102, GS_CAP_COMPUTE, "dt: NV503C_REGISTER_VA_SPACE: registers the caller's VA space with its own NV50_THIRD_PARTY_P2P object", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x503c0104, GS_CAP_COMPUTE, "dt: NV503C_REGISTER_VIDMEM: registers the caller's own video memory with its own P2P object", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x503c0105, GS_CAP_COMPUTE, "dt: NV503C_UNREGISTER_VIDMEM: undoes REGISTER_VIDMEM", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x83de0309, GS_CAP_COMPUTE, "dt: NV83DE_DEBUG_SET_EXCEPTION_MASK: exception mask on the caller's own debugger object; RM binds that object only to a compute object the caller may debug (owner or shared; CUDA shares DEBUG with same-PID clients only)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x906f0101, GS_CAP_COMPUTE, "dt: NV906F_CTRL_GET_CLASS_ENGINEID: engine id of the caller's own channel; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x90960103, GS_CAP_GRAPHICS, "g: NV9096_GET_ZBC_CLEAR_TABLE: reads the ZBC clear table (every SET is refused, so it holds RM's defaults only)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x90960106, GS_CAP_GRAPHICS, "g: NV9096_GET_ZBC_CLEAR_TABLE_SIZE: size of the ZBC table; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x90960107, GS_CAP_GRAPHICS, "g: NV9096_GET_ZBC_CLEAR_TABLE_ENTRY: one ZBC table entry; read-only (as GET_ZBC_CLEAR_TABLE)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x90e60102, GS_CAP_COMPUTE, "dt: NV90E6_MASTER_GET_VIRTUAL_FUNCTION_ERROR_CONT_INTR_MASK: VF error interrupt mask; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0x90e70113, GS_CAP_UTILITY, "s: NV90E7_BBX_GET_LAST_FLUSH_TIME: InfoROM BBX last flush time; read-only (RM answers 0x55 here)", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0xa06c0101, GS_CAP_COMPUTE, "dt: NVA06C_GPFIFO_SCHEDULE: puts the caller's own TSG on the runlist (bEnable=0 has no effect, docs/h100-findings.md); gating uses DISABLE_CHANNELS, which is refused", GS_REFUSE_NONE, NV_OK, &gs_schedule_handler },
	{ 0xa06c0103, GS_CAP_COMPUTE, "dt: NVA06C_SET_TIMESLICE: CUDA's own 2048 us at every context; a TSG's timeslice is the operator's (the instance's TIMESLICE_US): answered NV_OK, not passed", GS_REFUSE_NONE, NV_OK, &gs_timeslice_handler },
	{ 0xa06c0105, GS_CAP_VIDEO, "v: NVA06C_PREEMPT: preempts the caller's own TSG off its engine (it gives time back; gating is unaffected: a disabled TSG stays disabled); its wait capped (engines.c)", GS_REFUSE_NONE, NV_OK, &gs_preempt_handler },
	{ 0xa06f0103, GS_CAP_GRAPHICS | GS_CAP_VIDEO, "gv: NVA06F_GPFIFO_SCHEDULE: puts the caller's own channel on the runlist, as NVA06C_GPFIFO_SCHEDULE for a TSG", GS_REFUSE_NONE, NV_OK, &gs_schedule_handler },
	{ 0xa06f0104, GS_CAP_GRAPHICS | GS_CAP_VIDEO, "gv: NVA06F_BIND: binds the caller's own channel to an engine; engines.c records which (gpuctl status)", GS_REFUSE_NONE, NV_OK, &gs_bind_handler },
	{ 0xc36f0108, GS_CAP_COMPUTE, "dt: NVC36F_GPFIFO_GET_WORK_SUBMIT_TOKEN: doorbell token of the caller's own channel; read-only", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0xc36f010a, GS_CAP_GRAPHICS | GS_CAP_VIDEO, "gv: NVC36F_GPFIFO_SET_WORK_SUBMIT_TOKEN_NOTIF_INDEX: notifier index of the caller's own channel's doorbell token", GS_REFUSE_NONE, NV_OK, NULL },
	{ 0xcb330101, GS_CAP_COMPUTE, "dt: NV_CONF_COMPUTE_SYSTEM_GET_CAPABILITIES: confidential-compute capabilities; read-only", GS_REFUSE_NONE, NV_OK, NULL },
};

/*
 * Controls refused whatever the lists say, with RM's answer to an
 * unprivileged client that may not have them.
 */
static const struct gs_control_row gs_refused_controls[] = {
	{ NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS, GS_CAP_COMPUTE,
	  "gating belongs to the scheduler: the caller's own channels GLOBAL, another client's FOREIGN (it would stall that tenant)",
	  GS_REFUSE_GLOBAL, NV_ERR_INSUFFICIENT_PERMISSIONS, &gs_disable_handler },
	{ NV0000_CTRL_CMD_GPU_MODIFY_DRAIN_STATE, GS_CAP_UTILITY, "whole GPU: drain state", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV0080_CTRL_CMD_GPU_MODIFY_SW_STATE_PERSISTENCE, GS_CAP_UTILITY, "whole GPU: persistence mode", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_GPU_SET_POWER, GS_CAP_UTILITY, "whole GPU: power state", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_GPU_SET_COMPUTE_MODE_RULES, GS_CAP_UTILITY, "whole GPU: compute mode (a shared GPU stays DEFAULT)", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_GPU_SET_ECC_CONFIGURATION, GS_CAP_UTILITY, "whole GPU: ECC", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_GPU_RESET_ECC_ERROR_STATUS, GS_CAP_UTILITY, "whole GPU: ECC counters", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_GPU_SET_PARTITIONS, GS_CAP_UTILITY, "whole GPU: MIG partitions", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS_FOR_KEY_ROTATION, GS_CAP_COMPUTE, "channels of the whole GPU", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS_FOR_KEY_ROTATION_V2, GS_CAP_COMPUTE, "channels of the whole GPU", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_PERF_SET_POWERSTATE, GS_CAP_UTILITY, "whole GPU: power state", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_PERF_RATED_TDP_SET_CONTROL, GS_CAP_UTILITY, "whole GPU: power limit", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV0080_CTRL_CMD_BIF_RESET, GS_CAP_UTILITY, "whole GPU: reset", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_RESET, GS_CAP_UTILITY, "whole GPU: reset", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_GPU_UNMARK_DEVICE_FOR_RESET, GS_CAP_UTILITY, "whole GPU: reset", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_DRAIN_AND_RESET, GS_CAP_UTILITY, "whole GPU: reset", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV2080_CTRL_CMD_GPU_UNMARK_DEVICE_FOR_DRAIN_AND_RESET, GS_CAP_UTILITY, "whole GPU: reset", GS_REFUSE_GLOBAL,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	{ NV0000_CTRL_CMD_OS_UNIX_CREATE_EXPORT_OBJECT_FD, GS_CAP_COMPUTE,
	  "moves objects between processes through an fd that export.c does not decide on (deprecated in 580, os.c)",
	  GS_REFUSE_FOREIGN, NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	/*
	 * The runlist interleave level of a TSG puts it ahead of other
	 * tenants' (ctrla06c.h: a HIGH TSG runs between every LOW one); RM takes
	 * it from root only (0x1b on the H100). The operator's to set.
	 */
	{ NVA06C_CTRL_CMD_SET_INTERLEAVE_LEVEL, GS_CAP_COMPUTE, "runlist priority over other tenants",
	  GS_REFUSE_GLOBAL, NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
	/*
	 * An IMEX channel (an fd of /dev/nvidia-caps-imex-channels) lets the
	 * client import fabric memory of other processes and nodes
	 * (mem_fabric_import_v2.c, mem_multicast_fabric.c, mem_export.c).
	 * Instances have no such node; RM answers an fd that is not a channel
	 * so (client_resource.c cliresCtrlCmdClientSubscribeToImexChannel_IMPL).
	 */
	/*
	 * The ZBC (zero-bandwidth clear) table holds a few clear values every
	 * context on the GPU shares (kgrmgr/GSP): one tenant's entries would
	 * change or crowd out another's. RM's answer when the table is full,
	 * which the graphics driver meets with an ordinary clear (ctrl9096.h).
	 */
	{ NV9096_CTRL_CMD_SET_ZBC_COLOR_CLEAR, GS_CAP_GRAPHICS, "whole GPU: the ZBC clear table",
	  GS_REFUSE_GLOBAL, NV_ERR_INSUFFICIENT_RESOURCES, NULL },
	{ NV9096_CTRL_CMD_SET_ZBC_DEPTH_CLEAR, GS_CAP_GRAPHICS, "whole GPU: the ZBC clear table",
	  GS_REFUSE_GLOBAL, NV_ERR_INSUFFICIENT_RESOURCES, NULL },
	{ NV9096_CTRL_CMD_SET_ZBC_CLEAR_TABLE, GS_CAP_GRAPHICS, "whole GPU: the ZBC clear table",
	  GS_REFUSE_GLOBAL, NV_ERR_INSUFFICIENT_RESOURCES, NULL },
	{ NV9096_CTRL_CMD_SET_ZBC_STENCIL_CLEAR, GS_CAP_GRAPHICS, "whole GPU: the ZBC clear table",
	  GS_REFUSE_GLOBAL, NV_ERR_INSUFFICIENT_RESOURCES, NULL },
	{ NV0000_CTRL_CMD_CLIENT_SUBSCRIBE_TO_IMEX_CHANNEL, GS_CAP_COMPUTE,
	  "IMEX channel: fabric memory of other processes and nodes", GS_REFUSE_FOREIGN,
	  NV_ERR_INSUFFICIENT_PERMISSIONS, NULL },
};

/*
 * Allocation classes (RM_ALLOC), allowed and refused, with RM's answer for
 * the refused: the status RM gives an unprivileged client, or a client
 * without the feature, for that class. A class on no row is answered
 * NV_ERR_INVALID_CLASS, as RM answers a class it does not have
 * (rmapi/alloc_free.c: RsResInfoByExternalClassId() finds none).
 */
static const struct gs_class_row gs_classes[] = {
	{ .klass = NV01_ROOT, .caps = GS_CAP_COMPUTE | GS_CAP_UTILITY,
	  .why = "dst: a client" },
	{ .klass = NV01_ROOT_NON_PRIV, .caps = GS_CAP_COMPUTE | GS_CAP_UTILITY,
	  .why = "a client (non-privileged root)" },
	{ .klass = NV01_MEMORY_SYSTEM, .caps = GS_CAP_COMPUTE,
	  .why = "dt: pinned host memory, counted by quota.c",
	  .pre = gs_quota_pre, .params_size = sizeof(struct nv_memory_allocation_params), .stage = 1,
	  .abi_size = GS_ABI_SIZE_MEMORY_ALLOC },
	{ .klass = NV01_MEMORY_LOCAL_PRIVILEGED, .caps = GS_CAP_COMPUTE,
	  .why = "privileged video memory",
	  .refusal = GS_REFUSE_CLASS, .status = NV_ERR_INSUFFICIENT_PERMISSIONS },
	{ .klass = NV01_MEMORY_LOCAL_USER, .caps = GS_CAP_COMPUTE,
	  .why = "dt: video memory, counted by quota.c",
	  .pre = gs_quota_pre, .params_size = sizeof(struct nv_memory_allocation_params), .stage = 1,
	  .abi_size = GS_ABI_SIZE_MEMORY_ALLOC },
	{ .klass = NV01_ROOT_CLIENT, .caps = GS_CAP_COMPUTE | GS_CAP_UTILITY,
	  .why = "a client (CUDA's class for it)" },
	{ .klass = NV04_DISPLAY_COMMON, .caps = GS_CAP_UTILITY,
	  .why = "s: RM answers NOT_SUPPORTED" },
	{ .klass = NV01_EVENT_OS_EVENT, .caps = GS_CAP_COMPUTE,
	  .why = "dt: notifications of the caller's objects (hParentClient checked, core.c)",
	  .pre = gs_pre_other_clients, .params_size = sizeof(struct nv0005_alloc_params), .stage = 1 },
	{ .klass = NV01_DEVICE_0, .caps = GS_CAP_COMPUTE | GS_CAP_UTILITY,
	  .why = "dst: one of the instance's GPUs (core.c)",
	  .pre = gs_pre_device, .params_size = sizeof(struct nv0080_alloc_params), .stage = 1 },
	{ .klass = NV01_MEMORY_LIST_FBMEM, .caps = GS_CAP_COMPUTE,
	  .why = "names existing framebuffer pages",
	  .refusal = GS_REFUSE_CLASS, .status = NV_ERR_INSUFFICIENT_PERMISSIONS },
	{ .klass = NV01_MEMORY_LOCAL_PHYSICAL, .caps = GS_CAP_COMPUTE,
	  .why = "video memory whose size RM reports only on the way out",
	  .refusal = GS_REFUSE_CLASS, .status = NV_ERR_INSUFFICIENT_PERMISSIONS },
	{ .klass = RM_USER_SHARED_DATA, .caps = GS_CAP_COMPUTE | GS_CAP_UTILITY,
	  .why = "dst: read-only telemetry page" },
	{ .klass = NV_MEMORY_EXPORT, .caps = GS_CAP_COMPUTE,
	  .why = "fabric export: needs an IMEX channel (mem_export.c)",
	  .refusal = GS_REFUSE_FOREIGN, .status = NV_ERR_INSUFFICIENT_PERMISSIONS },
	{ .klass = NV_MEMORY_FABRIC, .caps = GS_CAP_COMPUTE,
	  .why = "h: CUDA maps every cuMemCreate allocation into the fabric address space on NVLink-fabric GPUs; holds its hVidMem's charge (core.c gs_pre_fabric)",
	  .pre = gs_pre_fabric, .params_size = sizeof(struct nv00f8_alloc_params), .stage = 1 },
	{ .klass = NV_MEMORY_FABRIC_IMPORT_V2, .caps = GS_CAP_COMPUTE,
	  .why = "another process's fabric memory: RM's answer to a client without an IMEX channel (mem_fabric_import_v2.c)",
	  .refusal = GS_REFUSE_FOREIGN, .status = NV_ERR_INSUFFICIENT_PERMISSIONS },
	{ .klass = NV_MEMORY_FABRIC_IMPORTED_REF, .caps = GS_CAP_COMPUTE,
	  .why = "IMEX daemon's reference: needs NV_RM_CAP_SYS_FABRIC_IMEX_MGMT (mem_fabric_import_ref.c)",
	  .refusal = GS_REFUSE_FOREIGN, .status = NV_ERR_INSUFFICIENT_PERMISSIONS },
	{ .klass = NV_MEMORY_MULTICAST_FABRIC, .caps = GS_CAP_COMPUTE,
	  .why = "multicast across GPUs and nodes, memory attached by controls the core does not decode: RM's answer on a GPU without multicast (mem_multicast_fabric.c), so CUDA and NCCL fall back",
	  .refusal = GS_REFUSE_CLASS, .status = NV_ERR_NOT_SUPPORTED },
	{ .klass = NV20_SUBDEVICE_0, .caps = GS_CAP_COMPUTE | GS_CAP_UTILITY,
	  .why = "dst: the device's GPU" },
	{ .klass = NV2081_BINAPI, .caps = GS_CAP_COMPUTE | GS_CAP_UTILITY,
	  .why = "dst: the subdevice's binary-API object, controls of the caller's own GPU" },
	{ .klass = NV50_P2P, .caps = GS_CAP_COMPUTE,
	  .why = "p: peer mapping between two subdevices of the caller's own client (p2p_api.c: subdeviceGetByHandle() in the caller's client)" },
	{ .klass = NV50_THIRD_PARTY_P2P, .caps = GS_CAP_COMPUTE,
	  .why = "dt: registers the caller's own VA space and video memory for peer DMA (CUDA's P2P tokens)" },
	{ .klass = NV50_MEMORY_VIRTUAL, .caps = GS_CAP_COMPUTE,
	  .why = "dt: a virtual range" },
	{ .klass = GT200_DEBUGGER, .caps = GS_CAP_COMPUTE,
	  .why = "dt: the caller's own contexts (hAppClient checked, core.c)",
	  .pre = gs_pre_other_clients, .params_size = sizeof(struct nv83de_alloc_params), .stage = 1 },
	{ .klass = FERMI_CONTEXT_SHARE_A, .caps = GS_CAP_COMPUTE,
	  .why = "dt: a subcontext in the caller's own TSG; staged: its VA space decides what it is freed with (core.c gs_dep_fields)",
	  .params_size = NV_CTXSHARE_ALLOC_PARAMS_SIZE, .stage = 1 },
	{ .klass = GF100_SUBDEVICE_MASTER, .caps = GS_CAP_COMPUTE,
	  .why = "dt: the subdevice's master object (error containment queries)" },
	{ .klass = GF100_SUBDEVICE_INFOROM, .caps = GS_CAP_UTILITY,
	  .why = "s: InfoROM queries (nvidia-smi -q); its write controls are not listed" },
	{ .klass = FERMI_VASPACE_A, .caps = GS_CAP_COMPUTE,
	  .why = "dt: a GPU virtual address space of the caller's own" },
	/*
	 * A TSG's and a channel's parameters name the engine they run on, which
	 * decides whether the controller gates them (engines.c): staged, so that
	 * RM reads the engine the core recorded.
	 */
	{ .klass = KEPLER_CHANNEL_GROUP_A, .caps = GS_CAP_COMPUTE,
	  .why = "dt: a TSG, registered and gated",
	  .params_size = NV_CHANNEL_GROUP_ALLOC_PARAMS_SIZE, .stage = 1 },
	{ .klass = AMPERE_SMC_CONFIG_SESSION, .caps = GS_CAP_UTILITY,
	  .why = "st: its MIG controls are not listed" },
	{ .klass = AMPERE_SMC_MONITOR_SESSION, .caps = GS_CAP_UTILITY,
	  .why = "st: read-only view of MIG state" },
	{ .klass = HOPPER_USERMODE_A, .caps = GS_CAP_COMPUTE,
	  .why = "dt: the doorbell page CUDA rings to submit work" },
	{ .klass = HOPPER_CHANNEL_GPFIFO_A, .caps = GS_CAP_COMPUTE,
	  .why = "dt: a channel, registered and gated",
	  .params_size = NV_CHANNEL_ALLOC_PARAMS_SIZE, .stage = 1,
	  .abi_size = GS_ABI_SIZE_CHANNEL_ALLOC },
	{ .klass = HOPPER_DMA_COPY_A, .caps = GS_CAP_COMPUTE,
	  .why = "dt: a copy engine object on the caller's own channel" },
	{ .klass = NV_CONFIDENTIAL_COMPUTE, .caps = GS_CAP_COMPUTE,
	  .why = "dt: confidential-computing capability queries" },
	{ .klass = HOPPER_COMPUTE_A, .caps = GS_CAP_COMPUTE,
	  .why = "dt: the compute engine object on the caller's own channel" },
	/* graphics and video: g, v (the header comment) */
	{ .klass = NV01_CONTEXT_DMA_FROM_MEMORY, .caps = GS_CAP_VIDEO,
	  .why = "v: a context DMA over the caller's own memory (RM looks hMemory up in the caller's client)" },
	{ .klass = NV01_EVENT, .caps = GS_CAP_GRAPHICS,
	  .why = "g: notifications of the caller's objects, as NV01_EVENT_OS_EVENT (hParentClient checked, core.c)",
	  .pre = gs_pre_other_clients, .params_size = sizeof(struct nv0005_alloc_params), .stage = 1 },
	{ .klass = NV01_MEMORY_VIRTUAL, .caps = GS_CAP_GRAPHICS | GS_CAP_VIDEO,
	  .why = "gv: a virtual range (no memory of its own), as NV50_MEMORY_VIRTUAL" },
	{ .klass = NV_SEMAPHORE_SURFACE, .caps = GS_CAP_GRAPHICS,
	  .why = "g: a semaphore surface over the caller's own memory, which RM duplicates and keeps: it holds that memory's charge (core.c)",
	  .pre = gs_pre_semaphore_surface, .params_size = sizeof(struct nv_semaphore_surface_alloc_params), .stage = 1 },
	{ .klass = NV_MEMORY_MAPPER, .caps = GS_CAP_GRAPHICS,
	  .why = "g: OpenGL's and Vulkan's paging-operations queue, in kernel memory RM sizes by the caller: bounded in size and number (core.c)",
	  .pre = gs_pre_memory_mapper, .params_size = sizeof(struct nv_memory_mapper_alloc_params), .stage = 1,
	  .abi_size = GS_ABI_SIZE_MEMORY_MAPPER },
	{ .klass = FERMI_TWOD_A, .caps = GS_CAP_GRAPHICS,
	  .why = "g: the 2D engine object on the caller's own channel" },
	{ .klass = GF100_ZBC_CLEAR, .caps = GS_CAP_GRAPHICS,
	  .why = "g: the ZBC table object; its SET controls are refused as GLOBAL" },
	{ .klass = KEPLER_INLINE_TO_MEMORY_B, .caps = GS_CAP_GRAPHICS,
	  .why = "g: the inline-to-memory engine object on the caller's own channel" },
	{ .klass = NVB8B0_VIDEO_DECODER, .caps = GS_CAP_VIDEO,
	  .why = "v: an NVDEC engine object on the caller's own channel; not one that shuts other clients out (engines.c)",
	  .pre = gs_pre_video_engine, .params_size = sizeof(struct nv_video_engine_alloc_params), .stage = 1 },
	{ .klass = NVB8D1_VIDEO_NVJPG, .caps = GS_CAP_VIDEO,
	  .why = "v: an NVJPG engine object, likewise",
	  .pre = gs_pre_video_engine, .params_size = sizeof(struct nv_video_engine_alloc_params), .stage = 1 },
	{ .klass = NVB8FA_VIDEO_OFA, .caps = GS_CAP_VIDEO,
	  .why = "the optical-flow engine object, likewise (from the 580 source and nvproxy's video set)",
	  .pre = gs_pre_video_engine, .params_size = sizeof(struct nv_video_engine_alloc_params), .stage = 1 },
	{ .klass = AMPERE_CHANNEL_GPFIFO_A, .caps = GS_CAP_GRAPHICS,
	  .why = "g: a channel (OpenGL's and Vulkan's class on the H100), registered and gated",
	  .params_size = NV_CHANNEL_ALLOC_PARAMS_SIZE, .stage = 1,
	  .abi_size = GS_ABI_SIZE_CHANNEL_ALLOC },
	{ .klass = HOPPER_A, .caps = GS_CAP_GRAPHICS,
	  .why = "g: the 3D engine object on the caller's own channel" },
};

/*
 * escapes on nvidiactl / nvidia<N> that need no decoding to be safe. Not here:
 * NV_ESC_ATTACH_GPUS_TO_FD (nv.c nvidia_dev_get() opens and pins any GPU of the
 * host by id, with no permission check: core.c lets it name the instance's
 * GPUs only), NV_ESC_REGISTER_FD (on nvidiactl it changes which file RM
 * checks clients against: core.c lets GPU files have it only) and
 * NV_ESC_SYS_PARAMS (host-wide: core.c answers it without the driver).
 * caps: nvproxy's for the escape (pkg/sentry/devices/nvproxy/version.go
 * Init(), frontendIoctl; NV_ESC_WAIT_OPEN_COMPLETE from 550.40.07): compUtil.
 * NV_ESC_STATUS_CODE is not in nvproxy's map: compUtil, as CARD_INFO, the
 * other read of the GPUs' state CUDA and nvidia-smi make (traces d s).
 */
static const struct {
	nv_u32 escape;
	nv_u32 caps;
} gs_plain_escapes[] = {
	{ NV_ESC_CARD_INFO, GS_CAPS_COMPUTE_UTILITY },
	{ NV_ESC_STATUS_CODE, GS_CAPS_COMPUTE_UTILITY },
	{ NV_ESC_CHECK_VERSION_STR, GS_CAPS_COMPUTE_UTILITY },
	{ NV_ESC_NUMA_INFO, GS_CAPS_COMPUTE_UTILITY },
	{ NV_ESC_WAIT_OPEN_COMPLETE, GS_CAPS_COMPUTE_UTILITY },
};

const struct gs_control_row *gs_control_row(nv_u32 cmd)
{
	unsigned int lo = 0, hi = ARRAY_SIZE(gs_allowed_controls), i;

	while (lo < hi) {
		unsigned int mid = lo + (hi - lo) / 2;

		if (gs_allowed_controls[mid].cmd == cmd)
			return &gs_allowed_controls[mid];
		if (gs_allowed_controls[mid].cmd < cmd)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (i = 0; i < ARRAY_SIZE(gs_refused_controls); i++)
		if (gs_refused_controls[i].cmd == cmd)
			return &gs_refused_controls[i];
	return NULL;
}

/* the escapes gs_pre() decodes itself are not asked about here */
enum gs_verdict gs_filter_escape(struct gs_inst *in, struct gs_call *c)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(gs_plain_escapes); i++)
		if (gs_plain_escapes[i].escape == c->escape)
			return gs_pre_caps(in, c, gs_plain_escapes[i].caps, GS_ST_NONE, 0);
	if (c->escape == GS_TEST_ESC_SUBMIT && (in->flags & GS_INST_ALLOW_TEST_ESCAPES))
		return GS_PASS;
	return gs_fail(c, GS_REFUSE_ESCAPE, EPERM);
}

/*
 * nvidia-uvm: the ioctls gVisor's nvproxy lets a compute/utility container make on
 * 580 (pkg/sentry/devices/nvproxy/version.go; docs/allowlist.md), which cover all
 * 15 in the traces (d s t). Each works on the caller's own UVM VA space, which
 * UVM ties to the file and to the caller's mm (kernel-open/nvidia-uvm/uvm.c).
 * Refused: the tools/profiler interface (event trackers, counters,
 * READ/WRITE_PROCESS_MEMORY), UVM_RUN_TEST, MPS registration, system-wide
 * atomics, POPULATE_PAGEABLE, sparse mappings, access-counter clearing,
 * device P2P allocation, DISCARD and the pre-UVM8 legacy calls.
 * caps: nvproxy's for the ioctl (version.go Init(), uvmIoctl: compUtil for
 * each of these but UVM_PAGEABLE_MEM_ACCESS_ON_GPU, CapVideo), checked as
 * its handler checks them (handlers.go uvmIoctlHandler.handle();
 * gs_pre_caps()).
 */
static const struct {
	nv_u32 cmd;
	nv_u32 caps;
	const char *why;
} gs_uvm_allowed[] = {
	{ UVM_INITIALIZE, GS_CAPS_COMPUTE_UTILITY, "dst: binds the VA space to the caller's mm" },
	{ UVM_DEINITIALIZE, GS_CAPS_COMPUTE_UTILITY, "s: ends it" },
	{ 23, GS_CAPS_COMPUTE_UTILITY, "dt UVM_CREATE_RANGE_GROUP: bookkeeping in the caller's VA space" },
	{ 24, GS_CAPS_COMPUTE_UTILITY, "dt UVM_DESTROY_RANGE_GROUP" },
	{ 25, GS_CAPS_COMPUTE_UTILITY, "dt UVM_REGISTER_GPU_VASPACE: RM VA space of the caller's own client (rmCtrlFd, hClient checked by RM)" },
	{ 26, GS_CAPS_COMPUTE_UTILITY, "UVM_UNREGISTER_GPU_VASPACE" },
	{ 27, GS_CAPS_COMPUTE_UTILITY, "dt UVM_REGISTER_CHANNEL: the caller's own channel (RM checks the client)" },
	{ 28, GS_CAPS_COMPUTE_UTILITY, "UVM_UNREGISTER_CHANNEL" },
	{ 29, GS_CAPS_COMPUTE_UTILITY, "UVM_ENABLE_PEER_ACCESS: between GPUs the caller registered" },
	{ 30, GS_CAPS_COMPUTE_UTILITY, "UVM_DISABLE_PEER_ACCESS" },
	{ 31, GS_CAPS_COMPUTE_UTILITY, "UVM_SET_RANGE_GROUP" },
	{ 33, GS_CAPS_COMPUTE_UTILITY, "dt UVM_MAP_EXTERNAL_ALLOCATION: maps the caller's own RM memory (cuMemMap)" },
	{ 34, GS_CAPS_COMPUTE_UTILITY, "dt UVM_FREE" },
	{ 37, GS_CAPS_COMPUTE_UTILITY, "dt UVM_REGISTER_GPU" },
	{ 38, GS_CAPS_COMPUTE_UTILITY, "UVM_UNREGISTER_GPU" },
	{ 39, GS_CAPS_COMPUTE_UTILITY, "dst UVM_PAGEABLE_MEM_ACCESS: a query" },
	{ 42, GS_CAPS_COMPUTE_UTILITY, "UVM_SET_PREFERRED_LOCATION: managed ranges of the caller" },
	{ 43, GS_CAPS_COMPUTE_UTILITY, "UVM_UNSET_PREFERRED_LOCATION" },
	{ 44, GS_CAPS_COMPUTE_UTILITY, "UVM_ENABLE_READ_DUPLICATION" },
	{ 45, GS_CAPS_COMPUTE_UTILITY, "UVM_DISABLE_READ_DUPLICATION" },
	{ 46, GS_CAPS_COMPUTE_UTILITY, "UVM_SET_ACCESSED_BY" },
	{ 47, GS_CAPS_COMPUTE_UTILITY, "UVM_UNSET_ACCESSED_BY" },
	{ 51, GS_CAPS_COMPUTE_UTILITY, "UVM_MIGRATE: prefetch of the caller's managed memory" },
	{ 53, GS_CAPS_COMPUTE_UTILITY, "UVM_MIGRATE_RANGE_GROUP" },
	{ 65, GS_CAPS_COMPUTE_UTILITY, "dt UVM_MAP_DYNAMIC_PARALLELISM_REGION" },
	{ 66, GS_CAPS_COMPUTE_UTILITY, "UVM_UNMAP_EXTERNAL" },
	{ 68, GS_CAPS_COMPUTE_UTILITY, "dt UVM_ALLOC_SEMAPHORE_POOL" },
	/* uvm_ioctl.h UVM_IOCTL_BASE(70) in every branch of nvrm_tables.c (535 on) */
	{ 70, GS_CAP_VIDEO,
	  "UVM_PAGEABLE_MEM_ACCESS_ON_GPU: a query of one registered GPU (nvproxy: CapVideo)" },
	{ 72, GS_CAPS_COMPUTE_UTILITY, "dt UVM_VALIDATE_VA_RANGE: a query" },
	{ 73, GS_CAPS_COMPUTE_UTILITY, "dt UVM_CREATE_EXTERNAL_RANGE" },
	{ 75, GS_CAPS_COMPUTE_UTILITY, "dt UVM_MM_INITIALIZE" },
};

enum gs_verdict gs_filter_uvm(struct gs_inst *in, struct gs_call *c)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(gs_uvm_allowed); i++)
		if (gs_uvm_allowed[i].cmd == c->escape)
			return gs_pre_caps(in, c, gs_uvm_allowed[i].caps, GS_ST_NONE, 0);
	return gs_fail(c, GS_REFUSE_UNLISTED, EPERM);
}

const struct gs_class_row *gs_class_row(nv_u32 klass)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(gs_classes); i++)
		if (gs_classes[i].klass == klass)
			return &gs_classes[i];
	return NULL;
}

nv_u32 gs_class_params_size(const struct gs_class_row *row)
{
	switch (row->abi_size) {
	case GS_ABI_SIZE_MEMORY_ALLOC:
		return gs_abi()->memory_alloc_size;
	case GS_ABI_SIZE_CHANNEL_ALLOC:
		return gs_abi()->channel_alloc_size;
	case GS_ABI_SIZE_MEMORY_MAPPER:
		return gs_abi()->memory_mapper_alloc_size;
	case GS_ABI_SIZE_FIXED:
		break;
	}
	return row->params_size;
}

/* NV_ESC_RM_ALLOC_MEMORY: only OS descriptors (pinned host memory), as traced */
enum gs_refusal gs_filter_alloc_memory_class(nv_u32 klass, nv_u32 *status)
{
	const struct gs_class_row *row = gs_class_row(klass);

	/*
	 * pinned host memory (NV01_MEMORY_SYSTEM counted: core.c
	 * gs_pre_alloc_memory_system()); NV01_MEMORY_LOCAL_PRIVILEGED, register
	 * memory OpenGL and Vulkan allocate, unmappable (core.c gs_pre_map_memory())
	 */
	if (klass == NV01_MEMORY_SYSTEM_OS_DESCRIPTOR || klass == NV01_MEMORY_SYSTEM ||
	    klass == NV01_MEMORY_LOCAL_PRIVILEGED)
		return GS_REFUSE_NONE;
	/* the heap-size question (core.c gs_post_heap_size()), never video memory */
	if (klass == NV01_MEMORY_LOCAL_USER)
		return GS_REFUSE_NONE;
	if (row && row->refusal != GS_REFUSE_NONE) {
		*status = row->status;
		return row->refusal;
	}
	if (gs_vidmem_class(klass)) {
		*status = NV_ERR_INSUFFICIENT_PERMISSIONS;
		return GS_REFUSE_CLASS;
	}
	*status = NV_ERR_INVALID_CLASS;
	return GS_REFUSE_UNLISTED;
}

enum gs_refusal gs_filter_disable_channels(struct gs_inst *in, const struct gs_io *io,
					   const struct nvos54_params *p)
{
	struct nv2080_ctrl_fifo_disable_channels_params *dp;
	enum gs_refusal r = GS_REFUSE_GLOBAL;
	nv_u32 i, n;

	if (p->params_size < sizeof(*dp))
		return GS_REFUSE_MALFORMED;
	dp = gs_zalloc(sizeof(*dp));
	if (!dp)
		return GS_REFUSE_GLOBAL;
	if (!io || io->read(io->ctx, p->params, dp, sizeof(*dp))) {
		gs_free(dp);
		return GS_REFUSE_MALFORMED;
	}
	n = dp->num_channels;
	if (n > NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES)
		n = NV2080_CTRL_FIFO_DISABLE_CHANNELS_MAX_ENTRIES;
	for (i = 0; i < n; i++)
		if (!gs_is_client(in, dp->h_client_list[i]))
			r = GS_REFUSE_FOREIGN;
	gs_free(dp);
	return r;
}
