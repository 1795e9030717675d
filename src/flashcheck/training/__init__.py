"""Training drift: does attention numerics move the weights? (arXiv 2405.02803's training study)."""
