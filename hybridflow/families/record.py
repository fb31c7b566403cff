"""The model-family record and its registry: a family registers one ``ModelFamily``; everyone looks it up.

The planner (hybridflow.config, hybridflow.placement), megatron_adapters (model building, the weight map, the
vLLM layout), the trainer (random checkpoints), the GGUF converter and the benchmarks ask the record; nothing else
tests an architecture name. This module imports only the standard library, its own package and the leaf
hybridflow.registry (one lookup convention: an unknown name is one UserError line listing the known ones).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from hybridflow.families.layout import Layout, WeightMapping
from hybridflow.registry import Registry

# vLLM's fused modules (its Llama-style models' `stacked_params_mapping`): the HF projections it stacks and
# the fused module's name (`model.layers.i.self_attn.qkv_proj`, `model.layers.i.mlp.gate_up_proj`).
VLLM_STACKED = MappingProxyType({Layout.QKV: "qkv_proj", Layout.GATE_UP: "gate_up_proj"})


@dataclass(frozen=True)
class ModelFamily:
    """Everything hybridflow knows about one decoder family, in one place.

    Attributes:
        model_type: HF `config.json` `model_type` (also the family's registry name), e.g. "qwen3".
        causal_lm: HF `architectures[0]` of the language model, e.g. "Qwen3ForCausalLM".
        sequence_classification: HF architecture of its reward-model form (a `score` head).
        layer_weights: the HF <-> megatron rows of decoder layer `i` (`weights.decoder_layer_weights` plus
            whatever the family adds: qkv biases, q/k norms).
        qkv_bias: q, k, v projections carry a bias (always, whatever the config says).
        qk_norm: per-head RMSNorm on queries and keys before RoPE (megatron `qk_layernorm`).
        sliding_window_always: a set `sliding_window` applies to every layer (Mistral); otherwise only with
            `use_sliding_window: true`.
        gguf_architecture: GGUF `general.architecture` that transformers' GGUF loader turns into this family
            (None: no GGUF path).
        vllm_stacked: which layouts vLLM holds as one fused parameter, and that parameter's module name.
    """

    model_type: str
    causal_lm: str
    sequence_classification: str
    layer_weights: Callable[[ModelShape, int], list[WeightMapping]]
    qkv_bias: bool = False
    qk_norm: bool = False
    sliding_window_always: bool = False
    gguf_architecture: str | None = None
    vllm_stacked: Mapping[Layout, str] = field(default=VLLM_STACKED)

    @property
    def name(self) -> str:
        """The registry name: `model_type`."""
        return self.model_type

    @property
    def architectures(self) -> tuple[str, str]:
        """The HF architecture names this family builds (causal LM, sequence classification)."""
        return self.causal_lm, self.sequence_classification


@dataclass(frozen=True)
class ModelShape:
    """What the weight table and the heads need to know about an HF model, independent of parallelism.

    It lives beside ``ModelFamily`` because each refers to the other (a family's ``layer_weights`` reads a
    shape; a shape names its family): one module, no import circle. ``shape.shape_from_hf`` makes one."""

    family: str  # the family's model_type
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool

    @property
    def record(self) -> ModelFamily:
        """The family record this shape belongs to."""
        return family(self.family)

    @property
    def qkv_bias(self) -> bool:
        return self.record.qkv_bias

    @property
    def qk_norm(self) -> bool:
        return self.record.qk_norm

    @property
    def q_dim(self) -> int:
        """Width of all query heads together (num_heads x head_dim; not always hidden_size)."""
        return self.num_heads * self.head_dim


_FAMILIES: Registry[ModelFamily] = Registry("family", "model_type")
_BY_ARCHITECTURE: Registry[ModelFamily] = Registry("family", "architectures")


def register_family(record: ModelFamily) -> ModelFamily:
    """Add `record` to the registry (by its name, model_type, and by both architecture names); returns it."""
    taken = [name for name in (record.name, *record.architectures)
             if name in _FAMILIES or name in _BY_ARCHITECTURE]
    if taken:
        raise ValueError(f"register_family: {', '.join(taken)} already registered; give the family new names")
    _FAMILIES.add(record.name, record)
    for arch in record.architectures:
        _BY_ARCHITECTURE.add(arch, record)
    return record


def family(model_type: str) -> ModelFamily:
    """The family registered under HF `model_type`; UserError naming the registered ones otherwise."""
    return _FAMILIES.get(model_type)


def family_for_architecture(architecture: str) -> ModelFamily:
    """The family whose causal-LM or sequence-classification architecture is `architecture`."""
    return _BY_ARCHITECTURE.get(architecture)


def registered_families() -> tuple[ModelFamily, ...]:
    """Every registered family, in registration order."""
    return _FAMILIES.records()


def causal_lm_architectures() -> tuple[str, ...]:
    """HF architecture names of the language models (what a policy may be)."""
    return tuple(f.causal_lm for f in registered_families())


def supported_architectures() -> tuple[str, ...]:
    """Every HF architecture name a role may load (causal LMs, then their sequence-classification forms)."""
    return (*causal_lm_architectures(), *(f.sequence_classification for f in registered_families()))


def family_for_gguf(gguf_architecture: str) -> ModelFamily | None:
    """The family transformers' GGUF loader makes of GGUF `general.architecture`, or None."""
    return next((f for f in registered_families() if f.gguf_architecture == gguf_architecture), None)
