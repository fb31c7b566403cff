"""The HF <-> megatron weight table: coverage of HF names, exact layout inverses, slice-only reads."""

import pytest
import torch
from transformers import GPT2Config

from hybridflow.errors import UserError
from megatron_adapters.hf_weights import (
    Layout,
    ShardSpec,
    hf_to_mcore_shard,
    mcore_full_to_hf,
    weight_table,
)
from megatron_adapters.model import model_shape, padded_vocab_size
from tests.megatron_adapters.tiny_hf_models import KINDS, LLAMA, QWEN2


def _hf_state(kind):
    config_cls, model_cls, base = KINDS[kind]
    torch.manual_seed(0)
    return config_cls(**base), {k: v.clone() for k, v in model_cls(config_cls(**base)).state_dict().items()}


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_table_covers_exactly_the_hf_tensors(kind):
    config, state = _hf_state(kind)
    table = weight_table(model_shape(config))
    names = {n for e in table if not e.tied for n in e.hf}
    expected = set(state) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    assert names == expected
    assert len({e.mcore for e in table}) == len(table)
    biases = [e for e in table if e.mcore.endswith("linear_qkv.bias")]
    assert len(biases) == (config.num_hidden_layers if kind == "qwen2" else 0)


class _RecordingReader:
    """In-memory stand-in for SafetensorsReader.read that records how many elements each call returns."""

    def __init__(self, tensors):
        self.tensors, self.read_elements = tensors, 0

    def __call__(self, name, dim, start, stop):
        t = self.tensors[name]
        out = t if dim is None else t.narrow(dim, start, stop - start)
        self.read_elements += out.numel()
        return out.clone()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shards_invert_exactly_and_read_only_their_slice(kind, tp):
    config, state = _hf_state(kind)
    shape = model_shape(config)
    padded = padded_vocab_size(shape.vocab_size, tp)
    for entry in weight_table(shape):
        shards, reads = [], []
        for rank in range(tp):
            reader = _RecordingReader(state)
            shards.append(hf_to_mcore_shard(entry, reader, shape, ShardSpec(tp, rank, padded)))
            reads.append(reader.read_elements)
        source = sum(state[n].numel() for n in entry.hf)
        if entry.tp_dim is None:
            assert all(torch.equal(s, shards[0]) for s in shards)
            full = shards[0]
        else:
            full = torch.cat(shards, dim=entry.tp_dim)
            if entry.layout is not Layout.VOCAB:
                assert reads == [source // tp] * tp, entry.mcore  # each rank reads exactly its 1/tp
        assert sum(reads) <= source * (1 if entry.tp_dim is not None else tp)
        back = mcore_full_to_hf(entry, full, shape, tp)
        assert set(back) == set(entry.hf)
        for name, tensor in back.items():
            assert torch.equal(tensor, state[name]), (entry.mcore, name)


def test_qkv_shard_is_grouped_per_query_group():
    """Hand formula: TP rank 1 of 2 holds groups 2,3; each group is [q heads 2g, 2g+1 | k_g | v_g]."""
    _, state = _hf_state("llama")
    shape = model_shape(KINDS["llama"][0](**LLAMA))
    d = shape.head_dim
    entry = next(
        e for e in weight_table(shape) if e.mcore == "decoder.layers.0.self_attention.linear_qkv.weight"
    )
    shard = hf_to_mcore_shard(entry, _RecordingReader(state), shape, ShardSpec(2, 1, 256))
    q, k, v = (state[n] for n in entry.hf)
    expected = torch.cat(
        [
            torch.cat([q[2 * g * d : (2 * g + 2) * d], k[g * d : (g + 1) * d], v[g * d : (g + 1) * d]])
            for g in (2, 3)
        ]
    )
    assert torch.equal(shard, expected)


def test_gate_up_shard_is_gate_then_up():
    _, state = _hf_state("qwen2")
    shape = model_shape(KINDS["qwen2"][0](**QWEN2))
    entry = next(e for e in weight_table(shape) if e.mcore == "decoder.layers.1.mlp.linear_fc1.weight")
    shard = hf_to_mcore_shard(entry, _RecordingReader(state), shape, ShardSpec(4, 3, 512))
    f = shape.ffn_hidden_size // 4
    gate, up = (state[n] for n in entry.hf)
    assert torch.equal(shard, torch.cat([gate[3 * f :], up[3 * f :]]))


def test_vocab_padding_follows_megatron_rule():
    assert padded_vocab_size(250, 1) == 256
    assert padded_vocab_size(250, 4) == 512
    assert padded_vocab_size(128256, 8) == 129024


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(
        UserError, match="^architectures: 'GPT2LMHeadModel' is unknown; use one of LlamaForCausalLM.*Qwen3ForCausalLM"
    ):
        model_shape(GPT2Config(architectures=["GPT2LMHeadModel"]))
