"""The serving study's settings (its table `serving` of study.json / TOML) and its presets."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from flashcheck.measure.longcontext import VARIANTS


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingSettings:
    """lengths: KV lengths of the long-context table; heads / head_dim: its query rows and D; variants: its
    kernels (measure.longcontext.VARIANTS); sdpa_max_batch: batch sizes 1..N of the SDPA certificates;
    sim_max_batch / sim_kv_len: the simulators' batch check (FA#1897); prefill_len: vllm#54035's prefill;
    captured_lengths: KV lengths run again with captured values (MiniLM's layer on the corpus: ~55k tokens)."""

    name: str = "serving"
    lengths: tuple[int, ...] = (8192, 32768, 131072)
    heads: int = 2
    head_dim: int = 32
    variants: tuple[str, ...] = tuple(VARIANTS)
    sdpa_max_batch: int = 16
    sim_max_batch: int = 8
    sim_kv_len: int = 2048
    prefill_len: int = 128
    captured_lengths: tuple[int, ...] = (8192, 32768)

    def __post_init__(self) -> None:
        bad = [v for v in self.variants if v not in VARIANTS]
        if bad:
            raise ValueError(f"serving variant {bad[0]!r} unknown; expected one of {', '.join(VARIANTS)}")
        if not self.lengths or min(self.lengths) < 1 or min(self.heads, self.head_dim, self.sdpa_max_batch) < 1:
            raise ValueError("serving settings: lengths, heads, head_dim and batch sizes must be positive")

    @classmethod
    def from_dict(cls, data: dict, source: str = "settings") -> ServingSettings:
        known = {f.name for f in fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            raise ValueError(
                f"{source}: unknown serving setting {extra[0]!r}; expected one of {', '.join(sorted(known))}"
            )
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return cls(**kw)

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS = {
    "serving": ServingSettings(),
    # the quick part: seconds, for tests and a first look
    "serving-tiny": ServingSettings(
        name="serving-tiny",
        lengths=(512, 1024),
        heads=1,
        sdpa_max_batch=4,
        sim_max_batch=2,
        sim_kv_len=2048,
        prefill_len=100,
        captured_lengths=(),
    ),
}
