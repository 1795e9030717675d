"""Pool workers that end with their parent: a parent killed by SIGKILL leaves no orphan computing on.

On Linux the kernel sends the worker SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG); everywhere a
daemon thread also polls the parent's PID and ends the worker once the parent is gone (it is re-parented).
The death signal follows the parent *thread* that started the worker: start pools from a thread that
outlives them (a `with ProcessPoolExecutor(...)` block in one function call does).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 0.5  # the watchdog's interval: an orphan ends within about this long where prctl is missing


def exit_with_parent(parent_pid: int, poll_s: float = POLL_S) -> None:
    """Call in a worker process (a pool's initializer) with the PID of the process that started it: the
    worker exits as soon as that process dies, even by SIGKILL. Exits at once when it has died already."""
    if sys.platform.startswith("linux"):
        _death_signal()
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        os._exit(1)
    watch = threading.Thread(target=_watch, args=(parent_pid, poll_s), name="flashcheck-lifeline", daemon=True)
    watch.start()


def _death_signal() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no libc prctl (musl builds without it): the watchdog still runs
        pass


def _watch(parent_pid: int, poll_s: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(poll_s)
    os._exit(1)
