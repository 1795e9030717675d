"""A hunt target whose import is hostile, as FLASHCHECK_TEST_HOSTILE says: segv (the process dies of SIGSEGV),
exit3 (sys.exit(3)), raise (ImportError), hang (never returns); anything else imports cleanly. Imported only by the
hunt's worker: the test process never imports it."""

from __future__ import annotations

import os

_HOW = os.environ.get("FLASHCHECK_TEST_HOSTILE", "")
if _HOW == "segv":
    import signal

    os.write(2, b"F1206 hostile.cc:1] Check failed: import\n")
    os.kill(os.getpid(), signal.SIGSEGV)
elif _HOW == "exit3":
    import sys

    sys.exit(3)
elif _HOW == "raise":
    raise ImportError("libhostile.so: cannot open shared object file")
elif _HOW == "hang":
    import time

    time.sleep(3600)


def attention(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    from hunt_bugs import correct

    return correct(q, k, v, causal=causal, scale=scale, mask=mask, sink=sink)
