"""The `flashcheck` command line. Exit codes: 0 ok, 1 a check failed, 2 bad usage or bad input."""

from __future__ import annotations

import signal
import sys

from flashcheck.cli import compare as _compare  # noqa: F401
from flashcheck.cli import consistency as _consistency  # noqa: F401
from flashcheck.cli import hunt as _hunt  # noqa: F401
from flashcheck.cli import judge as _judge  # noqa: F401
from flashcheck.cli import mutants as _mutants  # noqa: F401
from flashcheck.cli import predict as _predict  # noqa: F401
from flashcheck.cli import study as _study  # noqa: F401  (registers commands, in help order)
from flashcheck.cli import tools as _tools  # noqa: F401
from flashcheck.cli import training as _training  # noqa: F401
from flashcheck.cli import validate as _validate  # noqa: F401
from flashcheck.cli.app import app


def main() -> None:
    """Entry point: run the app; typer reports bad flags with exit code 2. Output into a pipe that closes early
    (`flashcheck compare | head -1`) ends the process as it ends `cat` (SIGPIPE), never with exit code 1, which
    means a failed check."""
    if hasattr(signal, "SIGPIPE"):
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        app()
    except KeyboardInterrupt:  # Ctrl-C anywhere a command does not say more itself: one line, never a traceback
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except SystemExit as done:
        if _bare_interrupt(done):
            print("interrupted", file=sys.stderr)
        raise


def _bare_interrupt(done: SystemExit) -> bool:
    """typer turns a Ctrl-C in a command into Exit(130) raised from the KeyboardInterrupt, silently (compare ran
    minutes, then exited 130 without a word); a command that said more itself (study, hunt) raised its own Exit(130)
    from None."""
    exit_ = done.__context__
    return done.code == 130 and isinstance(getattr(exit_, "__cause__", None), KeyboardInterrupt)


if __name__ == "__main__":
    main()
