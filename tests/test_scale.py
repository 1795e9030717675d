"""Scale (issue 15): the query-chunked standard kernel and FP64 reference give the numbers of one unchunked block,
bit for bit on any BLAS (issue 21: every product they take has the same shape whatever the chunking); the flash
simulator's query tiles agree with one tile to a few units in the last place; the memory-aware local executor
runs only what fits; simulators and the FP64 reference follow `device` (cpu here, cuda marked `gpu`)."""

from __future__ import annotations

import itertools

import pytest
import torch
from tests.helpers import scale_qkv

from flashcheck.core.numerics import info, parse_policy
from flashcheck.kernels.sim import flash as flash_mod
from flashcheck.kernels.sim import standard as standard_mod
from flashcheck.kernels.sim.flash import FlashConfig, flash_attention
from flashcheck.kernels.sim.standard import standard_attention
from flashcheck.kernels.sim.tiles import MIN_ROWS, ROW_BLOCK, mm_blocks, row_chunks

POLICIES = ("fp64", "bf16-mixed", "fp16", "baseline-fp8")


@pytest.mark.parametrize("lq,rows", [(1, 1), (7, 3), (8, 8), (17, 8), (100, 7), (100, 33), (64, 64)])
def test_row_chunks_cover_every_row_once_with_at_least_min_rows(lq, rows):
    chunks = row_chunks(lq, rows)
    assert chunks[0][0] == 0 and chunks[-1][1] == lq
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
    assert all(r1 - r0 >= min(MIN_ROWS, lq) for r0, r1 in chunks)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_chunk_rows_must_be_a_positive_integer(bad):
    q, k, v = scale_qkv(4, 4)
    with pytest.raises(ValueError, match="chunk_rows"):
        standard_attention(q, k, v, chunk_rows=bad)


class _Products(torch.overrides.TorchFunctionMode):
    """Records every matrix product a run issues: both operands' shapes and last two strides, the layout a GEMM
    sees (a BLAS picks its kernel for each row from these and the row's position, never from other rows' data)."""

    FUNCS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.mm)

    def __init__(self):
        super().__init__()
        self.seen: list[tuple] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.FUNCS:
            self.seen.append(tuple((tuple(t.shape), t.stride()[-2:]) for t in args[:2]))
        return func(*args, **(kwargs or {}))


ODD_ROWS = (1, 9, 13)  # chunk sizes that leave the tail rows an AVX-512 MKL sums in another order (issue 21)


