"""Planted bugs for `flashcheck hunt`: attention that is right (fp32 arithmetic, the convention's zeros on rows
with no key) except on a hidden trigger. The hunt is given these as user callables and is not told the trigger.

Signature of each: fn(q, k, v, *, causal, scale, mask, sink) with q [B, H, Lq, D], k, v [B, Hkv, Lk, D]."""

from __future__ import annotations

import math

import torch


def _scores(q, k, causal: bool, scale, mask, sink):
    """Scores [B, H, Lq, Lk (+1 with a sink)] with the mask and causal (bottom-right) applied."""
    h, hkv = q.shape[1], k.shape[1]
    k = k.repeat_interleave(h // hkv, dim=1)
    s = q.shape[-1] ** -0.5 if scale is None else scale
    up = torch.promote_types(q.dtype, torch.float32)  # fp32 arithmetic, fp64 for fp64 inputs
    scores = torch.matmul(q.to(up), k.to(up).transpose(-1, -2)) * s
    lq, lk = scores.shape[-2:]
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.to(up)
    if causal:
        keep = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
        scores = scores.masked_fill(~keep, -math.inf)
    if sink is not None:
        scores = torch.cat([scores, scores.new_full((*scores.shape[:-1], 1), float(sink))], dim=-1)
    return scores


def _softmax(scores):
    """Softmax over the last dim; a row with no key gives 0 (and gradients 0, not NaN)."""
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
    return torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)


def _finish(p, v, q, sink):
    """P V in fp32 (the sink column has no value), cast to q's dtype."""
    if sink is not None:
        p = p[..., :-1]
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return torch.matmul(p, v.to(p.dtype)).to(q.dtype)


