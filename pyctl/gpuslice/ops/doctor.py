"""`gpuctl doctor`: is this host set up the way gpuslice needs it?

One function per check, each taking what it reads through its parameters (paths, a
reader, a connector, a clock) so that tests point it at a temporary directory or a fake;
each returns one :class:`Check` and never raises for what it finds on the host. A check
that finds nothing to check (no NVIDIA driver, no module) says ``skip``; ``warn`` is a
weakness that does not stop gpuslice working; ``fail`` is something to fix, with the fix
in one line. :func:`run_all` runs them all against the host (or a root for tests).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shlex
import stat
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Sequence

from gpuslice import nvdriver, nvrm_versions
from gpuslice.netlink import SYS_MODULE
from gpuslice.state import DEFAULT_PATH as DEFAULT_STATE

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
STATUSES = (OK, WARN, FAIL, SKIP)

PROC_DRIVER_VERSION = nvdriver.PROC_DRIVER_VERSION
SYS_DRIVER_VERSION = nvdriver.SYS_DRIVER_VERSION
MMAP_MIN_ADDR = "/proc/sys/vm/mmap_min_addr"
# The module maps each process's parameter pages at 0x1000..0x10000 (15 pages, below
# mmap_min_addr, where only CAP_SYS_RAWIO may map): docs/isolation.md, section 2.
MMAP_MIN_ADDR_NEEDED = 65536
DAEMON_UNIT = "gpuslice-daemon.service"
EXPORTER_UNIT = "gpuslice-exporter.service"
# The daemon rewrites its status file every 0.5 s, and at the latest every 5 s
# (sched/report.py StatusFile.due): older than this, its loop is not running.
STATUS_MAX_AGE_S = 15.0
HTTP_TIMEOUT_S = 3.0

Reader = Callable[[str], str]


@dataclass(frozen=True)
class Check:
    """One check's outcome: status is ok, warn, fail or skip; fix is one line (or "")."""
    name: str
    status: str
    message: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _reason(e: OSError) -> str:
    return e.strerror or str(e)


# ---- 1. the NVIDIA driver ------------------------------------------------------------

parse_driver_version = nvdriver.parse_version


def check_driver(proc_version: str = PROC_DRIVER_VERSION, sys_version: str = SYS_DRIVER_VERSION,
                 read: Reader = read_text) -> Check:
    name = "driver"
    found = None
    for path in (proc_version, sys_version):
        try:
            text = read(path)
        except FileNotFoundError:
            continue
        except OSError as e:
            return Check(name, WARN, f"cannot read {path}: {_reason(e)}")
        found = (path, parse_driver_version(text))
        break
    if found is None:
        return Check(name, SKIP, f"no NVIDIA driver loaded (neither {proc_version} nor {sys_version})")
    path, version = found
    if version is None:
        return Check(name, WARN, f"no driver version found in {path}")
    sup = nvdriver.support(version)
    if sup.table:
        measured = "; the release gpuslice was measured on" if version == nvdriver.MEASURED_VERSION else ""
        return Check(name, OK, f"NVIDIA driver {version} (branch {sup.branch}, ABI table: yes{measured})")
    why = (f"branch {sup.branch} is supported, this release has no ABI table" if sup.branch_known
           else f"branch {sup.branch} is not supported")
    return Check(name, FAIL, f"NVIDIA driver {version} ({why}; supported: {nvrm_versions.supported_summary()}): "
                 "gpuslice.ko refuses to load on it and the library refuses its calls",
                 "install a supported release (docs/driver-versions.md), add this one's table from its tag "
                 "(scripts/nvrm-abi.py update --add VERSION), or load gpuslice with passthrough_only=1 "
                 "(calls pass through undecoded: no memory limit, no filtering)")


# ---- 2. the module and its netlink version -------------------------------------------

def connect_netlink() -> Any:
    """A GpusliceNetlink: binds to the family and runs the version handshake."""
    from gpuslice.netlink import GpusliceNetlink

    return GpusliceNetlink()


