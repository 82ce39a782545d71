"""BPF C sources for `gpuctl trace` (pure: text in, text out; bcc compiles them).

Three programs:
- IOCTL: gpuslice:gpuslice_ioctl -> cumulative sums and log2 histograms per
  (instance, escape, what); user space diffs snapshots, so nothing is ever lost to a clear.
- REFUSALS: gpuslice:gpuslice_refusal -> one perf event per refusal.
- SCHED: syscalls:sys_{enter,exit}_ioctl for RM_CONTROL ioctls whose NVOS54 cmd is
  NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS -> latency histogram per process.
"""

from __future__ import annotations

from gpuslice import abi
from gpuslice.state import valid_name
from gpuslice.trace.fmt import FILE_UVM, UVM_KEY_BIT

INST_LEN = 32  # GPUSLICE_NAME_MAX

NVOS54_CMD_OFFSET = 8
NVOS54_STATUS_OFFSET = 28


def inst_filter_c(name: str | None, var: str) -> str:
    """C statements that return 0 unless the NUL-terminated char array `var` equals name."""
    if name is None:
        return ""
    if not valid_name(name):
        raise ValueError(f"bad instance name {name!r}")
    conds = [f"{var}[{i}] != {ord(ch)}" for i, ch in enumerate(name)]
    conds.append(f"{var}[{len(name)}] != 0")
    return "if (" + " || ".join(conds) + ") return 0;"


def pid_filter_c(pid: int | None, expr: str) -> str:
    if pid is None:
        return ""
    if not 0 < pid < 1 << 32:
        raise ValueError(f"bad pid {pid}")
    return f"if ({expr} != {pid}) return 0;"


_LOG2 = """
static __always_inline u32 gs_slot(u64 v)
{
    return v ? bpf_log2l(v) : 0;    /* 0 -> 0, else floor(log2(v)) + 1 */
}
"""

_IOCTL = """
#define INST_LEN %(inst_len)d
struct key_t {
    char inst[INST_LEN];
    u32 escape;
    u32 what;
};
struct hkey_t {
    struct key_t k;
    u32 kind;    /* 0 total, 1 interposer overhead */
    u32 slot;
};
struct val_t {
    u64 count;
    u64 refused;
    u64 errors;
    u64 total_ns;
    u64 drv_ns;
};
BPF_HASH(sums, struct key_t, struct val_t, 4096);
BPF_HASH(hists, struct hkey_t, u64, 65536);
%(log2)s
TRACEPOINT_PROBE(gpuslice, gpuslice_ioctl)
{
    struct key_t k = {};
    struct val_t zero = {};
    struct hkey_t hk = {};
    struct val_t *v;
    u64 total = args->total_ns, drv = args->drv_ns;

    %(pid_filter)s
    TP_DATA_LOC_READ_STR(k.inst, inst, INST_LEN);
    %(inst_filter)s
    k.escape = args->escape;
    if (args->file_kind == %(file_uvm)d)
        k.escape |= %(uvm_bit)du;
    k.what = args->what;
    if (drv > total)
        drv = total;
    v = sums.lookup_or_try_init(&k, &zero);
    if (!v)
        return 0;
    __sync_fetch_and_add(&v->count, 1);
    if (args->refusal)
        __sync_fetch_and_add(&v->refused, 1);
    if (args->status)
        __sync_fetch_and_add(&v->errors, 1);
    __sync_fetch_and_add(&v->total_ns, total);
    __sync_fetch_and_add(&v->drv_ns, drv);
    __builtin_memcpy(&hk.k, &k, sizeof(k));
    hk.kind = 0;
    hk.slot = gs_slot(total / %(div)d);
    hists.increment(hk);
    hk.kind = 1;
    hk.slot = gs_slot((total - drv) / %(div)d);
    hists.increment(hk);
    return 0;
}
"""

_REFUSALS = """
#define INST_LEN %(inst_len)d
struct ev_t {
    u64 ts;
    u64 size;
    u32 inst_id;
    u32 pid;
    u32 escape;
    u32 what;
    u32 refusal;
    u32 status;
    char inst[INST_LEN];
};
BPF_PERF_OUTPUT(events);
TRACEPOINT_PROBE(gpuslice, gpuslice_refusal)
{
    struct ev_t ev = {};

    %(pid_filter)s
    TP_DATA_LOC_READ_STR(ev.inst, inst, INST_LEN);
    %(inst_filter)s
    ev.ts = bpf_ktime_get_ns();
    ev.size = args->size;
    ev.inst_id = args->inst_id;
    ev.pid = args->pid;
    ev.escape = args->escape;
    if (args->file_kind == %(file_uvm)d)
        ev.escape |= %(uvm_bit)du;
    ev.what = args->what;
    ev.refusal = args->refusal;
    ev.status = args->status;
    events.perf_submit(args, &ev, sizeof(ev));
    return 0;
}
"""

