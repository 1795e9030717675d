"""Number formats as hardware computes them, in torch: FA4's software exp2, Hadamard rotations, SageAttention3's FP4."""
