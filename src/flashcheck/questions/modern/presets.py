"""The modern study's sweeps and preset: FA4, FP8/FP4 attention, SageAttention and the P-cast with a sink."""

from __future__ import annotations

from flashcheck.core.numerics import parse_policy
from flashcheck.measure.collapse import P_CAST
from flashcheck.study.config import StudyConfig, Sweep

# The modern study's sweeps (FA4, FP8/FP4, SageAttention, P-cast with a sink; findings in questions.modern).
FA2, FA4 = "flash:bf16-mixed", "flash:fa4-bf16"
FA4_EMU, FA4_THR = "flash:bf16-mixed,exp2_emu=10", "flash:bf16-mixed,rescale_threshold=8"
FA3_FP8, FP22 = "flash:fa3-fp8", "flash:fa3-fp8-fp22"
LOWP = ("flash:fa4-fp8", "flash:fa4-fp4", "flash:sage3-fp4", FA3_FP8, FP22, FA2)
# SageAttention2 by the GPU its kernel runs on (kernels.sim.presets_modern: sage2-hopper, sage2-ada; the aliases sage2
# and
# sage2pp name the same policies and stay accepted where users type them)
SAGE = ("flash:sage1", "flash:sage2-hopper", "flash:sage2-ada", "flash:sage2-4b")
P_FP8 = f"flash:{P_CAST}"
SINK_SCORES = (4.0, 5.0, 6.0, 7.0, 8.0)  # the sink's score: weak to strong around 2606.06521's threshold 6.93
# the paper's own setting (4 sink tokens, i.i.d. scores: sink4:DELTA) at the scores its closed form calls moderate
# (Phi(Delta + 1.03 - 6.93) = 3%, 18%, 54% of P collapsed), where it reports 3-10x lower MSE
SINK4_SCORES = (4.0, 5.0, 6.0)
SINK_METHODS = (P_FP8, P_FP8 + ",kv_order=reverse", P_FP8 + ",p_scale=256", P_FP8 + ",kv_order=reverse,p_scale=256")
SINK_DISTRIBUTIONS = (*(f"sink:{d:g}" for d in SINK_SCORES), *(f"sink4:{d:g}" for d in SINK4_SCORES))
STAGE_PRESETS = {"modern_stages": ("fa4-fp8", "fa4-fp4", "sage3-fp4", "fa3-fp8-fp22"),
                 "modern_sage_stages": ("sage1", "sage2-hopper", "sage2-ada")}  # fmt: skip
RAISED = ("input", "score", "stats", "p", "accum", "output")  # each raised to FP64 alone: explain's attribution
QUESTIONS = ("modern_fa4", "modern_lowp", "modern_sage", "modern_sink", *STAGE_PRESETS)


def modern_sweeps(lengths: tuple[int, ...], seeds: tuple[int, ...], heads: int, captured: bool = True) -> list[Sweep]:
    """The four questions' sweeps at these lengths and seeds (captured MiniLM inputs unless `captured` is off;
    the FP8/FP4 and Sage questions at MiniLM's head dim 32; Sage at its 128 x 64 tiles is paired with
    modern_lowp's FA3-FP8 on the same inputs; the sink question at each sink score of SINK_SCORES with one sink key,
    the study's own, and at SINK4_SCORES with 2606.06521's four sink tokens)."""
    dists = ("normal", "outliers", *(("captured:minilm",) if captured else ()))
    common = dict(seq_lens=lengths, seeds=seeds, heads=heads, algorithm="fa2", baseline=False, metric="rel_l2")
    return [
        Sweep(question="modern_fa4", methods=(FA2, FA4, FA4_EMU, FA4_THR), distributions=("normal", "outliers"),
              blocks=((128, 128),), **common),
        Sweep(question="modern_lowp", methods=LOWP, distributions=dists, blocks=((128, 128),), head_dims=(32,),
              **common),
        Sweep(question="modern_sage", methods=SAGE, distributions=dists, blocks=((128, 64),),
              head_dims=(32,), **common),
        Sweep(question="modern_sink", methods=SINK_METHODS, distributions=SINK_DISTRIBUTIONS, blocks=((128, 128),),
              **common),
        *(Sweep(question=q, methods=_stage_methods(names), distributions=("normal",), head_dims=(32,),
                blocks=((128, 64 if "sage" in q else 128),), **common) for q, names in STAGE_PRESETS.items()),
    ]  # fmt: skip


def _stage_methods(names: tuple[str, ...]) -> tuple[str, ...]:
    """Each preset, the preset with one stage raised to FP64 and with one of its sub-stages removed (explain's
    "raised" runs, as study cases; sub_raised)."""
    return tuple(m for n in names for m in (f"flash:{n}", *(f"flash:{n},{s}=fp64" for s in RAISED),
                                            *(f"flash:{n},{t}" for t in sub_raised(n).values())))  # fmt: skip


def sub_raised(name: str) -> dict[str, str]:
    """The sub-stages of preset `name` (measure.substages) -> the policy terms that remove each alone, e.g.
    {"input:qk": "exact_inputs=qk", "input:v": "exact_inputs=v"} for sage1."""
    from flashcheck.measure.substages import raised_terms, substages

    pol = parse_policy(name)
    return {s.name: raised_terms(s, pol) for s in substages(pol)}


def modern() -> StudyConfig:
    """FlashAttention-4, FP8/FP4 attention and SageAttention against FP64 (questions.modern): minutes on 2 cores."""
    return StudyConfig(name="modern", sweeps=tuple(modern_sweeps((1024,), (0, 1, 2), 2)))
