"""A simulated kernel's error layer by layer, the way a unit test sees it and the way the error model predicts it.

Isolated: for each attention layer a, the reference model (eager, fp32) runs the probe batches with layer a's
attention through the kernel and every other layer eager (sim_impl.SimAttention.only), so layer a sees eager
fp32's own inputs; its error is max |hidden(a) - reference hidden(a)| over the probe tokens: what one call of the
kernel does, everything else exact. The propagated error (every layer through the kernel, the model in the
comparison's dtype) is the comparison's own `layers`; their ratio is the growth the layers add.

Predicted: the error model (measure.predict, as `flashcheck predict --draw` computes it) from the statistics of
layer a's captured Q, K, V (the first probe batch, eager fp32's inputs): the relative L2 error of the attention
output against FP64 of the kernel's rounded inputs (the kernel's own input quantisation left out, as predict does),
beside the same quantity measured on those Q, K, V.

Shapes: Ly hidden states (index 0 the embeddings, a + 1 the output of block a), T probe tokens, H hidden size.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

import flashcheck.validate.sim_impl as sim_impl
from flashcheck.validate.result import Comparison
from flashcheck.validate.run import Plan, RunOutput, _assemble, _collect


@dataclass(frozen=True, slots=True)
class LayerErrors:
    """Per hidden-state index (0: embeddings, None where not measured): the isolated max |error|, the measured and
    the predicted attention relative L2 error of that block's attention."""

    isolated: list[float]
    measured_rel_l2: list[float | None]
    predicted_rel_l2: list[float | None]


def layer_errors(plan: Plan, model, impl: str, dtype: torch.dtype, ref: RunOutput, advance) -> LayerErrors:
    """`model`: the reference model (eager, fp32, eval); `dtype`: the comparison's dtype (the kernel's format
    follows it). The model is left under eager."""
    from flashcheck.validate.loading import switch_impl

    kernel = sim_impl.parse_sim(impl)
    fn = sim_impl.attention_of(impl)
    n = len(ref.probe)
    iso: list[float] = [0.0] * n
    measured: list[float | None] = [None] * n
    predicted: list[float | None] = [None] * n
    if why := switch_impl(model, impl):
        raise ValueError(f"{impl}: {why}")
    try:
        for a in range(n - 1):
            fn.only, fn.capture, fn.fmt_dtype = a, {}, dtype
            acc = _collect(plan, model, plan.probe_batches, lambda *x, **y: None, f"{impl} isolated")
            run = _assemble(plan, impl, "fp32", acc)
            iso[a + 1] = _max_abs(run.probe[a + 1], ref.probe[a + 1])
            if a in fn.capture:
                measured[a + 1], predicted[a + 1] = _model_pair(kernel, dtype, fn.capture[a])
            advance(0, f"{impl}: isolated error of layer {a + 1}")
    finally:
        fn.only, fn.capture, fn.fmt_dtype = None, None, None
        switch_impl(model, "eager")
    return LayerErrors(iso, measured, predicted)


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.to(torch.float64) - b.to(torch.float64)).abs().nan_to_num(nan=math.inf)
    return float(d.max()) if d.numel() else 0.0


def _model_pair(kernel: sim_impl.SimKernel, dtype: torch.dtype, captured: tuple) -> tuple[float, float | None]:
    """(measured, predicted) relative L2 of the attention output on one layer's captured inputs."""
    q, k, v, mask, causal, scale = captured
    measured = sim_impl.attention_rel_l2(kernel, dtype, q, k, v, mask, causal, scale)
    try:
        predicted = predict_rel_l2(kernel, dtype, q, k, v, mask, causal)
    except ValueError:  # a setting outside the model's domain (e.g. a shape it does not cover): not predicted
        predicted = None
    return measured, predicted


def predict_rel_l2(kernel: sim_impl.SimKernel, dtype: torch.dtype, q, k, v, mask, causal: bool) -> float:
    """The error model's prediction on these inputs (q [B, H, Lq, D], k, v [B, Hkv, Lk, D] float32; mask
    [B, 1, Lq, Lk] bool or None): input statistics, the P-cast range terms where P is narrow and the tensor-core
    accumulator term where the policy names one, as `flashcheck predict --draw` adds them."""
    from flashcheck.measure import predict as model
    from flashcheck.measure.inputstats import input_stats, narrow_p, range_stats

    qd, kd, vd = (t.double() for t in (q, k, v))
    cfg = kernel.config(dtype, q.shape[2], k.shape[2], q.shape[3], causal)
    pol, bk = cfg["policy"], cfg["block_k"]
    st = input_stats(qd, kd, vd, causal=causal, mask=mask)
    f_out = min(max(st["f_out"], 0.0), 1.0)
    setting = model.Setting(kernel="flash", policy=pol, visible=max(st["visible"], 1.0), head_dim=q.shape[3],
                            block_k=bk, f_score=st["f_score"], f_p=st["f_p"], f_out=f_out)  # fmt: skip
    if narrow_p(pol):
        rs = range_stats(qd, kd, vd, pol, block_k=bk, order=pol.kv_order or "forward", causal=causal, mask=mask)
        setting = dataclasses.replace(setting, f_p_range=rs["f_p_range"], f_flush=rs["f_flush"])
    if pol.pv_mma:
        from flashcheck.measure.mma_error import pv_mma_stats

        acc = pv_mma_stats(qd, kd, vd, pol, block_k=bk, causal=causal, mask=mask)
        setting = dataclasses.replace(setting, f_acc=acc["f_acc"])
    return model.predict(setting)


def add_layer_errors(cmp: Comparison, errs: LayerErrors) -> Comparison:
    """The comparison with the isolated error, measured and predicted attention rel-L2 on each of its layers."""
    layers = tuple(
        dataclasses.replace(d, isolated_max_abs=errs.isolated[d.layer], attention_rel_l2=errs.measured_rel_l2[d.layer],
                            predicted_rel_l2=errs.predicted_rel_l2[d.layer])
        for d in cmp.layers
    )  # fmt: skip
    return dataclasses.replace(cmp, layers=layers)
