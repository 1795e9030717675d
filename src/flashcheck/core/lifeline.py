"""Pool workers that end with their parent: a parent killed by SIGKILL leaves no orphan computing on.

On Linux the kernel sends the worker SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG); everywhere a
daemon thread also polls the parent's PID and ends the worker once the parent is gone (it is re-parented).
The death signal follows the parent *thread* that started the worker: start pools from a thread that
outlives them (a `with ProcessPoolExecutor(...)` block in one function call does). A worker forked by a fork
server (core.pool.fresh_context) is the server's child, and the server lives as long as any of its workers
does: there the watchdog alone ends the worker, within POLL_S of its pool's owner's death (seen in /proc: gone,
or a zombie; elsewhere, gone).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 0.5  # the watchdog's interval: an orphan ends within about this long where prctl is missing


def exit_with_parent(parent_pid: int, poll_s: float = POLL_S) -> None:
    """Call in a worker process (a pool's initializer) with the PID of the process that started the pool: the
    worker exits as soon as that process dies, even by SIGKILL. Exits at once when it has died already."""
    if sys.platform.startswith("linux"):
        _death_signal()
    direct = os.getppid()  # parent_pid, or the fork server parent_pid started
    if direct != parent_pid and not _started_by(direct, parent_pid):  # it died before the signal was armed
        os._exit(1)
    watch = threading.Thread(target=_watch, args=(direct, parent_pid, poll_s), name="flashcheck-lifeline", daemon=True)
    watch.start()


def _death_signal() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no libc prctl (musl builds without it): the watchdog still runs
        pass


def _exists(pid: int) -> bool:
    """Whether process `pid` exists (signal 0; another user's process exists too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _started_by(pid: int, parent_pid: int) -> bool:
    """Whether process `pid` (a fork server) is a child of `parent_pid` (from /proc), else, where there is no
    /proc, whether `parent_pid` still exists."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return _exists(parent_pid)
    return int(stat.rpartition(")")[2].split()[1]) == parent_pid  # after "pid (comm)": state, ppid


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (where there is no /proc: whether it exists)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        if Path("/proc/self/stat").exists():
            return False
        return _exists(pid)
    return state not in ("Z", "X")


def _watch(direct: int, parent_pid: int, poll_s: float) -> None:
    while os.getppid() == direct and _running(parent_pid):
        time.sleep(poll_s)
    os._exit(1)
