"""Recording weights from real training, for `flashcheck drift`: a plain function for any loop, and
callbacks for the Hugging Face Trainer and Lightning. Under torch.distributed either rank 0 gathers a
full state dict and writes one file, or every rank writes its shards (torch.distributed.checkpoint)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from flashcheck.core.fileio import atomic_target
from flashcheck.training.safetensors_format import save_safetensors

FORMATS = ("pt", "safetensors", "dcp")


def _dist() -> tuple[bool, int]:
    d = torch.distributed
    on = d.is_available() and d.is_initialized()
    return on, (d.get_rank() if on else 0)


def _full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    on, _ = _dist()
    if on:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def record_weights(
    model: nn.Module, step: int, out: str | Path, *, every: int = 100, fmt: str = "safetensors"
) -> Path | None:
    """Save the model's weights as out/step_{step:08d}.{fmt} when step % every == 0 (else None).

    Every rank must call it under torch.distributed: with fmt "dcp" each rank writes its shards into a
    folder; otherwise rank 0 writes the gathered full state dict."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if every < 1:
        raise ValueError(f"every={every} must be a positive integer")
    if step % every:
        return None
    out = Path(out)
    on, rank = _dist()
    if fmt == "dcp":
        import torch.distributed.checkpoint as dcp

        target = out / f"step_{step:08d}"
        if rank == 0:
            out.mkdir(parents=True, exist_ok=True)
        sd = model.state_dict() if on else {k: v.detach() for k, v in model.state_dict().items()}
        dcp.save(sd, checkpoint_id=str(target))
        return target
    sd = _full_state_dict(model)
    target = out / f"step_{step:08d}.{fmt}"
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        if fmt == "safetensors":
            save_safetensors({k: v.float() if v.dtype == torch.float64 else v for k, v in sd.items()}, target)
        else:
            with atomic_target(target) as tmp:
                torch.save(sd, tmp)
    if on:
        torch.distributed.barrier()  # every rank returns once the file exists
    return target if rank == 0 else None


def hf_callback(out: str | Path, *, every: int = 100, fmt: str = "safetensors"):
    """A transformers.TrainerCallback that records weights every `every` optimizer steps."""
    try:
        from transformers import TrainerCallback
    except ImportError as exc:
        from flashcheck.core.extras import install_hint

        raise ImportError(f"hf_callback needs transformers: {install_hint('hf')}") from exc

    class FlashcheckRecorder(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if model is not None:
                record_weights(model, state.global_step, out, every=every, fmt=fmt)

    return FlashcheckRecorder()


def lightning_callback(out: str | Path, *, every: int = 100, fmt: str = "safetensors"):
    """A Lightning Callback that records weights every `every` optimizer steps (lightning, or the older
    pytorch_lightning)."""
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError as exc:
            from flashcheck.core.extras import install_hint

            raise ImportError(f"lightning_callback needs lightning: {install_hint('lightning')}") from exc

    class FlashcheckRecorder(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            record_weights(pl_module, trainer.global_step, out, every=every, fmt=fmt)

    return FlashcheckRecorder()
