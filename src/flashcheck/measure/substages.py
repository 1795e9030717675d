"""Sub-stages of explain's attribution: the parts of one stage that a quantized or FP8/FP4 policy computes in
separate steps (Q/K and V quantisation within `input`; the narrow MMA accumulators within `score` and `accum`;
FA4's emulated exp2 and P's cast within `p`; the approximate reciprocal within `stats`), each with the policy
changes that remove it alone ("raised") and the policy that keeps it alone (the rest FP64), and its name in words.

A sub-stage applies only where the policy computes that part: classic policies (bf16-mixed, fp16, ...) have
none, and their attribution is the six stages' as before."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from flashcheck.core.numerics import INT_FORMATS, NARROW_FORMATS, Format, Policy
from flashcheck.kernels.sim.quantized import uses_quantized_inputs


@dataclass(frozen=True, slots=True)
class SubStage:
    """One part of `stage`. `applies(policy)`; `raised`: the policy changes that remove this part alone (the
    rest of the policy as it is); `alone(policy, exact)`: this part alone in the policy's precision, every
    other stage FP64 (`exact`: the FP64 policy carrying the policy's knobs, as attribution builds it);
    `label(policy)`: its name in words."""

    name: str
    stage: str
    applies: Callable[[Policy], bool]
    raised: dict[str, object]
    alone: Callable[[Policy, Policy], Policy]
    label: Callable[[Policy], str]


def _low(pol: Policy, stage: str) -> bool:
    return pol.stage(stage) != Format.FP64


def _inputs_split(pol: Policy) -> bool:
    return _low(pol, "input") and (pol.input in NARROW_FORMATS or uses_quantized_inputs(pol))


def _fmt(fmt: Format) -> str:
    if fmt in INT_FORMATS:
        return fmt.value.upper()
    return {Format.FP4_E2M1: "FP4 e2m1"}.get(fmt, fmt.value)


_GRANULARITY = {"": "per-tensor", "tensor": "per-tensor", "block": "per-block", "token": "per-token",
                "thread": "per-thread", "channel": "per-channel"}  # fmt: skip


def _scaled(fmt: Format, scaling: str) -> str:
    if scaling == "nvfp4":
        return "NVFP4, 1x16 blocks with e4m3 scales"
    if scaling == "sage3":
        return "FP4, 1x16 blocks with single e4m3 scales amax/6"
    if scaling == "mx":
        return f"MX {_fmt(fmt)}, 32-element blocks with E8M0 scales"
    return f"{_fmt(fmt)} {_GRANULARITY[scaling]}"


def _qk_label(pol: Policy) -> str:
    if not uses_quantized_inputs(pol):
        if pol.input in NARROW_FORMATS:
            how = "per-block scales" if pol.fp8_scaling == "block" else "per-tensor scale"
            rot = ", Hadamard-rotated" if pol.hadamard else ""
            return f"Q/K cast to {_fmt(pol.input)} ({how}{rot})"
        return f"Q/K rounding to {_fmt(pol.input)}"
    smooth = {(True, True): ", Q and K smoothed", (False, True): ", K smoothed", (True, False): ", Q smoothed"}
    if pol.qk_scaling == "sage3":  # SageAttention3 smooths both itself (kernels.formats.sage3)
        return f"Q/K quantisation ({_scaled(pol.input, 'sage3')}, Q per-128-row means and K smoothed)"
    return f"Q/K quantisation ({_scaled(pol.input, pol.qk_scaling)}{smooth.get((pol.smooth_q, pol.smooth_k), '')})"


def _v_label(pol: Policy) -> str:
    if not uses_quantized_inputs(pol):
        if pol.input in NARROW_FORMATS:
            how = "per-block scales" if pol.fp8_scaling == "block" else "per-tensor scale"
            return f"V cast to {_fmt(pol.input)} ({how})"
        return f"V rounding to {_fmt(pol.input)}"
    fmt = pol.v_format or pol.input
    if fmt not in NARROW_FORMATS and not pol.v_scaling:
        return f"V rounding to {_fmt(fmt)}"
    amax = f", amax to {pol.v_scale_max:g}" if pol.v_scale_max and pol.v_scaling == "channel" else ""
    return f"V quantisation ({_scaled(fmt, pol.v_scaling)}{amax})"


def inside_words(pol: Policy) -> str | None:
    """What a policy quantises inside the kernel from its 16-bit inputs, operand by operand, as explain's input
    sub-stages name it ("Q/K quantisation (INT8 per-thread, K smoothed) and V quantisation (fp8-e4m3
    per-channel)"): the one description compare, explain and predict give; None for a policy that does not."""
    if pol.input == Format.FP64 or not uses_quantized_inputs(pol):
        return None
    return f"{_qk_label(pol)} and {_v_label(pol)}"


def _acc_words(bits: int, nearest: bool) -> str:
    name = {13: "FP22, ", 10: "fp16, "}.get(bits, "")
    return f"{name}{bits} mantissa bits, {'round to nearest' if nearest else 'truncating'}"


def _mma_words(model: str, bits: int, nearest: bool) -> str:
    """The accumulator: the tensor-core model (kernels.tensorcore.mma) when the policy names one, else its width."""
    if not model:
        return _acc_words(bits, nearest)
    reg = "fp16 register, " if nearest and bits == 10 else ""
    return f"{reg}{model} tensor-core model: blocks aligned to their largest term, truncated"


def _accum_label(pol: Policy) -> str:
    where = f"promoted to fp32 every {pol.acc_promote} keys" if pol.acc_promote else "O held in it"
    return f"P·V MMA accumulator ({_mma_words(pol.pv_mma, pol.acc_bits, pol.acc_nearest)}; {where})"


def _p_label(pol: Policy) -> str:
    if pol.p_scaling == "nvfp4":
        scale = f"x {pol.p_scale:g}, " if pol.p_scale != 1.0 else ""
        return f"P two-level quantisation ({scale}row max to 448 x 6 by an fp32 scale, then NVFP4 1x16 blocks)"
    if pol.p_scaling == "sage3":
        return f"P to FP4 (running max to {pol.p_scale:g}, 16-key blocks with e4m3 scales max/6)"
    return f"P cast to {_fmt(pol.p)}" + (f" x {pol.p_scale:g}" if pol.p_scale != 1.0 else "")


SUBSTAGES: tuple[SubStage, ...] = (
    SubStage("input:qk", "input", _inputs_split, {"exact_inputs": "qk"},
             lambda pol, ex: ex.replace(input=pol.input, exact_inputs="v"), _qk_label),
    SubStage("input:v", "input", _inputs_split, {"exact_inputs": "v"},
             lambda pol, ex: ex.replace(input=pol.input, exact_inputs="qk"), _v_label),
    SubStage("score:mma", "score", lambda pol: bool(pol.qk_acc_bits or pol.qk_mma) and _low(pol, "score"),
             {"qk_acc_bits": 0, "qk_mma": ""}, lambda pol, ex: ex.replace(score=pol.score),
             lambda pol: f"Q·K^T MMA accumulator ({_mma_words(pol.qk_mma, pol.qk_acc_bits, False)})"),
    SubStage("stats:rcp", "stats", lambda pol: pol.approx_recip and _low(pol, "stats"), {"approx_recip": False},
             lambda pol, ex: ex.replace(stats=pol.stats), lambda pol: "1/l by the approximate reciprocal"),
    # P in fp32 keeps the emulated exp2 (inert while p is FP64) without a cast: P as the exp2 computes it
    SubStage("p:exp2", "p", lambda pol: bool(pol.exp2_emu) and _low(pol, "p"), {"exp2_emu": 0},
             lambda pol, ex: ex.replace(p=Format.FP32, p_scale=1.0, p_scaling=""),
             lambda pol: f"FA4's emulated exp2 (degree-3 polynomial, ex2_emu_freq {pol.exp2_emu})"),
    SubStage("p:cast", "p",
             lambda pol: _low(pol, "p") and bool(pol.exp2_emu or pol.p_scaling or pol.p_scale != 1.0),
             {"p": Format.FP32, "p_scale": 1.0, "p_scaling": ""},
             lambda pol, ex: ex.replace(p=pol.p, exp2_emu=0), _p_label),
    SubStage("accum:mma", "accum", lambda pol: bool(pol.acc_bits or pol.pv_mma) and _low(pol, "accum"),
             {"acc_bits": 0, "pv_mma": ""},
             lambda pol, ex: ex.replace(accum=pol.accum), _accum_label),
)  # fmt: skip
BY_NAME = {s.name: s for s in SUBSTAGES}

STAGE_WORDS = {"input": "Q, K, V rounding", "score": "score rounding", "stats": "softmax statistics m, l",
               "p": "P before P·V", "accum": "output accumulator", "output": "output rounding"}  # fmt: skip


def substages(policy: Policy) -> tuple[SubStage, ...]:
    """The sub-stages that apply to `policy` (none for the classic policies), in stage order."""
    return tuple(s for s in SUBSTAGES if s.applies(policy))


def raised_terms(sub: SubStage, policy: Policy) -> str:
    """The raised changes that differ from `policy` as parse_policy terms, e.g. "exact_inputs=qk" (sage1's
    input:qk) or "p=fp32,p_scale=1.0" (fa4-fp8's p:cast)."""
    changes = {k: v for k, v in sub.raised.items() if getattr(policy, k) != v}
    return ",".join(f"{k}={v.value if isinstance(v, Format) else v}" for k, v in changes.items())
