"""The FA2 forward step's element-wise work in C, one pass per row block: torch's very bits, fewer passes.

A step of kernels.sim.flash._fa2_step runs, through torch, about ten passes over its score block s [R, N]: amax,
maximum, sub_, exp, sum, the rounding of P, and o * alpha + pv over the accumulator. `softmax_step` does the
first six for each row while it is in cache; `acc_update` does the last two in one pass.

Bits: each operation is the one torch runs, in torch's order.
- exp: torch's float32 exp on the CPU is MKL's vmsExp in its high-accuracy mode (aten's vml.h), whose value
  of an element depends on that element alone (measured: any chunking gives the same bits). The routine
  calls the very function, resolved from torch's own loaded library (VMSEXP_64_), with torch's mode.
- the row sum: torch.sum over the inner dimension (aten's SumKernel.cpp, cascade_sum): vectors of the CPU
  kernel's width summed in four interleaved accumulators (with a cascade of levels for long rows), the scalar
  tail, then the vector's lanes, all from 0. Its vector width is 8 floats under the capabilities of
  torch.backends.cpu.get_cpu_capability() it knows (AVX512 runs sum's AVX2 kernel, see _WIDTHS); rows narrower
  than a vector take its scalar form. Used only where torch's sum would run on one thread (torch.get_num_threads()).
- max and the subtraction as kernels.native.rounding.max_sub_ (NaN-free scores only, the caller's guarantee); P rounded
  to bf16 / fp16 as kernels.native.rounding rounds it; alpha * l + sum and o * alpha + pv rounded twice each (the C is
  built without FMA contraction).
At load a self-test compares both routines with torch on ties, -inf rows, subnormal results and ragged widths;
any difference, a missing function or an unknown capability disables them and the steps keep torch's ops
(same bits, slower). `status()` says which is on and why (`flashcheck doctor`).

`tile_forward` runs a whole plain query tile in one call: both products through torch's own MKL sgemm_ (the
routine and operands bmm hands its matrices to: measured bit for bit, and self-tested at load), the two routines
above between them, head by head, so a head's score block stays in the core's cache and the tile's thread holds
no GIL (step by step, two tile workers ran 1.69 times as fast as one; a tile's CPU time at L=2048 is about 10%
less in one call; both measured on the 2-core EPYC)."""

from __future__ import annotations

import ctypes
import functools
import math
import os

import torch

import flashcheck.kernels.native.cbuild as cbuild

VML_MODE = 0x2 | 0x140000 | 0x100  # VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE: aten's vml.h mode
_P_FORMATS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# the sum's vector width: 8 under each (sum_stub is registered without ALSO_REGISTER_AVX512_DISPATCH, so its
# AVX512 slot runs the AVX2 kernel; DEFAULT's Vectorized<float> is 32 bytes wide too)
_WIDTHS = {"AVX512": 8, "AVX2": 8, "DEFAULT": 8}


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, int, int, str]:
    """(the loaded library, vmsExp's address, the sum's vector width, "") or (None, 0, 0, why not)."""
    what = "the forward steps run torch's ops"
    width = _WIDTHS.get(torch.backends.cpu.get_cpu_capability())
    if width is None:
        cap = torch.backends.cpu.get_cpu_capability()
        return None, 0, 0, f"CPU capability {cap}: torch's sum order there is not modelled; {what}"
    vexp = _torch_vexp()
    if not vexp:
        return None, 0, 0, f"torch's library exports no MKL vmsExp (VMSEXP_64_) to call: {what}"
    lib, why = cbuild.load("step", what)
    if lib is None:
        return None, 0, 0, why
    steps = {"fc_has_fp16", "fc_softmax_step", "fc_acc_update"}  # fc_tile_forward: proven apart (_tile_ok)
    why = cbuild.proven("step", lib, lambda view: _self_test(view, vexp, width), what, steps)
    return (None, 0, 0, why) if why else (lib, vexp, width, "")


def _torch_vexp() -> int:
    """The address of MKL's vmsExp (Fortran form, 64-bit sizes) in torch's own loaded libtorch_cpu (0: none)."""
    return _torch_symbol("VMSEXP_64_")


