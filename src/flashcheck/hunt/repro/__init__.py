"""The parts of the standalone reproducers `flashcheck hunt --upstream` writes: plain Python files copied into each
script as text (never imported by flashcheck): `common` (numpy: the embedded case, the FP64 reference, the verdict,
main) after one library part (`torch_sdpa`, `jax_nn`, `onnx_attention`: versions, observe, same_format)."""
