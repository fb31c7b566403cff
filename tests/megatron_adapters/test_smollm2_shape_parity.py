"""SmolLM2's layout in small: a Llama with 9 query heads over 3 KV groups and tied embeddings. Megatron
logits equal HF transformers' (fp32, <= 1e-4) at TP1 and TP3 (the TP sizes 3 KV heads allow); the bridge
reshards the TP1 actor into exactly the TP3 model's tensors; an HF export of the TP3 model gives back the HF
tensors (no separate lm_head written for the tied head)."""

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import hf_logits, pipeline_forward, save_tiny_model, token_batch

SMOLLM2_SMALL = dict(hidden_size=72, intermediate_size=96, num_hidden_layers=2, num_attention_heads=9,
                     num_key_value_heads=3, head_dim=8, vocab_size=200, tie_word_embeddings=True,
                     rope_scaling=None, rope_theta=100000.0)


def _rank(path, ids, out_dir):
    from hybridflow.placement import ParallelDims, RoleMesh
    from megatron_adapters.bridge import (
        TargetFormat,
        WeightBridge,
        build_reshard_plan,
        training_shards,
    )
    from megatron_adapters.hf_safetensors import load_hf_weights, save_hf_weights
    from megatron_adapters.model import build_gpt, load_hf_config, model_shape
    from megatron_adapters.process_groups import build_role_groups

    report, models, ranks = {}, {}, tuple(range(3))
    for tp in (1, 3):
        pg = build_role_groups(list(ranks), tp=tp, pp=1, dp=3 // tp)
        models[tp] = model = build_gpt(path, pg, spec="sdpa")
        load_hf_weights(model, path)
        logits = pipeline_forward(model, ids)
        report[tp] = logits[..., :SMOLLM2_SMALL["vocab_size"]]
    save_hf_weights(models[3], out_dir, load_hf_config(path))
    # The actor at TP1 x DP3 -> the native rollout layout at TP3 (what a TP3 rollout under a TP1 actor gets).
    plan = build_reshard_plan(RoleMesh("actor", ranks, ParallelDims(1, 1, 3)),
                              RoleMesh("rollout", ranks, ParallelDims(3, 1, 1)))
    bridge = WeightBridge(plan, model_shape(path), TargetFormat.MEGATRON, dtype=torch.float32)
    bridged, _ = bridge.reshard(training_shards(models[1]))
    own = training_shards(models[3])
    report["bridge"] = (sorted(bridged) == sorted(own), all(torch.equal(bridged[n], own[n]) for n in own))
    dist.barrier()
    return report


def test_tied_gqa_9_over_3_matches_hf_at_tp1_and_tp3(tmp_path):
    model = save_tiny_model("llama", tmp_path / "hf", seed=7, **SMOLLM2_SMALL)
    ids = token_batch(SMOLLM2_SMALL["vocab_size"])
    reference = hf_logits(model, ids)
    reports = run_distributed(_rank, 3, args=(str(tmp_path / "hf"), ids, str(tmp_path / "export")))
    for report in reports:
        assert report.pop("bridge") == (True, True)
        for tp, logits in report.items():
            diff = (logits - reference).abs().max().item()
            assert diff <= 1e-4, f"tp{tp}: max abs diff {diff}"
    exported = {k: v for f in (tmp_path / "export").glob("*.safetensors") for k, v in load_file(f).items()}
    original = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: not a tensor of its own
    assert set(exported) == set(original)
    assert all(torch.equal(exported[k], v) for k, v in original.items())
