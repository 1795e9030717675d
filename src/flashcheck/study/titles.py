"""The study report's section titles: each question's id (the anchor and the key in summary.json) in words,
so a heading reads "Sequence length" rather than `seq_len` (issue 34)."""

from __future__ import annotations

TITLES = {
    "formats": "Number formats",
    "seq_len": "Sequence length",
    "block_area": "Tile size (block area)",
    "swapped": "Swapped tiles (Br x Bc against Bc x Br)",
    "square": "Square and oblong tiles of one area",
    "backends": "Real backends on this machine",
    "fa3": "FlashAttention-3's Table 3 (outlier inputs)",
    "guide_errors": "The production guide: error against length",
    "causal": "Causal masks",
    "gqa": "Grouped-query and multi-query attention",
    "padding": "Padding",
    "padding_dead_rows": "Padding: rows with no visible key",
    "decoding": "Decoding against a KV cache (split-KV)",
    "head_dim": "Head dimension",
    "backward": "Backward pass (dQ, dK, dV)",
    "captured": "Captured model activations",
    "error_model": "Error model: predicted against measured",
    "error_model_kinds": "Error model by kind of case",
    "modern_fa4": "FlashAttention-4 (bf16) against FA2",
    "modern_lowp": "FP8 and FP4 kernels against FA3's FP8 path",
    "modern_sage": "SageAttention kernels",
    "modern_sink": "P cast to FP8 with an attention sink",
    "modern_stages": "Which stage causes the FP8/FP4 kernels' error",
    "modern_sage_stages": "Which stage causes SageAttention's error",
    "production_prefill": "Production: prefill",
    "production_decoding": "Production: decoding",
    "production_backward": "Production: backward pass",
    "production_captured": "Production: captured activations",
}


def title(question: str) -> str:
    """The question's title in words (its id with spaces where none is listed)."""
    return TITLES.get(question, question.replace("_", " "))
