"""Small C routines of the simulators, compiled on first use and cached: one shared library per .c file.

Library NAME is kernels/native/c/NAME.c with the local headers it includes; NAME.h declares its entry points,
and their ctypes signatures are read from those prototypes (`signatures`: one source of truth, which the
compiler checks against the definitions). Built with $CC (else cc, gcc or clang on PATH) into
$FLASHCHECK_CACHE/native (else ~/.cache/flashcheck/native), keyed by the source texts, the flags, the compiler
and the CPU (-march=native ties a build to the CPU); written atomically, so concurrent processes are safe. No
-ffast-math and no FMA contraction: the routines' arithmetic is IEEE's, operation by operation, as the C source
writes it. FLASHCHECK_NATIVE_SANITIZE=1 builds with AddressSanitizer and UBSan instead, into native-sanitized/
(CI: .ci/native_checks.sh; the process needs libasan preloaded). Where there is no compiler, the build fails,
the cache is not writable or FLASHCHECK_NATIVE=0, `load` says why and the callers keep their torch code (same
bits, slower). `proven` runs a library's self-test and refuses the library unless it passed and called every
entry point of its header."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from flashcheck.core.fileio import make_folder

FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math")
# the sanitized build of CI: every out-of-bounds access, use after free and undefined operation stops the process
SANITIZE_FLAGS = (
    *("-O1", "-g", "-march=native", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math"),
    *("-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"),
)
SOURCE_DIR = Path(__file__).with_name("c")
_CTYPES = {"void": None, "int": ctypes.c_int, "int64_t": ctypes.c_int64, "float": ctypes.c_float,
           "double": ctypes.c_double}  # fmt: skip
_PROTO = re.compile(r"^(?!\s*(?:typedef|static|#))\s*([\w ]+?\**)\s*\b(fc_\w+)\s*\(([^)]*)\)\s*;", re.M)


def compiler() -> str | None:
    """The C compiler's path: $CC, else the first of cc, gcc, clang on PATH; None where there is none."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc)
    return next((p for p in (shutil.which(c) for c in ("cc", "gcc", "clang")) if p), None)


def disabled() -> bool:
    """FLASHCHECK_NATIVE=0 (or off / no / false): every caller keeps its torch code."""
    return os.environ.get("FLASHCHECK_NATIVE", "1").strip().lower() in ("0", "off", "no", "false")


def sanitized() -> bool:
    """FLASHCHECK_NATIVE_SANITIZE=1: libraries built with AddressSanitizer and UBSan (CI's checked build)."""
    return os.environ.get("FLASHCHECK_NATIVE_SANITIZE", "0").strip().lower() in ("1", "on", "yes", "true")


def cache_root() -> Path:
    root = os.environ.get("FLASHCHECK_CACHE") or Path.home() / ".cache" / "flashcheck"
    return Path(root) / ("native-sanitized" if sanitized() else "native")


def sources(name: str) -> dict[str, str]:
    """{file name: text} of library `name`: NAME.c first, then every local header it includes (recursively)."""
    out: dict[str, str] = {}
    todo = [f"{name}.c"]
    while todo:
        fname = todo.pop(0)
        if fname not in out:
            out[fname] = (SOURCE_DIR / fname).read_text()
            todo += re.findall(r'^\s*#\s*include\s+"([\w.]+)"', out[fname], re.M)
    return out


def signatures(header: str) -> dict[str, tuple[type | None, list[type]]]:
    """{entry point: (restype, argtypes)} from the `fc_*` prototypes of a header: void, int, int64_t, float,
    double and any pointer (c_void_p); ValueError on another type (the header and this table must agree)."""
    out = {}
    for m in _PROTO.finditer(header):
        ret, name, params = m.group(1), m.group(2), m.group(3).strip()
        args = [] if params in ("", "void") else [_ctype(p) for p in params.split(",")]
        out[name] = (_ctype(ret + " x"), args)
    return out


def _ctype(param: str) -> type | None:
    """The ctypes type of one C parameter declaration ("const float *x", "int64_t n")."""
    if "*" in param:
        return ctypes.c_void_p
    words = [w for w in param.replace("const", " ").split() if w]
    if len(words) != 2 or words[0] not in _CTYPES:
        raise ValueError(f"C parameter {param.strip()!r}: expected one of {sorted(_CTYPES)} or a pointer")
    return _CTYPES[words[0]]


def _key(texts: dict[str, str], flags: tuple[str, ...], cc: str) -> str:
    source = "".join(f"// {n}\n{t}" for n, t in texts.items())
    h = hashlib.sha256(source.encode() + " ".join(flags).encode() + cc.encode() + platform.machine().encode())
    try:
        with open("/proc/cpuinfo") as f:
            h.update(next((ln for ln in f if ln.startswith("flags")), "").encode())
    except OSError:
        h.update(platform.processor().encode())
    return h.hexdigest()[:16]


