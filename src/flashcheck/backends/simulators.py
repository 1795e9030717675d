"""The simulators behind the backend signature: `sim-standard` and `sim-flash` under any policy or preset."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashcheck.backends.base import Backend
from flashcheck.kernels import flash_attention, standard_attention
from flashcheck.kernels.sim.presets import resolve


@dataclass
class SimBackend(Backend):
    """A simulator, run on the CPU (it models a kernel's numerics, not its speed): inputs arrive in float64
    and the policy rounds them. `policy` (a name) or `preset` (a kernel preset, at format `fmt`) choose the
    numerics; block sizes apply without a preset."""

    kernel: str = "flash"
    policy: str = "bf16-mixed"
    preset: str | None = None
    fmt: str = "bf16"
    block_q: int = 128
    block_k: int = 128
    algorithm: str = "fa2"
    supports_gqa: bool = True

    def configured(
        self,
        *,
        policy: str | None = None,
        preset: str | None = None,
        fmt: str | None = None,
        block_q: int | None = None,
        block_k: int | None = None,
        algorithm: str | None = None,
    ) -> SimBackend:
        """A copy with these options set."""
        import dataclasses

        changes = {
            k: v
            for k, v in {
                "policy": policy,
                "preset": preset,
                "fmt": fmt,
                "block_q": block_q,
                "block_k": block_k,
                "algorithm": algorithm,
            }.items()
            if v is not None
        }
        return dataclasses.replace(self, **changes)

    def label(self) -> str:
        policy = getattr(self.policy, "name", self.policy)  # a Policy or its name
        if self.kernel == "standard":
            return f"{self.name}[{policy}]"
        if self.preset:
            from flashcheck.kernels.sim.presets import alias_of

            alias = alias_of(self.preset)  # sage2 is sage2-hopper: said, as explain and predict name it so
            return f"{self.name}[{self.preset}@{self.fmt}" + (f", alias of {alias}]" if alias else "]")
        return f"{self.name}[{policy}, {self.block_q}x{self.block_k} {self.algorithm}]"

    def forward(self, q, k, v, *, causal=False, scale=None, mask=None):
        if self.kernel == "standard":
            return standard_attention(q, k, v, policy=self.policy, causal=causal, scale=scale, mask=mask)
        if self.preset:
            kw = resolve(self.preset, self.fmt, q.shape[-2], k.shape[-2], q.shape[-1], causal)
        else:
            kw = {
                "policy": self.policy,
                "block_q": self.block_q,
                "block_k": self.block_k,
                "algorithm": self.algorithm,
            }
        return flash_attention(q, k, v, causal=causal, scale=scale, mask=mask, **kw)


def simulator_backends() -> list[Backend]:
    sims = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
    return [
        SimBackend(
            "sim-standard",
            "flashcheck standard attention under a policy",
            proof={"cpu": (r"^aten::exp$",)},
            dtypes=sims,
            devices=("cpu",),
            kernel="standard",
        ),
        SimBackend(
            "sim-flash",
            "flashcheck tiled flash attention under a policy or kernel preset",
            proof={"cpu": (r"_FlashFunction",)},
            dtypes=sims,
            devices=("cpu",),
        ),
    ]
