"""Serving kernels: KV-cache formats, FA3's serving forward, and the tile / split heuristics of serving stacks."""
