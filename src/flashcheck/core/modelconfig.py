"""A model folder's config.json (Hugging Face), read through the bounded JSON reader with the fields flashcheck and
transformers read checked for their type: a mistyped field is one line naming the file and the field, not a
TypeError from deep inside transformers."""

from __future__ import annotations

from pathlib import Path

from flashcheck.core.jsonguard import read_json

INT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
    "head_dim",
    "n_positions",
    "n_embd",
    "n_layer",
    "n_head",
    "n_inner",
    "n_ctx",
)
FLOAT_FIELDS = (
    "layer_norm_eps",
    "layer_norm_epsilon",
    "rms_norm_eps",
    "initializer_range",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "rope_theta",
)
STR_FIELDS = ("model_type", "hidden_act", "activation_function", "torch_dtype", "dtype")


def _kind(value: object) -> str:
    return "a boolean" if isinstance(value, bool) else f"{type(value).__name__} {value!r}"[:80]


def field_problem(cfg: dict) -> str | None:
    """The first field of `cfg` whose value has the wrong type ("field 'x' is str 'big'; expected an integer"),
    else None. null is allowed (transformers then uses its default)."""
    for key in INT_FIELDS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            return f"field {key!r} is {_kind(v)}; expected a non-negative integer"
    for key in FLOAT_FIELDS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            return f"field {key!r} is {_kind(v)}; expected a number"
    for key in STR_FIELDS:
        v = cfg.get(key)
        if v is not None and not isinstance(v, str):
            return f"field {key!r} is {_kind(v)}; expected a string"
    archs = cfg.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        return f"field 'architectures' is {_kind(archs)}; expected a list of class names"
    return None


def read_model_config(path: str | Path) -> dict:
    """config.json at `path` as a dict; ValueError of one line naming the file (unreadable, nested too deep, not
    JSON, not an object) or the file and its mistyped field."""
    cfg = read_json(path, "a model's configuration")
    if not isinstance(cfg, dict):
        raise ValueError(f"{str(path)!r} does not hold a JSON object (a model's configuration)")
    if (why := field_problem(cfg)) is not None:
        raise ValueError(f"{str(path)!r}: {why}")
    return cfg
