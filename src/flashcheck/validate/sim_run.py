"""The simulated kernels' steps of a validation: check them against the model's config before it loads, and add the
per-layer isolated errors and predictions (validate.layer_error) to a kernel's comparison."""

from __future__ import annotations

import torch

from flashcheck.validate.result import Comparison
from flashcheck.validate.run import Plan, RunOutput


def check_sims(source, impls, dtypes: list[torch.dtype]) -> None:
    """Register the sim: kernels of `impls` and check each takes the model's head dim (ValueError, one line), from
    the config of `source` (a loading.ModelSource) before any weights are loaded."""
    from flashcheck.validate.sim_impl import check_config, is_sim

    if not any(is_sim(i) for i in impls):
        return
    check_config(impls, source.config(), dtypes)


def with_layer_errors(cmp: Comparison, plan: Plan, ref_model, dtype: torch.dtype, ref: RunOutput, advance,
                      notes: list[str]) -> Comparison:  # fmt: skip
    """cmp (a sim: kernel's comparison) with each layer's isolated error and the error model's prediction, measured
    on `ref_model` (eager fp32); a failure of this aid is a note in `notes`, never a crash of the verdict."""
    from flashcheck.validate.layer_error import add_layer_errors, layer_errors

    try:
        errs = layer_errors(plan, ref_model, cmp.impl, dtype, ref, advance)
    except Exception as e:
        notes.append(f"{cmp.a}: isolated errors not measured ({type(e).__name__}: {e})")
        return cmp
    return add_layer_errors(cmp, errs)
