"""The daemon's watchdog: re-enables gated channels when the daemon dies, however it dies.

Started by gate.Watchdog in its own session, with a pipe from the daemon on stdin.
The daemon writes ``{"op": "add"|"del", "gpu", "client", "handle"}`` lines for each
channel before it first disables it. When the pipe reaches EOF - clean exit, crash or
SIGKILL of the daemon - this process re-enables every channel it was told about with
its own RM client and exits. It ignores SIGINT/SIGTERM/SIGHUP so a signal sent to the
whole group cannot take it down before its daemon.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys

from gpuslice.sched.rm import RmClient


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpuslice-watchdog")
    ap.add_argument("--ctl", default="/dev/nvidiactl")
    args = ap.parse_args(argv)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="gpuslice-watchdog: %(message)s")
    chans: set[tuple[int, int, int]] = set()
    rm = RmClient(args.ctl)
    try:
        rm.open()
    except OSError as e:
        logging.error("cannot open %s: %s", args.ctl, e)
        rm = None  # type: ignore[assignment]
    sys.stdout.write("ready\n")  # the daemon waits for this before it gates anything
    sys.stdout.flush()
    for line in sys.stdin.buffer:
        try:
            d = json.loads(line)
            key = (int(d["gpu"]), int(d["client"]), int(d["handle"]))
        except (ValueError, KeyError, TypeError):
            continue
        if d.get("op") == "del":
            chans.discard(key)
        else:
            chans.add(key)
            if rm is not None:
                try:
                    rm.attach(key[0])  # ready before it is needed
                except OSError as e:
                    logging.error("attach GPU %d: %s", key[0], e)
    if not chans:
        return 0
    if rm is None:
        rm = RmClient(args.ctl)
        try:
            rm.open()
        except OSError as e:
            logging.error("daemon gone, but cannot open %s to re-enable %d channel(s): %s", args.ctl, len(chans), e)
            return 1
    by_gpu: dict[int, list[tuple[int, int]]] = {}
    for g, c, h in chans:
        by_gpu.setdefault(g, []).append((c, h))
    for g, pairs in by_gpu.items():
        try:
            bad = rm.disable_channels_each(g, pairs, False)
        except OSError as e:
            logging.error("re-enable on GPU %d: %s", g, e)
            continue
        logging.info("daemon gone: re-enabled %d channel(s) on GPU %d", len(pairs) - len(bad), g)
    rm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
