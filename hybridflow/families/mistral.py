"""Mistral: the Llama layer with sliding-window attention whenever `sliding_window` is set."""

from hybridflow.families.record import ModelFamily, register_family
from hybridflow.families.weights import decoder_layer_weights

MISTRAL = register_family(ModelFamily(
    model_type="mistral",
    causal_lm="MistralForCausalLM",
    sequence_classification="MistralForSequenceClassification",
    layer_weights=decoder_layer_weights,
    sliding_window_always=True,
))