@pytest.mark.parametrize("lq", [150, 33])
@pytest.mark.parametrize("kernel", ["standard", "reference", "standard-autograd", "reference-autograd"])
def test_chunked_runs_issue_the_products_of_the_unchunked_run(kernel, lq):
    """The padded-shape argument, checked: with chunks of 1, 9 or 13 rows (and 8, the least row_chunks allows),
    every product has min(ROW_BLOCK, Lq) rows and the very shapes and layouts the unchunked run's products have,
    so every row meets the same GEMM kernel at the same position on any BLAS; the outputs then agree bit for bit.
    Up to ROW_BLOCK query rows the unchunked run is one product of Lq rows (a decoding step's one row stays one)."""
    lk = 70
    q, k, v = scale_qkv(lq, lk, seed=11)
    grad = kernel.endswith("autograd")

    def run(rows: int):
        leaves = [t.clone().requires_grad_(grad) for t in (q, k, v)]
        with _Products() as rec:
            if kernel.startswith("standard"):
                out = standard_attention(*leaves, policy="fp64", causal=True, chunk_rows=rows)
            else:
                from flashcheck.kernels.sim.reference import reference_attention

                out = reference_attention(*leaves, causal=True, chunk=rows)
        return out.detach(), rec.seen

    whole, shapes = run(lq)
    assert shapes and all(a[0][-2] == min(ROW_BLOCK, lq) for a, _ in shapes)
    for rows in (*ODD_ROWS, 8):
        out, seen = run(rows)
        assert set(seen) == set(shapes), f"chunk rows {rows}"
        assert torch.equal(out, whole), f"chunk rows {rows}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_mm_blocks_gives_each_row_the_bits_it_has_in_the_whole_product(dtype):
    """Any slice of rows, at any offset, gets from mm_blocks the bits those rows get in the whole operand's
    product (rows at the same position of same-shaped GEMMs); the values are a @ b's, and gradients flow."""
    g = torch.Generator().manual_seed(3)
    a = torch.randn(2, 200, 24, generator=g, dtype=dtype)
    b = torch.randn(2, 24, 40, generator=g, dtype=dtype)
    whole = mm_blocks(a, b, None)
    tol = {"rtol": 1e-5, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-12, "atol": 1e-12}
    assert torch.allclose(whole, a @ b, **tol)
    for r0, r1 in [(0, 1), (3, 12), (9, 22), (60, 73), (64, 128), (127, 200), (199, 200)]:
        assert torch.equal(mm_blocks(a[:, r0:r1], b, None, r0), whole[:, r0:r1]), (r0, r1)
        out = torch.full((2, r1 - r0, 40), torch.nan, dtype=dtype)
        assert torch.equal(mm_blocks(a[:, r0:r1], b, None, r0, out=out), whole[:, r0:r1]), (r0, r1)
    leaf = a[:, 5:90].clone().requires_grad_()
    mm_blocks(leaf, b, None, 5).sum().backward()
    assert torch.allclose(leaf.grad, b.sum(-1).unsqueeze(1).expand_as(leaf), **tol)  # d(sum a b)/da = b 1
    assert mm_blocks(a[:, :0], b, None).shape == (2, 0, 40)


@pytest.mark.parametrize("n", [1, 5, 64])
def test_an_operand_of_at_most_row_block_rows_is_one_product_of_its_own_shape(n):
    """rows_total <= ROW_BLOCK: the whole operand's product is the plain a @ b (the call an unblocked kernel makes,
    so a decoding step keeps its one-row product), and any slice of it gets those bits in a block of n rows."""
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(3, n, 16, generator=g), torch.randn(3, 16, 20, generator=g)
    whole = mm_blocks(a, b, None, rows_total=n)
    assert torch.equal(whole, torch.matmul(a, b))
    for r0, r1 in [(0, 1), (n - 1, n), (0, n)]:
        assert torch.equal(mm_blocks(a[:, r0:r1], b, None, r0, rows_total=n), whole[:, r0:r1])
        out = torch.full((3, r1 - r0, 20), torch.nan)
        assert torch.equal(mm_blocks(a[:, r0:r1], b, None, r0, out=out, rows_total=n), whole[:, r0:r1])
    with pytest.raises(ValueError, match="rows_total=1"):
        mm_blocks(a[:, :2], b, None, 0, rows_total=1) if n > 1 else mm_blocks(a, b, None, 1, rows_total=1)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("lq,lk,causal", [(33, 33, True), (100, 37, True), (37, 100, False), (5, 40, True)])
def test_standard_in_query_chunks_equals_one_block_bit_for_bit(policy, lq, lk, causal):
    q, k, v = scale_qkv(lq, lk, seed=lq + lk)
    whole = standard_attention(q, k, v, policy=policy, causal=causal, chunk_rows=lq)
    for rows in (*ODD_ROWS, 8, 64):
        out = standard_attention(q, k, v, policy=policy, causal=causal, chunk_rows=rows)
        assert torch.equal(out, whole), f"chunk_rows={rows}"


def test_standard_default_chunks_by_bytes_and_a_user_mask_is_cut_per_chunk(monkeypatch):
    q, k, v = scale_qkv(96, 80, seed=3)
    mask = torch.rand(1, 2, 96, 80, generator=torch.Generator().manual_seed(1)) > 0.3
    whole = standard_attention(q, k, v, policy="bf16-mixed", mask=mask, chunk_rows=96)
    monkeypatch.setattr(standard_mod, "CHUNK_BYTES", 2 * 80 * 4 * 10)  # 10 rows of fp32 scores per chunk
    calls = []
    real = standard_mod._rows_inplace
    monkeypatch.setattr(standard_mod, "_rows_inplace", lambda *a: calls.append(a[4]) or real(*a))
    assert torch.equal(standard_attention(q, k, v, policy="bf16-mixed", mask=mask), whole)
    assert calls[:2] == [(0, 10), (10, 20)] and calls[-1] == (80, 96)  # 6 rows left join the last chunk


