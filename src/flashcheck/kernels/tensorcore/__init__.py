"""Tensor-core MMA models: the block-FMA chain of FP8 / FP4 operands as the hardware computes it."""
