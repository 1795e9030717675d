"""Foundations (floor 1): number formats, rounding and policies; seeded inputs; metrics; the budget rule;
atomic files; the environment fingerprint; progress reporting. Nothing here imports the rest of flashcheck."""

VERSION = "0.1.0"  # the package version (flashcheck.__version__)
