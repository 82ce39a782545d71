// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * filter.c - what a process in an instance may ask RM for.
 *
 * Deny by default. A container must not reach what it does not need, and the
 * RM interface is large (about 1400 controls on 580) and grows with every
 * driver: a control added by NVIDIA tomorrow must not become reachable before
 * someone has looked at it. So every control, class and escape that is let
 * through is listed here, taken from what CUDA, PyTorch and nvidia-smi issue
 * in the three recorded traces (shared/traces: d = cuda-driver-alloc,
 * s = nvidia-smi-q, t = torch-matmul), plus (h) the few that the runs on the
 * H100 showed missing (docs/real-gpu.md) and (p) peer access between an
 * instance's GPUs, from the 580 source and nvproxy's compute set, which a
 * one-GPU trace cannot show (docs/multigpu.md; not yet seen on two GPUs). tests/test_filter_lists.py checks
 * against NVIDIA's source that none of them carries RMCTRL_FLAGS_PRIVILEGED
 * (0x4 in src/nvidia/generated/g_*_nvoc.c) and that the list still covers the
 * traces. Anything else is refused with NV_ERR_INSUFFICIENT_PERMISSIONS and
 * counted (GS_REFUSE_UNLISTED), and shows up in the events, so a workload that
 * needs more is seen at once and the list grows by review.
 *
 * Named refusals, whatever the lists say:
 *  - controls that change the whole GPU (compute mode, ECC, power, MIG,
 *    persistence, drain, reset, channel disable): GS_REFUSE_GLOBAL;
 *  - FIFO_DISABLE_CHANNELS naming a client that is not the instance's:
 *    GS_REFUSE_FOREIGN (the denial-of-service path of FINDINGS.md); naming
 *    only its own: GS_REFUSE_GLOBAL, since gating belongs to the scheduler and
 *    a container re-enabling its own channels would undo it;
 *  - the NV0000 OS_UNIX export and import controls are decided in export.c
 *    (the fd they name must be a nvidiactl node of the caller's instance);
 *    the deprecated CREATE_EXPORT_OBJECT_FD, which sets an export file up
 *    without exporting (os.c), and the EXPORT/IMPORT escapes:
 *    GS_REFUSE_FOREIGN;
 *  - IOCTL_XFER_CMD: it wraps another escape whose block the core would not
 *    see, so it would bypass everything here: GS_REFUSE_ESCAPE.
 */
#include "core_int.h"

/* controls seen in the traces, sorted */
static const nv_u32 gs_allowed_controls[] = {
0x00000101,	/* dst NV0000_SYSTEM_GET_BUILD_VERSION */
	0x00000127,	/* p NV0000_SYSTEM_GET_P2P_CAPS: read-only, peer access between the instance's GPUs */
	0x0000012b,	/* p NV0000_SYSTEM_GET_P2P_CAPS_V2: read-only, as above */
	0x0000013a,	/* dt NV0000_SYSTEM_GET_P2P_CAPS_MATRIX */
	0x000001f0,	/* dt NV0000_SYSTEM_GET_FEATURES */
	0x00000201,	/* dst NV0000_GPU_GET_ATTACHED_IDS */
	0x00000202,	/* dst NV0000_GPU_GET_ID_INFO */
	0x00000205,	/* dst NV0000_GPU_GET_ID_INFO_V2 */
	0x00000214,	/* dst NV0000_GPU_GET_PROBED_IDS */
	0x00000215,	/* dst NV0000_GPU_ATTACH_IDS */
	0x00000216,	/* s NV0000_GPU_DETACH_IDS */
	0x0000021b,	/* st NV0000_GPU_GET_PCI_INFO */
	0x00000279,	/* st NV0000_GPU_QUERY_DRAIN_STATE */
	0x0000027b,	/* dt NV0000_GPU_GET_MEMOP_ENABLE */
	0x00000288,	/* dt NV0000_GPU_GET_ACTIVE_DEVICE_IDS */
	0x00000289,	/* st NV0000_GPU_ASYNC_ATTACH_ID */
	0x00000a04,	/* dt NV0000_SYNC_GPU_BOOST_GROUP_INFO */
	0x00000b02,	/* s NV0000_GPUACCT_GET_ACCOUNTING_STATE */
	0x00000d01,	/* dst NV0000_CLIENT_GET_ADDR_SPACE_TYPE */
	0x00000d04,	/* dt NV0000_CLIENT_SET_INHERITED_SHARE_POLICY */
	0x00410110,	/* h NV0041_GET_SURFACE_INFO: cuMemImportFromShareableHandle on the H100; a read-only query of the caller's memory object (attributes, size, page size, aperture), non-privileged, in nvproxy's compute set */
	0x00800280,	/* dt NV0080_GPU_GET_NUM_SUBDEVICES */
	0x00800288,	/* s NV0080_GPU_QUERY_SW_STATE_PERSISTENCE */
	0x00800289,	/* dst NV0080_GPU_GET_VIRTUALIZATION_MODE */
	0x00800292,	/* dst NV0080_GPU_GET_CLASSLIST_V2 */
	0x00801307,	/* dt NV0080_FB_GET_CAPS_V2 */
	0x00801402,	/* dt NV0080_HOST_GET_CAPS_V2 */
	0x0080170d,	/* dt NV0080_FIFO_GET_CHANNELLIST */
	0x00801909,	/* dt NV0080_PERF_CUDA_LIMIT_SET_CONTROL */
	0x00de0001,	/* s NV00DE_REQUEST_DATA_POLL */
	0x20800102,	/* dst NV2080_GPU_GET_INFO_V2 */
	0x20800110,	/* dst NV2080_GPU_GET_NAME_STRING */
	0x20800111,	/* dt NV2080_GPU_GET_SHORT_NAME_STRING */
	0x20800119,	/* dt NV2080_GPU_GET_SIMULATION_INFO */
	0x2080012f,	/* dst NV2080_GPU_QUERY_ECC_STATUS */
	0x20800131,	/* dst NV2080_GPU_QUERY_COMPUTE_MODE_RULES */
	0x20800133,	/* s NV2080_GPU_QUERY_ECC_CONFIGURATION */
	0x2080013f,	/* s NV2080_GPU_GET_OEM_BOARD_INFO */
	0x20800145,	/* dt  */
	0x2080014a,	/* dst NV2080_GPU_GET_GID_INFO */
	0x2080014b,	/* s NV2080_GPU_GET_INFOROM_OBJECT_VERSION */
	0x20800156,	/* s NV2080_GPU_GET_INFOROM_IMAGE_VERSION */
	0x20800157,	/* s NV2080_GPU_QUERY_INFOROM_ECC_SUPPORT */
	0x2080016d,	/* s  */
	0x20800170,	/* dt NV2080_GPU_GET_ENGINES_V2 */
	0x2080017b,	/* s  */
	0x2080018d,	/* s NV2080_GPU_GET_PIDS */
	0x2080018e,	/* h NV2080_GPU_GET_PID_INFO: NVML on PyTorch's OOM path */
	0x20800195,	/* dt NV2080_GPU_GET_COMPUTE_POLICY_CONFIG */
	0x208001a3,	/* dst NV2080_GET_GPU_FABRIC_PROBE_INFO */
	0x208001a4,	/* s NV2080_GPU_GET_CHIP_DETAILS */
	0x208001b2,	/* s NV2080_GPU_GET_RECOVERY_ACTION */
	0x20800406,	/* st NV2080_TIMER_GET_GPU_CPU_TIME_CORRELATION_INFO */
	0x20800802,	/* s NV2080_BIOS_GET_INFO */
	0x20801201,	/* dt NV2080_GR_GET_INFO */
	0x20801210,	/* dt NV2080_GR_SET_CTXSW_PREEMPTION_MODE */
	0x20801218,	/* dt NV2080_GR_GET_CTX_BUFFER_SIZE */
	0x2080121b,	/* dt NV2080_GR_GET_GLOBAL_SM_ORDER */
	0x20801227,	/* dt NV2080_GR_GET_CAPS_V2 */
	0x2080122a,	/* dt NV2080_GR_GET_GPC_MASK */
	0x2080122b,	/* dt NV2080_GR_GET_TPC_MASK */
	0x20801230,	/* dt NV2080_GR_GET_SM_ISSUE_RATE_MODIFIER */
	0x20801303,	/* dst NV2080_FB_GET_INFO_V2 */
	0x20801322,	/* s NV2080_FB_GET_OFFLINED_PAGES */
	0x20801357,	/* s NV2080_FB_QUERY_DRAM_ENCRYPTION_INFOROM_SUPPORT */
	0x20801701,	/* dst NV2080_MC_GET_ARCH_INFO */
	0x20801702,	/* h NV2080_MC_SERVICE_INTERRUPTS: CUDA, channels stalled */
	0x20801801,	/* dst NV2080_BUS_GET_PCI_INFO */
	0x20801802,	/* s NV2080_BUS_GET_INFO */
	0x20801803,	/* dt NV2080_BUS_GET_PCI_BAR_INFO */
	0x20801813,	/* s NV2080_BUS_GET_PEX_COUNTERS */
	0x20801819,	/* s NV2080_BUS_GET_PEX_UTIL_COUNTERS */
	0x20801823,	/* dt NV2080_BUS_GET_INFO_V2 */
	0x20801829,	/* s NV2080_BUS_GET_PCIE_REQ_ATOMICS_CAPS */
	0x2080182a,	/* dt NV2080_BUS_GET_PCIE_SUPPORTED_GPU_ATOMICS */
	0x2080182b,	/* dst NV2080_BUS_GET_C2C_INFO */
	0x20801830,	/* s NV2080_BUS_GET_PCIE_CPL_ATOMICS_CAPS */
	0x2080200a,	/* dt NV2080_PERF_BOOST */
	0x2080220c,	/* dt NV2080_RC_RELEASE_WATCHDOG_REQUESTS */
	0x20802210,	/* dt NV2080_RC_SOFT_DISABLE_WATCHDOG */
	0x20802a0a,	/* dt NV2080_CE_GET_ALL_CAPS */
	0x20803001,	/* h NV2080_NVLINK_GET_NVLINK_CAPS: refused for a workload on the H100; read-only, non-privileged, in nvproxy's compute set (docs/allowlist.md) */
	0x20803002,	/* dt NV2080_NVLINK_GET_NVLINK_STATUS */
	0x20803083,	/* s NV2080_NVLINK_GET_PLATFORM_INFO */
	0x20803404,	/* s NV2080_ECC_GET_REPAIR_STATUS */
	0x20803406,	/* s  */
	0x20803601,	/* dst NV2080_GSP_GET_FEATURES */
	0x20803801,	/* dt NV2080_GRMGR_GET_GR_FS_INFO */
	0x20808159,	/* dt  */
	0x20808162,	/* dt  */
	0x2080852a,	/* s  */
	0x2080852b,	/* s  */
	0x2080852e,	/* s  */
	0x2080852f,	/* s  */
	0x20808536,	/* s  */
	0x2080853a,	/* s  */
	0x20808542,	/* s  */
	0x20808546,	/* s  */
	0x20809001,	/* t  */
	0x20809009,	/* st  */
	0x20809019,	/* s  */
	0x20809038,	/* dst  */
	0x20809064,	/* st  */
	0x2080a026,	/* t  */
	0x2080a060,	/* s  */
	0x2080a06e,	/* s  */
	0x2080a06f,	/* s  */
	0x2080a080,	/* s  */
	0x2080a084,	/* t  */
	0x2080a0a4,	/* s  */
	0x2080a0a6,	/* s  */
	0x2080a0a7,	/* s  */
	0x2080a0a8,	/* s  */
	0x2080a0f2,	/* s  */
	0x2080a612,	/* s  */
	0x2080a618,	/* s  */
	0x2080a63c,	/* s  */
	0x20810108,	/* dst  */
	0x20810110,	/* s  */
	0x20810111,	/* s  */
	0x503c0102,	/* dt NV503C_REGISTER_VA_SPACE */
	0x503c0104,	/* dt NV503C_REGISTER_VIDMEM */
	0x503c0105,	/* dt NV503C_UNREGISTER_VIDMEM */
	0x83de0309,	/* dt NV83DE_DEBUG_SET_EXCEPTION_MASK */
	0x906f0101,	/* dt  */
	0x90e60102,	/* dt NV90E6_MASTER_GET_VIRTUAL_FUNCTION_ERROR_CONT_INTR_MASK */
	0x90e70113,	/* s NV90E7_BBX_GET_LAST_FLUSH_TIME */
	0xa06c0101,	/* dt NVA06C_GPFIFO_SCHEDULE */
	0xa06c0103,	/* dt NVA06C_SET_TIMESLICE */
	0xc36f0108,	/* dt NVC36F_GPFIFO_GET_WORK_SUBMIT_TOKEN */
	0xcb330101,	/* dt  */
};

/* controls that change the whole GPU (clock controls are not named: unlisted) */
static const nv_u32 gs_global_controls[] = {
	NV0000_CTRL_CMD_GPU_MODIFY_DRAIN_STATE,
	NV0080_CTRL_CMD_GPU_MODIFY_SW_STATE_PERSISTENCE,
	NV2080_CTRL_CMD_GPU_SET_POWER,
	NV2080_CTRL_CMD_GPU_SET_COMPUTE_MODE_RULES,
	NV2080_CTRL_CMD_GPU_SET_ECC_CONFIGURATION,
	NV2080_CTRL_CMD_GPU_RESET_ECC_ERROR_STATUS,
	NV2080_CTRL_CMD_GPU_SET_PARTITIONS,
	NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
	NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS_FOR_KEY_ROTATION,
	NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS_FOR_KEY_ROTATION_V2,
	NV2080_CTRL_CMD_PERF_SET_POWERSTATE,
	NV2080_CTRL_CMD_PERF_RATED_TDP_SET_CONTROL,
	NV0080_CTRL_CMD_BIF_RESET,
	NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_RESET,
	NV2080_CTRL_CMD_GPU_UNMARK_DEVICE_FOR_RESET,
	NV2080_CTRL_CMD_GPU_MARK_DEVICE_FOR_DRAIN_AND_RESET,
	NV2080_CTRL_CMD_GPU_UNMARK_DEVICE_FOR_DRAIN_AND_RESET,
};

/*
 * controls that move RM objects between processes through fds and that
 * export.c does not decide on
 */
static const nv_u32 gs_export_controls[] = {
	NV0000_CTRL_CMD_OS_UNIX_CREATE_EXPORT_OBJECT_FD,	/* deprecated in 580 (os.c) */
};

/* classes seen in the traces (RM_ALLOC), plus the other two root classes */
static const nv_u32 gs_allowed_classes[] = {
	NV01_ROOT,			/* dst */
	NV01_ROOT_NON_PRIV,
	NV01_MEMORY_SYSTEM,		/* dt */
	NV01_MEMORY_LOCAL_USER,		/* dt, counted by quota.c */
	NV01_ROOT_CLIENT,
	NV04_DISPLAY_COMMON,		/* s, RM answers NOT_SUPPORTED */
	NV01_EVENT_OS_EVENT,		/* dt */
	NV01_DEVICE_0,			/* dst */
	RM_USER_SHARED_DATA,		/* dst */
	NV20_SUBDEVICE_0,		/* dst */
	NV2081_BINAPI,			/* dst */
	NV50_P2P,			/* p: peer mapping between two subdevices of the caller's own client (p2p_api.c: subdeviceGetByHandle() in the caller's client) */
	NV50_THIRD_PARTY_P2P,		/* dt */
	NV50_MEMORY_VIRTUAL,		/* dt */
	GT200_DEBUGGER,			/* dt */
	FERMI_CONTEXT_SHARE_A,		/* dt */
	GF100_SUBDEVICE_MASTER,		/* dt */
	GF100_SUBDEVICE_INFOROM,	/* s */
	FERMI_VASPACE_A,		/* dt */
	KEPLER_CHANNEL_GROUP_A,		/* dt */
	AMPERE_SMC_CONFIG_SESSION,	/* st, its MIG controls are not listed */
	AMPERE_SMC_MONITOR_SESSION,	/* st */
	HOPPER_USERMODE_A,		/* dt */
	HOPPER_CHANNEL_GPFIFO_A,	/* dt */
	HOPPER_DMA_COPY_A,		/* dt */
	NV_CONFIDENTIAL_COMPUTE,	/* dt */
	HOPPER_COMPUTE_A,		/* dt */
};

/*
 * escapes on nvidiactl / nvidia<N> that need no decoding to be safe. Not here:
 * NV_ESC_ATTACH_GPUS_TO_FD (nv.c nvidia_dev_get() opens and pins any GPU of the
 * host by id, with no permission check: core.c lets it name the instance's
 * GPUs only), NV_ESC_REGISTER_FD (on nvidiactl it changes which file RM
 * checks clients against: core.c lets GPU files have it only) and
 * NV_ESC_SYS_PARAMS (host-wide: core.c answers it without the driver).
 */
static const nv_u32 gs_plain_escapes[] = {
	NV_ESC_CARD_INFO,
	NV_ESC_STATUS_CODE,
	NV_ESC_CHECK_VERSION_STR,
	NV_ESC_NUMA_INFO,
	NV_ESC_WAIT_OPEN_COMPLETE,
};

static int gs_in(const nv_u32 *v, unsigned int n, nv_u32 x)
{
	unsigned int lo = 0, hi = n;

	while (lo < hi) {
		unsigned int mid = lo + (hi - lo) / 2;

		if (v[mid] == x)
			return 1;
		if (v[mid] < x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

int gs_control_allowed(nv_u32 cmd)
{
	return gs_in(gs_allowed_controls, ARRAY_SIZE(gs_allowed_controls), cmd);
}

/* the escapes gs_pre() decodes itself are not asked about here */
enum gs_refusal gs_filter_escape(struct gs_inst *in, nv_u32 escape)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(gs_plain_escapes); i++)
		if (gs_plain_escapes[i] == escape)
			return GS_REFUSE_NONE;
	if (escape == GS_TEST_ESC_SUBMIT && (in->flags & GS_INST_ALLOW_TEST_ESCAPES))
		return GS_REFUSE_NONE;
	return GS_REFUSE_ESCAPE;
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
 */
static const struct {
	nv_u32 cmd;
	const char *why;
} gs_uvm_allowed[] = {
	{ UVM_INITIALIZE, "dst: binds the VA space to the caller's mm" },
	{ UVM_DEINITIALIZE, "s: ends it" },
	{ 23, "dt UVM_CREATE_RANGE_GROUP: bookkeeping in the caller's VA space" },
	{ 24, "dt UVM_DESTROY_RANGE_GROUP" },
	{ 25, "dt UVM_REGISTER_GPU_VASPACE: RM VA space of the caller's own client (rmCtrlFd, hClient checked by RM)" },
	{ 26, "UVM_UNREGISTER_GPU_VASPACE" },
	{ 27, "dt UVM_REGISTER_CHANNEL: the caller's own channel (RM checks the client)" },
	{ 28, "UVM_UNREGISTER_CHANNEL" },
	{ 29, "UVM_ENABLE_PEER_ACCESS: between GPUs the caller registered" },
	{ 30, "UVM_DISABLE_PEER_ACCESS" },
	{ 31, "UVM_SET_RANGE_GROUP" },
	{ 33, "dt UVM_MAP_EXTERNAL_ALLOCATION: maps the caller's own RM memory (cuMemMap)" },
	{ 34, "dt UVM_FREE" },
	{ 37, "dt UVM_REGISTER_GPU" },
	{ 38, "UVM_UNREGISTER_GPU" },
	{ 39, "dst UVM_PAGEABLE_MEM_ACCESS: a query" },
	{ 42, "UVM_SET_PREFERRED_LOCATION: managed ranges of the caller" },
	{ 43, "UVM_UNSET_PREFERRED_LOCATION" },
	{ 44, "UVM_ENABLE_READ_DUPLICATION" },
	{ 45, "UVM_DISABLE_READ_DUPLICATION" },
	{ 46, "UVM_SET_ACCESSED_BY" },
	{ 47, "UVM_UNSET_ACCESSED_BY" },
	{ 51, "UVM_MIGRATE: prefetch of the caller's managed memory" },
	{ 53, "UVM_MIGRATE_RANGE_GROUP" },
	{ 65, "dt UVM_MAP_DYNAMIC_PARALLELISM_REGION" },
	{ 66, "UVM_UNMAP_EXTERNAL" },
	{ 68, "dt UVM_ALLOC_SEMAPHORE_POOL" },
	{ 72, "dt UVM_VALIDATE_VA_RANGE: a query" },
	{ 73, "dt UVM_CREATE_EXTERNAL_RANGE" },
	{ 75, "dt UVM_MM_INITIALIZE" },
};

enum gs_refusal gs_filter_uvm(nv_u32 cmd)
{
	unsigned int i;

	for (i = 0; i < ARRAY_SIZE(gs_uvm_allowed); i++)
		if (gs_uvm_allowed[i].cmd == cmd)
			return GS_REFUSE_NONE;
	return GS_REFUSE_UNLISTED;
}

enum gs_refusal gs_filter_class(nv_u32 klass)
{
	if (gs_vidmem_class(klass) < 0)
		return GS_REFUSE_CLASS;
	if (gs_in(gs_allowed_classes, ARRAY_SIZE(gs_allowed_classes), klass))
		return GS_REFUSE_NONE;
	return GS_REFUSE_UNLISTED;
}

/* NV_ESC_RM_ALLOC_MEMORY: only OS descriptors (pinned host memory), as traced */
enum gs_refusal gs_filter_alloc_memory_class(nv_u32 klass)
{
	if (klass == NV01_MEMORY_SYSTEM_OS_DESCRIPTOR)
		return GS_REFUSE_NONE;
	if (gs_vidmem_class(klass))
		return GS_REFUSE_CLASS;
	return GS_REFUSE_UNLISTED;
}

static enum gs_refusal gs_filter_disable_channels(struct gs_inst *in, const struct gs_io *io,
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

/* called with in->lock held; the caller checked that p->h_client is ours */
enum gs_refusal gs_filter_control(struct gs_inst *in, struct gs_call *c, const struct gs_io *io,
				  const struct nvos54_params *p)
{
	unsigned int i;

	if (p->cmd == NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS)
		return gs_filter_disable_channels(in, io, p);
	for (i = 0; i < ARRAY_SIZE(gs_global_controls); i++)
		if (gs_global_controls[i] == p->cmd)
			return GS_REFUSE_GLOBAL;
	for (i = 0; i < ARRAY_SIZE(gs_export_controls); i++)
		if (gs_export_controls[i] == p->cmd)
			return GS_REFUSE_FOREIGN;
	if (gs_control_allowed(p->cmd))
		return GS_REFUSE_NONE;
	return GS_REFUSE_UNLISTED;
}
