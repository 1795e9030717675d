"""The FA2 backward's element-wise passes in C, one pass per block: torch's very bits, fewer passes.

A key block of kernels.sim.flash._backward runs, through torch, about a dozen passes over its [B, H, rows, n]
blocks besides the five products: the scale, the causal bias, the LSE's subtraction and exp (P), P's rounding to
the grad_p stage, dP - delta, its product with P and rounding (dS), and the scale and accumulation of dQ and dK.
`probs`, `ds` and `scale_add` do them in three passes, the products staying torch's own (the same calls, on the
same operands: no product's bits can move).

Bits: each operation is the one torch runs, in torch's order, rounded to float32 as torch rounds it (the C is
built without FMA contraction); exp is torch's own MKL vmsExp (kernels.native.step: its value of an element depends
on that element alone); the roundings to bf16 / fp16 are to nearest even, for values that are never NaN (the
caller's guarantee: finite inputs that cannot overflow). Blocks are split over heads between torch's intra-op
thread count of threads (each element's value does not depend on who computes it). At load a self-test compares
every routine with torch's ops (ties, masked rows, rows of no key, subnormal P); any difference, a missing
function or FLASHCHECK_NATIVE=0 disables them and the backward keeps torch's ops (same bits, slower)."""

from __future__ import annotations

import ctypes
import functools
import math
import os
from concurrent.futures import ThreadPoolExecutor

import torch

import flashcheck.kernels.native.cbuild as cbuild
from flashcheck.kernels.native import step

_P_FORMATS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_POOL: dict = {}  # "pid", "size", "pool": the threads _split runs on (this process's)


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, int, str]:
    """(the loaded library, vmsExp's address, "") or (None, 0, why not)."""
    what = "the backward runs torch's ops"
    vexp = step._torch_vexp()
    if not vexp:
        return None, 0, f"torch's library exports no MKL vmsExp (VMSEXP_64_) to call: {what}"
    lib, why = cbuild.load("bwd", what)
    if lib is None:
        return None, 0, why
    why = cbuild.proven("bwd", lib, lambda view: _self_test(view, vexp), what)
    return (None, 0, why) if why else (lib, vexp, "")


def status() -> dict:
    """{"available": bool, "reason": str} for `flashcheck doctor`."""
    lib, _, why = _library()
    return {"available": lib is not None, "reason": why}


def usable(p_dtype: torch.dtype) -> bool:
    """Whether the routines run here for P / dS rounded to p_dtype (float32: not rounded)."""
    lib = _library()[0]
    return lib is not None and p_dtype in _P_FORMATS and (p_dtype != torch.float16 or bool(lib.fc_bwd_has_fp16()))


