"""A small Kubernetes API client for the DRA plugin: plain dicts in and out.

It rides on the official ``kubernetes`` Python client for configuration, authentication
(in-cluster service account, kubeconfig, token refresh) and TLS, but never uses its
typed models: those drop fields they do not know (a newer server's ResourceSlice fields,
``allowMultipleAllocations`` in older client releases), and the plugin must see exactly
what the server stored. Requests go through ``kubernetes.client.ApiClient.param_serialize``
and ``call_api`` and come back as parsed JSON.

Resource API versions: :meth:`ApiClient.resource_version` asks the server which of
resource.k8s.io v1, v1beta2 and v1beta1 it serves (preferring v1). ResourceSlices are
passed in and returned in the v1 layout whatever the server speaks (converted with
:func:`gpuslice.kube.slices.to_version` / ``from_version``), and ResourceClaims are
returned in the v1 layout (v1beta1's flat requests moved under ``exactly``; the
allocation results have the same shape in all three versions: kubernetes/api
``resource/v1beta1/types.go`` DeviceRequestAllocationResult at v0.36.3).
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any, Mapping
from urllib.parse import quote

import kubernetes.client
import kubernetes.config
import urllib3

from . import slices as S

__all__ = ["ApiClient", "ApiError", "claim_to_v1"]

# v1beta1 ExactDeviceRequest fields that sit directly in its DeviceRequest
# (kubernetes/api resource/v1beta1/types.go DeviceRequest at v0.36.3; v1beta2 and v1 have
# them under "exactly").
_V1BETA1_EXACT_FIELDS = ("deviceClassName", "selectors", "allocationMode", "count", "adminAccess",
                         "tolerations", "capacity")


class ApiError(Exception):
    """A request failed: ``status`` is the HTTP status (0: no response), ``reason`` one line."""

    def __init__(self, status: int, reason: str) -> None:
        self.status = status
        self.reason = " ".join(str(reason).split())
        super().__init__(f"Kubernetes API: {status} {self.reason}" if status else f"Kubernetes API: {self.reason}")


def claim_to_v1(claim: Mapping[str, Any]) -> dict[str, Any]:
    """A ResourceClaim of any of resource.k8s.io v1, v1beta2, v1beta1 in the v1 layout."""
    out = copy.deepcopy(dict(claim))
    version = str(out.get("apiVersion", "")).rsplit("/", 1)[-1]
    if version == "v1beta1":
        devices = (out.get("spec") or {}).get("devices") or {}
        reqs = []
        for r in devices.get("requests") or []:
            r = dict(r)
            if not r.get("firstAvailable"):
                exact = {k: r.pop(k) for k in _V1BETA1_EXACT_FIELDS if k in r}
                r["exactly"] = exact
            reqs.append(r)
        if "requests" in devices:
            devices["requests"] = reqs
    out["apiVersion"] = f"{S.API_GROUP}/v1"
    return out


class ApiClient:
    """Plain-dict access to the few API objects the plugin touches."""

    def __init__(self, configuration: kubernetes.client.Configuration | None = None, *,
                 api_version: str | None = None, timeout: float = 30.0) -> None:
        """``configuration``: where and how to reach the server (default: the official
        client's default Configuration). ``api_version``: force a resource.k8s.io
        version instead of discovering it. ``timeout``: seconds per request."""
        self._client = kubernetes.client.ApiClient(configuration or kubernetes.client.Configuration.get_default_copy())
        self._version = api_version.rsplit("/", 1)[-1] if api_version else None
        self._timeout = timeout

    @classmethod
    def from_env(cls, kubeconfig: str | None = None, **kw: Any) -> "ApiClient":
        """In-cluster configuration (the plugin's service account) when ``kubeconfig`` is
        None and the pod runs in a cluster, else the kubeconfig (``kubeconfig``, $KUBECONFIG
        or ~/.kube/config)."""
        cfg = kubernetes.client.Configuration()
        try:
            if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                kubernetes.config.load_incluster_config(client_configuration=cfg)
            else:
                kubernetes.config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        except (kubernetes.config.ConfigException, OSError, ValueError) as e:
            raise ApiError(0, f"no Kubernetes configuration: {e}") from None
        return cls(cfg, **kw)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "ApiClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- raw requests ---------------------------------------------------------------

    def request(self, method: str, path: str, query: Mapping[str, str] | None = None,
                body: Any = None) -> Any:
        """``method`` ``path`` with JSON ``body``; the parsed JSON answer. Raises ApiError."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            if hasattr(self._client, "param_serialize"):  # client 37 and later
                m, url, hdrs, data, post = self._client.param_serialize(
                    method=method, resource_path=path, query_params=list((query or {}).items()),
                    header_params=headers, body=body, auth_settings=["BearerToken"])
                resp = self._client.call_api(m, url, header_params=hdrs, body=data, post_params=post,
                                             _request_timeout=self._timeout)
            else:  # 34 to 36: the older generator's call_api, the raw urllib3 response
                old_call: Any = self._client.call_api
                resp = old_call(path, method, query_params=list((query or {}).items()),
                                header_params=headers, body=body, auth_settings=["BearerToken"],
                                _preload_content=False, _return_http_data_only=True, _request_timeout=self._timeout)
            raw = resp.read()
        except kubernetes.client.exceptions.ApiException as e:
            raise ApiError(int(e.status or 0), _message(e.body) or str(e.reason or e)) from None
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise ApiError(0, f"{method} {path}: {e}") from None
        text = raw.decode(errors="replace") if isinstance(raw, (bytes, bytearray)) else str(raw or "")
        try:
            parsed = json.loads(text) if text.strip() else None
        except ValueError:
            parsed = None
        if not 200 <= resp.status <= 299:
            reason = ""
            if isinstance(parsed, Mapping):
                reason = str(parsed.get("message") or parsed.get("reason") or "")
            raise ApiError(resp.status, reason or resp.reason or text[:200] or f"{method} {path} failed")
        if parsed is None and text.strip():
            raise ApiError(resp.status, f"{method} {path}: the answer is not JSON")
        return parsed

    # ---- discovery ------------------------------------------------------------------

    def resource_version(self) -> str:
        """The resource.k8s.io version to use: v1 if served, else v1beta2, else v1beta1.
        Asked once (GET /apis/resource.k8s.io). Raises ApiError."""
        if self._version is None:
            try:
                group = self.request("GET", f"/apis/{S.API_GROUP}")
            except ApiError as e:
                if e.status == 404:
                    raise ApiError(404, f"the API server does not serve {S.API_GROUP} (DRA disabled?)") from None
                raise
            served = {str(v.get("version")) for v in (group or {}).get("versions") or [] if isinstance(v, Mapping)}
            for v in S.VERSIONS:
                if v in served:
                    self._version = v
                    break
            else:
                raise ApiError(404, f"the API server serves {S.API_GROUP} {sorted(served)}, none of {list(S.VERSIONS)}")
        return self._version

    def _base(self) -> str:
        return f"/apis/{S.API_GROUP}/{self.resource_version()}"

    # ---- ResourceSlices (v1 layout in and out) --------------------------------------

    def list_slices(self, node: str, driver: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        """The ResourceSlices of ``driver`` on ``node`` (fieldSelector spec.nodeName and
        spec.driver, both indexed upstream: strategy.go toSelectableFields)."""
        query = {"fieldSelector": f"spec.nodeName={node},spec.driver={driver}"}
        if label_selector:
            query["labelSelector"] = label_selector
        items = (self.request("GET", f"{self._base()}/resourceslices", query) or {}).get("items") or []
        return [S.from_version({**i, "apiVersion": i.get("apiVersion") or f"{S.API_GROUP}/{self._version}"})
                for i in items]

    def get_slice(self, name: str) -> dict[str, Any]:
        return S.from_version(self.request("GET", f"{self._base()}/resourceslices/{quote(name, safe='')}"))

    def create_slice(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create (``metadata.generateName`` allowed); the stored object, v1 layout."""
        body = S.to_version(obj, self.resource_version())
        return S.from_version(self.request("POST", f"{self._base()}/resourceslices", body=body))

    def replace_slice(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """PUT over ``metadata.name``; with ``metadata.resourceVersion`` the server refuses
        (409) when the slice changed since. The stored object, v1 layout."""
        name = str((obj.get("metadata") or {}).get("name") or "")
        if not name:
            raise ApiError(0, "replace_slice: the slice has no metadata.name")
        body = S.to_version(obj, self.resource_version())
        return S.from_version(self.request("PUT", f"{self._base()}/resourceslices/{quote(name, safe='')}", body=body))

    def delete_slice(self, name: str) -> None:
        self.request("DELETE", f"{self._base()}/resourceslices/{quote(name, safe='')}")

    # ---- claims and nodes -----------------------------------------------------------

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """A ResourceClaim, in the v1 layout whatever version the server serves."""
        obj = self.request("GET", f"{self._base()}/namespaces/{quote(namespace, safe='')}/resourceclaims/"
                                  f"{quote(name, safe='')}")
        return claim_to_v1({**obj, "apiVersion": obj.get("apiVersion") or f"{S.API_GROUP}/{self._version}"})

    def get_node(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/api/v1/nodes/{quote(name, safe='')}")
        return result


def _message(body: Any) -> str:
    """The ``message`` of a Status object in an error's body (bytes or str), else ""."""
    try:
        doc = json.loads(body.decode(errors="replace") if isinstance(body, (bytes, bytearray)) else body or "")
    except (ValueError, TypeError):
        return ""
    return str(doc.get("message") or "") if isinstance(doc, dict) else ""