def check_module(sys_module: str = SYS_MODULE, connect: Callable[[], Any] = connect_netlink,
                 read: Reader = read_text) -> Check:
    from gpuslice.netlink import VERSION, VersionMismatch

    name = "module"
    if not os.path.isdir(sys_module):
        return Check(name, FAIL, "gpuslice.ko is not loaded",
                     "sudo modprobe gpuslice (at boot: deploy/modules-load.d/gpuslice.conf; the gpuslice-daemon "
                     "unit loads it too)")
    try:
        nl = connect()
    except VersionMismatch as e:  # one line naming both versions (netlink.check_version)
        return Check(name, FAIL, str(e), "install gpuctl and gpuslice.ko from the same checkout (docs/operations.md, "
                     "\"Upgrade\"), then reload the module")
    except (OSError, ImportError) as e:
        return Check(name, FAIL, f"gpuslice.ko is loaded but its netlink family does not answer: {e}",
                     "dmesg | grep gpuslice says why; reload it (rmmod gpuslice && modprobe gpuslice)")
    try:
        version = getattr(nl, "module_version", VERSION)
    finally:
        nl.close()
    msg = f"gpuslice.ko loaded, netlink version {version} (gpuctl's)"
    try:
        passthrough = read(os.path.join(sys_module, "parameters", "passthrough_only")).strip()
    except OSError:
        passthrough = ""
    if passthrough in ("Y", "1"):
        return Check(name, WARN, msg + ", but loaded with passthrough_only=1: calls reach the driver undecoded "
                     "(no memory limit, no filtering)",
                     "on a tested driver, load it without passthrough_only (/etc/modprobe.d/gpuslice.conf)")
    return Check(name, OK, msg)


# ---- 2b. the state file's instances in the module ----------------------------------

def check_instances(state_file: str | None, sys_module: str = SYS_MODULE,
                    connect: Callable[[], Any] = connect_netlink, dev: str = "/dev") -> Check:
    """Every instance of the state file is in the module (`instance restore` makes them
    after a boot, and names those the module refuses, e.g. of a GPU that is gone).
    ``state_file`` None: not asked (gpuctl --kernel no)."""
    from gpuslice import instances as I
    from gpuslice import state as S

    name = "instances"
    if state_file is None:
        return Check(name, SKIP, "--kernel no: the state file is not compared with the module")
    try:
        st = S.load(state_file)
    except S.StateError as e:
        return Check(name, FAIL, str(e), f"repair {state_file} or put its backup back (gpuctl leaves it untouched)")
    if not st.instances:
        return Check(name, OK, f"no instances in {state_file}")
    if not os.path.isdir(sys_module):
        return Check(name, SKIP, "gpuslice.ko is not loaded (see the module check)")
    try:
        nl = connect()
    except Exception:  # the module check says why
        return Check(name, SKIP, "the module does not answer (see the module check)")
    try:
        have = {d["name"] for d in nl.instances() if "name" in d}
    finally:
        nl.close()
    missing = [i for i in sorted(st.instances.values(), key=lambda i: i.name) if i.name not in have]
    if not missing:
        return Check(name, OK, f"the {len(st.instances)} instance(s) of {state_file} are in the module")
    why = []
    for i in missing:
        gone = I.missing_gpus(i.gpus, dev) or []
        why.append(f"{i.name} ({I.gpu_words(i.gpus)}: "
                   + (f"this host has no {I.gpu_words(gone)})" if gone else "not made)"))
    return Check(name, FAIL, f"{len(missing)} of {len(st.instances)} instance(s) of {state_file} not in the module: "
                 + "; ".join(why),
                 "sudo gpuctl instance restore (it names why the module refuses one); one whose GPU is gone: "
                 "sudo gpuctl instance delete NAME, or put the GPU back")