def _torch_symbol(name: str) -> int:
    """The address of `name` in torch's own loaded libtorch_cpu (the MKL it links; 0: none)."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        fn = getattr(ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL), name)
    except (OSError, AttributeError):
        return 0
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


@functools.cache
def _sgemm() -> int:
    """The address of MKL's sgemm_ (Fortran form, 32-bit sizes: the one torch's CPU BLAS calls) in torch's loaded
    libtorch_cpu (0: none)."""
    return _torch_symbol("sgemm_")


@functools.cache
def _tile_ok() -> str:
    """'' when fc_tile_forward gives the torch step loop's bits here (its self-test), else why not."""
    lib, vexp, width, why = _library()
    if lib is None:
        return why
    if not _sgemm():
        return "torch's library exports no MKL sgemm_ to call: the query tiles run step by step"
    return cbuild.proven("step", lib, lambda view: _tile_test(view, vexp, width), "step by step", {"fc_tile_forward"})


def _tile_test(lib, vexp: int, width: int) -> str:
    """'' when fc_tile_forward gives the torch step loop's bits on _TILE_CASES, else which case differs."""
    with _threads(1):
        for shape, spans, spec in _TILE_CASES:
            how = _tile_how(shape, spec)
            for p_dtype in (torch.float32, torch.bfloat16):
                q, k, v = _tile_case(shape, sliced=how is not None)
                want = _torch_tile(q, k, v, spans, p_dtype, how)
                got = _tile_run(lib, vexp, width, q, k, v, spans, p_dtype, how)
                if not all(_same(a, b) for a, b in zip(want, got, strict=True)):
                    return f"the tile loop differs from torch's steps ({shape}, P in {p_dtype})"
    return ""


@functools.cache
def _mkl_local() -> int | None:
    """MKL_Set_Num_Threads_Local (by value) in torch's loaded library (None: absent; MKL then keeps its own setting)."""
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        fn = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL).MKL_Set_Num_Threads_Local  # the C form
    except (OSError, AttributeError):
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value


def status() -> dict:
    """{"available": bool, "vector_width": int, "reason": str, "tile_loop": bool, "tile_reason": str} for
    `flashcheck doctor` (tile_loop: whole query tiles run in one C call, see tile_forward)."""
    lib, _, width, why = _library()
    cap = torch.backends.cpu.get_cpu_capability()
    tile_why = _tile_ok() if lib is not None else why
    return {
        "available": lib is not None, "capability": cap, "vector_width": width, "reason": why,
        "tile_loop": lib is not None and not tile_why, "tile_reason": tile_why,
    }  # fmt: skip


def _usable(s: torch.Tensor) -> bool:
    ok = s.dtype == torch.float32 and s.device.type == "cpu" and s.is_contiguous() and not s.requires_grad
    return ok and torch.get_num_threads() == 1


