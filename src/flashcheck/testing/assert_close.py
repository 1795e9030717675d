"""A pytest helper for kernel authors: assert that an attention function passes the field's budget.

    from flashcheck.testing import assert_attention_close

    def test_my_kernel():
        assert_attention_close(my_attention, dtype=torch.bfloat16, causal=(False, True))

`fn(q, k, v, causal=bool)` takes [B, H, L, D] tensors in `dtype` on `device` and returns [B, H, L, D]."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from flashcheck.backends.eager import eager_attention
from flashcheck.budget import K_FORWARD, K_GRADIENT, check_budget
from flashcheck.inputs import InputSpec, make_grad, make_qkv
from flashcheck.kernels import reference_attention


def _outputs(fn, tensors, do, **kw):
    leaves = [t.detach().requires_grad_(do is not None) for t in tensors]
    out = fn(*leaves, **kw)
    if do is None:
        return out.detach(), None
    out.backward(do.to(out.device, out.dtype))
    return out.detach(), [t.grad for t in leaves]


def assert_attention_close(
    fn: Callable[..., torch.Tensor],
    *,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    shapes: Iterable[tuple[int, int, int, int]] = ((1, 2, 128, 64), (2, 3, 77, 32)),
    causal: Iterable[bool] = (False, True),
    distributions: Iterable[str] = ("normal",),
    seeds: Iterable[int] = (0,),
    k: float = K_FORWARD,
    k_grad: float = K_GRADIENT,
    backward: bool = False,
) -> None:
    """Raise AssertionError (listing every failing case) unless fn passes, at every grid point:
    max|fn - ref| <= k * max|eager - ref| + floor, ref the FP64 attention, eager plain PyTorch in dtype;
    with `backward`, the same for dq, dk, dv with k_grad."""
    failures, n = [], 0
    for b, h, length, d in shapes:
        for dist in distributions:
            for seed in seeds:
                q, kk, v = make_qkv(
                    InputSpec(batch=b, heads=h, seq_len=length, head_dim=d, distribution=dist, seed=seed)
                )
                do = make_grad(q.shape, seed) if backward else None
                for c in causal:
                    n += 1
                    low = [t.to(device, dtype) for t in (q, kk, v)]
                    out, grads = _outputs(fn, low, do, causal=c)
                    base, bgrads = _outputs(eager_attention, low, do, causal=c)
                    ref, rgrads = _outputs(reference_attention, [q, kk, v], do, causal=c)
                    where = f"shape {(b, h, length, d)} {dist} seed {seed} causal={c}"
                    res = check_budget(out.cpu(), ref, base.cpu(), k=k, dtype=dtype)
                    if not res:
                        failures.append(f"{where}: output\n{res.message()}")
                    for name, g, bg, rg in zip("qkv", grads or [], bgrads or [], rgrads or [], strict=False):
                        gres = check_budget(g.cpu(), rg, bg.cpu(), k=k_grad, dtype=dtype)
                        if not gres:
                            failures.append(f"{where}: d{name}\n{gres.message()}")
    if failures:
        raise AssertionError(f"{len(failures)} check(s) failed over {n} case(s):\n\n" + "\n\n".join(failures))
