"""Real attention implementations (and the simulators) behind one signature in [B, H, L, D].

Each adapter imports its optional package only when asked whether it is available or to run."""

from __future__ import annotations

import difflib

from flashcheck.backends.base import Availability, Backend


def all_backends() -> list[Backend]:
    """Every known backend, in a stable order (nothing optional is imported here)."""
    from flashcheck.backends.eager import eager_backends
    from flashcheck.backends.external import external_backends
    from flashcheck.backends.jax_xla import jax_backends
    from flashcheck.backends.onnx_rt import onnx_backends
    from flashcheck.backends.sdpa import sdpa_backends
    from flashcheck.backends.simulators import simulator_backends

    return [
        *sdpa_backends(),
        *external_backends(),
        *jax_backends(),
        *onnx_backends(),
        *eager_backends(),
        *simulator_backends(),
    ]


def backend_names() -> list[str]:
    return [b.name for b in all_backends()]


def get_backend(name: str) -> Backend:
    """The backend called `name`; ValueError names the allowed ones (with a suggestion)."""
    for b in all_backends():
        if b.name == name:
            return b
    names = backend_names()
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(f"unknown backend {name!r}{hint}; expected one of {', '.join(names)}")


__all__ = ["Availability", "Backend", "all_backends", "backend_names", "get_backend"]
