"""Tokenised batches, one forward pass with every layer's hidden states, pooling, and where NaN/Inf began.

Shapes: B batch rows, L tokens, H hidden size, V vocabulary, T valid (non-padding) tokens.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

FULL_PAD = -1  # text id of a fully padded row (attention mask all zero)


@dataclass(slots=True)
class Batch:
    """Model inputs for B rows and the text id of each row (FULL_PAD for a fully padded row)."""

    inputs: dict[str, torch.Tensor]  # input_ids [B, L], attention_mask [B, L], ...
    texts: list[int]

    @property
    def mask(self) -> torch.Tensor:
        return self.inputs["attention_mask"]


def encode_texts(tok, texts: list[str], max_length: int) -> list[dict[str, list[int]]]:
    """Tokenise each text once (truncated to max_length), unpadded."""
    enc = tok(texts, truncation=True, max_length=max_length)
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc]
    return [{k: enc[k][i] for k in keys} for i in range(len(texts))]


def pad_batch(
    tok, enc: list[dict], ids: list[int], *, side: str = "right", full_pad_row: bool = False, positions: bool = False
) -> Batch:
    """A batch of the encoded texts `ids`, padded on `side`; optionally one extra row that is all padding,
    and explicit position_ids (cumsum of the mask) so that left padding keeps each token's position."""
    rows = [dict(enc[i]) for i in ids]
    texts = list(ids)
    if full_pad_row:
        n = max(len(r["input_ids"]) for r in rows)
        rows.append({k: [tok.pad_token_id if k == "input_ids" else 0] * n for k in rows[0]})
        texts.append(FULL_PAD)
    old = tok.padding_side
    tok.padding_side = side
    try:
        inputs = dict(tok.pad(rows, return_tensors="pt"))
    finally:
        tok.padding_side = old
    if full_pad_row:
        inputs["attention_mask"][-1] = 0
    if positions:
        inputs["position_ids"] = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return Batch(inputs, texts)


def length_batches(tok, enc: list[dict], ids: list[int], batch_size: int) -> list[Batch]:
    """Right-padded batches of `ids`, grouped by token length (less padding, as sentence-transformers does)."""
    order = sorted(ids, key=lambda i: (-len(enc[i]["input_ids"]), i))
    return [pad_batch(tok, enc, order[s : s + batch_size]) for s in range(0, len(order), batch_size)]


def max_length_rows(tok, texts: list[str], enc: list[dict], max_length: int, rows: int) -> list[dict[str, list[int]]]:
    """`rows` encodings of exactly max_length tokens, each of texts joined (cyclically) from a different
    start; `enc` holds the texts' own encodings, whose lengths say when a join is long enough to try."""
    out, n = [], len(texts)
    for r in range(rows):
        start = r * max(1, n // max(rows, 1))
        joined, total = [], 0
        for i in range(start, start + max_length + n):  # every text adds >= 1 token, so this bound suffices
            joined.append(texts[i % n])
            total += len(enc[i % n]["input_ids"])
            if total >= max_length + 8:  # a join may merge a few tokens: tokenise and check
                row = encode_texts(tok, [" ".join(joined)], max_length)[0]
                if len(row["input_ids"]) == max_length:
                    out.append(row)
                    break
    return out


def accepts_position_ids(model) -> bool:
    return "position_ids" in inspect.signature(model.forward).parameters


def run_batch(model, batch: Batch, device: str) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Hidden states of every layer ([B, L, H] each, index 0 the embeddings) and logits [B, L, V] or None."""
    inputs = {k: v.to(device) for k, v in batch.inputs.items()}
    with torch.inference_mode():
        out = model(**inputs, output_hidden_states=True, return_dict=True)
    return [h.detach() for h in out.hidden_states], getattr(out, "logits", None)


def valid_tokens(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The rows of h [B, L, H] at mask == 1, row-major: [T, H]."""
    return h[mask.to(h.device).bool()]


def pool(h: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """Sentence embedding [B, H] (float64) from h [B, L, H] over valid tokens, as sentence-transformers pools."""
    h = h.to(torch.float64)
    m = mask.to(h.device, torch.float64).unsqueeze(-1)
    n = m.sum(1).clamp(min=1)
    last = (mask.shape[1] - 1 - mask.flip(-1).to(torch.int64).argmax(-1)).to(h.device)
    first = mask.to(torch.int64).argmax(-1).to(h.device)
    rows = torch.arange(h.shape[0], device=h.device)
    if how == "mean":
        return (h * m).sum(1) / n
    if how == "mean_sqrt_len":
        return (h * m).sum(1) / n.sqrt()
    if how == "max":
        return torch.where(m.bool(), h, torch.finfo(h.dtype).min).amax(1) * (m.sum(1) > 0)
    if how == "cls":
        return h[rows, first]
    if how == "lasttoken":
        return h[rows, last]
    raise ValueError(f"pooling {how!r} is not supported; expected mean, mean_sqrt_len, max, cls or lasttoken")


def first_nonfinite(hidden: list[torch.Tensor], batch: Batch, where: str) -> dict | None:
    """Where NaN/Inf first appears: the lowest layer, then the first row and token (None: all finite)."""
    for layer, h in enumerate(hidden):
        bad = ~torch.isfinite(h).all(-1)  # [B, L]
        if bad.any():
            row, tok = (int(x) for x in bad.nonzero()[0])
            text = batch.texts[row]
            return {
                "where": where,
                "layer": layer,
                "text": None if text == FULL_PAD else text,
                "row": row,
                "token": tok,
                "fully_padded_row": text == FULL_PAD,
                "padding": not bool(batch.mask[row, tok]),
                "count": int(bad.sum()),
            }
    return None
