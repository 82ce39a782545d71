"""Where `gpuctl exporter` listens: the default address and the HOST:PORT parser, in a
module of their own so that the command line and `gpuctl doctor` can use them without
importing prometheus_client (gpuslice.ops.exporter re-exports both)."""

from __future__ import annotations

import re

# Not 9400: that is dcgm-exporter's default, and dcgm-exporter runs on the same GPU hosts.
DEFAULT_LISTEN = "127.0.0.1:9410"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``; a bare ``:PORT`` or ``PORT`` is loopback) -> (host, port)."""
    m = re.fullmatch(r"(?:\[(?P<v6>[0-9a-fA-F:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d+)|(?P<bare>\d+)", text.strip())
    if not m:
        raise ValueError(f"not HOST:PORT: {text!r} (e.g. {DEFAULT_LISTEN})")
    port = int(m.group("port") or m.group("bare"))
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} outside 0..65535")
    return m.group("v6") or m.group("host") or "127.0.0.1", port
