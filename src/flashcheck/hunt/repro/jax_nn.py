# ruff: noqa: F821  (array, additive: the common part of the script)
# --- the library: JAX's public jax.nn.dot_product_attention ---
import jax
import jax.numpy as jnp
import numpy as np

DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}


def versions():
    import jaxlib

    return f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, numpy {np.__version__}"


def _run(case, fn):
    """fn(q, k, v, mask, bias) in JAX's [B, L, H, D] layout (and its vjp), as float64 arrays in [B, H, L, D]."""
    dt = DTYPES[case["dtype"]]
    arrays = (array(case[n]).swapaxes(1, 2).astype(np.float32) for n in ("q", "k", "v", "dout"))
    q, k, v, dout = (jnp.asarray(a).astype(dt) for a in arrays)
    m, b = array(case.get("mask")), array(case.get("bias"))
    extra = (None if m is None else jnp.asarray(m), None if b is None else jnp.asarray(b.astype(np.float32)))
    call = jax.jit(fn) if case["jit"] else fn
    if case["backward"]:
        out, vjp = jax.vjp(lambda a, b_, c: call(a, b_, c, *extra), q, k, v)
        res = {"out": out} | dict(zip(("dq", "dk", "dv"), vjp(dout), strict=True))
    else:
        res = {"out": call(q, k, v, *extra)}
    return {n: np.asarray(t.astype(jnp.float32)).astype(np.float64).swapaxes(1, 2) for n, t in res.items()}


def observe(case, kernel):
    def fn(a, b, c, mask, bias):
        return jax.nn.dot_product_attention(
            a, b, c, bias=bias, mask=mask, scale=case["scale"], is_causal=case["is_causal"], implementation=kernel
        )

    return _run(case, fn)


def same_format(case):
    """Plain attention in the same dtype (einsum, softmax, einsum; jnp ops in the format)."""

    def fn(a, b, c, mask, bias):
        g = a.shape[2] // b.shape[2]
        b, c = jnp.repeat(b, g, axis=2), jnp.repeat(c, g, axis=2)
        scale = a.shape[-1] ** -0.5 if case["scale"] is None else case["scale"]
        s = jnp.einsum("bqhd,bkhd->bhqk", a, b) * jnp.asarray(scale, a.dtype)
        lq, lk = s.shape[-2:]
        keep = jnp.tril(jnp.ones((lq, lk), bool)) if case["is_causal"] else jnp.ones((lq, lk), bool)
        if mask is not None:
            keep = keep & mask
        if bias is not None:
            s = s + bias.astype(s.dtype)
        s = jnp.where(keep, s, -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), c)

    return _run(case, fn)
