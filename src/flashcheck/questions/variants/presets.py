"""The attention variants' sweeps (causal, GQA, padding, decoding, head dims, backward, captured activations)
and the production preset (a typical LLM's attention)."""

from __future__ import annotations

from flashcheck.kernels import SIMULATED_KERNELS as KERNELS
from flashcheck.study.config import StudyConfig, Sweep


def dims_sweeps(small: bool) -> list[Sweep]:
    """The attention users run (issue 13): causal, GQA, padding, decoding (split-KV where the kernel exists),
    head dims, the backward pass and captured activations; `small` for quick, else full's sizes."""
    seeds = (0, 1, 2) if small else (0, 1, 2, 3, 4)
    both = ("flash:bf16-mixed", "flash:bf16")
    common = {"seeds": seeds, "algorithm": "fa2", "metric": "rel_l2"}
    kv = (1024, 8192, 32768) if small else (1024, 2048, 4096, 8192, 16384, 32768)
    decode = ("flash:bf16-mixed", "splitkv:bf16-mixed") if "splitkv" in KERNELS else ("flash:bf16-mixed",)
    sweeps = [
        Sweep(question="causal", methods=both, seq_lens=(1024, 2048) if small else (1024, 4096, 16384),
              causal=(False, True), heads=2, **common),
        Sweep(question="gqa", methods=("flash:bf16-mixed",), seq_lens=(1024,) if small else (1024, 4096),
              heads=8, kv_heads=(8, 2, 1), causal=True, **common),
        Sweep(question="padding", methods=("flash:bf16-mixed", "sdpa-math:bf16", "sdpa-flash:bf16"),
              seq_lens=(512,) if small else (512, 2048), batch=2, heads=2, paddings=("left:0.25", "right:0.25"),
              causal=(False, True), **common),
        Sweep(question="decoding", methods=decode, seq_lens=(1, 16), seq_lens_k=kv, heads=8, kv_heads=(1,),
              causal=True, splits=(4,) if small else (2, 4, 16), **common),
        Sweep(question="head_dim", methods=both, seq_lens=(1024,) if small else (1024, 4096),
              head_dims=(64, 128) if small else (64, 128, 256), heads=2, **common),
        Sweep(question="backward", methods=("flash:bf16-mixed", "flash:fp16-mixed"),
              seq_lens=(256, 512) if small else (512, 1024, 2048), heads=2, causal=True, backward=True, **common),
    ]  # fmt: skip
    # without transformers its cases are recorded as skipped, with the install command
    sweeps.append(
        Sweep(question="captured", methods=both, seq_lens=(1024,) if small else (512, 1024, 4096),
              head_dims=(32,), distributions=("normal", "captured:minilm"),
              layers=(0, 5) if small else (0, 1, 2, 3, 4, 5), heads=4, **common)
    )  # fmt: skip
    return sweeps


def production() -> StudyConfig:
    """A typical LLM's attention: causal, GQA 8:1, D=128, bf16-mixed (and SDPA at bf16), prefill to 8k and
    decoding against a KV cache to 32k, the backward pass, and captured activations (the bundled model's own
    head dim). Its verdicts are the first lines of its report."""
    seeds = (0, 1, 2)
    common = {"seeds": seeds, "algorithm": "fa2", "metric": "rel_l2", "heads": 8, "kv_heads": (1,), "causal": True}
    decode = ("flash:bf16-mixed", "splitkv:bf16-mixed") if "splitkv" in KERNELS else ("flash:bf16-mixed",)
    sweeps = [
        Sweep(question="production_prefill", methods=("flash:bf16-mixed", "sdpa-math:bf16", "sdpa-flash:bf16"),
              seq_lens=(1024, 4096, 8192), head_dims=(128,), **common),
        Sweep(question="production_decoding", methods=decode, seq_lens=(1, 16), seq_lens_k=(1024, 8192, 32768),
              head_dims=(128,), splits=(4,), **common),
        Sweep(question="production_backward", methods=("flash:bf16-mixed",), seq_lens=(512, 1024),
              head_dims=(128,), backward=True, **common),
    ]  # fmt: skip
    # without transformers its cases are recorded as skipped, with the install command
    sweeps.append(
        Sweep(question="production_captured", methods=("flash:bf16-mixed",), seq_lens=(1024, 4096),
              head_dims=(32,), distributions=("normal", "captured:minilm"), layers=(0, 5),
              **(common | {"heads": 4, "kv_heads": (0,)}))
    )  # fmt: skip
    return StudyConfig(name="production", sweeps=tuple(sweeps))
