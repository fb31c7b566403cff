"""The HF <-> megatron-core parameter-name map of a decoder: the rows every family shares, and the table.

Every parameter of a megatron-core GPT built by ``megatron_adapters.model.build_gpt`` has one
``WeightMapping``: its megatron name (local-spec spelling, *global* layer index), the HF tensor(s) it is made
of, its ``Layout`` and canonical shape, and the global layer. A family's ``layer_weights`` returns
``decoder_layer_weights`` plus its own rows; loading, export, dist-checkpoint conversion and the resharding
bridge all read ``weight_table``; nothing else string-matches weight names.
"""

from __future__ import annotations

from hybridflow.families.layout import Layout, WeightMapping
from hybridflow.families.shape import ModelShape


def layer_prefixes(i: int) -> tuple[str, str]:
    """(megatron, HF) name prefixes of decoder layer `i`."""
    return f"decoder.layers.{i}.", f"model.layers.{i}."


def decoder_layer_weights(shape: ModelShape, i: int) -> list[WeightMapping]:
    """The rows of a Llama-style layer: pre-norm GQA attention (no biases) and a SwiGLU MLP."""
    m, h = layer_prefixes(i)
    h_, f = shape.hidden_size, shape.ffn_hidden_size
    qkv_rows = (shape.num_heads + 2 * shape.num_kv_heads) * shape.head_dim
    attn = tuple(f"{h}self_attn.{p}_proj.weight" for p in "qkv")
    return [
        WeightMapping(m + "input_layernorm.weight", (h + "input_layernorm.weight",), Layout.REPLICATED, (h_,), i),
        WeightMapping(m + "self_attention.linear_qkv.weight", attn, Layout.QKV, (qkv_rows, h_), i),
        WeightMapping(m + "self_attention.linear_proj.weight", (h + "self_attn.o_proj.weight",), Layout.ROW,
                      (h_, shape.q_dim), i),
        WeightMapping(m + "pre_mlp_layernorm.weight", (h + "post_attention_layernorm.weight",), Layout.REPLICATED,
                      (h_,), i),
        WeightMapping(m + "mlp.linear_fc1.weight", (h + "mlp.gate_proj.weight", h + "mlp.up_proj.weight"),
                      Layout.GATE_UP, (2 * f, h_), i),
        WeightMapping(m + "mlp.linear_fc2.weight", (h + "mlp.down_proj.weight",), Layout.ROW, (h_, f), i),
    ]


def weight_table(shape: ModelShape, head: str = "lm") -> list[WeightMapping]:
    """Every parameter of the whole model (all layers, all stages), in HF file order."""
    h, v = shape.hidden_size, shape.vocab_size
    table = [WeightMapping("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), Layout.VOCAB, (v, h))]
    for i in range(shape.num_layers):
        table += shape.record.layer_weights(shape, i)
    table.append(WeightMapping("decoder.final_layernorm.weight", ("model.norm.weight",), Layout.REPLICATED, (h,)))
    if head != "lm":
        table.append(WeightMapping("output_layer.weight", ("score.weight",), Layout.REPLICATED, (1, h)))
    elif shape.tie_word_embeddings:
        table.append(WeightMapping("output_layer.weight", ("model.embed_tokens.weight",), Layout.VOCAB, (v, h),
                                   tied=True))
    else:
        table.append(WeightMapping("output_layer.weight", ("lm_head.weight",), Layout.VOCAB, (v, h)))
    return table


def local_name(entry: WeightMapping, layer_offset: int) -> str:
    """The megatron name on a pipeline stage whose first layer is global layer ``layer_offset``."""
    if entry.layer is None:
        return entry.mcore
    prefix = f"decoder.layers.{entry.layer}."
    return f"decoder.layers.{entry.layer - layer_offset}." + entry.mcore[len(prefix) :]
