"""What every backend adapter is: one signature in [B, H, L, D], and an honest availability check."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether a backend can run here, and if not, why (missing package, no GPU, arch, dtype)."""

    ok: bool
    reason: str = ""


@dataclass
class Backend:
    """A real or simulated attention implementation.

    forward(q, k, v, *, causal, scale, mask) -> out, all [B, H, L, D] on `device()`; `ops` are
    substrings of the profiler op names that prove this kernel ran; `dtypes` the input dtypes allowed."""

    name: str
    description: str
    ops: tuple[str, ...] = ()
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
    needs_cuda: bool = False
    supports_backward: bool = True
    supports_mask: bool = True
    extra: dict = field(default_factory=dict)

    def device(self) -> torch.device:
        return torch.device("cuda" if self.needs_cuda else "cpu")

    def available(self, dtype: torch.dtype | None = None) -> Availability:
        if self.needs_cuda and not torch.cuda.is_available():
            why = "no CUDA device" if torch.version.cuda else f"torch {torch.__version__} is a CPU build"
            return Availability(False, f"needs an NVIDIA GPU: {why}")
        if dtype is not None and dtype not in self.dtypes:
            allowed = ", ".join(str(d).replace("torch.", "") for d in self.dtypes)
            return Availability(False, f"dtype {str(dtype).replace('torch.', '')} not supported; allowed {allowed}")
        return self._available()

    def _available(self) -> Availability:
        return Availability(True)

    def backward_reason(self) -> str | None:
        """Why this backend cannot run a backward here (None: it can)."""
        return None if self.supports_backward else f"{self.name} has no backward"

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        causal: bool = False,
        scale: float | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError


def cuda_capability() -> tuple[int, int] | None:
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability()