def check_build(sys_module: str = SYS_MODULE, read: Reader = read_text) -> Check:
    """gpuctl and the loaded module from one checkout: the module's version
    (/sys/module/gpuslice/version, ``RELEASE BUILD``: kmod/version.h) against gpuctl's
    release and build (gpuslice.version); the netlink ABI is check_module's."""
    from gpuslice import version as V

    name = "build"
    ours = f"gpuctl {V.RELEASE} (netlink ABI {V.ABI}, build {V.build()})"
    fix = "install gpuctl and gpuslice.ko from the same checkout (docs/operations.md, \"Upgrade\"), then reload the module"
    if not os.path.isdir(sys_module):
        return Check(name, SKIP, "gpuslice.ko is not loaded")
    try:
        text = read(os.path.join(sys_module, "version"))
    except FileNotFoundError:
        return Check(name, WARN, f"gpuslice.ko states no version (built before modules did): {ours} cannot tell "
                     "whether it is from the same checkout", fix)
    except OSError as e:
        return Check(name, WARN, f"cannot read {os.path.join(sys_module, 'version')}: {_reason(e)}")
    release, build = V.parse_module_version(text)
    mine = V.build()
    theirs = f"gpuslice.ko {release} (build {build})"
    if release != V.RELEASE:
        return Check(name, FAIL, f"{ours} and {theirs} are different releases", fix)
    if V.UNKNOWN in (mine, build):
        return Check(name, OK, f"{ours}, {theirs}: same release; a build unknown, so not compared")
    if mine != build:
        return Check(name, WARN, f"{ours} and {theirs} were built from different checkouts", fix)
    return Check(name, OK, f"{ours}: the module is the same build")


# ---- 3. the daemon -------------------------------------------------------------------

def run_cmd(argv: Sequence[str]) -> tuple[int, str] | None:
    """(exit status, stdout) of a command; None when it cannot run (no systemctl)."""
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.returncode, r.stdout


def unit_state(unit: str, run: Callable[[Sequence[str]], tuple[int, str] | None] = run_cmd) -> str | None:
    """``systemctl is-active UNIT``: active, inactive, failed, ...; None without systemd."""
    r = run(["systemctl", "is-active", unit])
    if r is None:
        return None
    out = r[1].strip().splitlines()
    return out[0] if out else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's (root's, as seen by a user): alive
        return True
    except (OSError, OverflowError):
        return False
    return True


def check_daemon(status_file: str, unit: Callable[[str], str | None] = unit_state,
                 now: Callable[[], float] = time.time, alive: Callable[[int], bool] = pid_alive,
                 read: Reader = read_text, max_age_s: float = STATUS_MAX_AGE_S) -> Check:
    """Running: the unit is active, or the status file (which `gpuctl daemon` rewrites
    every 0.5 s) is fresh and names a live pid (a daemon started by hand)."""
    name = "daemon"
    state = unit(DAEMON_UNIT)
    start = f"sudo systemctl enable --now {DAEMON_UNIT.removesuffix('.service')} (deploy/systemd/{DAEMON_UNIT})"
    logs = f"journalctl -u {DAEMON_UNIT.removesuffix('.service')} says why"
    status: dict[str, Any] | None = None
    unreadable = ""
    try:
        d = json.loads(read(status_file))
        status = d if isinstance(d, dict) else None
        if status is None:
            unreadable = "not a JSON object"
    except FileNotFoundError:
        pass
    except OSError as e:
        unreadable = _reason(e)
    except ValueError:
        unreadable = "not JSON"
    pid, age = None, None
    if status is not None:
        pid = status.get("pid") if isinstance(status.get("pid"), int) else None
        t = status.get("time")
        age = now() - float(t) if isinstance(t, (int, float)) else None
    live = pid is not None and alive(pid)
    fresh = live and age is not None and age <= max_age_s
    unit_note = f"{DAEMON_UNIT} {state}" if state else "no systemd"
    if fresh:
        return Check(name, OK, f"running (pid {pid}, {status_file} {max(age or 0.0, 0.0):.1f} s old; {unit_note})")
    if status is None:
        stale = ""
    elif not live:
        stale = f"{status_file} names " + (f"pid {pid}, which is gone" if pid is not None else "no pid")
    else:
        stale = f"{status_file} of pid {pid} is " + (f"{age:.0f} s old" if age is not None else "undated")
    if state == "active":
        if unreadable:
            return Check(name, OK, f"{DAEMON_UNIT} active ({status_file} unreadable: {unreadable}; run as root "
                         "to see that its loop runs)")
        if status is None:
            return Check(name, WARN, f"{DAEMON_UNIT} active but no {status_file} yet", logs)
        return Check(name, FAIL, f"{DAEMON_UNIT} active but {stale}: its scheduling loop is not running",
                     f"{logs}; sudo systemctl restart {DAEMON_UNIT.removesuffix('.service')}")
    fix = (f"{logs}; then " if state == "failed" else "") + start
    if stale:
        return Check(name, FAIL, f"not running ({unit_note}; {stale})", fix)
    if unreadable:
        return Check(name, FAIL, f"not running ({unit_note}; {status_file} unreadable: {unreadable})", fix)
    return Check(name, FAIL, f"not running ({unit_note}, no {status_file})", fix)


