"""Foundations (floor 1): number formats, rounding and policies; seeded inputs; metrics; the budget rule;
atomic files; the environment fingerprint; progress reporting. Nothing here imports the rest of flashcheck."""
