"""assert_attention_close: a pytest helper that fails when an attention kernel breaks an acceptance rule."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

import torch

from flashcheck.core.budget import RULES
from flashcheck.testing.harness import Case, judge, prepare, run_kernel


def assert_attention_close(
    fn: Callable[..., torch.Tensor],
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    shapes: Iterable[tuple[int, int, int, int]] = ((1, 2, 128, 64), (2, 3, 77, 32)),
    causal: Iterable[bool] = (False, True),
    distributions: Iterable[str] = ("normal",),
    seeds: Iterable[int] = (0,),
    k: float | None = None,
    k_grad: float | None = None,
    backward: bool = False,
    kv_heads: int | None = None,
    rule: str = "flashcheck",
) -> None:
    """Raise AssertionError (listing every failing case) unless fn passes `rule` at every grid point.

    `fn(q, k, v, causal=bool)` takes q [B, H, L, D] and k, v [B, Hkv, L, D] in `dtype` on `device` and
    returns [B, H, L, D]; shapes are (B, H, L, D); `kv_heads` (dividing every H) tests grouped-query
    attention. The reference is FP64 attention on the same rounded inputs, the baseline plain PyTorch in
    `dtype`. rule "flashcheck" (default): max|fn - ref| <= k * max|eager - ref| + floor, no NaN/Inf, and
    relative L2, bias and per-row error within calibrated factors of eager's; rule "peers": the max test
    and a mean test (flashcheck.core.budget). With `backward`, the same for dq, dk, dv. k and k_grad
    (None: the rule's own, 2 and 3 for the peers, calibrated for flashcheck) set the max test's k."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; expected one of {', '.join(RULES)}")
    failures, grid = [], list(itertools.product(shapes, distributions, seeds, causal))
    for (b, h, length, d), dist, seed, c in grid:
        case = Case(
            batch=b,
            heads=h,
            kv_heads=kv_heads,
            seq_len=length,
            head_dim=d,
            dtype=dtype,
            causal=c,
            distribution=dist,
            seed=seed,
            backward=backward,
        )
        prep = prepare(case, device)
        outputs = run_kernel(fn, prep.inputs, prep.grad_out, c, device)
        for name, res in judge(outputs, prep, rule=rule, k=k, k_grad=k_grad).items():
            if not res:
                failures.append(f"{case.label()}: {'output' if name == 'out' else name}\n{res.message()}")
    if failures:
        raise AssertionError(f"{len(failures)} check(s) failed over {len(grid)} case(s):\n\n" + "\n\n".join(failures))
