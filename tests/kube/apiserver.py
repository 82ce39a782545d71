"""A Kubernetes API server stand-in for the DRA plugin's tests.

A real HTTP server (http.server, one thread per request, 127.0.0.1 on a free port) that
answers what gpuslice.kube.apiclient asks, in memory and thread-safe:

* discovery: ``GET /apis``, ``GET /apis/resource.k8s.io`` (the versions it is configured
  with, preferred first), ``GET /apis/resource.k8s.io/<v>``;
* resourceslices (cluster-scoped) in each served version: list with ``labelSelector``
  (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, comma-joined) and ``fieldSelector``
  (``spec.nodeName``, ``spec.driver``, ``metadata.name``; ``=``, ``==``, ``!=``; anything
  else 400 as upstream), create (``generateName``: 5 random characters, the base cut to
  58 as names.SimpleNameGenerator does), get, PUT (``metadata.resourceVersion``
  mismatch -> 409 Conflict; none -> unconditional, AllowUnconditionalUpdate; metadata
  .generation +1 on a spec change), delete;
* resourceclaims get (namespaced); nodes get (``/api/v1/nodes/<name>``).

Objects are kept in the v1 layout and converted for v1beta1 (a device's fields under
``basic``; a claim request's exact fields flat), as the real server keeps one internal
version. ``gate_consumable_capacity=False`` does what upstream's
``dropDisabledDRAConsumableCapacityFields`` does (kubernetes/kubernetes
pkg/registry/resource/resourceslice/strategy.go): on create and update, drop every
device's ``allowMultipleAllocations`` and every capacity's ``requestPolicy``, unless the
stored (old) slice already used one of them.

Validation (422 Invalid, Status like upstream's) covers the cheap rules of
pkg/apis/resource/validation/validation.go ValidateResourceSlice: metadata.name a DNS
subdomain; spec.driver a DNS subdomain <= 63; pool name, resourceSliceCount > 0,
generation >= 0; exactly one of nodeName/nodeSelector/allNodes/perDeviceNodeSelection;
at most 128 devices (64 with taints, consumesCounters or list attributes); device names
unique DNS labels; attributes + capacities <= 32 per device; attribute names
(``[domain/]id``, id a C identifier <= 32); exactly one attribute value; strings <= 64;
versions semver 2.0.0; requestPolicy only with allowMultipleAllocations; validRange
rules (min required, min <= value, default >= min, step > 0, min + step <= value,
default and max on the min + n*step grid; max rules); validValues sorted, within value,
default among them. Immutable on update: driver, pool.name, nodeName.

Not covered: authentication/authorization, admission, watches, server-side apply,
PATCH, CEL, field-validation warnings for unknown fields (unknown fields are kept),
quantity canonicalisation (quantities are stored as sent), finalizers, owner garbage
collection, pagination.
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import re
import threading
import uuid as uuidlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable
from urllib.parse import parse_qs, unquote, urlsplit

from gpuslice.kube.capacity import parse_quantity

GROUP = "resource.k8s.io"
ALL_VERSIONS = ("v1", "v1beta2", "v1beta1")
MAX_DEVICES = 128
MAX_DEVICES_ADVANCED = 64
MAX_ATTRS_AND_CAPS = 32
MAX_VALUE_LEN = 64

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CSI_DRIVER = re.compile(r"^[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$")
_NUM = r"(0|[1-9]\d*)"
_PRE = r"(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
_SEMVER = re.compile(rf"^{_NUM}\.{_NUM}\.{_NUM}(-{_PRE}(\.{_PRE})*)?(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$")
_V1BETA1_EXACT = ("deviceClassName", "selectors", "allocationMode", "count", "adminAccess", "tolerations", "capacity")
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # apiserver/pkg/storage/names: utilrand.String


class HttpError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


# ---- conversion (internal = v1 layout) ------------------------------------------------

def slice_out(obj: dict[str, Any], version: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{GROUP}/{version}"
    if version == "v1beta1":
        spec = out.get("spec") or {}
        if "devices" in spec:
            spec["devices"] = [{"name": d.get("name"), "basic": {k: v for k, v in d.items() if k != "name"}}
                               for d in spec["devices"]]
    return out


def slice_in(obj: dict[str, Any], version: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    if version == "v1beta1":
        spec = out.get("spec") or {}
        if "devices" in spec:
            devs = []
            for d in spec.get("devices") or []:
                flat = {k: v for k, v in d.items() if k != "basic"}
                flat.update(d.get("basic") or {})
                devs.append(flat)
            spec["devices"] = devs
    out["apiVersion"] = f"{GROUP}/v1"
    return out


def claim_out(obj: dict[str, Any], version: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["apiVersion"] = f"{GROUP}/{version}"
    if version == "v1beta1":
        for r in ((out.get("spec") or {}).get("devices") or {}).get("requests") or []:
            r.update(r.pop("exactly", None) or {})
    return out


def claim_in(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    if str(out.get("apiVersion", "")).endswith("/v1beta1"):
        for r in ((out.get("spec") or {}).get("devices") or {}).get("requests") or []:
            if not r.get("firstAvailable"):
                r["exactly"] = {k: r.pop(k) for k in _V1BETA1_EXACT if k in r}
    out["apiVersion"] = f"{GROUP}/v1"
    out.setdefault("kind", "ResourceClaim")
    return out


# ---- strategy: dropDisabledDRAConsumableCapacityFields --------------------------------

def uses_consumable_capacity(obj: dict[str, Any] | None) -> bool:
    if obj is None:
        return False
    for d in (obj.get("spec") or {}).get("devices") or []:
        if d.get("allowMultipleAllocations") is not None:
            return True
        for cap in (d.get("capacity") or {}).values():
            if isinstance(cap, dict) and cap.get("requestPolicy") is not None:
                return True
    return False


def drop_consumable_capacity(new: dict[str, Any], old: dict[str, Any] | None) -> None:
    if uses_consumable_capacity(old):
        return
    for d in (new.get("spec") or {}).get("devices") or []:
        d.pop("allowMultipleAllocations", None)
        for cap in (d.get("capacity") or {}).values():
            if isinstance(cap, dict):
                cap.pop("requestPolicy", None)


# ---- validation -------------------------------------------------------------------------

def _q(v: Any, path: str, errs: list[str]) -> int | None:
    try:
        return parse_quantity(v)
    except ValueError as e:
        errs.append(f"{path}: Invalid value: {e}")
        return None


def _validate_policy(value: int, pol: dict[str, Any], path: str, errs: list[str]) -> None:
    values, rng = pol.get("validValues"), pol.get("validRange")
    default = _q(pol["default"], f"{path}.default", errs) if pol.get("default") is not None else None
    if values and rng is not None:
        errs.append(f"{path}: Forbidden: exactly one policy can be specified")
        return
    if values:
        if default is None:
            errs.append(f"{path}.default: Required value: required when validValues is defined")
            return
        vs = [_q(v, f"{path}.validValues", errs) for v in values]
        ints = [v for v in vs if v is not None]
        if ints != sorted(ints):
            errs.append(f"{path}.validValues: Invalid value: values must be sorted in ascending order")
        if any(v > value for v in ints):
            errs.append(f"{path}.validValues: Invalid value: option is larger than capacity value")
        if default not in ints:
            errs.append(f"{path}.validValues: Invalid value: default value is not valid according to the requestPolicy")
    elif rng is not None:
        if default is None:
            errs.append(f"{path}.default: Required value: required when validRange is defined")
            return
        if rng.get("min") is None:
            errs.append(f"{path}.validRange.min: Required value")
            return
        lo = _q(rng["min"], f"{path}.validRange.min", errs)
        hi = _q(rng["max"], f"{path}.validRange.max", errs) if rng.get("max") is not None else None
        step = _q(rng["step"], f"{path}.validRange.step", errs) if rng.get("step") is not None else None
        if lo is None:
            return
        if lo > value:
            errs.append(f"{path}.validRange.min: Invalid value: min is larger than capacity value")
        if default < lo:
            errs.append(f"{path}.validRange.default: Invalid value: default is less than min")
        if hi is not None:
            if lo > hi:
                errs.append(f"{path}.validRange.max: Invalid value: min is larger than max")
            if hi > value:
                errs.append(f"{path}.validRange.max: Invalid value: max is larger than capacity value")
            if default > hi:
                errs.append(f"{path}.validRange.default: Invalid value: default is more than max")
        if step is not None:
            if step <= 0:
                errs.append(f"{path}.validRange.step: Invalid value: must be greater than zero")
                return
            if lo + step > value:
                errs.append(f"{path}.validRange.step: Invalid value: one step is larger than capacity value")
            for what, v in (("default", default), ("max", hi)):
                if v is not None and (v - lo) % step:
                    errs.append(f"{path}.validRange.step: Invalid value: {what} is not a multiple of step from min")


def _validate_qualified_name(name: str, path: str, errs: list[str]) -> None:
    if "/" in name:
        domain, ident = name.split("/", 1)
        if len(domain) > 63 or not _DNS_SUBDOMAIN.match(domain):
            errs.append(f"{path}: Invalid value: {name!r}: domain must be a DNS subdomain of at most 63 characters")
    else:
        ident = name
    if not ident or len(ident) > 32 or not _C_IDENT.match(ident):
        errs.append(f"{path}: Invalid value: {name!r}: must be a C identifier of at most 32 characters")


def _validate_attribute(attr: Any, path: str, errs: list[str]) -> None:
    if not isinstance(attr, dict):
        errs.append(f"{path}: Invalid value: not an object")
        return
    kinds = [k for k in ("bool", "int", "string", "version", "bools", "ints", "strings", "versions") if k in attr]
    if len(kinds) != 1:
        errs.append(f"{path}: Invalid value: exactly one value must be specified")
    if isinstance(attr.get("string"), str) and len(attr["string"]) > MAX_VALUE_LEN:
        errs.append(f"{path}.string: Too long: may not be more than {MAX_VALUE_LEN} bytes")
    if "version" in attr:
        v = attr["version"]
        if not isinstance(v, str) or not _SEMVER.match(v):
            errs.append(f"{path}.version: Invalid value: {v!r}: must be a string compatible with semver.org spec 2.0.0")
        elif len(v) > MAX_VALUE_LEN:
            errs.append(f"{path}.version: Too long: may not be more than {MAX_VALUE_LEN} bytes")


def validate_slice(obj: dict[str, Any], old: dict[str, Any] | None) -> list[str]:
    """Upstream's cheap rules (see the module docstring); field errors as strings."""
    errs: list[str] = []
    meta = obj.get("metadata") or {}
    name = str(meta.get("name") or "")
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        errs.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist of "
                    "lower case alphanumeric characters, '-' or '.'")
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return errs + ["spec: Required value"]
    driver = spec.get("driver")
    if not driver:
        errs.append("spec.driver: Required value")
    elif len(driver) > 63 or not _CSI_DRIVER.match(driver):
        errs.append(f"spec.driver: Invalid value: {driver!r}")
    pool = spec.get("pool") or {}
    if not pool.get("name"):
        errs.append("spec.pool.name: Required value")
    elif len(pool["name"]) > 253 or not all(_DNS_SUBDOMAIN.match(p) for p in str(pool["name"]).split("/")):
        errs.append(f"spec.pool.name: Invalid value: {pool['name']!r}")
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] <= 0:
        errs.append("spec.pool.resourceSliceCount: Invalid value: must be greater than zero")
    if not isinstance(pool.get("generation", 0), int) or pool.get("generation", 0) < 0:
        errs.append("spec.pool.generation: Invalid value: must be greater than or equal to zero")
    if old is not None:
        ospec = old.get("spec") or {}
        for what, a, b in (("pool.name", pool.get("name"), (ospec.get("pool") or {}).get("name")),
                           ("driver", driver, ospec.get("driver")),
                           ("nodeName", spec.get("nodeName"), ospec.get("nodeName"))):
            if a != b:
                errs.append(f"spec.{what}: Invalid value: field is immutable")
    set_fields = [f for f in ("nodeName", "nodeSelector") if spec.get(f)]
    set_fields += [f for f in ("allNodes", "perDeviceNodeSelection") if spec.get(f) is True]
    if len(set_fields) != 1:
        errs.append("spec: Required value: exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                    "`perDeviceNodeSelection` is required")
    devices = spec.get("devices") or []
    advanced = any(d.get("taints") or d.get("consumesCounters")
                   or any(isinstance(a, dict) and any(k in a for k in ("bools", "ints", "strings", "versions"))
                          for a in (d.get("attributes") or {}).values())
                   for d in devices if isinstance(d, dict))
    limit = MAX_DEVICES_ADVANCED if advanced else MAX_DEVICES
    if len(devices) > limit:
        errs.append(f"spec.devices: Too many: {len(devices)}: must have at most {limit} items")
    seen: set[str] = set()
    for i, d in enumerate(devices):
        p = f"spec.devices[{i}]"
        if not isinstance(d, dict):
            errs.append(f"{p}: Invalid value: not an object")
            continue
        dname = str(d.get("name") or "")
        if not dname:
            errs.append(f"{p}.name: Required value")
        elif len(dname) > 63 or not _DNS_LABEL.match(dname):
            errs.append(f"{p}.name: Invalid value: {dname!r}: a lowercase RFC 1123 label must consist of lower "
                        "case alphanumeric characters or '-'")
        if dname in seen:
            errs.append(f"{p}.name: Duplicate value: {dname!r}")
        seen.add(dname)
        attrs = d.get("attributes") or {}
        caps = d.get("capacity") or {}
        if len(attrs) + len(caps) > MAX_ATTRS_AND_CAPS:
            errs.append(f"{p}: Invalid value: the total number of attributes and capacities must not exceed "
                        f"{MAX_ATTRS_AND_CAPS}")
        for k, a in attrs.items():
            _validate_qualified_name(k, f"{p}.attributes[{k}]", errs)
            _validate_attribute(a, f"{p}.attributes[{k}]", errs)
        multi = d.get("allowMultipleAllocations") is True
        for k, c in caps.items():
            cp = f"{p}.capacity[{k}]"
            _validate_qualified_name(k, cp, errs)
            if not isinstance(c, dict) or c.get("value") is None:
                errs.append(f"{cp}.value: Required value")
                continue
            value = _q(c["value"], f"{cp}.value", errs)
            pol = c.get("requestPolicy")
            if pol is None or value is None:
                continue
            if not multi:
                errs.append(f"{cp}.requestPolicy: Forbidden: allowMultipleAllocations must be true")
            else:
                _validate_policy(value, pol, f"{cp}.requestPolicy", errs)
    return errs


# ---- selectors --------------------------------------------------------------------------

def _match_labels(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = (s.strip() for s in term.split("!=", 1))
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif re.match(r"^[A-Za-z0-9./_-]+$", term):
            if term not in labels:
                return False
        else:
            raise HttpError(400, "BadRequest", f"unable to parse requirement: {term!r} (the stand-in supports "
                                              "=, ==, !=, exists and !exists)")
    return True


_SLICE_FIELDS = {
    "spec.nodeName": lambda o: str((o.get("spec") or {}).get("nodeName") or ""),
    "spec.driver": lambda o: str((o.get("spec") or {}).get("driver") or ""),
    "metadata.name": lambda o: str((o.get("metadata") or {}).get("name") or ""),
}


def _match_fields(selector: str, obj: dict[str, Any]) -> bool:
    for term in filter(None, (t.strip() for t in selector.split(","))):
        m = re.fullmatch(r"([^!=]+)(!=|==|=)(.*)", term)
        if not m:
            raise HttpError(400, "BadRequest", f"invalid field selector: {term!r}")
        key, op, value = m.group(1).strip(), m.group(2), m.group(3).strip()
        if key not in _SLICE_FIELDS:
            raise HttpError(400, "BadRequest", f"field label not supported: {key}")
        if (_SLICE_FIELDS[key](obj) == value) != (op != "!="):
            return False
    return True


# ---- the server -------------------------------------------------------------------------

class FakeApiServer:
    """The stand-in. ``versions``: the resource.k8s.io versions it serves (newest first
    is preferred). ``gate_consumable_capacity``: the DRAConsumableCapacity gate."""

    def __init__(self, versions: Iterable[str] = ALL_VERSIONS, gate_consumable_capacity: bool = True) -> None:
        self.versions = [v for v in ALL_VERSIONS if v in set(versions)]
        self.gate_consumable_capacity = gate_consumable_capacity
        self._lock = threading.RLock()
        self._slices: dict[str, dict[str, Any]] = {}
        self._claims: dict[tuple[str, str], dict[str, Any]] = {}
        self._nodes: dict[str, dict[str, Any]] = {}
        self._rv = itertools.count(1)
        self.log: list[tuple[str, str]] = []  # (method, path) of every request
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle
    def start(self) -> "FakeApiServer":
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _do(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                code, body = server.handle(self.command, self.path, raw)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _do

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        name="fake-apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "FakeApiServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._httpd is not None, "not started"
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def configuration(self) -> Any:
        """A kubernetes.client.Configuration pointing at this server."""
        import kubernetes.client

        cfg = kubernetes.client.Configuration()
        cfg.host = self.url
        return cfg

    def kubeconfig(self, path: Any) -> str:
        """Write a kubeconfig naming this server (no authentication) at ``path``."""
        with open(path, "w") as f:
            json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "t",
                       "clusters": [{"name": "t", "cluster": {"server": self.url}}],
                       "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}],
                       "users": [{"name": "u", "user": {}}]}, f)
        return str(path)

    # test helpers
    def add_claim(self, claim: dict[str, Any]) -> dict[str, Any]:
        """Store a ResourceClaim (v1 or v1beta1 layout; namespace default "default")."""
        obj = claim_in(claim)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuidlib.uuid4()))
        with self._lock:
            meta["resourceVersion"] = str(next(self._rv))
            self._claims[(meta["namespace"], meta["name"])] = obj
        return copy.deepcopy(obj)

    def add_node(self, name: str, uid: str | None = None) -> dict[str, Any]:
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "uid": uid or str(uuidlib.uuid4())}}
        with self._lock:
            self._nodes[name] = node
        return copy.deepcopy(node)

    def add_slice(self, obj: dict[str, Any], version: str = "v1") -> dict[str, Any]:
        """Store a slice directly, as another writer would (validated, gate applied)."""
        code, body = self._create_slice(version, obj)
        if code >= 300:
            raise ValueError(body.get("message"))
        return body

    def slices(self) -> list[dict[str, Any]]:
        """The stored slices (v1 layout), by name."""
        with self._lock:
            return [copy.deepcopy(self._slices[n]) for n in sorted(self._slices)]

    def writes(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.log if m in ("POST", "PUT", "DELETE", "PATCH")]

    def clear_log(self) -> None:
        with self._lock:
            self.log.clear()

    # dispatch
    def handle(self, method: str, raw_path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
        parts = urlsplit(raw_path)
        path = parts.path.rstrip("/")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        with self._lock:
            self.log.append((method, path))
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                return _status(400, "BadRequest", "the request body is not JSON")
            try:
                return self._route(method, path, query, body)
            except HttpError as e:
                return _status(e.code, e.reason, e.message)

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> tuple[int, dict[str, Any]]:
        seg = [unquote(s) for s in path.split("/")[1:]]
        if seg == ["apis"] and method == "GET":
            groups = [self._group()] if self.versions else []
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        if seg[:2] == ["api", "v1"] and len(seg) == 4 and seg[2] == "nodes" and method == "GET":
            if seg[3] not in self._nodes:
                raise HttpError(404, "NotFound", f'nodes "{seg[3]}" not found')
            return 200, copy.deepcopy(self._nodes[seg[3]])
        if seg[:2] != ["apis", GROUP]:
            raise HttpError(404, "NotFound", "the server could not find the requested resource")
        if len(seg) == 2 and self.versions and method == "GET":
            return 200, self._group()
        if len(seg) < 3 or seg[2] not in self.versions:
            raise HttpError(404, "NotFound", "the server could not find the requested resource")
        version, rest = seg[2], seg[3:]
        if not rest and method == "GET":
            return 200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{version}",
                         "resources": [{"name": "resourceslices", "namespaced": False, "kind": "ResourceSlice"},
                                       {"name": "resourceclaims", "namespaced": True, "kind": "ResourceClaim"}]}
        if rest[:1] == ["resourceslices"]:
            if len(rest) == 1 and method == "GET":
                return self._list_slices(version, query)
            if len(rest) == 1 and method == "POST":
                return self._create_slice(version, body)
            if len(rest) == 2 and method == "GET":
                return 200, slice_out(self._get_slice(rest[1]), version)
            if len(rest) == 2 and method == "PUT":
                return self._replace_slice(version, rest[1], body)
            if len(rest) == 2 and method == "DELETE":
                obj = self._get_slice(rest[1])
                del self._slices[rest[1]]
                return 200, slice_out(obj, version)
            raise HttpError(405, "MethodNotAllowed", f"{method} is not supported by the stand-in")
        if len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "resourceclaims" and method == "GET":
            key = (rest[1], rest[3])
            if key not in self._claims:
                raise HttpError(404, "NotFound", f'resourceclaims.{GROUP} "{rest[3]}" not found')
            return 200, claim_out(self._claims[key], version)
        raise HttpError(404, "NotFound", "the server could not find the requested resource")

    def _group(self) -> dict[str, Any]:
        vs = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in self.versions]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": vs, "preferredVersion": vs[0]}

    def _get_slice(self, name: str) -> dict[str, Any]:
        if name not in self._slices:
            raise HttpError(404, "NotFound", f'resourceslices.{GROUP} "{name}" not found')
        return self._slices[name]

    def _list_slices(self, version: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        items = []
        for name in sorted(self._slices):
            obj = self._slices[name]
            if "labelSelector" in query and not _match_labels(query["labelSelector"], (obj.get("metadata") or {})
                                                              .get("labels") or {}):
                continue
            if "fieldSelector" in query and not _match_fields(query["fieldSelector"], obj):
                continue
            item = slice_out(obj, version)
            item.pop("apiVersion", None), item.pop("kind", None)  # list items carry no TypeMeta, as upstream's
            items.append(item)
        return 200, {"kind": "ResourceSliceList", "apiVersion": f"{GROUP}/{version}",
                     "metadata": {"resourceVersion": str(next(self._rv))}, "items": items}

    def _check_kind(self, version: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise HttpError(400, "BadRequest", "the body is not an object")
        if body.get("kind") != "ResourceSlice" or body.get("apiVersion") != f"{GROUP}/{version}":
            raise HttpError(400, "BadRequest", f"the body is {body.get('apiVersion')}/{body.get('kind')}, "
                                               f"not {GROUP}/{version} ResourceSlice")
        return slice_in(body, version)

    def _create_slice(self, version: str, body: Any) -> tuple[int, dict[str, Any]]:
        obj = self._check_kind(version, body)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name"):
            base = meta.get("generateName")
            if not base:
                raise HttpError(422, "Invalid", "ResourceSlice.resource.k8s.io is invalid: metadata.name: "
                                               "Required value: name or generateName is required")
            meta["name"] = base[:253 - 5] + "".join(random.choice(_NAME_CHARS) for _ in range(5))
        name = meta["name"]
        if name in self._slices:
            raise HttpError(409, "AlreadyExists", f'resourceslices.{GROUP} "{name}" already exists')
        if not self.gate_consumable_capacity:
            drop_consumable_capacity(obj, None)
        errs = validate_slice(obj, None)
        if errs:
            raise HttpError(422, "Invalid", f'ResourceSlice.{GROUP} "{name}" is invalid: ' + "; ".join(errs))
        meta.update(uid=str(uuidlib.uuid4()), resourceVersion=str(next(self._rv)), generation=1,
                    creationTimestamp="2026-01-01T00:00:00Z")
        self._slices[name] = obj
        return 201, slice_out(obj, version)

    def _replace_slice(self, version: str, name: str, body: Any) -> tuple[int, dict[str, Any]]:
        obj = self._check_kind(version, body)
        meta = obj.setdefault("metadata", {})
        if meta.get("name") != name:
            raise HttpError(400, "BadRequest", f"the name of the object ({meta.get('name')}) does not match the "
                                               f"name on the URL ({name})")
        old = self._get_slice(name)
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise HttpError(409, "Conflict", f'Operation cannot be fulfilled on resourceslices.{GROUP} "{name}": '
                                             "the object has been modified; please apply your changes to the "
                                             "latest version and try again")
        if not self.gate_consumable_capacity:
            drop_consumable_capacity(obj, old)
        errs = validate_slice(obj, old)
        if errs:
            raise HttpError(422, "Invalid", f'ResourceSlice.{GROUP} "{name}" is invalid: ' + "; ".join(errs))
        ometa = old["metadata"]
        meta.update(uid=ometa["uid"], creationTimestamp=ometa["creationTimestamp"],
                    resourceVersion=str(next(self._rv)),
                    generation=ometa["generation"] + (obj.get("spec") != old.get("spec")))
        self._slices[name] = obj
        return 200, slice_out(obj, version)


def _status(code: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": message, "reason": reason, "code": code}