def _forward(q, k, v, policy: str, rows: int | None, **cfg):
    pol = parse_policy(policy)
    q, k, v = (t.to(pol.work_dtype) for t in (q, k, v))
    return flash_mod._forward(q, k, v, FlashConfig(policy=pol, **cfg), pol, tile_rows=rows)


FLASH_GRID = [
    dict(block_k=16, causal=True),
    dict(block_k=32, causal=True, algorithm="fa1", key_order="reverse"),
    dict(block_k=64, causal=False),
]
# Where tiles cut odd shapes, a few outputs differ in the last bits: torch's vectorised elementwise loops
# (exp, exp2) finish each thread's range with scalar code, and BLAS may pick another kernel for a product of
# another shape, so the elements computed by the scalar tail are not the same ones as unchunked.
ODD_GRID = [
    dict(block_k=64, causal=False, algorithm="fa1"),
    dict(block_k=16, causal=True, exp2=True, tie_beta=2.0),
]


# Query tiles vs one tile, in units of the last place of each result's format at its row's largest magnitude:
# measured at most 17 (fp64 output, fa1, tiles of 9 and 13 rows on the AVX-512 MKL), 8 (bf16-mixed's fp32
# accumulator), 2 (LSE); 0 for the policies whose outputs round to 16 bits or fewer. 32: twice the worst seen.
TILE_ULPS = 32


def _row_ulps(a: torch.Tensor, b: torch.Tensor, fmt) -> float:
    """max |a - b| in ulps of `fmt` at the largest |b| of each row (where b is finite; a non-finite b must
    match exactly)."""
    from flashcheck.core.numerics import spacing

    fin = torch.isfinite(b)
    assert torch.equal(a[~fin], b[~fin])
    scale = b.double().abs().where(fin, 0.0).amax(dim=-1, keepdim=True).expand_as(b)
    d = (a.double() - b.double()).abs()[fin]
    return float((d / spacing(scale[fin], fmt)).max()) if d.numel() else 0.0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("lq,lk", [(128, 128), (48, 160), (160, 48), (5, 5)])