_SCHED = """
struct start_t {
    u64 ts;
    u64 arg;
};
struct skey_t {
    u32 tgid;
    char comm[16];    /* TASK_COMM_LEN */
};
struct shkey_t {
    struct skey_t k;
    u32 slot;
};
struct sval_t {
    u64 count;
    u64 errors;
    u64 total_ns;
};
BPF_HASH(start, u64, struct start_t, 4096);
BPF_HASH(sums, struct skey_t, struct sval_t, 1024);
BPF_HASH(maxes, struct skey_t, u64, 1024);
BPF_HASH(hists, struct shkey_t, u64, 16384);
%(log2)s
TRACEPOINT_PROBE(syscalls, sys_enter_ioctl)
{
    u64 id = bpf_get_current_pid_tgid();
    struct start_t s = {};
    u32 cmd = 0;

    if (args->cmd != %(req)du)
        return 0;
    %(pid_filter)s
    if (bpf_probe_read_user(&cmd, sizeof(cmd), (void *)(args->arg + %(cmd_off)d)))
        return 0;
    if (cmd != %(ctrl)du)
        return 0;
    s.ts = bpf_ktime_get_ns();
    s.arg = args->arg;
    start.update(&id, &s);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_exit_ioctl)
{
    u64 id = bpf_get_current_pid_tgid();
    struct start_t *s = start.lookup(&id);
    struct skey_t k = {};
    struct shkey_t hk = {};
    struct sval_t zero = {};
    struct sval_t *v;
    u64 delta, *m;
    u32 status = 0;

    if (!s)
        return 0;
    delta = bpf_ktime_get_ns() - s->ts;
    if (args->ret == 0 &&
        bpf_probe_read_user(&status, sizeof(status), (void *)(s->arg + %(status_off)d)))
        status = 1;
    start.delete(&id);
    k.tgid = id >> 32;
    bpf_get_current_comm(&k.comm, sizeof(k.comm));
    v = sums.lookup_or_try_init(&k, &zero);
    if (!v)
        return 0;
    __sync_fetch_and_add(&v->count, 1);
    if (args->ret != 0 || status != 0)
        __sync_fetch_and_add(&v->errors, 1);
    __sync_fetch_and_add(&v->total_ns, delta);
    m = maxes.lookup(&k);
    if (!m)
        maxes.update(&k, &delta);
    else if (delta > *m)
        *m = delta;
    __builtin_memcpy(&hk.k, &k, sizeof(k));
    hk.slot = gs_slot(delta / %(div)d);
    hists.increment(hk);
    return 0;
}
"""


def ioctl_program(div: int, instance: str | None, pid: int | None) -> str:
    return _IOCTL % {
        "inst_len": INST_LEN,
        "log2": _LOG2,
        "div": div,
        "pid_filter": pid_filter_c(pid, "args->pid"),
        "inst_filter": inst_filter_c(instance, "k.inst"),
        "file_uvm": FILE_UVM,
        "uvm_bit": UVM_KEY_BIT,
    }


def refusals_program(instance: str | None, pid: int | None) -> str:
    return _REFUSALS % {
        "inst_len": INST_LEN,
        "pid_filter": pid_filter_c(pid, "args->pid"),
        "inst_filter": inst_filter_c(instance, "ev.inst"),
        "file_uvm": FILE_UVM,
        "uvm_bit": UVM_KEY_BIT,
    }


def sched_program(div: int, pid: int | None) -> str:
    return _SCHED % {
        "log2": _LOG2,
        "div": div,
        "req": abi.IOCTL_RM_CONTROL,
        "ctrl": abi.NV2080_CTRL_CMD_FIFO_DISABLE_CHANNELS,
        "cmd_off": NVOS54_CMD_OFFSET,
        "status_off": NVOS54_STATUS_OFFSET,
        "pid_filter": pid_filter_c(pid, "(u32)(id >> 32)"),
    }
