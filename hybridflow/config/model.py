"""Model architecture config: field names mirror Hugging Face `config.json`."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from hybridflow.errors import UserError

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
DTYPES = ("bf16", "fp32", "fp16")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass
class ModelConfig:
    """A decoder-only transformer. When `path` is set, its `config.json` overrides the shape fields."""

    architecture: str = "LlamaForCausalLM"
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 128
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    path: str | None = None
    dtype: str = "bf16"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


# HF config.json keys that carry our shape fields (Qwen2 sets attention bias implicitly).
_HF_SHAPE_FIELDS = tuple(f.name for f in fields(ModelConfig) if f.name not in ("architecture", "path", "dtype"))


def apply_hf_checkpoint(model: ModelConfig, field: str) -> ModelConfig:
    """Return `model` with its shape read from `model.path/config.json` (the checkpoint is the truth)."""
    if model.path is None:
        return model
    config_file = Path(model.path) / "config.json"
    if not config_file.is_file():
        raise UserError(f"{field}.path: {model.path!r} has no config.json; point it at a local HF model directory")
    hf = json.loads(config_file.read_text())
    values = {name: hf[name] for name in _HF_SHAPE_FIELDS if name in hf}
    architectures = hf.get("architectures") or [model.architecture]
    values["architecture"] = architectures[0]
    if values["architecture"] == "Qwen2ForCausalLM":
        values.setdefault("attention_bias", True)
    values.setdefault("num_key_value_heads", values.get("num_attention_heads", model.num_attention_heads))
    return ModelConfig(**{**model.__dict__, **values})


def validate_model(model: ModelConfig, field: str) -> None:
    """Check the architecture and shape fields that every later stage relies on."""
    if model.architecture not in SUPPORTED_ARCHITECTURES:
        raise UserError(
            f"{field}.architecture: {model.architecture!r} is not supported; use one of "
            + ", ".join(SUPPORTED_ARCHITECTURES)
        )
    if model.dtype not in DTYPES:
        raise UserError(f"{field}.dtype: {model.dtype!r} is unknown; use one of {', '.join(DTYPES)}")
    for name in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
    ):
        if getattr(model, name) < 1:
            raise UserError(f"{field}.{name}: must be >= 1, got {getattr(model, name)}; set a positive integer")
    if model.hidden_size % model.num_attention_heads:
        raise UserError(
            f"{field}.hidden_size: {model.hidden_size} is not divisible by num_attention_heads="
            f"{model.num_attention_heads}; pick a multiple"
        )
    if model.num_attention_heads % model.num_key_value_heads:
        raise UserError(
            f"{field}.num_key_value_heads: {model.num_key_value_heads} does not divide num_attention_heads="
            f"{model.num_attention_heads}; use a divisor"
        )