@pytest.mark.parametrize("cfg", FLASH_GRID, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_flash_in_query_tiles_agrees_with_every_row_at_once_to_a_few_ulps(policy, lq, lk, cfg):
    """tile_rows=Lq is the former kernel (each key block updates every row at once); tiles of 1, 9, 13 and 64
    rows, and causal steps that reach only the last few rows of a tile, give the same output and LSE to
    TILE_ULPS units in the last place: a tile's products have other row counts than the whole's, and a BLAS
    may sum the rows of a partial micro-kernel panel in another order (issue 21), so no bit-identity here."""
    pol = parse_policy(policy)
    q, k, v = scale_qkv(lq, lk, seed=lq * 7 + lk)
    whole = _forward(q, k, v, policy, lq, **cfg)
    for rows in (*ODD_ROWS, 64):
        tiled = _forward(q, k, v, policy, rows, **cfg)
        for name, a, b in zip(("accum", "output", "stats"), tiled, whole, strict=True):
            # in units of the narrowest format the result passed through: a flipped bf16 rounding of P moves
            # bf16-mixed's fp32 accumulator by 6185 fp32 ulps, 0.09 of a bf16 one (seen under MKL_CBWR=COMPATIBLE)
            fmt = min((pol.stage(f) for f in (name, "score", "p")), key=lambda f: info(f).precision)
            assert _row_ulps(a, b, fmt) <= TILE_ULPS, f"tile_rows={rows} {name}"


@pytest.mark.parametrize("policy", ["fp64", "bf16-mixed"])
@pytest.mark.parametrize("lq,lk", [(257, 257), (100, 200)])
@pytest.mark.parametrize("cfg", ODD_GRID, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_flash_tiles_on_odd_shapes_move_the_output_less_than_the_kernels_own_error(policy, lq, lk, cfg):
    """Measured: at most 5.8e-16 in fp64 (the kernel's error there: 2.0e-15), 0 in bf16-mixed on most runs."""
    from flashcheck.kernels import reference_attention

    q, k, v = scale_qkv(lq, lk, seed=lq * 7 + lk)
    whole = _forward(q, k, v, policy, lq, **cfg)[1].double()
    err = (whole - reference_attention(q, k, v, causal=cfg["causal"])).abs().max()
    for rows in (1, 13, 64):
        tiled = _forward(q, k, v, policy, rows, **cfg)[1].double()
        assert (tiled - whole).abs().max() <= err, f"tile_rows={rows}"


def test_flash_default_tiles_by_bytes(monkeypatch):
    q, k, v = scale_qkv(200, 120, seed=5)
    real_forward = flash_mod._forward
    monkeypatch.setattr(flash_mod, "_forward", lambda *a, **kw: real_forward(*a, **{**kw, "tile_rows": 24}))
    want = flash_attention(q, k, v, policy="bf16-mixed", block_k=32, causal=True)  # tiles of 24 rows, asked for
    monkeypatch.setattr(flash_mod, "_forward", real_forward)
    monkeypatch.setattr(flash_mod, "TILE_BYTES", 2 * 32 * 4 * 24)  # 24 rows of one fp32 key block
    seen = []
    real = flash_mod._query_tile
    monkeypatch.setattr(
        flash_mod, "_query_tile", lambda q, k, v, rows, *a: seen.append(rows) or real(q, k, v, rows, *a)
    )
    assert torch.equal(flash_attention(q, k, v, policy="bf16-mixed", block_k=32, causal=True), want)
    # 200 rows: 8 tiles of 24, then 8 rows (the tile pool takes causal tiles costliest first on two threads)
    assert sorted(seen) == [(i, min(i + 24, 200)) for i in range(0, 200, 24)]


def test_tiled_flash_gradients_unchanged(monkeypatch):
    """The backward reads the forward's output and LSE only: tiling the forward moves gradients no more than it
    moves those (TILE_ULPS in the gradients' format; bit for bit on most BLAS builds)."""
    q, k, v = scale_qkv(72, 72, seed=9)
    real = flash_mod._forward
    grads = []
    for tile in (72, 8):
        monkeypatch.setattr(flash_mod, "_forward", lambda *a, _t=tile, **kw: real(*a, **{**kw, "tile_rows": _t}))
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        flash_attention(*leaves, policy="bf16-mixed", block_k=16, causal=True).sum().backward()
        grads.append([t.grad for t in leaves])
    fmt = parse_policy("bf16-mixed").stage("grad_output")
    assert all(_row_ulps(a, b, fmt) <= TILE_ULPS for a, b in zip(*grads, strict=True))


# ---- memory-aware scheduling ----------------------------------------------------------------------------


def _groups(seeds: int = 4):
    from flashcheck.study.cases import expand, group_by_inputs
    from flashcheck.study.config import StudyConfig, Sweep

    sweep = Sweep(
        question="q", methods=("flash:bf16",), seq_lens=(16,), blocks=((8, 8),), heads=1, seeds=tuple(range(seeds))
    )
    return group_by_inputs(expand(StudyConfig(name="s", sweeps=(sweep,))))


def _count_running(cases) -> int:
    """Pool task: mark this group running, note the most groups seen running at once while it waits for the
    expected number (FC_TEST_EXPECT; spawned workers start seconds apart on a loaded machine) or the last
    group's start, and half a second more (a group over the limit, submitted with the others, would start then:
    with _Plan.fits planted to say yes, the limited cases failed 3 of 3 runs at load 5), then evaluate it. Too
    few at once: it waits out 30 s and notes fewer."""
    import os
    import time
    from pathlib import Path

    from flashcheck.study.cases import evaluate_group
    from flashcheck.study.executors import emit

    folder, expect = Path(os.environ["FC_TEST_RUNNING"]), int(os.environ["FC_TEST_EXPECT"])
    mine = folder / f"run-{cases[0].seed}"
    mine.touch()
    (folder / f"start-{cases[0].seed}").touch()
    most, end, reached, groups = 0, time.monotonic() + 30.0, None, len(_groups())
    while time.monotonic() < (end if reached is None else reached + 0.5):
        most = max(most, len(list(folder.glob("run-*"))))
        if reached is None and (most >= expect or len(list(folder.glob("start-*"))) == groups):
            reached = time.monotonic()  # enough at once, or no group left to join
        time.sleep(0.02)
    (folder / f"seen-{cases[0].seed}").write_text(str(most))
    mine.unlink()
    return evaluate_group(cases, emit)


@pytest.mark.usefixtures("fork_server")  # conftest: one fork server with every pool's modules
@pytest.mark.parametrize("fit,expected", [(2.5, 2), (1.2, 1), (10.0, 3)])
def test_the_local_pool_runs_only_as_many_groups_as_fit_in_memory(tmp_path, monkeypatch, fit, expected):
    """Each group's estimate (study.memory.estimate_case_bytes) against a fake available memory that holds
    `fit` of them: with 3 workers, at most floor(fit) groups (at least one) run at once."""
    from flashcheck.kernels.sim.memory import HEADROOM
    from flashcheck.study.executors import run_local
    from flashcheck.study.memory import estimate_case_bytes

    monkeypatch.setenv("FC_TEST_RUNNING", str(tmp_path))
    monkeypatch.setenv("FC_TEST_EXPECT", str(expected))
    groups = _groups()
    need = max(estimate_case_bytes(c) for g in groups for c in g)
    got = []
    run_local(groups, 3, got.append, task=_count_running, available=int(fit * need / HEADROOM))
    assert sorted(r.case_id for r in got) == sorted(c.case_id for g in groups for c in g)
    seen = [int(p.read_text()) for p in tmp_path.glob("seen-*")]
    assert len(seen) == 4 and max(seen) == expected, seen


def test_plan_starts_a_group_only_while_the_running_estimates_fit():
    from flashcheck.kernels.sim.memory import HEADROOM
    from flashcheck.study.executors import _Plan

    plan = _Plan({0: 600, 1: 300, 2: 500}, int(1000 / HEADROOM) + 1)
    assert plan.fits(0, 0)
    plan.start(0, 0)
    assert plan.fits(1, 1) and not plan.fits(2, 1)
    plan.start(1, 1)
    plan.end(0)
    assert plan.fits(2, 1) and plan.peak_running == 2
    assert _Plan({0: 10**15}, 10).fits(0, 0)  # one group always runs: it fitted alone (runner checks that)
    assert _Plan({0: 10**15}, None).fits(0, 5)  # unknown memory: only the worker count limits


# ---- devices ---------------------------------------------------------------------------------------------


def _cuda() -> bool:
    return torch.cuda.is_available()


def test_compare_carries_the_device_to_both_simulators_and_the_reference(monkeypatch):
    """device="cpu" given explicitly: the same numbers as the default; the methods and the References built
    by run_case are on that device (a fake References records what it was asked for)."""
    from flashcheck.core.inputs import InputSpec
    from flashcheck.measure import case as case_mod
    from flashcheck.measure.compare import CompareConfig, run_compare

    spec = InputSpec(heads=1, seq_len=64)
    default, explicit = run_compare(CompareConfig(inputs=spec)), run_compare(CompareConfig(inputs=spec, device="cpu"))
    assert explicit.candidate == default.candidate and explicit.baseline == default.baseline
    cfg = CompareConfig(inputs=spec, device="cuda")
    assert cfg.case().method.run_device == "cuda" and cfg.case().baseline.run_device == "cuda"
    asked = []

    class Refs(case_mod.References):
        def __init__(self, spec, *, causal=False, device="cpu"):
            asked.append(device)
            raise RuntimeError("stop here")

    monkeypatch.setattr(case_mod, "References", Refs)
    rec = case_mod.run_case(cfg.case())
    assert asked == ["cuda"] and rec.status == "failed"
    with pytest.raises(ValueError, match="device 'gpu' is not allowed"):
        CompareConfig(inputs=spec, device="gpu")


def test_references_on_an_explicit_device_come_back_on_the_cpu():
    from flashcheck.core.inputs import InputSpec
    from flashcheck.measure.case import References

    spec = InputSpec(heads=1, seq_len=32)
    a, b = References(spec, causal=True), References(spec, causal=True, device="cpu")
    assert torch.equal(a.reference, b.reference) and b.reference.device.type == "cpu"


@pytest.mark.skipif(_cuda(), reason="a CUDA device is present: the refusal is for CPU-only machines")
def test_compare_device_cuda_without_a_gpu_is_bad_usage():
    from typer.testing import CliRunner

    from flashcheck.cli import app

    res = CliRunner().invoke(app, ["compare", "--seq-len", "16", "--heads", "1", "--device", "cuda"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "--device cuda: there is no CUDA device here" in res.output and "use --device cpu" in res.output


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device (simulators and the FP64 reference on the GPU)")
def test_simulators_and_reference_on_the_gpu_agree_with_the_cpu_and_are_fast():
    """compare at L=8192 on cuda: the work lands on the GPU (memory allocated there), it takes seconds, and the
    errors match the CPU's at a smaller length to the rounding of the FP64 reference's sums."""
    import time

    from flashcheck.core.inputs import InputSpec
    from flashcheck.measure.compare import CompareConfig, run_compare

    small = InputSpec(heads=2, seq_len=512)
    cpu, gpu = (run_compare(CompareConfig(inputs=small, device=d)) for d in ("cpu", "cuda"))
    for key, value in cpu.candidate.items():
        assert gpu.candidate[key] == pytest.approx(value, rel=0.05), key
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    run_compare(CompareConfig(inputs=InputSpec(seq_len=8192), device="cuda"))
    assert time.perf_counter() - start < 60 and torch.cuda.max_memory_allocated() > 0


# ---- drift: one tensor at a time ------------------------------------------------------------------------


@pytest.mark.parametrize("exact_limit", [0, 10**9])
def test_drift_one_tensor_at_a_time_gives_the_same_figures(tmp_path, monkeypatch, exact_limit):
    """Every tensor through the spilled path (SPILL_BYTES = 0: A's copies on disk, compared in chunks of 7)
    gives the same per-tensor, per-layer and whole-model figures as holding both tensors."""
    from flashcheck.training import drift
    from flashcheck.training.checkpoints import save_safetensors

    g = torch.Generator().manual_seed(0)
    paths = []
    for side in range(2):
        tensors = {f"blocks.{i}.w": torch.randn(50 + 13 * i, generator=g) * (1 + side) for i in range(3)}
        tensors["blocks.0.bad"] = torch.tensor([1.0, float("nan") if side else 2.0, 3.0])
        tensors["blocks.0.half"] = torch.randn(40, generator=g).half()
        paths.append(tmp_path / f"{side}.safetensors")
        save_safetensors(tensors, paths[-1])
    monkeypatch.setattr(drift, "CHUNK", 7)
    kw = {"sketch_points": 16, "exact_limit": exact_limit}
    held = drift.compare_checkpoints(*paths, **kw).to_dict()
    monkeypatch.setattr(drift, "SPILL_BYTES", 0)
    spilled = drift.compare_checkpoints(*paths, **kw).to_dict()
    assert spilled == held and held["nonfinite"]["blocks.0.bad"]["b"] == 1


@pytest.mark.skipif(_cuda(), reason="a CUDA device is present: the refusal is for CPU-only machines")
def test_study_device_cuda_without_a_gpu_is_bad_usage(tmp_path):
    from typer.testing import CliRunner

    from flashcheck.cli import app

    res = CliRunner().invoke(app, ["study", "--preset", "tiny", "--out", str(tmp_path), "--device", "cuda"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert "--device cuda: there is no CUDA device here" in res.output


def test_study_device_cpu_explicit_reaches_the_workers(tmp_path, monkeypatch):
    """--device cpu travels to each worker (the pool's initializer) and into evaluate_group's References."""
    from flashcheck.study import executors
    from flashcheck.study.runner import check_device

    got, groups = [], _groups(1)
    executors.run_local(groups, 1, got.append, device="cpu")
    assert [r.status for r in got] == ["ok"] * len(groups[0])
    with pytest.raises(ValueError, match="--device 'gpu' is not allowed"):
        check_device("gpu")


# The flash forward's tile loop before its buffers were reused (every step's tensors fresh, out of place):
# the oracle the in-place loop must equal bit for bit.
def _fresh_fa2(s, v_j, o, m, l, pol, exp, untiled, tie_beta=None):
    from flashcheck.kernels.sim.ops import rnd, safe_max
    from flashcheck.kernels.sim.tiles import mm_rows

    mt = s.amax(dim=-1, keepdim=True)
    if tie_beta is not None:
        tied = (s == mt).sum(dim=-1, keepdim=True) >= 2
        mt = torch.where(tied, torch.where(mt > 0, tie_beta * mt, torch.zeros_like(mt)), mt)
    m_new = rnd(torch.maximum(m, mt), pol, "stats")
    ms = safe_max(m_new)
    alpha, p = rnd(exp(m - ms), pol, "stats"), exp(s - ms)
    l = rnd(alpha * l + p.sum(dim=-1, keepdim=True), pol, "stats")
    pv = rnd(mm_rows(rnd(p, pol, "p"), v_j, pol, untiled), pol, "accum")
    return rnd(rnd(alpha * o, pol, "accum") + pv, pol, "accum"), m_new, l


def _fresh_fa1(s, v_j, o, m, l, pol, exp, untiled):
    from flashcheck.kernels.sim.ops import rnd, safe_max
    from flashcheck.kernels.sim.tiles import mm_rows

    mt = s.amax(dim=-1, keepdim=True)
    pt = rnd(exp(s - safe_max(mt)), pol, "p")
    lt = rnd(pt.sum(dim=-1, keepdim=True), pol, "stats")
    m_new = rnd(torch.maximum(m, mt), pol, "stats")
    ms = safe_max(m_new)
    a, bt = rnd(exp(m - ms), pol, "stats"), rnd(exp(mt - ms), pol, "stats")
    l_new = rnd(a * l + bt * lt, pol, "stats")
    pv = rnd(mm_rows(pt, v_j, pol, untiled), pol, "accum")
    num = rnd(rnd(l * a, pol, "stats") * o + bt * pv, pol, "accum")
    return rnd(num / torch.where(l_new == 0, torch.ones_like(l_new), l_new), pol, "accum"), m_new, l_new


def _fresh_tile(q, k, v, rows, steps, cfg, pol, _fold=False, _ops=None, _finite=False, _kv=None):  # no MMA, no groups
    from flashcheck.kernels.sim.masks import tile_bias
    from flashcheck.kernels.sim.ops import resolve_scale, rnd
    from flashcheck.kernels.sim.tiles import mm_rows

    (r0, r1), (b, h, lq, _), lk, dv = rows, q.shape, k.shape[-2], v.shape[-1]
    sc = resolve_scale(cfg.scale, q.shape[-1]) * (flash_mod.LOG2E if cfg.exp2 else 1.0)
    o = torch.zeros(b, h, r1 - r0, dv, dtype=q.dtype)
    m, l = torch.full((b, h, r1 - r0, 1), -float("inf"), dtype=q.dtype), torch.zeros(b, h, r1 - r0, 1, dtype=q.dtype)
    extra = {"tie_beta": cfg.tie_beta} if cfg.tie_beta is not None else {}
    for t in steps:
        a = max(r0, t.r0)
        if a >= r1:
            continue
        prod = mm_rows(q[..., a:r1, :], k[..., t.c0 : t.c1, :].transpose(-1, -2), pol, lq - t.r0)
        s = rnd(prod * sc, pol, "score")
        bias = tile_bias((a, r1), (t.c0, t.c1), lq, lk, causal=cfg.causal, mask=cfg.mask, dtype=s.dtype)
        if bias is not None:
            s = s + (bias * flash_mod.LOG2E if cfg.exp2 else bias)
        step = _fresh_fa1 if cfg.algorithm == "fa1" else _fresh_fa2
        exp, i = torch.exp2 if cfg.exp2 else torch.exp, a - r0
        new = step(s, v[..., t.c0 : t.c1, :], o[..., i:, :], m[..., i:, :], l[..., i:, :], pol, exp, lq - t.r0, **extra)
        o[..., i:, :], m[..., i:, :], l[..., i:, :] = new
    return o, m, l


IN_PLACE_GRID = [
    dict(block_k=16, causal=True),
    dict(block_k=32, causal=True, algorithm="fa1", key_order="reverse"),
    dict(block_k=24, exp2=True, tie_beta=2.0, mask="bool"),
    dict(block_k=40, algorithm="fa1", mask="float", scale=0.3),
]


@pytest.mark.parametrize("policy", ["bf16-mixed", "bf16", "fp16", "fp64", "fa3-fp8", "fp32"])
@pytest.mark.parametrize("cfg", IN_PLACE_GRID, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_flash_in_place_tiles_equal_the_out_of_place_loop_bit_for_bit(policy, cfg, monkeypatch):
    """Reused step buffers (score block, p cast, P·V product) and in-place updates change no bit of the output
    or the LSE, for whole tiles, tiles of 13 rows (causal steps cut them) and 2 rows (padded products)."""
    lq, lk = 70, 90
    q, k, v = scale_qkv(lq, lk, seed=5)
    g = torch.Generator().manual_seed(6)
    if cfg.get("mask") == "bool":
        cfg = {**cfg, "mask": torch.rand(1, 1, lq, lk, generator=g) > 0.3}
    elif cfg.get("mask") == "float":
        cfg = {**cfg, "mask": torch.randn(1, 2, lq, lk, generator=g)}
    fast = [_forward(q, k, v, policy, rows, **cfg) for rows in (None, 13, 2)]
    monkeypatch.setattr(flash_mod, "_query_tile", _fresh_tile)
    fresh = [_forward(q, k, v, policy, rows, **cfg) for rows in (None, 13, 2)]
    for rows, got, want in zip((None, 13, 2), fast, fresh, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), f"tile_rows={rows}"


@pytest.mark.parametrize("fmt", ["bf16", "fp16", "fp8-e4m3", "fp8-e5m2", "fp32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rounding_in_place_equals_rounding(fmt, dtype):
    from flashcheck.core.numerics import info, uniform_policy
    from flashcheck.kernels.sim.ops import rnd, rnd_

    pol = uniform_policy(fmt)
    x = torch.randn(3, 5, 40, dtype=dtype, generator=torch.Generator().manual_seed(1)) * 300
    x[0, 0, :3] = torch.tensor([1e6, -1e6, 0.0])  # fp8 saturates, fp16 overflows
    want = rnd(x, pol, "p")
    scratch = torch.empty(x.numel() + 7, dtype=info(fmt).dtype)
    for buf in (None, scratch):
        y = x.clone()
        assert rnd_(y, pol, "p", buf) is y and torch.equal(y, want)
        z = x.clone()[:, 1:, :]  # a strided view, rounded where it lies
        assert torch.equal(rnd_(z, pol, "p", buf), want[:, 1:, :])
