"""What every backend adapter is: one signature in [B, H, L, D], the devices it runs on, an honest
availability check, and the profiler op names that prove its kernel ran on each device."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flashcheck.kernels.sim.validation import check_backend_call

DEVICES = ("cpu", "cuda")


def cuda_unavailable_reason() -> str | None:
    """Why no CUDA device can be used here (None: one can)."""
    if torch.cuda.is_available():
        return None
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU build"
    return "no CUDA device is visible (driver, CUDA_VISIBLE_DEVICES)"


def default_device() -> str:
    """The device a comparison runs on when none is asked for: cuda where available, else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(device: str | None) -> str:
    """`device` checked ("cpu" or "cuda"; None: `default_device()`); ValueError names what is allowed,
    or why cuda cannot be used here."""
    if device is None:
        return default_device()
    if device not in DEVICES:
        raise ValueError(f"device {device!r} is not allowed; expected one of {', '.join(DEVICES)}")
    if device == "cuda" and (why := cuda_unavailable_reason()):
        raise ValueError(f"device 'cuda' asked for, but there is none here: {why}")
    return device


def _names(dtypes: tuple[torch.dtype, ...]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


@dataclass(frozen=True, slots=True)
class Availability:
    """Whether a backend can run here, and if not, why (missing package, no GPU, arch, dtype)."""

    ok: bool
    reason: str = ""


@dataclass
class Backend:
    """A real or simulated attention implementation.

    forward(q, k, v, *, causal, scale, mask) -> out runs on the tensors' device, all [B, H, L, D];
    run(..., device=) moves the inputs to `device` first and the output back. `devices`: where it runs;
    `proof[device]`: regular expressions that must each match one profiler op name for the kernel to count
    as proven there (exact "^aten::...$" names for CPU ops; CUDA kernel names for CUDA, so that a run
    that stayed on the CPU cannot prove a CUDA kernel). `dtypes` (and `cuda_dtypes` where CUDA differs):
    the input dtypes allowed."""

    name: str
    description: str
    proof: dict[str, tuple[str, ...]] = field(default_factory=dict)
    dtypes: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
    cuda_dtypes: tuple[torch.dtype, ...] | None = None
    devices: tuple[str, ...] = DEVICES
    supports_backward: bool = True
    supports_mask: bool = True
    supports_gqa: bool = False  # K/V with fewer heads than Q (grouped-query attention)
    extra: dict = field(default_factory=dict)

    def default_device(self) -> str:
        """cuda where this backend runs on CUDA and a GPU is visible (or it runs on CUDA only), else cpu."""
        if "cuda" in self.devices and (torch.cuda.is_available() or "cpu" not in self.devices):
            return "cuda"
        return self.devices[0]

    def device(self, device: str | None = None) -> torch.device:
        """The torch device of a run on `device` (None: `default_device()`)."""
        return torch.device(device or self.default_device())

    def dtypes_on(self, device: str) -> tuple[torch.dtype, ...]:
        return self.cuda_dtypes if device == "cuda" and self.cuda_dtypes is not None else self.dtypes

    def proof_on(self, device: str) -> tuple[str, ...]:
        """The op-name patterns that prove this kernel ran on `device` (empty: nothing to prove)."""
        return self.proof.get(device, ())

    def available(self, dtype: torch.dtype | None = None, device: str | None = None) -> Availability:
        """Whether it can run here on `device` (None: `default_device()`) with inputs of `dtype`."""
        dev = device or self.default_device()
        if dev not in DEVICES:
            raise ValueError(f"device {dev!r} is not allowed; expected one of {', '.join(DEVICES)}")
        if dev not in self.devices:
            where = "a CUDA GPU" if self.devices == ("cuda",) else " or ".join(self.devices)
            why = cuda_unavailable_reason() if self.devices == ("cuda",) else None
            return Availability(False, f"runs on {where} only, not on {dev}" + (f"; no GPU here: {why}" if why else ""))
        if dev == "cuda" and (why := cuda_unavailable_reason()):
            return Availability(False, f"needs an NVIDIA GPU: {why}")
        allowed = self.dtypes_on(dev)
        if dtype is not None and dtype not in allowed:
            name = str(dtype).replace("torch.", "")
            return Availability(False, f"dtype {name} not supported on {dev}; allowed {_names(allowed)}")
        return self._available(dev)

    def _available(self, device: str) -> Availability:
        return Availability(True)

    def missing_package(self) -> str | None:
        """Why the optional package this backend needs cannot be imported, naming the extra to install (None:
        it can, or the backend needs none)."""
        return None

    def version(self) -> str | None:
        """The version of the package behind this backend, where it is not torch's (None: none to report)."""
        return None

    def backward_reason(self, device: str | None = None) -> str | None:
        """Why this backend cannot run a backward on `device` (None: it can)."""
        return None if self.supports_backward else f"{self.name} has no backward"

    def run(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        device: str,
        causal: bool = False,
        scale: float | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """forward on `device`: q [B, H, Lq, D], k/v [B, Hkv, Lk, D] moved there (differentiably, so
        gradients reach the callers' tensors), the output [B, H, Lq, Dv] returned on q's device."""
        if (empty := check_backend_call(q, k, v, scale=scale, mask=mask, gqa=self.supports_gqa)) is not None:
            return empty  # bad input raised a ValueError there (kernels.sim.validation); empty input: its result
        avail = self.available(q.dtype, device)
        if not avail.ok:
            raise ValueError(f"backend {self.name!r} cannot run on {device}: {avail.reason}")
        dev = torch.device(device)
        out = self.forward(
            q.to(dev),
            k.to(dev),
            v.to(dev),
            causal=causal,
            scale=scale,
            mask=None if mask is None else mask.to(dev),
        )
        return out.to(q.device)

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
