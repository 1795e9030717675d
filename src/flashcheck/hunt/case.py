"""One hunted input configuration: its fields, its one-line text form (`--case` of compare) and its tensors.

Legend: q [B, H, Lq, D]; k, v [B, Hkv, Lk, D]; mask [B, 1, Lq, Lk] (bool True = keep, or additive float);
every tensor built here is float64 on the CPU, holding values already rounded to the case's dtype."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_SHORT = {"b": "batch", "h": "heads", "hkv": "kv_heads", "d": "head_dim", "mag": "magnitude"}
_LONG = {v: k for k, v in _SHORT.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class HuntCase:
    """An input configuration. `pad`: keys masked at the end of every row; `dead`: query rows masked whole
    (the last ones); `shift`: added to every visible score through an additive mask (a very negative shift
    gives log-sum-exps below -88.7, the exp underflow of fp32); `scale`: the softmax scale as a multiple of
    1/sqrt(D); `magnitude`: Q, K, V are N(0, 1) times it; `sink`: one sink logit for every head (None:
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
    scale: float = 1.0
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
        finite = [self.shift, self.scale, self.magnitude] + ([] if self.sink is None else [self.sink])
        if not all(math.isfinite(x) for x in finite) or self.magnitude <= 0:
            raise ValueError("shift, scale and sink must be finite, magnitude positive and finite")
        if self.magnitude * 8 > torch.finfo(DTYPES[self.dtype]).max:
            raise ValueError(f"magnitude={self.magnitude:g} overflows {self.dtype} (at most max / 8)")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def has_mask(self) -> bool:
        return bool(self.pad or self.dead or self.shift)

    @property
    def softmax_scale(self) -> float:
        return self.scale / math.sqrt(self.head_dim)

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
        parts += [f"{n} x{v:g}" for n, v in (("scale", self.scale), ("magnitude", self.magnitude)) if v != 1]
        return ", ".join(parts)


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
    magnitude, then rounded; dout N(0, 1) rounded), drawn from the case's seed."""
    g = torch.Generator().manual_seed(case.seed)
    b, h, hkv, d = case.batch, case.heads, case.kv_heads, case.head_dim
    shapes = ((b, h, case.lq, d), (b, hkv, case.lk, d), (b, hkv, case.lk, d), (b, h, case.lq, d))
    low = case.torch_dtype
    out = []
    for i, shape in enumerate(shapes):
        t = torch.randn(shape, generator=g, dtype=torch.float64) * (case.magnitude if i < 3 else 1.0)
        out.append(t.to(low).to(torch.float64))
    return tuple(out)