# ---- 4. the real nodes ---------------------------------------------------------------

NV_MAJOR = 195


def real_nodes(dev: str = "/dev", listdir: Callable[[str], list[str]] = os.listdir) -> list[str]:
    """The real driver's nodes in ``dev``: nvidiactl, nvidia<N> (in order), nvidia-uvm
    and nvidia-uvm-tools, those that exist."""
    try:
        names = set(listdir(dev))
    except OSError:
        return []
    gpus = sorted((n for n in names if re.fullmatch(r"nvidia\d+", n)), key=lambda n: int(n[6:]))
    return [os.path.join(dev, n) for n in ("nvidiactl", *gpus, "nvidia-uvm", "nvidia-uvm-tools") if n in names]


def _owner(uid: int, gid: int) -> str:
    try:
        u = pwd.getpwuid(uid).pw_name
    except KeyError:
        u = str(uid)
    try:
        g = grp.getgrgid(gid).gr_name
    except KeyError:
        g = str(gid)
    return f"{u}:{g}"


def check_real_nodes(dev: str = "/dev", listdir: Callable[[str], list[str]] = os.listdir,
                     stat_fn: Callable[[str], os.stat_result] = os.stat) -> Check:
    """What the real nodes' modes are. World access (the driver's default 0666) is a
    weakness docs/fd-translation.md names: a container thread that reaches a real file
    through /proc/<pid>/task/<tid>/fd during another thread's call passes open()'s mode
    check, and only its device cgroup stops it."""
    name = "real-nodes"
    paths = real_nodes(dev, listdir)
    if not paths:
        return Check(name, SKIP, f"no real NVIDIA nodes in {dev} (nvidiactl, nvidia<N>, nvidia-uvm)")
    found, world, bad = [], [], []
    for p in paths:
        try:
            st = stat_fn(p)
        except OSError as e:
            bad.append(f"{p}: {_reason(e)}")
            continue
        mode = stat.S_IMODE(st.st_mode)
        desc = f"{os.path.basename(p)} {mode:04o} {_owner(st.st_uid, st.st_gid)}"
        found.append(desc)
        if not stat.S_ISCHR(st.st_mode):
            bad.append(f"{p} is not a character device")
        elif "uvm" not in os.path.basename(p) and os.major(st.st_rdev) != NV_MAJOR:
            bad.append(f"{p} is not major {NV_MAJOR}")
        if mode & 0o006:
            world.append(f"{os.path.basename(p)} {mode:04o}")
    if bad:
        return Check(name, FAIL, f"{'; '.join(bad)} (found: {', '.join(found)})",
                     "recreate the nodes (nvidia-modprobe -c0 -u, or reload the driver)")
    if world:
        return Check(name, WARN, f"world-accessible: {', '.join(world)}: a container that reaches a real file "
                     "through /proc/<pid>/task/<tid>/fd during a call passes the mode check, only its device cgroup "
                     "stops the reopen (docs/fd-translation.md)",
                     f"sudo chmod o-rw {' '.join(paths)}, and keep it at boot with `options nvidia "
                     "NVreg_DeviceFileMode=0660 NVreg_DeviceFileGID=<gid>` in /etc/modprobe.d/ (gpuslice opens the "
                     "real nodes without a mode check; host users of the GPU need the group)")
    return Check(name, OK, ", ".join(found))


# ---- 5. the device-cgroup requirement ------------------------------------------------

