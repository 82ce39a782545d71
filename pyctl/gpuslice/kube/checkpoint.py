"""The kubelet plugin's checkpoint: which claims it prepared, so that a retried
NodePrepareResources answers what the first one did, and NodeUnprepareResources
finds what to undo, across plugin restarts and `kill -9`.

One JSON file (``<plugin-dir>/checkpoint.json``), replaced atomically (temporary file,
fsync, rename, fsync of the directory): a crash leaves the old file or the new one,
never half of one. The content carries its SHA-256; a file that does not match (a disk
error, a hand edit) is refused with an error, never silently replaced by an empty one:
the instances it names would otherwise be forgotten while containers use them.

Layout (version 1)::

    {"version": 1, "sha256": "<of the claims object, canonical JSON>",
     "claims": {"<uid>": {"namespace": "ns", "name": "c", "instance": "dra-...",
                          "state": "preparing" | "prepared",
                          "per_gpu": {"0": [memory, compute]},
                          "devices": [{"requests": ["gpu"], "pool": "node", "device": "gpu-0",
                                       "share_id": null, "cdi": ["gpuslice.dev/claim=dra-..."]}]}}}
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from gpuslice import state as S

VERSION = 1
PREPARING, PREPARED = "preparing", "prepared"


class CheckpointError(Exception):
    """The checkpoint cannot be read or is not one of ours."""


def _digest(claims: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def load(path: str) -> dict[str, dict[str, Any]]:
    """The claims in the checkpoint at ``path`` (empty when there is none)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise CheckpointError(f"cannot read the checkpoint {path}: {e.strerror}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"the checkpoint {path} is not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("claims"), dict):
        raise CheckpointError(f"the checkpoint {path} is not a version {VERSION} checkpoint")
    if doc.get("sha256") != _digest(doc["claims"]):
        raise CheckpointError(f"the checkpoint {path} does not match its checksum: left as it is")
    for uid, c in doc["claims"].items():
        if not isinstance(c, dict) or c.get("state") not in (PREPARING, PREPARED) or not c.get("instance"):
            raise CheckpointError(f"the checkpoint {path}: claim {uid!r} is malformed")
    return doc["claims"]


def save(path: str, claims: dict[str, dict[str, Any]]) -> None:
    """Replace the checkpoint at ``path`` atomically."""
    S.write_json(path, {"version": VERSION, "sha256": _digest(claims), "claims": claims}, indent=1,
                 prefix=".checkpoint.")
