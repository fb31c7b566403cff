"""vLLM's own model classes hold exactly the bridge's output (GPU with vLLM installed; skipped otherwise).

vLLM loads a small random HF checkpoint (from the tests' tiny-model factory) with its own loader; the bridge
reshards the same weights from a megatron TP1 layout (built with the models helper's loader transform); every
vLLM parameter must match.
"""

from __future__ import annotations

import os

import pytest
import torch

from hybridflow.placement import ParallelDims, RoleMesh
from megatron_adapters.bridge import TargetFormat, WeightBridge, build_reshard_plan
from megatron_adapters.hf_weights import ShardSpec, hf_to_mcore_shard
from megatron_adapters.model import model_shape, padded_vocab_size
from tests.megatron_adapters.bridge.bridge_fixtures import hf_reader
from tests.megatron_adapters.tiny_hf_models import save_tiny_model

pytestmark = pytest.mark.gpu


def _vllm_parameters(model_dir: str) -> dict[str, torch.Tensor]:
    vllm = pytest.importorskip("vllm")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    # fp32 as saved (vLLM would downcast to bf16), so the comparison below can be exact
    llm = vllm.LLM(model=model_dir, tensor_parallel_size=1, enforce_eager=True, gpu_memory_utilization=0.2,
                   dtype="float32", skip_tokenizer_init=True)  # the checkpoint has weights and config only
    per_worker = llm.apply_model(lambda model: {n: p.detach().cpu() for n, p in model.named_parameters()})
    return per_worker[0]


# head_dim 16 (4 query heads over 2 KV groups): vLLM's fp32 attention backends take it. The Qwen3 case has
# per-head q/k norms and head_dim 32 != hidden 64 / 4 heads.
VLLM_CASES = {
    "llama": dict(num_attention_heads=4, num_key_value_heads=2),
    "qwen3": dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=False),
}


@pytest.mark.parametrize("kind", sorted(VLLM_CASES))
def test_vllm_holds_the_bridge_output(tmp_path, kind):
    pytest.importorskip("vllm")
    import torch.distributed as dist

    hf = save_tiny_model(kind, tmp_path, **VLLM_CASES[kind])
    state = {n: t.detach() for n, t in hf.state_dict().items()}
    held = _vllm_parameters(str(tmp_path))

    if not dist.is_initialized():  # vLLM in-process normally initialises a 1-rank world itself
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    shape = model_shape(hf.config)
    plan = build_reshard_plan(RoleMesh("actor", (0,), ParallelDims(1, 1, 1)),
                              RoleMesh("rollout", (0,), ParallelDims(1, 1, 1)))
    bridge = WeightBridge(plan, shape, TargetFormat.VLLM, dtype=torch.float32, device=torch.device("cpu"))
    spec = ShardSpec(1, 0, padded_vocab_size(shape.vocab_size, 1))
    src = {t.entry.mcore: hf_to_mcore_shard(t.entry, hf_reader(state), shape, spec) for t in bridge.tensors}
    out, _ = bridge.reshard(src)
    assert sorted(out) == sorted(held)
    for name, tensor in held.items():
        assert tuple(tensor.shape) == tuple(out[name].shape), name
        assert torch.equal(tensor, out[name]), name
