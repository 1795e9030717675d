"""One test case of an attention kernel: its inputs, the FP64 reference and the baseline on them, verdicts.

The kernel gets Q, K, V (and dO) rounded to the case's dtype; the reference is exact attention on those
same rounded values (as flash-attention's tests build out_ref), so that only the kernel's own arithmetic
counts; the baseline is plain PyTorch in that dtype (`eager_attention`, flash-attention's out_pt).
Tensor names: out [B, H, Lq, D]; dq [B, H, Lq, D]; dk, dv [B, Hkv, Lk, D].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from flashcheck.backends.eager import eager_attention
from flashcheck.core.budget import BudgetResult, check_budget
from flashcheck.core.inputs import InputSpec, make_grad, make_qkv
from flashcheck.kernels import reference_attention

GRADIENTS = ("dq", "dk", "dv")
_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64"}


def dtype_name(dtype: torch.dtype) -> str:
    """bf16, fp16, fp32, fp64 (else torch's name)."""
    return _SHORT.get(dtype, str(dtype).replace("torch.", ""))


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One grid point. kv_heads None: as many as heads (no grouped-query attention)."""

    batch: int = 1
    heads: int = 2
    kv_heads: int | None = None
    seq_len: int = 128
    head_dim: int = 64
    dtype: torch.dtype = torch.bfloat16
    causal: bool = False
    distribution: str = "normal"
    seed: int = 0
    backward: bool = False

    def __post_init__(self) -> None:
        hkv = self.heads if self.kv_heads is None else self.kv_heads
        if hkv < 1 or self.heads % hkv:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")

    @property
    def hkv(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    def label(self) -> str:
        shape = (self.batch, self.heads, self.seq_len, self.head_dim)
        kv = f" kv_heads {self.hkv}" if self.hkv != self.heads else ""
        return f"{dtype_name(self.dtype)} shape {shape}{kv} {self.distribution} seed {self.seed} causal={self.causal}"


@dataclass(frozen=True, slots=True)
class Prepared:
    """A case's rounded inputs (CPU, the case's dtype), the reference's and the baseline's tensors."""

    case: Case
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    grad_out: torch.Tensor | None
    reference: dict[str, torch.Tensor] = field(default_factory=dict)
    baseline: dict[str, torch.Tensor] = field(default_factory=dict)


def _expand(x: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V [B, Hkv, L, D] repeated to [B, heads, L, D] (query head h reads K/V head h // group)."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def _eager(q, k, v, *, causal=False):
    return eager_attention(q, _expand(k, q.shape[1]), _expand(v, q.shape[1]), causal=causal)


def _reference(q, k, v, *, causal=False):
    return reference_attention(q, k, v, causal=causal)


def run_kernel(
    fn: Callable[..., torch.Tensor],
    inputs: tuple[torch.Tensor, ...],
    grad_out: torch.Tensor | None,
    causal: bool,
    device: str | torch.device = "cpu",
) -> dict[str, torch.Tensor]:
    """fn(q, k, v, causal=causal) on `device`; returns out (and dq, dk, dv with grad_out) on the CPU."""
    leaves = [t.detach().to(device).requires_grad_(grad_out is not None) for t in inputs]
    out = fn(*leaves, causal=causal)
    res = {"out": out.detach().cpu()}
    if grad_out is not None:
        out.backward(grad_out.to(out.device, out.dtype))
        for name, t in zip(GRADIENTS, leaves, strict=True):
            res[name] = (t.grad if t.grad is not None else torch.zeros_like(t)).cpu()
    return res


def prepare(case: Case, device: str | torch.device = "cpu") -> Prepared:
    """Draw the case's inputs, round them to its dtype, and run the reference and the baseline on them."""
    spec = InputSpec(
        batch=case.batch,
        heads=case.heads,
        seq_len=case.seq_len,
        head_dim=case.head_dim,
        distribution=case.distribution,
        seed=case.seed,
    )
    q, k, v = make_qkv(spec)
    k, v = k[:, : case.hkv].contiguous(), v[:, : case.hkv].contiguous()
    low = tuple(t.to(case.dtype) for t in (q, k, v))
    do = make_grad(q.shape, case.seed).to(case.dtype) if case.backward else None
    exact = tuple(t.to(torch.float64) for t in low)
    ref = run_kernel(_reference, exact, None if do is None else do.to(torch.float64), case.causal)
    base = run_kernel(_eager, low, do, case.causal, device)
    return Prepared(case, low, do, ref, base)


def judge(
    outputs: dict[str, torch.Tensor],
    prep: Prepared,
    *,
    rule: str = "flashcheck",
    k: float | None = None,
    k_grad: float | None = None,
) -> dict[str, BudgetResult]:
    """The verdict of `rule` on each tensor the kernel produced (out, and dq, dk, dv with a backward); k and
    k_grad (None: the rule's own) set the max-error test's k for the output and the gradients."""
    res = {}
    for name, ref in prep.reference.items():
        grad = name != "out"
        res[name] = check_budget(
            outputs[name],
            ref,
            prep.baseline[name],
            k=k_grad if grad else k,
            dtype=prep.case.dtype,
            rule=rule,
            gradient=grad,
            distribution=prep.case.distribution,
        )
    return res
