"""Tiny megatron-core GPTModels for runtime tests, and copying a full (TP1 x PP1) model into TP x PP shards.

Built directly with megatron-core's GPTModel + local layer spec (until megatron_adapters.model.build_gpt is
the shared way). The sharded copy relies on megatron's own parameter attributes (`tensor_model_parallel`,
`partition_dim`) and on the fused QKV being laid out per query group, so a TP shard is a contiguous chunk of
the TP1 tensor.

Device: models and micro-batches land on `megatron_adapters.cpu_backend.compute_device()` (the CPU under the
CPU backend, the rank's GPU under nccl); random data still comes from CPU generators, so it is the same on
both.
"""

from __future__ import annotations

import re

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig

from megatron_adapters.cpu_backend import compute_device

VOCAB = 64
SEQ = 8
LAYERS = 4


def tiny_config(tp: int, pp: int, **overrides) -> TransformerConfig:
    settings = dict(
        num_layers=LAYERS,
        hidden_size=32,
        num_attention_heads=4,
        ffn_hidden_size=64,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        add_bias_linear=True,
    )
    settings.update(overrides)
    return TransformerConfig(**settings)


def tiny_gpt(pgs, tied: bool = True, **overrides) -> GPTModel:
    """This rank's stage of a tiny GPT over the role groups `pgs` (tied embeddings use the embd group).

    With `use_cpu_initialization` (the default) the weights are drawn on the CPU, as before, and the model is
    then moved to `compute_device()` like megatron's `get_model()` does (a no-op under the CPU backend).
    """
    tp, pp = pgs.tp.size(), pgs.pp.size()
    config = tiny_config(tp, pp, **overrides)
    model = GPTModel(
        config,
        get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pg_collection=pgs,
        pre_process=pgs.pp.rank() == 0,
        post_process=pgs.pp.rank() == pp - 1,
        share_embeddings_and_output_weights=tied,
    )
    device = compute_device()
    if config.use_cpu_initialization and device.type != "cpu":
        model.cuda(device)
    return model


def full_name(local_name: str, pp_rank: int, layers_per_stage: int, reference_names) -> str:
    """The TP1 x PP1 name of a stage-local parameter (layer numbers are local to each stage)."""
    if local_name == "output_layer.weight" and local_name not in reference_names:
        return "embedding.word_embeddings.weight"  # the last stage's copy of the tied embedding
    match = re.match(r"decoder\.layers\.(\d+)\.(.*)", local_name)
    if match:
        return f"decoder.layers.{int(match.group(1)) + pp_rank * layers_per_stage}.{match.group(2)}"
    return local_name


def shard_of(full: torch.Tensor, param: torch.nn.Parameter, tp_rank: int, tp: int) -> torch.Tensor:
    if getattr(param, "tensor_model_parallel", False) and tp > 1:
        return full.chunk(tp, dim=param.partition_dim)[tp_rank]
    return full


def copy_into_shards(model: torch.nn.Module, reference_state: dict[str, torch.Tensor], pgs) -> None:
    """Overwrite every parameter of this rank's stage with its shard of `reference_state` (full model)."""
    pp_rank, tp_rank, tp = pgs.pp.rank(), pgs.tp.rank(), pgs.tp.size()
    per_stage = LAYERS // pgs.pp.size()
    with torch.no_grad():
        for name, param in model.named_parameters():
            name = name.removeprefix("module.")
            source = reference_state[full_name(name, pp_rank, per_stage, reference_state)]
            shard = shard_of(source, param, tp_rank, tp)
            assert shard.shape == param.shape, (name, shard.shape, param.shape)
            param.copy_(shard)


def sharded_view(model: torch.nn.Module, reference_state: dict[str, torch.Tensor], pgs):
    """(name, local tensor, matching shard of `reference_state`) for every parameter of this stage."""
    pp_rank, tp_rank, tp = pgs.pp.rank(), pgs.tp.rank(), pgs.tp.size()
    per_stage = LAYERS // pgs.pp.size()
    for name, param in model.named_parameters():
        name = name.removeprefix("module.")
        source = reference_state[full_name(name, pp_rank, per_stage, reference_state)]
        yield name, param.detach(), shard_of(source, param, tp_rank, tp)


def micro_batches(
    count: int, batch: int = 2, seed: int = 0, device: torch.device | str | None = None
) -> list[dict[str, torch.Tensor]]:
    """`count` micro-batches of random ids (a CPU generator: the same ids on every device), on `device`
    (default `compute_device()`)."""
    device = compute_device() if device is None else device
    generator = torch.Generator().manual_seed(seed)
    return [
        {"input_ids": torch.randint(0, VOCAB, (batch, SEQ), generator=generator).to(device)}
        for _ in range(count)
    ]