def _private(path: Path) -> None:
    """OSError unless `path` (not followed) is this user's and no one else may write it: code loaded from a folder
    or file others can write could be theirs (they could swap a library between its check and its load). Such a
    folder is refused, not tightened: its mode is the user's choice, and what it holds now is not known to be ours."""
    st = os.lstat(path)
    if st.st_uid != os.getuid():
        raise OSError(f"{path} is not yours: not loaded")
    if st.st_mode & 0o022:
        kind = "folder" if stat.S_ISDIR(st.st_mode) else "library"
        mode = f"{stat.S_IMODE(st.st_mode):04o}"
        raise OSError(f"the {kind} {path} is writable by others (mode {mode}): not loaded (chmod go-w it to use it)")


def _cache_folder() -> Path:
    """cache_root(), made (mode 0700, whatever the umask) unless it is there; a link or another's folder refused."""
    root = cache_root()
    make_folder(root.parent, "flashcheck's cache")
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    folder = make_folder(root, "flashcheck's cache of compiled routines")
    _private(folder)
    return folder


def build(name: str, texts: dict[str, str], cc: str, flags: tuple[str, ...] = FLAGS) -> Path:
    """The compiled library's path (built now unless cached) from texts ({file name: text}, `sources`' result:
    copied as read, so the build is of the text the key names). OSError, ValueError (a linked cache folder) or
    SubprocessError on failure."""
    folder = _cache_folder()
    lib = folder / f"{name}-{_key(texts, flags, cc)}.so"
    if lib.is_file() and not lib.is_symlink():
        _private(lib)
        return lib
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        for fname, text in texts.items():
            (Path(tmp) / fname).write_text(text)
        src, out = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
        subprocess.run([cc, *flags, "-o", str(out), str(src), "-lm"], check=True, capture_output=True, timeout=120)
        os.chmod(out, 0o755)  # whatever the umask: a library others can write is never loaded (_private)
        os.replace(out, lib)  # atomic: a concurrent build replaces it with the same bytes
    return lib


def load(name: str, what: str) -> tuple[ctypes.CDLL | None, str]:
    """(library `name` loaded, its entry points typed from NAME.h, "") or (None, why not); `what` names the torch
    code the caller keeps instead. The caller runs its self-test through `proven` before any use."""
    if disabled():
        return None, f"FLASHCHECK_NATIVE=0: {what}"
    cc = compiler()
    if cc is None:
        if os.environ.get("CC"):  # the user's choice, not found: say so rather than "no compiler" beside a cc
            return None, f"$CC={os.environ['CC']}: not found (set CC to a C compiler, or unset it): {what} (slower)"
        return None, f"no C compiler ($CC, cc, gcc or clang) on PATH: {what} (slower)"
    try:
        texts = sources(name)
        lib = ctypes.CDLL(str(build(name, texts, cc, SANITIZE_FLAGS if sanitized() else FLAGS)))
        for fn, (restype, argtypes) in signatures(texts[f"{name}.h"]).items():
            getattr(lib, fn).restype, getattr(lib, fn).argtypes = restype, argtypes
    except (OSError, ValueError, AttributeError, KeyError, subprocess.SubprocessError) as err:
        return None, f"{name} did not build: {_failure(err, cc)}; {what}"
    return lib, ""


class _Calls:
    """A library seen through its self-test: every entry point of its header it calls is noted in `called`."""

    def __init__(self, lib: ctypes.CDLL, entries: set[str]) -> None:
        self._lib, self._entries, self.called = lib, entries, set()

    def __getattr__(self, attr: str):
        fn = getattr(self._lib, attr)
        if attr not in self._entries:
            return fn

        def call(*args):
            self.called.add(attr)
            return fn(*args)

        return call


def proven(name: str, lib: ctypes.CDLL, selftest, what: str, entries: set[str] | None = None) -> str:
    """ "" when selftest(lib) (a library-like view of lib: "" or why the C differs from the torch path) passed and
    called every entry point of NAME.h (or of `entries`, a part of them that the caller proves, and gates, apart
    from the rest); else why not, ending in `what` (the torch code the caller keeps)."""
    entries = set(signatures((SOURCE_DIR / f"{name}.h").read_text())) if entries is None else entries
    view = _Calls(lib, entries)
    why = selftest(view)
    if why:
        return f"{why}: {what}"
    missing = sorted(entries - view.called)
    if missing:
        return f"{name}'s self-test did not check {', '.join(missing)} against the torch path: {what}"
    return ""


def _failure(err: BaseException, cc: str) -> str:
    """One line for a failed build: the compiler's exit status and its last stderr line, not a Python repr."""
    lines = (getattr(err, "stderr", b"") or b"").decode(errors="replace").strip().splitlines()
    last = lines[-1][:200] if lines else "no message"
    if isinstance(err, subprocess.CalledProcessError):
        return f"the compiler {cc} failed (exit {err.returncode}): {last}"
    if isinstance(err, subprocess.TimeoutExpired):
        return f"the compiler {cc} did not finish in {err.timeout:g} s"
    return f"with {cc}: {(str(err).splitlines() or [type(err).__name__])[0][:200]}"
