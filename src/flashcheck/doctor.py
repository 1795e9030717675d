"""Why flash attention will or will not run here: platform, GPU, versions, wheels, SDPA's choice."""

from __future__ import annotations

import importlib.util
import os
import platform
import sys

import torch


def _flash_attn_wheel() -> dict:
    """The flash-attn release wheel this environment would need, and why one may be missing. On torch's CPU
    build no wheel fits: `wheel_tag` is None and `wheel_tag_with_cuda` is the one a CUDA build of the same
    torch would need, X standing for that build's CUDA major version (release wheels say cu12, not
    cu12.4)."""
    cuda = torch.version.cuda
    abi = "TRUE" if getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", False) else "FALSE"
    tv = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    plat = f"{platform.system().lower()}_{platform.machine()}"
    cuda_tag = f"cu{cuda.split('.')[0]}" if cuda else None

    def tag(cu: str) -> str:
        return f"flash_attn-VERSION+{cu}torch{tv}cxx11abi{abi}-{py}-{py}-{plat}.whl"

    problems = []
    if platform.system() != "Linux":
        problems.append(f"flash-attn publishes Linux wheels only; this is {platform.system()}")
    if not cuda:
        problems.append(f"torch {torch.__version__} is the CPU build (no CUDA): flash-attn needs a CUDA build of torch")
    if platform.machine() not in ("x86_64", "AMD64"):
        problems.append(f"release wheels are built for x86_64; this is {platform.machine()} (build from source)")
    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability()
        if cap < (8, 0):
            problems.append(f"GPU sm{cap[0]}{cap[1]} is older than Ampere (sm80): FA2 does not support it")
    elif cuda:
        problems.append("no CUDA device visible (CUDA_VISIBLE_DEVICES, driver)")
    return {
        "wheel_tag": tag(cuda_tag) if cuda_tag else None,
        "wheel_tag_with_cuda": tag(cuda_tag or "cuX"),
        "torch_tag": f"torch{tv}",
        "cuda_tag": cuda_tag,
        "cxx11_abi": abi,
        "python_tag": py,
        "platform_tag": plat,
        "problems": problems,
    }


def _sdpa_choice(shape: tuple[int, int, int, int], dtype: torch.dtype, causal: bool) -> dict:
    """The SDPA kernel the dispatcher picks for this shape and dtype, read from the profiler."""
    from flashcheck.backends.profiling import attention_ops

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    q = torch.randn(shape, dtype=dtype, device=dev)
    try:
        ops = attention_ops(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=causal))
    except RuntimeError as exc:
        return {"device": dev, "error": str(exc).splitlines()[0]}
    chosen = [o for o in ops if o != "aten::scaled_dot_product_attention"]
    return {
        "device": dev,
        "shape": list(shape),
        "dtype": str(dtype).replace("torch.", ""),
        "causal": causal,
        "kernel": chosen[0] if chosen else None,
        "ops": ops,
    }


def diagnose(
    shape: tuple[int, int, int, int] = (1, 8, 1024, 64),
    dtype: torch.dtype = torch.bfloat16,
    causal: bool = False,
) -> dict:
    """Everything `flashcheck doctor` reports, as a JSON-able dict."""
    from flashcheck.backends import all_backends

    gpu = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = {
            "name": props.name,
            "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
            "memory_gb": round(props.total_memory / 2**30, 1),
            "count": torch.cuda.device_count(),
        }
    flags = {
        name: getattr(torch.backends.cuda, f"{name}_sdp_enabled")()
        for name in ("flash", "mem_efficient", "math", "cudnn")
    }
    backends = []
    for b in all_backends():
        a = b.available()
        backends.append({"name": b.name, "available": a.ok, "reason": a.reason, "version": b.version()})
    fa = importlib.util.find_spec("flash_attn") is not None
    return {
        "os": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "gpu": gpu,
        "flash_attn": {"importable": fa, **({} if fa else _flash_attn_wheel())},
        "sdpa_backends_enabled": flags,
        "sdpa_choice": _sdpa_choice(shape, dtype, causal),
        "determinism": {
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "CUBLAS_WORKSPACE_CONFIG": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        },
        "backends": backends,
        "simulator_rounding": _native_rounding(),
        "simulator_mma": _native_mma(),
        "simulator_step": _native_step(),
        "simulator_backward": _native_backward(),
        "simulator_fp8": _native_fp8(),
        "simulator_preset_steps": _native_preset(),
    }


def _native_rounding() -> dict:
    """kernels.native.rounding's status: the simulators' one-pass C rounding of P, or why they cast through torch."""
    from flashcheck.kernels.native import rounding as native

    return native.status()


def _native_step() -> dict:
    """kernels.native.step's status: whether the flash simulator's FA2 step runs fused in C, or why it runs torch's
    ops (same bits either way)."""
    from flashcheck.kernels.native import step as native_step

    return native_step.status()


def _native_backward() -> dict:
    """kernels.native.backward's status: whether the FA2 backward's passes between its products run in C, or why
    they run torch's ops (same bits either way)."""
    from flashcheck.kernels.native import backward as native_bwd

    return native_bwd.status()


def _native_fp8() -> dict:
    """kernels.native.fp8's status: whether FP8 / integer quantisation runs in one C pass, or why in torch."""
    from flashcheck.kernels.native.fp8 import native_status

    return native_status()


def _native_preset() -> dict:
    """kernels.native.presets's status: whether the quantised presets' P quantisation and MMA descales run in one
    C pass each, or why in torch (same bits either way)."""
    from flashcheck.kernels.native.presets import native_status

    return native_status()


def _native_mma() -> dict:
    """Whether kernels.tensorcore.mma's chain runs in C here (kernels.native.mma), or why it runs in torch."""
    from flashcheck.kernels.tensorcore.mma import native_status

    return native_status()
