"""Small C routines of the simulators, compiled on first use and cached: one shared library per source.

Built with $CC (else cc, gcc or clang on PATH) into $FLASHCHECK_CACHE/native (else ~/.cache/flashcheck/native),
keyed by the source, the flags, the compiler and the CPU (-march=native ties a build to the CPU); written
atomically, so concurrent processes are safe. No -ffast-math and no FMA contraction: the routines' arithmetic
is IEEE's, operation by operation, as the C source writes it. Where there is no compiler, the build fails, the
cache is not writable or FLASHCHECK_NATIVE=0, `load` says why and the callers keep their torch code (same bits,
slower)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from flashcheck.core.fileio import make_folder

FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math")


def compiler() -> str | None:
    """The C compiler's path: $CC, else the first of cc, gcc, clang on PATH; None where there is none."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return next((p for p in (shutil.which(c) for c in ("cc", "gcc", "clang")) if p), None)


def disabled() -> bool:
    """FLASHCHECK_NATIVE=0 (or off / no / false): every caller keeps its torch code."""
    return os.environ.get("FLASHCHECK_NATIVE", "1").strip().lower() in ("0", "off", "no", "false")


def cache_root() -> Path:
    root = os.environ.get("FLASHCHECK_CACHE") or Path.home() / ".cache" / "flashcheck"
    return Path(root) / "native"


def _key(source: str, flags: tuple[str, ...], cc: str) -> str:
    h = hashlib.sha256(source.encode() + " ".join(flags).encode() + cc.encode() + platform.machine().encode())
    try:
        with open("/proc/cpuinfo") as f:
            h.update(next((ln for ln in f if ln.startswith("flags")), "").encode())
    except OSError:
        h.update(platform.processor().encode())
    return h.hexdigest()[:16]


def _private(path: Path) -> None:
    """OSError unless `path` (not followed) is this user's; a folder others may write into is tightened (it is
    ours), a library others may write is refused: code loaded from there could be theirs."""
    st = os.lstat(path)
    if st.st_uid != os.getuid():
        raise OSError(f"{path} is not yours: not loaded")
    if st.st_mode & 0o022:
        if not stat.S_ISDIR(st.st_mode):
            raise OSError(f"{path} is writable by others: not loaded")
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o022)


def build(name: str, source: str, cc: str, flags: tuple[str, ...] = FLAGS) -> Path:
    """The compiled library's path (built now unless cached). OSError, ValueError (a linked cache folder) or
    SubprocessError on failure."""
    folder = make_folder(cache_root(), "flashcheck's cache of compiled routines")
    _private(folder)
    lib = folder / f"{name}-{_key(source, flags, cc)}.so"
    if lib.is_file() and not lib.is_symlink():
        _private(lib)
        return lib
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src, out = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
        src.write_text(source)
        subprocess.run([cc, *flags, "-o", str(out), str(src), "-lm"], check=True, capture_output=True, timeout=120)
        os.chmod(out, 0o755)  # whatever the umask: a library others can write is never loaded (_private)
        os.replace(out, lib)  # atomic: a concurrent build replaces it with the same bytes
    return lib


def load(name: str, source: str, what: str) -> tuple[ctypes.CDLL | None, str]:
    """(the loaded library, "") or (None, why not); `what` names the torch code the caller keeps instead."""
    if disabled():
        return None, f"FLASHCHECK_NATIVE=0: {what}"
    cc = compiler()
    if cc is None:
        if os.environ.get("CC"):  # the user's choice, not found: say so rather than "no compiler" beside a cc
            return None, f"$CC={os.environ['CC']}: not found (set CC to a C compiler, or unset it): {what} (slower)"
        return None, f"no C compiler ($CC, cc, gcc or clang) on PATH: {what} (slower)"
    try:
        return ctypes.CDLL(str(build(name, source, cc))), ""
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        return None, f"{name} did not build: {_failure(err, cc)}; {what}"


def _failure(err: BaseException, cc: str) -> str:
    """One line for a failed build: the compiler's exit status and its last stderr line, not a Python repr."""
    lines = (getattr(err, "stderr", b"") or b"").decode(errors="replace").strip().splitlines()
    last = lines[-1][:200] if lines else "no message"
    if isinstance(err, subprocess.CalledProcessError):
        return f"the compiler {cc} failed (exit {err.returncode}): {last}"
    if isinstance(err, subprocess.TimeoutExpired):
        return f"the compiler {cc} did not finish in {err.timeout:g} s"
    return f"with {cc}: {(str(err).splitlines() or [type(err).__name__])[0][:200]}"
