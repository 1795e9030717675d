# ruff: noqa: F821  (array, additive: the common part of the script)
# --- the library: torch's public F.scaled_dot_product_attention under sdpa_kernel ---
import numpy as np
import torch

DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def versions():
    return f"torch {torch.__version__}, numpy {np.__version__}"


def observe(case, kernel):
    """out (and dq, dk, dv) of F.scaled_dot_product_attention under sdpa_kernel([kernel]), as float64 arrays."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = DTYPES[case["dtype"]]
    q, k, v = (torch.from_numpy(array(case[n])).to(dt).requires_grad_(case["backward"]) for n in ("q", "k", "v"))
    m = array(case.get("mask"))
    mask = None if m is None else torch.from_numpy(m) if m.dtype == bool else torch.from_numpy(m).to(dt)
    with sdpa_kernel([getattr(SDPBackend, kernel)]):
        out = torch.nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=case["is_causal"],
            scale=case["scale"],
            enable_gqa=q.shape[1] != k.shape[1],
        )
    res = {"out": out}
    if case["backward"]:
        dout = torch.from_numpy(array(case["dout"])).to(dt)
        res |= dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, (q, k, v), dout), strict=True))
    return {n: t.detach().double().numpy() for n, t in res.items()}


def same_format(case):
    """The same call on the MATH backend, in the same dtype (the same-format reference)."""
    return observe(case, "MATH")