def check_device_cgroup(sys_module: str = SYS_MODULE, read: Reader = read_text) -> Check:
    """The module's require_device_cgroup: Y refuses instance nodes to a process whose
    device cgroup would let it open the real nodes (major 195, nvidia-uvm's)."""
    name = "device-cgroup"
    path = os.path.join(sys_module, "parameters", "require_device_cgroup")
    try:
        value = read(path).strip()
    except FileNotFoundError:
        return Check(name, SKIP, f"gpuslice.ko is not loaded (no {path})")
    except OSError as e:
        return Check(name, WARN, f"cannot read {path}: {_reason(e)}")
    if value in ("Y", "1"):
        return Check(name, OK, "require_device_cgroup=Y: a process whose device cgroup allows the real nodes "
                     f"(major {NV_MAJOR}, nvidia-uvm's) gets no instance node")
    return Check(name, FAIL, f"require_device_cgroup={value}: a container allowed the real nodes (major {NV_MAJOR}) "
                 "still gets instance nodes, and can reopen the real files through /proc/<pid>/task/<tid>/fd "
                 "during a call (right only for host use: tests, benchmarks)",
                 f"echo Y | sudo tee {path}, `options gpuslice require_device_cgroup=1` in "
                 "/etc/modprobe.d/gpuslice.conf, and give containers only their instance's nodes (CDI or "
                 "`gpuctl run-args`; never --privileged, --gpus or the NVIDIA runtime)")


# ---- 6. vm.mmap_min_addr -------------------------------------------------------------

def check_mmap_min_addr(path: str = MMAP_MIN_ADDR, read: Reader = read_text,
                        needed: int = MMAP_MIN_ADDR_NEEDED) -> Check:
    name = "mmap-min-addr"
    try:
        value = int(read(path).strip())
    except OSError as e:
        return Check(name, WARN, f"cannot read {path}: {_reason(e)}")
    except ValueError:
        return Check(name, WARN, f"{path} is not a number")
    if value >= needed:
        return Check(name, OK, f"vm.mmap_min_addr = {value}")
    return Check(name, FAIL, f"vm.mmap_min_addr = {value} < {needed}: a container process can map over the "
                 "parameter pages the module maps at 0x1000 (docs/isolation.md, section 2)",
                 f"sudo sysctl -w vm.mmap_min_addr={needed} && echo 'vm.mmap_min_addr = {needed}' | "
                 "sudo tee /etc/sysctl.d/60-gpuslice.conf")


# ---- 7. the CDI spec -----------------------------------------------------------------

def check_cdi(path: str, generate: Callable[[], Mapping[str, Any]], read: Reader = read_text) -> Check:
    """The spec at ``path`` against what `gpuctl cdi generate` makes now (``generate``:
    the spec as a dict)."""
    from gpuslice.ops import cdi

    name = "cdi"
    regen = f"sudo gpuctl cdi generate --output {path}"
    try:
        spec = generate()
    except Exception as e:  # the module, the state file or the host: whatever it was, one line
        return Check(name, WARN, f"cannot make the spec to compare with {path}: {e}",
                     "run gpuctl doctor as root")
    want = [d["name"] for d in spec.get("devices", [])]
    try:
        text = read(path)
    except FileNotFoundError:
        if not want:
            return Check(name, OK, f"no instances, and no {path} (CDI refuses a spec without devices)")
        return Check(name, FAIL, f"{path} missing (instances: {', '.join(want)})",
                     f"{regen}; `gpuctl --cdi-spec {path}` (or GPUSLICE_CDI_SPEC) keeps it current")
    except OSError as e:
        return Check(name, WARN, f"cannot read {path}: {_reason(e)}")
    if text == cdi.render(spec):
        n_files = len(spec.get("containerEdits", {}).get("mounts", []))
        if want and not n_files:
            return Check(name, WARN, f"{path} current: {len(want)} device(s) ({', '.join(want)}), but no NVIDIA "
                         "driver files found on this host: containers will get no libcuda",
                         f"install the NVIDIA driver, then {regen}")
        return Check(name, OK, f"{path} current: {len(want)} device(s) ({', '.join(want)}), {n_files} driver files")
    import yaml

    try:
        have = yaml.safe_load(text)
    except yaml.YAMLError:
        have = None
    if not isinstance(have, dict):
        return Check(name, FAIL, f"{path} is not a CDI spec (no YAML mapping)", regen)
    if not want:
        return Check(name, FAIL, f"{path} still lists devices but there are no instances", regen + " (removes it)")
    if have == dict(spec) and not spec.get("containerEdits", {}).get("mounts"):
        return Check(name, WARN, f"{path} current: {len(want)} device(s) ({', '.join(want)}), but no NVIDIA "
                     "driver files found on this host: containers will get no libcuda",
                     f"install the NVIDIA driver, then {regen}")
    if have == dict(spec):  # written otherwise (formatting), same content
        return Check(name, OK, f"{path} current: {len(want)} device(s) ({', '.join(want)})")
    return Check(name, FAIL, f"{path} differs from `gpuctl cdi generate`: {describe_spec_diff(have, spec)}", regen)


