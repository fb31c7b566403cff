"""SmolLM2's layout in small: a Llama with 9 query heads over 3 KV groups and tied embeddings. Megatron
logits equal HF transformers' (fp32, <= 1e-4) at TP1 and TP3 (the TP sizes 3 KV heads allow), and an HF
export of the TP3 model gives back the HF tensors (no separate lm_head written for the tied head)."""

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import hf_logits, pipeline_forward, save_tiny_model, token_batch

SMOLLM2_SMALL = dict(hidden_size=72, intermediate_size=96, num_hidden_layers=2, num_attention_heads=9,
                     num_key_value_heads=3, head_dim=8, vocab_size=200, tie_word_embeddings=True,
                     rope_scaling=None, rope_theta=100000.0)


def _rank(path, ids, out_dir):
    from megatron_adapters.hf_safetensors import load_hf_weights, save_hf_weights
    from megatron_adapters.model import build_gpt, load_hf_config
    from megatron_adapters.process_groups import build_role_groups

    report = {}
    for tp in (1, 3):
        pg = build_role_groups(list(range(3)), tp=tp, pp=1, dp=3 // tp)
        model = build_gpt(path, pg, spec="sdpa")
        load_hf_weights(model, path)
        logits = pipeline_forward(model, ids)
        report[tp] = logits[..., :SMOLLM2_SMALL["vocab_size"]]
        if tp == 3:
            save_hf_weights(model, out_dir, load_hf_config(path))
    dist.barrier()
    return report


def test_tied_gqa_9_over_3_matches_hf_at_tp1_and_tp3(tmp_path):
    model = save_tiny_model("llama", tmp_path / "hf", seed=7, **SMOLLM2_SMALL)
    ids = token_batch(SMOLLM2_SMALL["vocab_size"])
    reference = hf_logits(model, ids)
    reports = run_distributed(_rank, 3, args=(str(tmp_path / "hf"), ids, str(tmp_path / "export")))
    for report in reports:
        for tp, logits in report.items():
            diff = (logits - reference).abs().max().item()
            assert diff <= 1e-4, f"tp{tp}: max abs diff {diff}"
    exported = {k: v for f in (tmp_path / "export").glob("*.safetensors") for k, v in load_file(f).items()}
    original = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: not a tensor of its own
    assert set(exported) == set(original)
    assert all(torch.equal(exported[k], v) for k, v in original.items())