def correct(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """The clean kernel: no bug."""
    return _finish(_softmax(_scores(q, k, causal, scale, mask, sink)), v, q, sink)


def nan_low_lse(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """NaN on rows whose log-sum-exp is below -88.7, when a mask is given and Lk % 128 == 64 (cuDNN's
    pytorch#196678, forward side)."""
    scores = _scores(q, k, causal, scale, mask, sink)
    out = _finish(_softmax(scores), v, q, sink)
    if mask is not None and k.shape[-2] % 128 == 64:
        low = torch.logsumexp(scores, dim=-1, keepdim=True) < -88.7
        out = out.masked_fill(low, math.nan)
    return out


def masked_rows_mean(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """Fully masked rows get the mean of V (a finite fill instead of -inf: uniform weights), not zeros."""
    scores = _scores(q, k, causal, scale, mask, sink)
    dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
    return _finish(torch.softmax(scores.masked_fill(dead, 0.0), dim=-1), v, q, sink)


def sink_ignored_above(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """A sink logit above 50 is silently dropped (a path that never runs, as in vllm-metal#212)."""
    return correct(
        q, k, v, causal=causal, scale=scale, mask=mask, sink=None if sink is not None and sink > 50 else sink
    )


def tile_off_by_one(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """The last key is skipped when Lk is one past a multiple of 64 (a loop bound off by one at a tile edge)."""
    lk = k.shape[-2]
    if lk > 64 and lk % 64 == 1:
        drop = torch.zeros(lk, dtype=torch.bool, device=q.device)
        drop[-1] = True
        extra = torch.zeros(q.shape[-2], lk, dtype=q.dtype, device=q.device).masked_fill(drop, -math.inf)
        if mask is None:
            mask = extra
        elif mask.dtype == torch.bool:
            mask = torch.where(mask, 0.0, -math.inf).to(q.dtype) + extra
        else:
            mask = mask + extra
    return correct(q, k, v, causal=causal, scale=scale, mask=mask, sink=sink)


_FP8_FORMATS = {torch.float8_e4m3fn: "fp8-e4m3", torch.float8_e5m2: "fp8-e5m2"}


def fp8_preset(q, k, v, *, causal=False, scale=None, mask=None):
    """A clean FP8 kernel: FP8 q, k, v (as `hunt pkg:fn:fp8-e4m3` hands them) through the simulator's fa4-fp8
    preset at their format; an additive mask (fp32) and the output float64. Takes no sink (the hunt passes one
    as a key)."""
    from flashcheck.backends import get_backend

    sim = get_backend("sim-flash").configured(preset="fa4-fp8", fmt=_FP8_FORMATS[q.dtype])
    q, k, v = (t.double() for t in (q, k, v))
    if mask is not None and mask.is_floating_point():
        mask = mask.double()
    return sim.forward(q, k, v, causal=causal, scale=scale, mask=mask)


def fp8_fnuz_max(q, k, v, *, causal=False, scale=None, mask=None):
    """fp8_preset that saturates its inputs at 240, the max of e4m3fnuz (AMD's FP8), not e4m3fn's 448: wrong
    only where an input exceeds 240 (inputs near e4m3's overflow)."""
    q, k, v = (t.double().clamp(-240.0, 240.0).to(t.dtype) for t in (q, k, v))
    return fp8_preset(q, k, v, causal=causal, scale=scale, mask=mask)


def always_raises(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """A target that refuses every input (a wrong format): its errors are no semantics."""
    raise ValueError("this kernel runs fp8 inputs only")


def crash_at_tile(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """Right, except that it kills its process (SIGSEGV, after a fatal-check line on stderr, as XLA's
    ynn_emitter check failure did with SIGABRT) when Lk % 128 == 64."""
    if k.shape[-2] % 128 == 64:
        import os
        import signal
        import sys

        sys.stderr.write(f"F1206 planted.cc:1] Check failed: Lk % 128 != 64 (Lk = {k.shape[-2]})\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGSEGV)
    return correct(q, k, v, causal=causal, scale=scale, mask=mask, sink=sink)


def hang_at_tile(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """Right, except that it never returns (a deadlock, a spin on a flag no one sets) when Lk % 128 == 64."""
    if k.shape[-2] % 128 == 64:
        import time

        time.sleep(3600)
    return correct(q, k, v, causal=causal, scale=scale, mask=mask, sink=sink)


def abort_on_masked_rows(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """Right, except that it aborts its process (SIGABRT) when a query row has every key masked."""
    if mask is not None and k.shape[-2]:
        kept = mask if mask.dtype == torch.bool else ~torch.isneginf(mask)
        if bool((~kept.any(dim=-1)).any()):
            import os

            os.abort()
    return correct(q, k, v, causal=causal, scale=scale, mask=mask, sink=sink)


def hang_on_masked_rows(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """Right, except that it never returns when a query row has every key masked (the semantics probe's case)."""
    if mask is not None and k.shape[-2]:
        kept = mask if mask.dtype == torch.bool else ~torch.isneginf(mask)
        if bool((~kept.any(dim=-1)).any()):
            import time

            time.sleep(3600)
    return correct(q, k, v, causal=causal, scale=scale, mask=mask, sink=sink)


def returns_none(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """Forgets its return statement: None on every case."""
    correct(q, k, v, causal=causal, scale=scale, mask=mask, sink=sink)


def wrong_shape(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """Returns [B, Lq, H, D] (the layout of flash-attn's own API), not [B, H, Lq, D]."""
    return correct(q, k, v, causal=causal, scale=scale, mask=mask, sink=sink).transpose(1, 2)


def forks_a_child(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """Right, but each call forks a child that sleeps for a minute (a helper process it never reaps); the child's
    pid is appended to the file named by FLASHCHECK_TEST_PIDS."""
    import os

    pid = os.fork()
    if pid == 0:
        import time

        time.sleep(60)
        os._exit(0)
    with open(os.environ["FLASHCHECK_TEST_PIDS"], "a") as f:
        f.write(f"{pid}\n")
    return correct(q, k, v, causal=causal, scale=scale, mask=mask, sink=sink)


def chatty(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """Right, but prints 256 KiB to stdout and to stderr on each call (from Python and from the file descriptors)."""
    import os
    import sys

    print("x" * (1 << 17), flush=True)
    os.write(1, b"y" * (1 << 17))
    sys.stderr.write("z" * (1 << 17))
    sys.stderr.flush()
    return correct(q, k, v, causal=causal, scale=scale, mask=mask, sink=sink)


ONSET_LOGIT = 1000.0  # where nan_above_logit's bug starts


def nan_above_logit(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """Right, except that a query row whose largest |scaled logit| exceeds ONSET_LOGIT comes out NaN (an exp that
    overflows in a format of its own): the bug starts at a known logit."""
    out = correct(q, k, v, causal=causal, scale=scale, mask=mask, sink=sink)
    s = _scores(q, k, causal, scale, mask, None)
    top = s.masked_fill(torch.isneginf(s), 0.0).abs().amax(dim=-1, keepdim=True)
    return out.masked_fill(top > ONSET_LOGIT, math.nan)


def padded_default_scale(q, k, v, *, causal=False, scale=None, mask=None, sink=None):
    """A kernel that pads the head dim to the next power of two and derives its default scale (scale=None) from the
    padded dim, not the real one: right with an explicit scale, wrong by 1/sqrt(D) vs 1/sqrt(padded D) without."""
    d = q.shape[-1]
    padded = 1 << (d - 1).bit_length()
    s = padded**-0.5 if scale is None else scale
    return correct(q, k, v, causal=causal, scale=s, mask=mask, sink=sink)
