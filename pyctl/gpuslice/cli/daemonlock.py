"""One `gpuctl daemon` per host: a lock file held with flock(2) for the daemon's life.

Two daemons would gate the same GPUs and write the same status file, and the first to
exit would remove the preload socket the other had bound. The lock goes with its holder
however it ends (flock locks are released when the last descriptor of the open file
closes, a kill -9 included); the file itself stays, holding the PID of the last holder,
and is never removed (a removed lock file would let two daemons lock two files).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import signal
import time

from .common import GpuctlError

LOCK_PATH = "/run/gpuslice/daemon.lock"
REPLACE_WAIT_S = 60.0  # how long --replace waits for the running daemon to stop


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def holder_pid(path: str, wait_s: float = 1.0) -> int | None:
    """The PID the holder of the lock at ``path`` wrote (it writes it just after it
    locks: read again for up to ``wait_s``), or None."""
    end = time.monotonic() + wait_s
    while True:
        try:
            with open(path) as f:
                text = f.read().strip()
            if text.isdigit() and int(text) > 0:
                return int(text)
        except OSError:
            pass
        if time.monotonic() >= end:
            return None
        time.sleep(0.02)


def _same_file(fd: int, path: str) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def take(path: str, replace: bool = False, wait_s: float = REPLACE_WAIT_S) -> int:
    """Lock ``path`` (made with its directory when missing) and write our PID in it; the
    descriptor returned holds the lock until it is closed or the process ends. Held by
    another process: GpuctlError naming its PID, or with ``replace``, SIGTERM to it and
    wait up to ``wait_s`` for its lock to go."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), mode=0o755, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise GpuctlError(f"cannot open the daemon lock {path}: {e.strerror or e}") from None
    try:
        signalled: int | None = None
        end: float | None = None
        while True:
            if _try_lock(fd):
                if _same_file(fd, path):
                    break
                # the file was replaced while we waited for it: lock the one at the path now
                os.close(fd)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
                continue
            pid = holder_pid(path)
            who = f"PID {pid}" if pid else "PID unknown"
            if not replace:
                raise GpuctlError(f"another gpuctl daemon is running ({who}, holding {path}): stop it first, "
                                  "or start this one with --replace")
            if end is None:
                end = time.monotonic() + wait_s
            if pid and pid != signalled:
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass  # gone meanwhile: its lock goes with it
                except OSError as e:
                    raise GpuctlError(f"--replace: cannot stop the running daemon ({who}): {e.strerror or e}") \
                        from None
                signalled = pid
            if time.monotonic() > end:
                raise GpuctlError(f"--replace: the running daemon ({who}) still holds {path} after "
                                  f"{wait_s:.0f} s")
            time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        if signalled:
            logging.info("replaced the running daemon (PID %d)", signalled)
    except BaseException:
        os.close(fd)
        raise
    return fd