def _split(heads: int, run) -> None:
    """run(h0, h1) over [0, heads), in torch.get_num_threads() parts side by side (ctypes frees the GIL)."""
    parts = max(1, min(torch.get_num_threads(), heads))
    bounds = [heads * i // parts for i in range(parts + 1)]
    if parts == 1:
        run(0, heads)
        return
    if _POOL.get("pid") != os.getpid() or _POOL.get("size", 0) < parts - 1:  # made again after a fork, or to grow
        _POOL.update(pid=os.getpid(), size=parts - 1, pool=ThreadPoolExecutor(parts - 1, "flashcheck-bwd"))
    futures = [_POOL["pool"].submit(run, bounds[i], bounds[i + 1]) for i in range(1, parts)]
    run(bounds[0], bounds[1])
    for f in futures:
        f.result()


def _flat(t: torch.Tensor, name: str) -> tuple[int, int, int]:
    """(B * H, rows, cols) of a contiguous float32 [B, H, rows, cols] block."""
    if t.dtype != torch.float32 or t.device.type != "cpu" or not t.is_contiguous() or t.dim() != 4:
        raise ValueError(f"{name} must be a contiguous float32 CPU [B, H, rows, cols] tensor")
    return t.shape[0] * t.shape[1], t.shape[2], t.shape[3]


def _rows_ptr(t: torch.Tensor, heads: int, rows: int) -> tuple[int, int]:
    """(pointer, head stride) of a [B, H, rows, 1] (or [.., d]) view whose heads sit at one stride."""
    b, h = t.shape[:2]
    hs = t.stride(1) if h > 1 else t.stride(0)
    if (b > 1 and h > 1 and t.stride(0) != h * t.stride(1)) or b * h != heads or t.shape[2] != rows:
        raise ValueError("a row operand's heads are not at one stride")
    return t.data_ptr(), hs


def probs(
    s: torch.Tensor,
    scale: float,
    lse: torch.Tensor,
    p_dtype: torch.dtype,
    causal: tuple[int, int, int] | None,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """For the raw scores s [B, H, R, n] (contiguous, float32): P = exp(s * scale (+ bias) - lse) in place, lse
    [B, H, R, 1] (a view; -inf already +inf); causal = (the rows' first row, the block's first key, Lk - Lq) or
    None; mask: the block's user mask (bool or float32 [B|1, H|1, R|1, n|1], any strides: bool adds 0 / -inf, float
    its value, the causal bias summed into it first where it applies, as kernels.sim.masks.tile_bias) or None; the
    scores plus the bias must be NaN-free (the caller's guarantee). Returns P rounded to p_dtype (a new block; P
    itself where p_dtype is float32)."""
    lib, vexp, _ = _library()
    return _probs(lib, vexp, s, scale, lse, p_dtype, causal, mask)


def ds(dp: torch.Tensor, p: torch.Tensor, delta: torch.Tensor, p_dtype: torch.dtype) -> torch.Tensor:
    """dS = rnd(P * (dP - delta)) to p_dtype in place in dp [B, H, R, n] (P alike; delta [B, H, R, 1] a view),
    returned."""
    return _ds(_library()[0], dp, p, delta, p_dtype)


def scale_add(dst: torch.Tensor, x: torch.Tensor, scale: float, add: bool) -> None:
    """dst = dst + x * scale (add) or x * scale, rounded as torch's ops: x [B, H, R, D] contiguous, dst a view of
    that shape (each head's rows contiguous, its heads at one stride)."""
    _scale_add(_library()[0], dst, x, scale, add)


def _probs(lib, vexp: int, s, scale: float, lse, p_dtype: torch.dtype, causal, mask=None) -> torch.Tensor:
    heads, rows, n = _flat(s, "scores")
    lse_ptr, lse_h = _rows_ptr(lse, heads, rows)
    pr = s if p_dtype == torch.float32 else torch.empty_like(s)
    row0, c0, off = causal if causal is not None else (0, 0, 0)
    fmt, local = _P_FORMATS[p_dtype], step._mkl_local()
    kind, mst = _mask_args(mask, s.shape)

    def run(h0: int, h1: int) -> None:
        at = h0 * rows * n * 4
        lib.fc_bwd_probs(
            s.data_ptr() + at, 0 if pr is s else pr.data_ptr() + at, h1 - h0, rows, n, scale, lse_ptr + h0 * lse_h * 4,
            lse_h, causal is not None, row0, c0, off, None if mask is None else mask.data_ptr(), kind, mst.data_ptr(),
            s.shape[1], h0, fmt, vexp, step.VML_MODE, local,
        )  # fmt: skip

    _split(heads, run)
    return pr


def _mask_args(mask: torch.Tensor | None, shape: torch.Size) -> tuple[int, torch.Tensor]:
    """(fc_bwd_probs' mask kind, the mask's element strides over the block `shape` [B, H, R, n] (0: broadcast))."""
    if mask is None:
        return 0, torch.zeros(4, dtype=torch.int64)
    if mask.dtype not in (torch.bool, torch.float32) or mask.device.type != "cpu" or mask.dim() != 4:
        raise ValueError("a block's mask must be a 4-D bool or float32 CPU tensor")
    if any(m not in (1, w) for m, w in zip(mask.shape, shape, strict=True)):
        raise ValueError(f"a block's mask of shape {tuple(mask.shape)} does not broadcast to {tuple(shape)}")
    kind = 1 if mask.dtype == torch.bool else 2
    return kind, torch.tensor(mask.expand(shape).stride(), dtype=torch.int64)


def _ds(lib, dp, p, delta, p_dtype: torch.dtype) -> torch.Tensor:
    heads, rows, n = _flat(dp, "dP")
    if p.shape != dp.shape or not p.is_contiguous():
        raise ValueError("P must be contiguous and of dP's shape")
    d_ptr, d_h = _rows_ptr(delta, heads, rows)
    fmt = _P_FORMATS[p_dtype]

    def run(h0: int, h1: int) -> None:
        at = h0 * rows * n * 4
        lib.fc_bwd_ds(dp.data_ptr() + at, p.data_ptr() + at, h1 - h0, rows, n, d_ptr + h0 * d_h * 4, d_h, fmt)

    _split(heads, run)
    return dp


def _scale_add(lib, dst, x, scale: float, add: bool) -> None:
    heads, rows, d = _flat(x, "x")
    if dst.shape != x.shape or dst.stride(-1) != 1 or dst.stride(-2) != d or dst.dtype != torch.float32:
        raise ValueError("dst must be a float32 view of x's shape with contiguous rows")
    ptr, dh = _rows_ptr(dst, heads, rows)

    def run(h0: int, h1: int) -> None:
        lib.fc_bwd_scale_add(ptr + h0 * dh * 4, h1 - h0, rows, d, dh, x.data_ptr() + h0 * rows * d * 4, scale, add)

    _split(heads, run)


def _torch_probs(s, scale, lse, p_dtype, causal, mask=None):
    """_backward's torch ops for P (the scores plus kernels.sim.masks.tile_bias's bias): (P, P rounded to
    p_dtype)."""
    s = s.mul_(scale)
    bias = None
    if causal is not None:
        row0, c0, off = causal
        i = torch.arange(row0, row0 + s.shape[-2]).unsqueeze(-1)
        keep = torch.arange(c0, c0 + s.shape[-1]).unsqueeze(0) <= i + off
        if not bool(keep.all()):
            bias = torch.zeros(keep.shape).masked_fill(~keep, -math.inf)
    if mask is not None:
        mb = torch.zeros(mask.shape).masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else mask.float()
        bias = mb if bias is None else bias + mb
    if bias is not None:
        s = s + bias
    p = torch.exp(s.sub_(lse))
    return p, p.to(p_dtype).to(torch.float32)


# (B, H, rows, n), causal (row0, c0, offset) or None, scale, a user mask (_mask) or None: masked blocks of both
# alignments, ragged widths, bool and float masks of several broadcast shapes with and without causal
_CASES = [
    ((1, 2, 37, 64), None, 0.125, None), ((2, 3, 100, 33), (50, 0, 0), 0.1, None),
    ((1, 4, 70, 128), (130, 200, 40), 0.09, None), ((1, 2, 9, 5), (0, 0, 0), 1.0, None),
    ((1, 1, 300, 1000), None, 0.3, None), ((2, 2, 40, 64), (100, 64, -60), 0.07, None),
    ((2, 3, 100, 33), (50, 0, 0), 0.1, "bool"), ((2, 2, 40, 64), None, 0.07, "bool"),
    ((1, 4, 70, 128), (130, 200, 40), 0.09, "float"), ((2, 3, 37, 64), None, 0.125, "float"),
    ((2, 2, 40, 64), (100, 64, -60), 0.07, "keys"), ((1, 2, 9, 5), (0, 0, 0), 1.0, "rows"),
]  # fmt: skip


def _mask(spec: str | None, shape: tuple[int, ...], seed: int) -> torch.Tensor | None:
    """A block's user mask: bool ([B, 1, R, n], about 30% masked, row 2 wholly), float ([1, H, R, n]: random,
    -inf at about 20%, -0.0 at about 10%, row 1 all -inf), keys (float [B, 1, 1, n] over a strided view, -inf at
    every third key) or rows (bool [1, 1, R, 1], every third row masked); None: none."""
    if spec is None:
        return None
    g = torch.Generator().manual_seed(seed + 100)
    b, h, rows, n = shape
    if spec == "bool":
        keep = torch.rand(b, 1, rows, n, generator=g) > 0.3
        keep[:, :, 2] = False
        return keep
    if spec == "float":
        bias = torch.randn(1, h, rows, n, generator=g) * 3
        bias = bias.masked_fill(torch.rand(bias.shape, generator=g) < 0.2, -math.inf)
        bias = bias.masked_fill(torch.rand(bias.shape, generator=g) < 0.1, -0.0)
        bias[:, :, 1] = -math.inf
        return bias
    if spec == "keys":
        bias = torch.randn(b, 1, 1, 2 * n, generator=g)[..., ::2]
        bias[..., ::3] = -math.inf
        return bias
    return (torch.arange(rows) % 3 != 0).view(1, 1, rows, 1)


def _case(shape, seed: int):
    g = torch.Generator().manual_seed(seed)
    b, h, rows, n = shape
    s = torch.randn(b, h, rows, n, generator=g) * torch.exp2(torch.randint(-2, 9, (b, h, rows, 1), generator=g).float())
    lse = s.amax(-1, keepdim=True) * 0.3 + torch.rand(b, h, rows, 1, generator=g) * 3
    lse[..., :1, :] = math.inf  # a row of no key (its LSE was -inf)
    dp = torch.randn(b, h, rows, n, generator=g) * 3
    delta = torch.randn(b, h, rows + 3, 1, generator=g)[..., 3:, :]  # a view, as delta[..., r0:, :]
    x = torch.randn(b, h, rows, n, generator=g)
    acc = torch.randn(b, h, rows + 5, n, generator=g)
    return s, lse, dp, delta, x, acc


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def _self_test(lib, vexp: int) -> str:
    """'' when every routine gives torch's ops' bits on _CASES (one thread and two), else which one differs."""
    fp16 = (torch.float16,) if lib.fc_bwd_has_fp16() else ()
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            for i, (shape, causal, scale, spec) in enumerate(_CASES):
                s, lse, dp, delta, x, acc = _case(shape, i)
                mask = _mask(spec, shape, i)
                for p_dtype in (torch.float32, torch.bfloat16, *fp16):
                    p, pr = _torch_probs(s.clone(), scale, lse, p_dtype, causal, mask)
                    got = s.clone()
                    got_r = _probs(lib, vexp, got, scale, lse, p_dtype, causal, mask)
                    if not (_same(p, got) and _same(pr, got_r)):
                        return f"fc_bwd_probs differs from torch here ({shape}, {causal}, {spec}, P in {p_dtype})"
                    want = (p * (dp - delta)).to(p_dtype).to(torch.float32)
                    if not _same(want, _ds(lib, dp.clone(), p, delta, p_dtype)):
                        return f"fc_bwd_ds differs from torch here ({shape}, P in {p_dtype})"
                for add in (True, False):
                    want, got = acc.clone(), acc.clone()
                    rows = slice(5, None)
                    want[..., rows, :] = want[..., rows, :] + x * scale if add else x * scale
                    _scale_add(lib, got[..., rows, :], x, scale, add)
                    if not _same(want, got):
                        return f"fc_bwd_scale_add differs from torch here ({shape}, add={add})"
    finally:
        torch.set_num_threads(threads)
    return ""
