"""Model families: one registered ``ModelFamily`` record per decoder family owns its facts.

A record holds the HF architecture names (causal LM and sequence classification) and `model_type`, the
shape rules (qkv bias, q/k norm, sliding window), the HF <-> megatron weight rows of a layer, the vLLM
layout facts and the GGUF architecture name; the shape of a checkpoint (`shape_from_hf`, with the one
head_dim rule) comes from here too. Looked up by name: `family(model_type)`,
`family_for_architecture(name)`. This package is a leaf: it imports only the standard library and the
leaves hybridflow.registry and hybridflow.errors, so hybridflow.config, hybridflow.placement and
megatron_adapters may all import it.

Adding a family = one module here that calls `register_family` (docs/extending.md), plus its import below.
"""

from hybridflow.families import llama, mistral, qwen2, qwen3  # noqa: F401  (each registers its family)
from hybridflow.families.layout import Layout, WeightMapping
from hybridflow.families.record import (
    ModelFamily,
    causal_lm_architectures,
    family,
    family_for_architecture,
    family_for_gguf,
    register_family,
    registered_families,
    supported_architectures,
)
from hybridflow.families.shape import (
    HF_CONFIG_FILE,
    VOCAB_DIVISIBLE_BY,
    ModelShape,
    family_of_hf,
    padded_vocab_size,
    read_hf_config,
    resolved_head_dim,
    shape_from_hf,
)
from hybridflow.families.weights import decoder_layer_weights, local_name, weight_table

__all__ = [
    "HF_CONFIG_FILE", "VOCAB_DIVISIBLE_BY", "Layout", "ModelFamily", "ModelShape", "WeightMapping",
    "causal_lm_architectures", "decoder_layer_weights", "family", "family_for_architecture", "family_for_gguf",
    "family_of_hf", "local_name", "padded_vocab_size", "read_hf_config", "register_family", "registered_families",
    "resolved_head_dim", "shape_from_hf", "supported_architectures", "weight_table",
]