def describe_spec_diff(have: Mapping[str, Any], want: Mapping[str, Any]) -> str:
    """What differs between two CDI specs, in a few words."""
    def names(s: Mapping[str, Any]) -> list[str]:
        return sorted(str(d.get("name")) for d in s.get("devices") or [] if isinstance(d, dict))

    def mounts(s: Mapping[str, Any]) -> set[str]:
        edits = s.get("containerEdits") or {}
        return {str(m.get("hostPath")) for m in edits.get("mounts") or [] if isinstance(m, dict)}

    out = []
    hn, wn = names(have), names(want)
    if sorted(set(wn) - set(hn)):
        out.append(f"devices missing: {', '.join(sorted(set(wn) - set(hn)))}")
    if sorted(set(hn) - set(wn)):
        out.append(f"devices of no instance: {', '.join(sorted(set(hn) - set(wn)))}")
    hm, wm = mounts(have), mounts(want)
    if hm != wm:
        out.append(f"driver files: {len(wm - hm)} new, {len(hm - wm)} gone (driver changed?)")
    if not out:
        out.append("other fields (nodes, environment, hooks or cdiVersion)")
    return "; ".join(out)


# ---- 8. the exporter -----------------------------------------------------------------

def exporter_listen_of(exec_start: str | None, default: str) -> str:
    """The --listen of the exporter unit's ExecStart (``systemctl show -p ExecStart
    --value``: ``{ path=... ; argv[]=/usr/local/bin/gpuctl exporter --listen H:P ; ... }``,
    or a plain command line), else ``default``."""
    if not exec_start:
        return default
    m = re.search(r"argv\[\]=(.*?)\s;", exec_start)
    try:
        argv = shlex.split(m.group(1) if m else exec_start)
    except ValueError:
        return default
    for i, a in enumerate(argv):
        if a == "--listen" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--listen="):
            return a.split("=", 1)[1]
    return default


def unit_exec_start(unit: str, run: Callable[[Sequence[str]], tuple[int, str] | None] = run_cmd) -> str | None:
    r = run(["systemctl", "show", "-p", "ExecStart", "--value", unit])
    return r[1].strip() or None if r is not None and r[0] == 0 else None


def http_get(url: str, timeout: float) -> tuple[int, str]:
    """(status, body) of a GET, without the environment's proxies."""
    import urllib.error
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as r:
            return int(r.status), r.read(8 << 20).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return int(e.code), ""


def metrics_url(listen: str) -> str:
    from gpuslice.ops.listen import parse_listen

    host, port = parse_listen(listen)
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