def softmax_step(
    s: torch.Tensor, m: torch.Tensor, l: torch.Tensor, p_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """For NaN-free float32 s [..., R, N] (contiguous) and m, l [..., R, 1]: (m_new, l_new, alpha) [..., R, 1]
    with s holding P = exp(s - ms) rounded to p_dtype (float32: not rounded), as _fa2_step computes them with
    torch's ops (amax, maximum, where, sub_, exp, sum, the cast, exp(m - ms), alpha * l + sum), bit for bit.
    None (s untouched) where the routine is unavailable or does not apply (then run torch's ops)."""
    if not _usable(s) or s.shape[-1] == 0 or p_dtype not in _P_FORMATS or s.shape[:-1] != m.shape[:-1]:
        return None
    lib, vexp, width, _ = _library()
    if lib is None or (p_dtype == torch.float16 and not lib.fc_has_fp16()):
        return None
    m, l = (t.contiguous() for t in (m, l))
    if m.dtype != torch.float32 or l.dtype != torch.float32 or l.shape != m.shape:
        return None
    m_new, l_new, alpha = (torch.empty_like(m) for _ in range(3))
    rows, n = m.numel(), s.shape[-1]
    ptrs = (s.data_ptr(), rows, n, m.data_ptr(), l.data_ptr(), m_new.data_ptr(), l_new.data_ptr(), alpha.data_ptr())
    lib.fc_softmax_step(*ptrs, width, _P_FORMATS[p_dtype], vexp, VML_MODE, _mkl_local())
    return m_new, l_new, alpha


def acc_update(o: torch.Tensor, alpha: torch.Tensor, pv: torch.Tensor) -> bool:
    """o = o * alpha + pv in place, as o.mul_(alpha).add_(pv) rounds it, for float32 o [B, H, R, Dv] (each head's
    rows contiguous), alpha [B, H, R, 1] and pv [B, H, R, Dv] contiguous. False (o untouched) where it does not
    apply."""
    lib = _library()[0]
    if lib is None or not (_usable(pv) and alpha.is_contiguous() and alpha.dtype == o.dtype == torch.float32):
        return False
    if o.dim() != 4 or o.shape != pv.shape or alpha.shape != (*o.shape[:-1], 1) or o.device.type != "cpu":
        return False
    b, h, r, dv = o.shape
    if o.stride(3) != 1 or o.stride(2) != dv or (b > 1 and o.stride(0) != h * o.stride(1)):
        return False
    lib.fc_acc_update(o.data_ptr(), b * h, r, dv, o.stride(1), alpha.data_ptr(), pv.data_ptr())
    return True


def tile_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spans: list[tuple[int, int]],
    o: torch.Tensor,
    m: torch.Tensor,
    l: torch.Tensor,
    p_dtype: torch.dtype,
    *,
    starts: list[int] | None = None,
    scale: float = 1.0,
    causal: tuple[int, int] | None = None,
    mask: torch.Tensor | None = None,
) -> bool:
    """A whole query tile of the FA2 forward in one C call (the GIL released throughout): for q [B, H, R, D] (the
    tile's rows, each head's contiguous: a row slice of the whole Q), k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv]
    (columns contiguous; Hkv divides H, query head h reads K / V head h // (H / Hkv): grouped heads without a
    copy) and each key block (c0, c1) of `spans` in turn, on the tile's rows from starts[t] on (None: all), the
    step kernels.sim.flash._query_tile runs with torch's bmm: scores S = Q K_j^T, times `scale` unless 1 (torch's
    float32 mul_), plus the causal bias where the step's block has a masked entry (causal = (row0, offset): the
    tile's first row in the sequence and Lk - Lq; row i sees key j iff j <= i + offset), the user mask's bias on
    every step where `mask` is given (bool or float32 [B|1, H|1, R|1, Lk|1], the tile's rows, strides as they are:
    bool adds 0 / -inf, float its value, the causal bias summed into it first where that applies, as
    kernels.sim.masks.tile_bias), the softmax of softmax_step (P rounded to p_dtype), P V_j and acc_update, into o
    [B, H, R, Dv], m, l [B, H, R, 1] (contiguous; zeros, -inf, zeros at the start). Bit for bit the step loop's:
    rows are independent, the products are MKL's sgemm on the very operands and leading dimensions of bmm's, its
    outputs at the same alignment (see fc_tile_forward), checked at load (_tile_ok). The scores, the mask's bias
    added, must be NaN-free (finite inputs, no overflow, no NaN or +inf in the mask: the caller's guarantee). False
    (nothing touched) where it does not apply: a product torch's bmm forms otherwise (under _BMM_SMALL
    multiply-adds per matrix: its own loops; a single key column or query row: measured to
    differ from sgemm's)."""
    if not spans or p_dtype not in _P_FORMATS or torch.get_num_threads() != 1:
        return False
    if q.dtype != torch.float32 or q.device.type != "cpu" or q.requires_grad:
        return False
    if _tile_ok() or q.dim() != 4 or q.stride(-1) != 1 or q.stride(-2) != q.shape[-1]:
        return False
    if q.shape[0] > 1 and q.shape[1] > 1 and q.stride(0) != q.shape[1] * q.stride(1):
        return False  # heads the C does not step through at one stride (bmm would copy them)
    if torch.get_float32_matmul_precision() != "highest":  # bmm may then run oneDNN's reduced-precision product
        return False
    lib, vexp, width, _ = _library()
    if p_dtype == torch.float16 and not lib.fc_has_fp16():
        return False
    starts = [0] * len(spans) if starts is None else list(starts)
    if not _tile_shapes_ok(q, (k, v, o, m, l), spans, starts) or not _mask_ok(mask, q, k):
        return False
    _tile_call(lib, vexp, width, (q, k, v), spans, (o, m, l), p_dtype, (starts, scale, causal, mask))
    return True


