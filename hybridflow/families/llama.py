"""Llama 2 / 3 / 3.1 (llama3 rope scaling): the reference Llama-style decoder, no biases."""

from hybridflow.families.record import ModelFamily, register_family
from hybridflow.families.weights import decoder_layer_weights

LLAMA = register_family(ModelFamily(
    model_type="llama",
    causal_lm="LlamaForCausalLM",
    sequence_classification="LlamaForSequenceClassification",
    layer_weights=decoder_layer_weights,
    gguf_architecture="llama",
))