def check_exporter(listen: str, get: Callable[[str, float], tuple[int, str]] = http_get,
                   timeout: float = HTTP_TIMEOUT_S) -> Check:
    name = "exporter"
    unit = EXPORTER_UNIT.removesuffix(".service")
    try:
        url = metrics_url(listen)
    except ValueError as e:
        return Check(name, FAIL, f"the exporter's address: {e}", f"fix --listen in {EXPORTER_UNIT}")
    start = f"sudo systemctl enable --now {unit} (deploy/systemd/{EXPORTER_UNIT}); journalctl -u {unit} says why " \
            "it stopped"
    try:
        code, body = get(url, timeout)
    except Exception as e:  # URLError, timeout, refused: all "nothing answers"
        reason = getattr(e, "reason", None) or e
        return Check(name, FAIL, f"nothing answers at {url} ({reason})", start)
    if code != 200:
        return Check(name, FAIL, f"{url} answers HTTP {code}", start)
    series = [ln for ln in body.splitlines() if ln.startswith("gpuslice_")]
    if not series:
        return Check(name, FAIL, f"{url} answers, but with no gpuslice_ metrics: another service holds the port",
                     f"free the port, or move `gpuctl exporter --listen` in {EXPORTER_UNIT} "
                     "(and give `gpuctl doctor --exporter` the same)")
    ups = []
    for key in ("gpuslice_module_up", "gpuslice_daemon_up"):
        v = next((ln.split()[-1] for ln in series if ln.split()[0] == key), None)
        if v is not None:
            ups.append(f"{key[len('gpuslice_'):]} {v.removesuffix('.0')}")
    return Check(name, OK, f"{url}: {len(series)} gpuslice_ samples" + (f" ({', '.join(ups)})" if ups else ""))


# ---- all of them ---------------------------------------------------------------------

ROOT = "/"  # where host paths (/proc, /sys, /dev) are looked up: tests point it elsewhere


def _guarded(name: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as e:  # a bug in a check must not hide the others
        if os.environ.get("GPUSLICE_DEBUG"):
            raise
        return Check(name, FAIL, f"the check itself failed: {type(e).__name__}: {e}",
                     "report it (GPUSLICE_DEBUG=1 shows the traceback)")


def run_all(status_file: str, cdi_path: str, cdi_generate: Callable[[], Mapping[str, Any]],
            exporter_listen: str | None = None, root: str | None = None, state_file: str | None = "",
            connect: Callable[[], Any] | None = None,
            unit: Callable[[str], str | None] | None = None,
            exec_start: Callable[[str], str | None] | None = None,
            get: Callable[[str, float], tuple[int, str]] | None = None) -> list[Check]:
    """Every check, in order. ``state_file``: the instances to look for in the module
    ("": the default state file under ``root``; None: not compared). ``exporter_listen``
    None: the exporter unit's --listen,
    else `gpuctl exporter`'s default. What is not given is this module's own (looked up
    when called, so tests can replace them) and the host's paths under ``root`` (None:
    ROOT)."""
    from gpuslice.ops import listen as listen_mod  # its DEFAULT_LISTEN is read when called

    base = ROOT if root is None else root
    conn = connect or connect_netlink
    unit_fn = unit or unit_state
    exec_fn = exec_start or unit_exec_start
    get_fn = get or http_get

    def host(path: str) -> str:
        return os.path.join(base, path.lstrip("/"))

    sys_module = host(SYS_MODULE)

    def listen() -> str:
        return exporter_listen or exporter_listen_of(exec_fn(EXPORTER_UNIT), listen_mod.DEFAULT_LISTEN)

    checks: list[tuple[str, Callable[[], Check]]] = [
        ("driver", lambda: check_driver(host(PROC_DRIVER_VERSION), host(SYS_DRIVER_VERSION))),
        ("module", lambda: check_module(sys_module, conn)),
        ("build", lambda: check_build(sys_module)),
        ("instances", lambda: check_instances(host(DEFAULT_STATE) if state_file == "" else state_file, sys_module,
                                              conn, host("/dev"))),
        ("daemon", lambda: check_daemon(status_file, unit_fn)),
        ("real-nodes", lambda: check_real_nodes(host("/dev"))),
        ("device-cgroup", lambda: check_device_cgroup(sys_module)),
        ("mmap-min-addr", lambda: check_mmap_min_addr(host(MMAP_MIN_ADDR))),
        ("cdi", lambda: check_cdi(cdi_path, cdi_generate)),
        ("exporter", lambda: check_exporter(listen(), get_fn)),
    ]
    return [_guarded(name, fn) for name, fn in checks]


def failed(checks: Sequence[Check]) -> list[str]:
    return [c.name for c in checks if c.status == FAIL]