def _mask_ok(mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> bool:
    """Whether tile_forward takes `mask` (None: no mask): bool or float32 on the CPU, 4-D, broadcastable to
    [B, H, R, Lk] (q [B, H, R, D], k [B, Hkv, Lk, D])."""
    if mask is None:
        return True
    if mask.dtype not in (torch.bool, torch.float32) or mask.device.type != "cpu" or mask.dim() != 4:
        return False
    want = (*q.shape[:3], k.shape[-2])
    return all(n in (1, w) for n, w in zip(mask.shape, want, strict=True))


def _tile_shapes_ok(q: torch.Tensor, tensors, spans: list[tuple[int, int]], starts: list[int]) -> bool:
    """Whether tile_forward's other operands (k, v, o, m, l) fit q [B, H, R, D] and every step's products are
    sgemm's as torch's bmm forms them."""
    k, v, o, m, l = tensors
    b, h, rows, d = q.shape
    dv, width_k = v.shape[-1], max(c1 - c0 for c0, c1 in spans)
    if any(t.dtype != torch.float32 or t.device.type != "cpu" or t.requires_grad for t in tensors):
        return False
    if k.dim() != 4 or v.dim() != 4 or k.shape[0] != b or v.shape[:2] != k.shape[:2] or k.shape[-1] != d:
        return False
    if k.shape[1] < 1 or h % k.shape[1] or len(starts) != len(spans):
        return False
    if k.stride(-1) != 1 or v.stride(-1) != 1 or not all(t.is_contiguous() for t in (o, m, l)):
        return False
    if o.shape != (b, h, rows, dv) or m.shape != (b, h, rows, 1) or l.shape != m.shape:
        return False
    if max(rows, d, dv, width_k, k.stride(-2), v.stride(-2), b * h * rows * max(width_k, dv)) >= 2**31:
        return False  # sgemm_'s 32-bit sizes
    for (c0, c1), i0 in zip(spans, starts, strict=True):
        if not 0 <= i0 <= rows - 2 or c1 - c0 < 2 or min(d, dv) * (rows - i0) * (c1 - c0) < _BMM_SMALL:
            return False  # products torch's bmm does not hand to sgemm (a step's bits would move)
    return True


def _tile_call(lib, vexp: int, width: int, qkv, spans, oml, p_dtype: torch.dtype, how=None) -> None:
    """fc_tile_forward on the tensors; how = (starts, scale, causal[, mask]) as tile_forward takes them (None: all
    rows, no scale, not causal, no mask)."""
    (q, k, v), (o, m, l) = qkv, oml
    starts, scale, causal, mask = (*how, None)[:4] if how is not None else ([0] * len(spans), 1.0, None, None)
    b, h, rows, d = q.shape
    width_k = max(c1 - c0 for c0, c1 in spans)
    bufs = [torch.empty(rows * n + 16, dtype=torch.float32) for n in (width_k, v.shape[-1])]  # 64-byte aligned
    flat = torch.tensor([c for (c0, c1), i0 in zip(spans, starts, strict=True) for c in (c0, c1, i0)],
                        dtype=torch.int64)  # fmt: skip
    tmp = torch.empty(2 * rows, dtype=torch.float32)
    row0, off = causal if causal is not None else (0, 0)
    strides = mask.expand(b, h, rows, k.shape[-2]).stride() if mask is not None else (0, 0, 0, 0)
    mst = torch.tensor(strides, dtype=torch.int64)  # the mask's element strides (0: broadcast)
    kind = 0 if mask is None else 1 if mask.dtype == torch.bool else 2
    lib.fc_tile_forward(
        q.data_ptr(), k.data_ptr(), v.data_ptr(), b * h, h, h // k.shape[1], q.stride(1) if h > 1 else q.stride(0),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), rows, d, v.shape[-1], flat.data_ptr(), len(spans), scale,
        causal is not None, row0, off, mask.data_ptr() if mask is not None else None, kind, mst.data_ptr(),
        o.data_ptr(), m.data_ptr(), l.data_ptr(), bufs[0].data_ptr(),
        bufs[1].data_ptr(), tmp.data_ptr(), width, _P_FORMATS[p_dtype], vexp, VML_MODE, _mkl_local(), _sgemm(),
    )  # fmt: skip


_BMM_SMALL = 400  # aten's bmm forms a product of fewer multiply-adds (contraction * rows * columns) in plain loops
_SCALE = 1 / math.sqrt(96)  # a score scale that is no power of two (head dims 32, 96, 128, 256 have such scales)
# (shape (B, H, Hkv, rows, Lk, D, Dv), spans, how): how = (starts, scale, causal (row0, offset)) or None
_TILE_CASES = [
    ((1, 2, 2, 37, 300, 64, 64), [(0, 128), (128, 256), (256, 300)], None),
    ((2, 3, 3, 64, 200, 32, 48), [(100, 200), (0, 100)], None),
    ((1, 4, 4, 160, 256, 64, 64), [(0, 128), (128, 256)], None),
    ((1, 2, 2, 9, 70, 16, 16), [(0, 33), (33, 66), (66, 70)], None),
    ((1, 3, 3, 13, 90, 24, 40), [(45, 90), (0, 45)], None),
    ((1, 2, 2, 8, 6, 64, 32), [(0, 2), (2, 4), (4, 6)], None),
    ((1, 2, 2, 100, 300, 128, 128), [(0, 128), (128, 256), (256, 300)], ([0, 0, 0], _SCALE, None)),
    # causal: a tile of rows 128..256 of Lq = Lk = 300, blocks of 64 (the last ones start inside the tile)
    ((1, 2, 2, 128, 300, 96, 96), [(0, 64), (64, 128), (128, 192), (192, 256)], ([0, 0, 0, 64], _SCALE, (128, 0))),
    # bottom-right causal, Lq = 200 < Lk = 330 (offset 130), grouped heads 4:2, batch 2, odd row starts
    ((2, 4, 2, 200, 330, 32, 32), [(0, 100), (100, 200), (200, 300), (300, 330)], ([0, 0, 70, 170], 0.125, (0, 130))),
    # causal with Lq = 260 > Lk = 200 (offset -60): a tile of rows 100..260; grouped heads 6:1; head dim 256
    ((1, 6, 1, 160, 200, 256, 256), [(0, 100), (100, 200)], ([0, 60], 1 / 16, (100, -60))),
    # user masks (_tile_mask): bool with a fully masked row, bottom-right causal, grouped heads, batch 2
    ((2, 4, 2, 200, 330, 32, 32), [(0, 100), (100, 200), (200, 300), (300, 330)],
     ([0, 0, 70, 170], 0.125, (0, 130), "bool-rows")),
    ((2, 3, 3, 64, 200, 32, 48), [(100, 200), (0, 100)], ([0, 0], 1.0, None, "bool-rows")),
    # float (ALiBi-like, -inf and -0.0 entries, a row all -inf) per head, plain and causal
    ((1, 2, 2, 100, 300, 128, 128), [(0, 128), (128, 256), (256, 300)], ([0, 0, 0], _SCALE, None, "float")),
    ((1, 2, 2, 128, 300, 96, 96), [(0, 64), (64, 128), (128, 192), (192, 256)],
     ([0, 0, 0, 64], _SCALE, (128, 0), "float")),
    # left key padding [B, 1, 1, Lk] under causal (the tile's first rows see no key); a float bias per row
    # [1, 1, R, 1] (broadcast over keys; -inf rows) with grouped heads 6:1
    ((2, 2, 2, 128, 300, 64, 64), [(0, 64), (64, 128), (128, 192), (192, 256)],
     ([0, 0, 0, 64], 0.125, (128, 0), "pad-left")),
    ((1, 6, 1, 160, 200, 64, 64), [(0, 100), (100, 200)], ([0, 60], 1 / 16, (100, -60), "float-rows")),
]  # fmt: skip


def _tile_how(shape: tuple[int, ...], how):
    """how with its mask spec (a _TILE_CASES entry's 4th item) made a mask of the tile (_tile_mask)."""
    if how is None or len(how) < 4 or how[3] is None:
        return how
    return (*how[:3], _tile_mask(how[3], shape))


def _tile_mask(spec: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A user mask of a _TILE_CASES shape's tile: bool-rows (bool [B, 1, R, Lk], about 30% masked, row 3 wholly),
    pad-left (bool [B, 1, 1, Lk]: batch b keeps its last Lk - 150 - 10 b keys), float ([1, H, R, Lk]: -0.1 (h + 1)
    |i - j| with -inf at about 20%, -0.0 at about 10% and row 1 all -inf) or float-rows (float32 [1, 1, R, 1]:
    a random bias, -inf at every fifth row)."""
    b, h, _, rows, lk = shape[:5]
    g = torch.Generator().manual_seed(rows + lk)
    if spec == "bool-rows":
        keep = torch.rand(b, 1, rows, lk, generator=g) > 0.3
        keep[:, :, 3] = False
        return keep
    if spec == "pad-left":
        return torch.stack([torch.arange(lk) >= 150 + 10 * i for i in range(b)])[:, None, None, :]
    if spec == "float":
        i, j = torch.arange(rows).unsqueeze(-1), torch.arange(lk)
        bias = -0.1 * torch.arange(1, h + 1).view(1, h, 1, 1) * (i - j).abs()
        bias = bias.masked_fill(torch.rand(bias.shape, generator=g) < 0.2, -math.inf)
        bias = bias.masked_fill(torch.rand(bias.shape, generator=g) < 0.1, -0.0)
        bias[:, :, 1] = -math.inf
        return bias
    bias = torch.randn(1, 1, rows, 1, generator=g) * 4
    bias[:, :, ::5] = -math.inf
    return bias


def _tile_case(shape: tuple[int, ...], sliced: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of a _TILE_CASES shape; sliced: q rows 5:5 + rows of a longer Q (a query tile's view)."""
    b, h, hkv, rows, lk, d, dv = shape
    g = torch.Generator().manual_seed(rows * 31 + lk + d)
    q = (torch.randn(b, h, rows + 12, d, generator=g) * 0.25)[..., 5 : 5 + rows, :] if sliced else None
    q = torch.randn(b, h, rows, d, generator=g) * 0.25 if q is None else q
    k = torch.randn(b, hkv, lk, d, generator=g) * 2
    v = torch.randn(b, hkv, lk, dv, generator=g)
    return q, k, v


def _torch_tile(q, k, v, spans, p_dtype, how=None):
    """The step loop with torch's ops as kernels.sim.flash._query_tile runs it (bmm into flat buffers laid out as
    its scratch, grouped K / V heads repeated, a step on its rows from starts[t], the scale's mul_, the causal
    and mask bias's add_; how = (starts, scale, causal[, mask])): (o, m, l)."""
    b, h, rows, _ = q.shape
    starts, scale, causal, mask = (*how, None)[:4] if how is not None else ([0] * len(spans), 1.0, None, None)
    k, v = (t.repeat_interleave(h // t.shape[1], dim=1) for t in (k, v))
    dv = v.shape[-1]
    o = torch.zeros(b, h, rows, dv)
    m, l = torch.full((b, h, rows, 1), -math.inf), torch.zeros(b, h, rows, 1)
    width = max(c1 - c0 for c0, c1 in spans)
    s_buf, pv_buf = torch.empty(b * h * rows * width), torch.empty(b * h * rows * dv)
    for (c0, c1), i0 in zip(spans, starts, strict=True):
        nr = rows - i0
        s = s_buf[: b * h * nr * (c1 - c0)].view(b, h, nr, c1 - c0)
        torch.matmul(q[..., i0:, :], k[..., c0:c1, :].transpose(-1, -2), out=s)
        if scale != 1.0:
            s.mul_(scale)
        bias = None
        if causal is not None:
            i = torch.arange(causal[0] + i0, causal[0] + rows).unsqueeze(-1)
            keep = torch.arange(c0, c1).unsqueeze(0) <= i + causal[1]
            if not bool(keep.all()):
                bias = torch.zeros(keep.shape).masked_fill(~keep, -math.inf)
        if mask is not None:  # as kernels.sim.masks.tile_bias
            mk = mask[..., i0:, :] if mask.shape[-2] != 1 else mask
            mk = mk[..., c0:c1] if mk.shape[-1] != 1 else mk
            mk = torch.zeros(mk.shape).masked_fill(~mk, -math.inf) if mk.dtype == torch.bool else mk.float()
            bias = mk if bias is None else bias + mk
        if bias is not None:
            s.add_(bias)
        p, m_new, l_new, alpha = _torch_step(s, m[..., i0:, :], l[..., i0:, :], p_dtype)
        m[..., i0:, :], l[..., i0:, :] = m_new, l_new
        pv = pv_buf[: b * h * nr * dv].view(b, h, nr, dv)
        torch.matmul(p, v[..., c0:c1, :], out=pv)
        o[..., i0:, :].mul_(alpha).add_(pv)
    return o, m, l


def _tile_run(lib, vexp, width, q, k, v, spans, p_dtype, how=None):
    b, h, rows, _ = q.shape
    dv = v.shape[-1]
    o = torch.zeros(b, h, rows, dv)
    m, l = torch.full((b, h, rows, 1), -math.inf), torch.zeros(b, h, rows, 1)
    _tile_call(lib, vexp, width, (q, k, v), spans, (o, m, l), p_dtype, how)
    return o, m, l


def _self_test(lib, vexp: int, width: int) -> str:
    """'' when both routines give torch's bits on the probe cases, else why not (naming the case)."""
    with _threads(1):
        for n, rows, how in _CASES:
            s, m, l = _case(n, rows, how)
            for p_dtype in (torch.float32, torch.bfloat16, *((torch.float16,) if lib.fc_has_fp16() else ())):
                want = _torch_step(s.clone(), m, l, p_dtype)
                got_s = s.clone()
                m_new, l_new, alpha = (torch.empty_like(m) for _ in range(3))
                lib.fc_softmax_step(
                    got_s.data_ptr(), m.numel(), n, m.data_ptr(), l.data_ptr(), m_new.data_ptr(), l_new.data_ptr(),
                    alpha.data_ptr(), width, _P_FORMATS[p_dtype], vexp, VML_MODE, _mkl_local(),
                )  # fmt: skip
                if not all(_same(a, b) for a, b in zip(want, (got_s, m_new, l_new, alpha), strict=True)):
                    return f"fc_softmax_step differs from torch here (width {n}, {how} rows, P in {p_dtype})"
            o = torch.randn(*m.shape[:-1], 24, generator=torch.Generator().manual_seed(n))
            pv = torch.randn_like(o)
            want = o * alpha
            want += pv
            lib.fc_acc_update(o.data_ptr(), m.shape[0], m.shape[1], 24, o.stride(0), alpha.data_ptr(), pv.data_ptr())
            if not _same(o, want):
                return f"fc_acc_update differs from torch here ({n} rows)"
    return ""


_CASES = [(n, rows, how) for n in (1, 3, 8, 15, 16, 17, 37, 64, 128, 129, 200, 1000, 4103) for rows, how in
          ((5, "random"), (3, "tied"), (2, "masked"))]  # fmt: skip


def _case(n: int, rows: int, how: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scores [2, rows, n] and the running m, l [2, rows, 1]: random (wide range, so P has subnormals and
    zeros), tied maxima, or rows partly / wholly -inf (masked) with m = -inf."""
    g = torch.Generator().manual_seed(n * 7 + rows)
    s = torch.randn(2, rows, n, generator=g) * torch.exp2(torch.randint(-3, 7, (2, rows, 1), generator=g).float())
    m = s.amax(-1, keepdim=True) + torch.randn(2, rows, 1, generator=g) * 4
    l = torch.rand(2, rows, 1, generator=g) * 50
    if how == "tied":
        s = s.round()
        s[..., : max(1, n // 2)] = s.amax(-1, keepdim=True)
    elif how == "masked":
        s[..., : (n + 1) // 2] = -math.inf
        s[0, 0], m[0], l[0] = -math.inf, -math.inf, 0.0
    return s.contiguous(), m.contiguous(), l.contiguous()


def _torch_step(s, m, l, p_dtype):
    """_fa2_step's torch ops (stats and the working dtype float32): (P, m_new, l_new, alpha)."""
    m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
    ms = torch.where(torch.isneginf(m_new), 0.0, m_new)
    s.sub_(ms)
    alpha = torch.exp(m - ms)
    p = torch.exp(s, out=s)
    l_new = alpha * l + p.sum(dim=-1, keepdim=True)
    if p_dtype != torch.float32:
        p.copy_(p.to(p_dtype))
    return p, m_new, l_new, alpha


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, but a zero's sign (exp takes either to 1; max_sub_ allows the same)."""
    return a.shape == b.shape and torch.equal((a + 0.0).view(torch.int32), (b + 0.0).view(torch.int32))


class _threads:
    def __init__(self, n: int) -> None:
        self.n, self.old = n, 0

    def __enter__(self) -> None:
        self.old = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self.old)
