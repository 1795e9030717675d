"""The paper set's sweeps and presets: the seed paper's microbenchmark (arXiv 2405.02803), the real CPU backends
beside the simulator, and FlashAttention-3's Table 3 (arXiv 2407.08608)."""

from __future__ import annotations

from flashcheck.study.config import StudyConfig, Sweep

FORMATS = ("bf16", "fp16", "fp32", "fp64")
FA3_METHODS = (
    "standard:fp16",
    "flash:fp16-mixed",
    "standard:baseline-fp8",
    "flash:fa3-fp8",
    "flash:fa3-fp8-no-block",
    "flash:fa3-fp8-no-hadamard",
)
# FlashAttention-3 (arXiv 2407.08608) Table 3, RMSE against an FP64 reference with outlier inputs.
FA3_PAPER_RMSE = {
    "standard:fp16": 3.2e-4,
    "flash:fp16-mixed": 1.9e-4,
    "standard:baseline-fp8": 2.4e-2,
    "flash:fa3-fp8": 9.1e-3,
    "flash:fa3-fp8-no-block": 9.3e-3,
    "flash:fa3-fp8-no-hadamard": 2.4e-2,
}


# What FlashAttention-3 states of Table 3's setting (arXiv 2407.08608, section 4.3 "Numerical Error Validation" and
# Table 3) and what it leaves unstated there (appendix C's sizes are those of the speed benchmarks, not of Table 3).
FA3_TABLE3_SOURCE = "arXiv 2407.08608, section 4.3 and Table 3"
FA3_TABLE3_STATED = (
    "every entry of Q, K, V ~ N(0, 1) + N(0, 100) x Bernoulli(0.001); RMSE against an FP64 reference; the baseline a "
    "standard attention (FP16: softmax intermediates in FP16; FP8: e4m3 with per-tensor scaling, FP32 matmul "
    "accumulator, FP16 softmax intermediates); FA2/FA3 FP16 keep the softmax in FP32; FA3 FP8 with block quantisation "
    "and incoherent processing (random +-1 diagonal times a Hadamard matrix)"
)
FA3_TABLE3_UNSTATED = (
    "sequence length", "head dim", "number of heads", "batch size", "causal mask", "softmax scale", "tile sizes",
    "number of runs",
)  # fmt: skip


def paper_sweeps(
    lengths: tuple[int, ...], fixed_len: int, areas: tuple[int, ...], heads: int, seeds: tuple[int, ...]
) -> list[Sweep]:
    """arXiv 2405.02803's microbenchmark, each question under the uniform and the -mixed policy."""
    both = ("flash:bf16", "flash:bf16-mixed")
    common = {"heads": heads, "seeds": seeds, "algorithm": "fa1"}
    return [
        Sweep(
            question="formats",
            methods=tuple(f"flash:{f}{m}" for f in FORMATS for m in ("", "-mixed")),
            seq_lens=(fixed_len,),
            blocks=((16, 16),),
            **common,
        ),
        Sweep(question="seq_len", methods=both, seq_lens=lengths, blocks=((16, 16),), **common),
        Sweep(
            question="block_area",
            methods=both,
            seq_lens=(fixed_len,),
            blocks=tuple((a, a) for a in areas),
            **common,
        ),
        Sweep(question="swapped", methods=both, seq_lens=(fixed_len,), blocks=((16, 64), (64, 16)), **common),
        Sweep(
            question="square",
            methods=both,
            seq_lens=(fixed_len,),
            blocks=((32, 32), (16, 64), (64, 16)),
            **common,
        ),
    ]


def backend_sweep(lengths: tuple[int, ...], heads: int, seeds: tuple[int, ...]) -> Sweep:
    """Real CPU backends beside the kernel-realistic simulator, same inputs and FP64 reference."""
    return Sweep(
        question="backends",
        methods=("sdpa-math:bf16", "sdpa-flash:bf16", "flash:bf16-mixed"),
        seq_lens=lengths,
        blocks=((128, 128),),
        seeds=seeds,
        heads=heads,
        algorithm="fa2",
        metric="rel_l2",
    )


def fa3_sweep(lengths: tuple[int, ...], head_dims: tuple[int, ...], heads: int, seeds: tuple[int, ...]) -> Sweep:
    return Sweep(
        question="fa3",
        methods=FA3_METHODS,
        seq_lens=lengths,
        head_dims=head_dims,
        blocks=((128, 128),),
        distributions=("outliers",),
        seeds=seeds,
        algorithm="fa2",
        heads=heads,
        baseline=False,
        metric="rmse",
    )


def paper() -> StudyConfig:
    """The seed paper's microbenchmark (arXiv 2405.02803), lengths 512..8192."""
    return StudyConfig(
        name="paper",
        sweeps=tuple(paper_sweeps((512, 1024, 2048, 4096, 8192), 4096, (8, 16, 32, 64, 128), 8, (0, 1, 2))),
    )


def fa3() -> StudyConfig:
    """FlashAttention-3's Table 3 at head dims 64 and 128 and several lengths."""
    return StudyConfig(name="fa3", sweeps=(fa3_sweep((1024, 2048, 4096), (64, 128), 8, (0, 1, 2)),))
