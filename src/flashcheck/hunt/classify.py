"""Each finding classified the way a maintainer triages it: its category, the largest logit of its minimal case and a
known upstream report it matches (a hand-maintained table: no network lookup).

Categories: `kernel-bug` (the FP64 reference finite and the same-format reference, plain attention in the case's dtype,
within the budget: judge's nan / inf / budget kinds), `format-overflow` (the same-format reference is not finite either:
judge's overflow kind; or the logits or Q.K products exceed the format's range where the operator's specification
computes them in that format: SPEC_IN_FORMAT, cited; or, there, logits so large that the format's ulp at them is 1 or
more), `convention` (only rows with no visible key differ: fully masked
rows, Lk = 0, causal with Lq > Lk), `private-only` (reached through a private op users do not call), `crash`, `hang`,
and `target-error` (the target returned no tensor of the right shape, or failed on every case)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from flashcheck.hunt.case import HuntCase, make_inputs, visible
from flashcheck.hunt.target import Target

# operators whose specification computes the logits in the input type: their overflow is the format's, not a bug
SPEC_IN_FORMAT = {
    "onnxruntime": "the ONNX Attention operator (opset 23) computes Q.K^T, the scale and the softmax in the input "
    "type T (ONNX Operators.md, Attention; its reference implementation, onnx/reference/ops/op_attention.py, "
    "gives the same non-finite values)",
}


@dataclass(frozen=True)
class KnownReport:
    """An upstream report a finding matches: the target's name pattern, the finding's kind, tensor and case."""

    target: str  # regex on the target's name
    kinds: tuple[str, ...]
    tensors: tuple[str, ...]  # () for any
    when: str  # what of the case: "lk0", "large" (magnitude or scale >= 64), "masked" (dead rows), "" any
    report: str  # owner/repo#number
    title: str

    def matches(self, target: str, kind: str, tensor: str, case: HuntCase) -> bool:
        if not re.match(self.target, target) or kind not in self.kinds or (self.tensors and tensor not in self.tensors):
            return False
        large = case.magnitude >= 64 or (case.scale or 1.0) >= 64
        return {"lk0": case.lk == 0, "large": large, "masked": case.dead > 0, "": True}[self.when]


# maintained by hand: each entry a report read in full, its title as filed
KNOWN = (
    KnownReport(
        r"^sdpa-flash", ("crash",), ("SIGFPE",), "lk0", "pytorch/pytorch#141219",
        "Floating point exception (core dumped) in `_scaled_dot_product_flash_attention_for_cpu`",
    ),
    KnownReport(
        r"^sdpa-", ("nan", "inf"), ("dq", "dk", "dv"), "large", "pytorch/pytorch#125674",
        "[BUG]Nan in gradients of scaled_dot_product_attention operation with mem_efficient backend (related: "
        "non-finite gradients at very large inputs)",
    ),
    KnownReport(
        r"^sdpa-", ("semantics",), (), "masked", "pytorch/pytorch#110213",
        "`scaled_dot_product_attention` behaves differently between v2.0 and v2.1 (fully masked rows)",
    ),
)  # fmt: skip


def known_report(target: str, kind: str, tensor: str, case: HuntCase) -> str:
    """'owner/repo#N: title' of the first known report the finding matches ('' when none)."""
    hit = next((r for r in KNOWN if r.matches(target, kind, tensor, case)), None)
    return "" if hit is None else f"{hit.report}: {hit.title}"


def max_logit(case: HuntCase) -> float:
    """The largest |scaled logit| of the case: |q.k * scale + shift| over its visible (query, key) pairs (0: none)."""
    if case.lk == 0:
        return 0.0
    q, k, _, _ = make_inputs(case)
    k = k.repeat_interleave(case.heads // case.kv_heads, dim=1)
    s = torch.matmul(q, k.transpose(-1, -2)) * case.softmax_scale + case.shift
    keep = visible(case).expand_as(s)
    return float(s[keep].abs().max()) if bool(keep.any()) else 0.0


def max_product(case: HuntCase) -> float:
    """The largest |q_d k_d| term and the largest |q.k| sum, whichever is larger (unscaled: what a kernel that
    multiplies before it scales holds)."""
    if case.lk == 0:
        return 0.0
    q, k, _, _ = make_inputs(case)
    k = k.repeat_interleave(case.heads // case.kv_heads, dim=1)
    return float(torch.matmul(q, k.transpose(-1, -2)).abs().max())


def category(target: Target, kind: str, tensor: str, case: HuntCase) -> tuple[str, str]:
    """(the category, why: the specification cited for a format overflow, '' otherwise) of a finding."""
    if kind == "crash":
        found = "hang" if tensor == "hang" else "crash"
    elif kind in ("output", "failed"):
        return "target-error", ""
    elif kind == "semantics":
        return "convention", ""
    elif kind == "overflow":
        return "format-overflow", f"the same-format reference ({case.dtype}) is not finite there either"
    else:
        spec = SPEC_IN_FORMAT.get(target.name.partition(":")[0])
        info, logit = torch.finfo(case.torch_dtype), max_logit(case)
        if spec and max(logit, max_product(case)) > info.max:
            return "format-overflow", f"logits beyond {case.dtype}'s {info.max:.6g}, and {spec}"
        if spec and logit * info.eps >= 1:  # an ulp of 1 or more at the largest logit: exp of it is off by e or more
            return "format-overflow", f"logits of {logit:.3g}, beyond what {case.dtype} resolves (ulp >= 1), and {spec}"
        found = "kernel-bug"
    if target.kind == "backend" and target.api.startswith("private"):
        return "private-only", f"reached through {target.api.removeprefix('private: ')}"
    if found == "kernel-bug" and target.kind == "preset":  # flashcheck's model of an algorithm, nobody's code
        return "simulated", "flashcheck's simulation of the preset's algorithm and formats leaves the budget here"
    return found, ""
