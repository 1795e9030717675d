"""One hunted input configuration: its fields, its one-line text form (`--case` of compare) and its tensors.

Legend: q [B, H, Lq, D]; k, v [B, Hkv, Lk, D]; mask [B, 1, Lq, Lk] (bool True = keep, or additive float);
every tensor built here is float64 on the CPU, holding values already rounded to the case's dtype. FP8 cases
(fp8-e4m3, fp8-e5m2: the inputs of the FP8 kernel presets) round Q, K, V saturating at the format's max (448,
57344), as FP8 casts do; their mask and sink stay fp32, the format FP8 kernels hold scores in."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

DTYPES = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8-e4m3": torch.float8_e4m3fn,
    "fp8-e5m2": torch.float8_e5m2,
}
FP8 = ("fp8-e4m3", "fp8-e5m2")
_SHORT = {"b": "batch", "h": "heads", "hkv": "kv_heads", "d": "head_dim", "mag": "magnitude"}
_LONG = {v: k for k, v in _SHORT.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class HuntCase:
    """An input configuration. `pad`: keys masked at the end of every row; `dead`: query rows masked whole
    (the last ones); `shift`: added to every visible score through an additive mask (a very negative shift
    gives log-sum-exps below -88.7, the exp underflow of fp32); `scale`: the softmax scale as a multiple of
    1/sqrt(D) (None: the target is called with scale=None, its own default, which should be 1/sqrt(D));
    `magnitude`: Q, K, V are N(0, 1) times it; `sink`: one sink logit for every head (None:
    no sink). A mask is passed whenever pad, dead or shift is set."""

    dtype: str = "fp32"
    batch: int = 1
    heads: int = 1
    kv_heads: int = 1
    lq: int = 16
    lk: int = 16
    head_dim: int = 16
    causal: bool = False
    pad: int = 0
    dead: int = 0
    shift: float = 0.0
    scale: float | None = 1.0
    magnitude: float = 1.0
    sink: float | None = None
    seed: int = 0
    backward: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not allowed; expected one of {', '.join(DTYPES)}")
        for name in ("batch", "heads", "kv_heads", "lq", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be a positive integer")
        if self.lk < 0 or not 0 <= self.pad <= self.lk or not 0 <= self.dead <= self.lq:
            raise ValueError(f"lk={self.lk}, pad={self.pad}, dead={self.dead}: need 0 <= pad <= lk, 0 <= dead <= lq")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads={self.kv_heads} must divide heads={self.heads}")
        finite = [self.shift, self.magnitude] + [x for x in (self.scale, self.sink) if x is not None]
        if not all(math.isfinite(x) for x in finite) or self.magnitude <= 0:
            raise ValueError("shift, scale and sink must be finite, magnitude positive and finite")
        if self.magnitude > max_magnitude(self.dtype):
            top = "max / 4: draws past the max saturate" if self.dtype in FP8 else "max / 8"
            raise ValueError(f"magnitude={self.magnitude:g} overflows {self.dtype} (at most {top})")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def mask_dtype(self) -> torch.dtype:
        """The dtype of the additive mask and the sink as the target receives them: fp32 for FP8 cases."""
        return torch.float32 if self.dtype in FP8 else DTYPES[self.dtype]

    @property
    def has_mask(self) -> bool:
        return bool(self.pad or self.dead or self.shift)

    @property
    def softmax_scale(self) -> float:
        """The softmax scale the reference applies: scale / sqrt(D), 1 / sqrt(D) for the default (None)."""
        return (1.0 if self.scale is None else self.scale) / math.sqrt(self.head_dim)

    @property
    def call_scale(self) -> float | None:
        """The `scale` the target is called with: None for the default, else softmax_scale."""
        return None if self.scale is None else self.softmax_scale

    def to_text(self) -> str:
        """KEY=VALUE terms, comma-separated (parse_case reads them back)."""
        terms = []
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            text = (
                "none"
                if v is None
                else (str(int(v)) if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v))
            )
            terms.append(f"{_LONG.get(f.name, f.name)}={text}")
        return ",".join(terms)

    def describe(self) -> str:
        """The case in words, only what differs from a plain one (a finding's headline)."""
        parts = [self.dtype, f"Lq={self.lq} Lk={self.lk} D={self.head_dim}"]
        if self.kv_heads != self.heads:
            parts.append(f"H={self.heads} Hkv={self.kv_heads}")
        parts += [w for w, on in (("causal", self.causal), ("backward", self.backward)) if on]
        extras = {"pad": self.pad, "dead rows": self.dead, "shift": self.shift}
        parts += [f"{n} {v:g}" for n, v in extras.items() if v]
        parts += [] if self.sink is None else [f"sink {self.sink:g}"]
        parts += ["scale=None (the default)"] if self.scale is None else []
        parts += [
            f"{n} x{v:g}" for n, v in (("scale", self.scale), ("magnitude", self.magnitude)) if v not in (1, None)
        ]
        return ", ".join(parts)


def max_magnitude(dtype: str) -> float:
    """The largest magnitude a case allows in `dtype`: N(0, 1) x magnitude stays finite to 8 sigma (max / 8),
    or for FP8, whose casts saturate, to 4 sigma (max / 4: 112 for e4m3, 14336 for e5m2)."""
    return torch.finfo(DTYPES[dtype]).max / (4 if dtype in FP8 else 8)


def parse_case(text: str) -> HuntCase:
    """A case from its `to_text` form; ValueError names a bad term and what is allowed."""
    fields = {f.name: f for f in dataclasses.fields(HuntCase)}
    values: dict = {}
    for term in (t.strip() for t in str(text).split(",")):
        key, eq, raw = term.partition("=")
        name = _SHORT.get(key.strip(), key.strip())
        if not eq or name not in fields:
            allowed = ", ".join(_LONG.get(n, n) for n in fields)
            raise ValueError(f"case term {term!r} is not KEY=VALUE with KEY one of {allowed}")
        kind = fields[name].type
        try:
            if raw == "none" and "None" in kind:
                values[name] = None
            elif kind == "bool":
                values[name] = {"1": True, "0": False, "true": True, "false": False}[raw.lower()]
            elif kind == "int":
                values[name] = int(raw)
            elif kind.startswith("float"):
                values[name] = float(raw)
            else:
                values[name] = raw
        except (KeyError, ValueError):
            raise ValueError(f"case term {term!r}: {raw!r} is not a valid {kind}") from None
    return HuntCase(**values)


def visible(case: HuntCase) -> torch.Tensor:
    """[Lq, Lk] bool: which key each query row sees (causal bottom-right, padding, dead rows)."""
    keep = torch.ones(case.lq, case.lk, dtype=torch.bool)
    if case.causal:
        keep = torch.tril(keep, diagonal=case.lk - case.lq)
    if case.pad:
        keep[:, case.lk - case.pad :] = False
    if case.dead:
        keep[case.lq - case.dead :] = False
    return keep


def keyless_rows(case: HuntCase) -> torch.Tensor:
    """[Lq] bool: the query rows with no visible key (their result is a convention, not arithmetic)."""
    return ~visible(case).any(dim=-1) if case.lk else torch.ones(case.lq, dtype=torch.bool)


def make_mask(case: HuntCase) -> torch.Tensor | None:
    """The mask passed with the case: None, bool [1, 1, Lq, Lk] (padding, dead rows) or, with a shift,
    additive float64 (shift where kept, -inf elsewhere). Causal is not in it (passed as causal=True)."""
    if not case.has_mask:
        return None
    keep = torch.ones(case.lq, case.lk, dtype=torch.bool)
    if case.pad:
        keep[:, case.lk - case.pad :] = False
    if case.dead:
        keep[case.lq - case.dead :] = False
    if not case.shift:
        return keep.view(1, 1, case.lq, case.lk)
    bias = torch.full((case.lq, case.lk), case.shift, dtype=torch.float64).masked_fill(~keep, -math.inf)
    return bias.view(1, 1, case.lq, case.lk)


def make_inputs(case: HuntCase) -> tuple[torch.Tensor, ...]:
    """(q, k, v, dout) float64 on the CPU, each value representable in the case's dtype (q, k, v scaled by the
    magnitude, then rounded, saturating at the max for FP8; dout N(0, 1) rounded), drawn from the case's seed."""
    g = torch.Generator().manual_seed(case.seed)
    b, h, hkv, d = case.batch, case.heads, case.kv_heads, case.head_dim
    shapes = ((b, h, case.lq, d), (b, hkv, case.lk, d), (b, hkv, case.lk, d), (b, h, case.lq, d))
    low = case.torch_dtype
    out = []
    for i, shape in enumerate(shapes):
        t = torch.randn(shape, generator=g, dtype=torch.float64) * (case.magnitude if i < 3 else 1.0)
        out.append(_round(t, case.dtype) if case.dtype in FP8 else t.to(low).to(torch.float64))
    return tuple(out)


def _round(t: torch.Tensor, dtype: str) -> torch.Tensor:
    """t rounded to an FP8 format, saturating at its max (core.numerics.round_to), as float64."""
    from flashcheck.core.numerics import round_to

    return round_to(t, dtype)
