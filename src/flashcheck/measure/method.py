"""A Method: what a user writes ("flash:bf16", "standard:fp16-mixed", "sdpa-flash:bf16", "sim-flash" with a
kernel preset), parsed once into an immutable value that runs, rounds its inputs and names its baseline.

Legend: q [B, H, Lq, D]; k, v [B, H, Lk, D]; every tensor handed to `run` is float64 on the CPU and every
output comes back float64 on the CPU."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass

import torch

from flashcheck.core.numerics import FP8_FORMATS, Format, Policy, info, parse_format, parse_policy, round_to
from flashcheck.kernels import SIMULATED_KERNELS, simulate
from flashcheck.kernels.sim.fp8 import round_inputs


class Unavailable(Exception):
    """The method cannot run here (recorded as skipped, with the reason)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Method:
    """A simulator (`kernel` in flash/standard under `policy`) or a real backend (`kernel` a backend name at
    format `fmt` on `device`; `preset` / `policy` / blocks configure `sim-flash` and `sim-standard`).
    Simulators run on the CPU in float64 tensors whatever `device` says."""

    kernel: str
    policy: Policy | None = None
    fmt: Format = Format.BF16
    preset: str | None = None
    block_q: int = 128
    block_k: int = 128
    algorithm: str = "fa2"
    device: str = "cpu"
    splits: int = 4  # key chunks of the split-KV simulator ("splitkv"), else unused
    exp2: bool = False  # flash: scores in log2 units (a kernel preset's policy as a method, e.g. flash:fa4-fp8)

    @property
    def is_simulator(self) -> bool:
        return self.kernel in SIMULATED_KERNELS

    @property
    def input_format(self) -> Format:
        return self.policy.input if self.is_simulator else self.fmt

    def __str__(self) -> str:
        if self.is_simulator:
            return f"{self.kernel}:{self.policy.name}"
        return f"{self.kernel}:{self.fmt.value}" + (f"[{self.preset}]" if self.preset else "")

    def label(self) -> str:
        """The stable string with blocks where they matter (records, tables)."""
        if self.is_simulator and self.kernel == "flash":
            return f"{self}[{self.block_q}x{self.block_k} {self.algorithm}]"
        if self.kernel == "splitkv":
            return f"{self}[{self.block_q}x{self.block_k} {self.algorithm} S={self.splits}]"
        return str(self)

    def backend(self):
        """The backend adapter (configured for the simulators' backends); ValueError for simulators."""
        from flashcheck.backends import get_backend
        from flashcheck.backends.simulators import SimBackend

        b = get_backend(self.kernel)
        if isinstance(b, SimBackend):
            default = f"{self.fmt.value}-mixed" if b.kernel == "flash" else self.fmt.value
            b = b.configured(
                policy=self.policy or parse_policy(default),
                preset=self.preset,
                fmt=self.fmt.value,
                block_q=self.block_q,
                block_k=self.block_k,
                algorithm=self.algorithm,
            )
        return b

    def dtype(self) -> torch.dtype:
        return info(self.fmt).dtype

    def check_available(self, *, backward: bool = False) -> None:
        """Raise Unavailable with the reason when this method cannot run here."""
        if self.kernel == "splitkv" and backward:
            raise Unavailable("splitkv (split-KV decoding) runs forward only")
        if self.is_simulator:
            return
        b = self.backend()
        avail = b.available(None if _takes_float64(b) else self.dtype(), self.run_device)
        if not avail.ok:
            raise Unavailable(avail.reason)
        if backward and b.backward_reason(self.run_device):
            raise Unavailable(b.backward_reason(self.run_device))

    @property
    def run_device(self) -> str:
        """Where the method runs: simulators (pure torch) and real backends on `device`, the sim-* backends on
        the CPU."""
        if self.kernel.startswith("sim-"):
            return "cpu"
        return self.device

    def runner(self, *, causal: bool = False, **flash_options):
        """fn(q, k, v) -> out in the method's own dtype and device (autograd-capable)."""
        if self.kernel == "splitkv":
            flash_options = {"splits": self.splits, **flash_options}
        if self.exp2 and self.kernel == "flash":
            flash_options = {"exp2": True, **flash_options}
        if self.is_simulator:
            dev = torch.device(self.device)
            flash_options = {n: x.to(dev) if isinstance(x, torch.Tensor) else x for n, x in flash_options.items()}
            return lambda q, k, v: simulate(
                self.kernel,
                q.to(dev),
                k.to(dev),
                v.to(dev),
                policy=self.policy,
                causal=causal,
                block_q=self.block_q,
                block_k=self.block_k,
                algorithm=self.algorithm,
                **flash_options,
            )
        b, dev = self.backend(), self.run_device
        return lambda q, k, v: b.run(q, k, v, device=dev, causal=causal)

    def prepare(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The float64 CPU inputs as this method takes them: simulators the inputs themselves (they never write
        into them: tests/test_scale_memory.py; a copy costs 3 inputs' memory at long L); float64 backends copies;
        other backends in their dtype (the adapter moves them to the device and the output back)."""
        if self.is_simulator:
            return tuple(tensors)
        if _takes_float64(self.backend()):
            return tuple(t.clone() for t in tensors)
        return tuple(t.to(self.dtype()) for t in tensors)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False) -> torch.Tensor:
        """The method's output for float64 inputs, as float64 on the CPU (no autograd)."""
        self.check_available()
        with torch.no_grad():
            return self.runner(causal=causal)(*self.prepare(q, k, v)).detach().double().cpu()

    def rounding_key(self) -> tuple | None:
        """What the method's rounded inputs depend on (None: they are the original inputs). Two methods share a
        key only when rounded_inputs gives both the same bits: a backend rounds float64 straight to its format,
        a simulator through its working dtype (float64 -> float32 -> fp16 can round twice), so the working dtype
        is part of the key (sdpa-math:fp16 and flash:fp16-mixed differ in about 1 element in 30,000)."""
        if not self.is_simulator:  # the key of a simulator policy whose inputs are fmt, rounded from float64
            if self.fmt == Format.FP64:
                return None
            if self.fmt in FP8_FORMATS:  # rounded_inputs gives the inputs as they are (the backend scales them)
                return (self.fmt, "as-given")
            return (self.fmt, "tensor", False, None, torch.float64)
        pol = self.policy
        if pol.input == Format.FP64 and not pol.hadamard:
            return None
        fp8_block = pol.input in FP8_FORMATS and pol.fp8_scaling == "block"
        blocks = (self.block_q, self.block_k) if fp8_block else None
        if pol.knobs():  # quantized inputs depend on the knobs and on both block sizes
            knobs = sorted(pol.knobs().items())
            return (pol.input, pol.fp8_scaling, pol.hadamard, (self.block_q, self.block_k), pol.work_dtype, *knobs)
        return (pol.input, pol.fp8_scaling, pol.hadamard, blocks, pol.work_dtype)

    def rounded_inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Q, K, V as the method actually sees them, float64 (its kernel error is measured against these)."""
        if self.is_simulator:
            return round_inputs(q, k, v, self.policy, block_q=self.block_q or None, block_k=self.block_k or None)[:3]
        if self.fmt in FP8_FORMATS:
            return (q, k, v)
        return tuple(round_to(t, self.fmt) for t in (q, k, v))

    def baseline(self) -> Method:
        """The one baseline rule: standard attention in the same input format with the same intermediate
        policy. Simulators: `standard:POLICY`; a real backend at FMT: eager PyTorch at FMT (the peers'
        baseline); fp8 formats, which eager cannot run: `standard:baseline-fp8`."""
        if self.is_simulator:
            return dataclasses.replace(self, kernel="standard", block_q=0, block_k=0, algorithm="")
        if self.fmt in FP8_FORMATS:
            return Method(kernel="standard", policy=parse_policy("baseline-fp8"), block_q=0, block_k=0, algorithm="")
        return Method(kernel="eager", fmt=self.fmt, device=self.run_device)


def _takes_float64(backend) -> bool:
    from flashcheck.backends.simulators import SimBackend

    return isinstance(backend, SimBackend)


def parse_method(
    text: str | Method,
    *,
    preset: str | None = None,
    block_q: int = 128,
    block_k: int = 128,
    algorithm: str = "fa2",
    policy: str | None = None,
    device: str = "cpu",
    splits: int = 4,
) -> Method:
    """Parse "kernel:policy" (simulators flash/standard/splitkv), "backend:FORMAT" or a bare backend name (bf16).
    `preset`, `policy` and the blocks configure the simulator backends (sim-flash, sim-standard); `device`
    is where a real backend runs; `splits` the number of key chunks of "splitkv".

    ValueError names the value and what is allowed, with a "did you mean" for backend names."""
    if isinstance(text, Method):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"method {text!r} is empty; write kernel:policy (flash:bf16) or backend:FORMAT")
    name, _, spec = text.strip().partition(":")
    if name in SIMULATED_KERNELS:
        policy = parse_policy(spec or "bf16-mixed")
        if name == "standard":
            block_q = block_k = 0
            algorithm = ""
        if name == "splitkv" and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
            raise ValueError(f"splits={splits!r} must be a positive integer")
        kw = {"block_q": block_q, "block_k": block_k, "algorithm": algorithm, "splits": splits, "device": device}
        from flashcheck.kernels.sim.presets_modern import preset_policy

        # a preset's own exp2, also under overrides (flash:sage2,input=fp64)
        found = preset_policy(spec.split(",", 1)[0]) if name == "flash" and spec else None
        return Method(kernel=name, policy=policy, exp2=bool(found and found[1].exp2), **kw)
    from flashcheck.backends import backend_names

    names = backend_names()
    if name not in names:
        allowed = [*SIMULATED_KERNELS, *names]
        close = difflib.get_close_matches(name, allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(
            f"unknown method {text!r}{hint}; expected kernel:policy with kernel in "
            f"{', '.join(SIMULATED_KERNELS)}, or backend:FORMAT with backend in {', '.join(names)}"
        )
    fmt = parse_format(spec or "bf16")
    if preset is not None:
        from flashcheck.kernels.sim.presets import kernel_preset

        kernel_preset(preset).policy(fmt)  # unknown preset, or a format the preset does not run: ValueError
    return Method(
        kernel=name,
        fmt=fmt,
        policy=parse_policy(policy) if policy else None,
        preset=preset,
        block_q=block_q,
        block_k=block_k,
        algorithm=algorithm,
        device=device,
    )


def baseline_name(text: str) -> str:
    """The one baseline rule on a method's string: "flash:POLICY" -> "standard:POLICY" (the policy string
    kept as written); "backend:FMT" -> "eager:FMT" ("standard:baseline-fp8" for fp8 formats)."""
    kernel, _, spec = text.partition(":")
    if kernel in SIMULATED_KERNELS:
        return f"standard:{spec}"
    return str(parse_method(text).baseline())
