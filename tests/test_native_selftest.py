"""Native code proves itself at load: every entry point of every library is checked against the torch path, a
library with one wrong entry point is refused (torch runs it: the same bits) and doctor says why."""

from __future__ import annotations

import shutil

import pytest
import torch

from flashcheck.core.numerics import parse_policy
from flashcheck.kernels.native import cbuild, rounding
from flashcheck.kernels.native import fp8 as native_fp8
from flashcheck.kernels.sim import ops as ops_mod

HAS_CC = cbuild.compiler() is not None and not cbuild.disabled()
LIBRARIES = sorted(p.stem for p in cbuild.SOURCE_DIR.glob("*.c"))


def test_every_library_has_a_header_of_its_entry_points():
    """Each .c has a .h whose fc_* prototypes type every entry point (ctypes reads them; the C compiler checks the
    definitions against them), and the rooms' wrappers load each library by that name."""
    assert LIBRARIES == ["bwd", "fp8", "mma", "presets", "rounding", "step"]
    for name in LIBRARIES:
        texts = cbuild.sources(name)
        assert f"{name}.h" in texts, f"{name}.c does not include its header"
        sigs = cbuild.signatures(texts[f"{name}.h"])
        assert sigs and all(n.startswith("fc_") for n in sigs), name


def test_signatures_are_read_from_the_prototypes():
    import ctypes

    sigs = cbuild.signatures("int fc_a(const float *x, int64_t n);\nvoid fc_b(void);\ndouble fc_c(float a, int b,\n"
                             "    double c, void *p);\nstatic int fc_hidden(int x);\n")  # fmt: skip
    assert sigs == {
        "fc_a": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),
        "fc_b": (None, []),
        "fc_c": (ctypes.c_double, [ctypes.c_float, ctypes.c_int, ctypes.c_double, ctypes.c_void_p]),
    }
    with pytest.raises(ValueError, match="'unsigned n'"):
        cbuild.signatures("int fc_d(unsigned n);")


class _Lib:
    """A stand-in library whose two entry points do nothing."""

    def fc_round_bf16(self, *args):
        return 0

    def fc_round_fp16(self, *args):
        return 0


def test_a_self_test_that_skips_an_entry_point_refuses_the_library():
    """proven: a self-test that passes but never calls some entry point of the header refuses the library, naming
    the entry points it did not check."""
    why = cbuild.proven("rounding", _Lib(), lambda lib: "" if lib.fc_round_bf16(0, 0) == 0 else "x", "torch runs it")
    assert why.startswith("rounding's self-test did not check ") and why.endswith(": torch runs it"), why
    for name in ("fc_round_bf16_copy", "fc_max_sub", "fc_abs_stats", "fc_round_fp16", "fc_has_fp16"):
        assert name in why
    assert "fc_round_bf16," not in why
    assert cbuild.proven("rounding", _Lib(), lambda lib: "it differs", "torch runs it") == "it differs: torch runs it"


@pytest.fixture
def planted(monkeypatch, tmp_path):
    """plant(name, old, new): the C sources copied to tmp_path with `old` replaced by `new` in NAME.c, the builder
    pointed at them and at a cache of its own; every loaded library forgotten before and after."""
    src = tmp_path / "c"
    shutil.copytree(cbuild.SOURCE_DIR, src)
    monkeypatch.setenv("FLASHCHECK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cbuild, "SOURCE_DIR", src)
    rounding._library.cache_clear()
    native_fp8._native.cache_clear()

    def plant(name: str, old: str, new: str) -> None:
        path = src / f"{name}.c"
        text = path.read_text()
        assert text.count(old) == 1, f"{old!r} not once in {name}.c"
        path.write_text(text.replace(old, new))

    yield plant
    rounding._library.cache_clear()
    native_fp8._native.cache_clear()


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
def test_a_truncating_bf16_copy_is_refused_and_the_bits_stay(planted):
    """fc_round_bf16_copy truncating (the attacker's library of issue 47): refused at load with the entry point
    named in doctor's line; rnd_fresh then gives torch's cast, bit for bit."""
    planted("rounding", "uint32_t v = s[i];", "uint32_t v = s[i] & 0xFFFF0000u;")
    st = rounding.status()
    assert not st["available"] and "fc_round_bf16_copy differs" in st["reason"], st["reason"]
    assert st["reason"].endswith("P is rounded by two torch casts")
    from flashcheck.doctor import _native_rounding

    assert _native_rounding()["reason"] == st["reason"]
    x = torch.randn(4096) * 3
    got = ops_mod.rnd_fresh(x, parse_policy("bf16-mixed"), "p")
    assert torch.equal(got.view(torch.int32), x.to(torch.bfloat16).float().view(torch.int32))


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
def test_a_wrong_fp8_split_is_refused(planted):
    """fc_fp8_split_f32 flipping one code's sign (an entry point no self-test checked before): the fp8 library is
    refused with that entry point named, and scaled() runs torch's steps."""
    planted("fp8", "SPLIT(split_f32, float)", (
        "SPLIT(split_f32_good, float)\n"
        "int fc_fp8_split_f32_good(const float *x, const int64_t *xs, const double *s, const int64_t *ss, "
        "float *codes, const int64_t *n, int mbits, int emin, double maxv, double tol);\n"
        "int fc_fp8_split_f32(const float *x, const int64_t *xs, const double *s, const int64_t *ss, float *codes,\n"
        "                     const int64_t *n, int mbits, int emin, double maxv, double tol) {\n"
        "    const int ok = fc_fp8_split_f32_good(x, xs, s, ss, codes, n, mbits, emin, maxv, tol);\n"
        "    codes[n[0] * n[1] * n[2] * n[3] * n[4] - 1] *= -1.0f;\n"
        "    return ok;\n}"
    ))  # fmt: skip
    st = native_fp8.native_status()
    assert not st["available"] and "fc_fp8_split_f32 differs" in st["reason"], st["reason"]
    assert native_fp8.library() is None


@pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
def test_the_shipped_libraries_prove_every_entry_point():
    """Today's sources: every library loads and passes its self-test over every entry point of its header (or is
    off for a reason of this machine's, never a failed self-test)."""
    from flashcheck.kernels.native import backward, presets, step
    from flashcheck.kernels.tensorcore import mma

    statuses = {
        "rounding": rounding.status(), "step": step.status(), "fp8": native_fp8.native_status(),
        "presets": presets.native_status(), "mma": mma.native_status(), "bwd": backward.status(),
    }  # fmt: skip
    for name, st in statuses.items():
        assert st["available"] or not any(w in st["reason"] for w in ("differs", "did not check")), (name, st)
    assert rounding.status()["available"] and native_fp8.native_status()["available"]
