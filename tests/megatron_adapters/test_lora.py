"""LoRA on the megatron path against HF PEFT (the independent reference), fp32 on gloo, TP 1/2 x PP 1/2.

The parent builds a tiny GQA Llama (and a Qwen3: q/k norms, head_dim 16 != hidden / heads, tied embeddings),
puts PEFT LoRA on all seven projections with random *nonzero* A and B,
saves that adapter, and records PEFT's logits, per-token-loss gradients, merged weights (`merge_and_unload`)
and the base model's logits. Each rank builds the same model with `build_gpt(lora=...)`, loads the base
checkpoint and the PEFT adapter, and checks: logits == PEFT's; adapters off == the base model; only adapter
parameters get gradients, and they equal PEFT's; merged export == PEFT's merged weights; its own PEFT export
loads in PEFT (`PeftModel.from_pretrained`) and gives PEFT's logits again.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import hf_logits, pipeline_forward, save_tiny_model, tiny_model, token_batch

peft = pytest.importorskip("peft")

TOLERANCE = 1e-4
RANK, ALPHA = 4, 8.0
HF_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LAYOUTS = {1: [(1, 1)], 2: [(2, 1), (1, 2)]}


def _peft_model(base):
    config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=HF_TARGETS)
    model = peft.get_peft_model(base, config)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:  # B nonzero too: the zero init would hide every B-side mapping bug
                param.copy_(0.2 * torch.randn(param.shape, generator=gen))
    return model.eval()


def _peft_grads(model, ids):
    logits = model(ids).logits
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1), reduction="sum").backward()
    # PEFT's in-memory names carry the adapter name; its files do not.
    return {n.replace(".default", ""): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def reference(request, tmp_path_factory):
    kind = request.param
    root = tmp_path_factory.mktemp(f"lora_{kind}")
    base = save_tiny_model(kind, root / "base", seed=1)
    ids = token_batch(base.config.vocab_size)
    base_logits = hf_logits(base, ids)
    model = _peft_model(tiny_model(kind, seed=1))
    model.save_pretrained(root / "adapter")
    peft_logits = hf_logits(model, ids)
    grads = _peft_grads(model, ids)
    merged = {k: v.detach().clone() for k, v in model.merge_and_unload().state_dict().items()}
    return dict(kind=kind, root=root, ids=ids, base_logits=base_logits, peft_logits=peft_logits, grads=grads,
                merged=merged, tied=base.config.tie_word_embeddings)


def _lora_rank(root, ids, layouts, peft_logits, base_logits):
    import torch.distributed as dist

    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.hf_safetensors import load_hf_weights, save_hf_weights
    from megatron_adapters.logprobs import token_logprobs
    from megatron_adapters.lora import LoraSettings, adapters_disabled, adapters_merged, is_adapter_param
    from megatron_adapters.model import build_gpt
    from megatron_adapters.peft_export import load_peft_adapter, save_peft_adapter
    from megatron_adapters.process_groups import build_role_groups

    world = dist.get_world_size()
    report = []
    for tp, pp in layouts:
        tag = f"tp{tp}_pp{pp}"
        pg = build_role_groups(list(range(world)), tp=tp, pp=pp, dp=world // (tp * pp))
        model = build_gpt(root / "base", pg, spec="sdpa", lora=LoraSettings(rank=RANK, alpha=ALPHA))
        load_hf_weights(model, root / "base")
        load_peft_adapter(model, root / "adapter")
        logits = pipeline_forward(model, ids)
        with adapters_disabled(model):
            off = pipeline_forward(model, ids)
        with adapters_merged(model):
            merged_logits = pipeline_forward(model, ids)
            save_hf_weights(model, root / f"merged_{tag}", root / "base")
        again = pipeline_forward(model, ids)  # adapters back on, base weights restored
        save_peft_adapter(model, root / f"export_{tag}", base_model_name_or_path=str(root / "base"))
        trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
        frozen_ok = all(is_adapter_param(p) == p.requires_grad for p in model.parameters())
        # the summed per-token loss through megatron's pipeline schedule (all stages' adapters get gradients)
        run_forward_backward([model], pg, [{"input_ids": ids}],
                             lambda out, b, tp_group=pg.tp: (-token_logprobs(out, b["input_ids"], tp_group).sum(), {}))
        got_grad = sorted(n for n, p in model.named_parameters() if p.grad is not None)
        with torch.no_grad():  # the gradients in the adapters' place, exported in PEFT's layout
            for p in model.parameters():
                if p.grad is not None:
                    p.copy_(p.grad)
        save_peft_adapter(model, root / f"grads_{tag}")
        if logits is not None and pg.tp.rank() == 0:
            vocab = peft_logits.shape[-1]
            report.append(dict(
                tag=tag,
                peft=(logits[..., :vocab] - peft_logits).abs().max().item(),
                off=(off[..., :vocab] - base_logits).abs().max().item(),
                merged=(merged_logits[..., :vocab] - peft_logits).abs().max().item(),
                restored=torch.equal(again, logits),
                trainable=trainable, frozen_ok=frozen_ok, got_grad=got_grad,
            ))
    return report


def test_lora_matches_peft(reference):
    r = reference
    root = r["root"]
    reports = []
    for world, layouts in LAYOUTS.items():
        args = (root, r["ids"], layouts, r["peft_logits"], r["base_logits"])
        reports += [rep for rank in run_distributed(_lora_rank, world, args=args) for rep in rank]
    assert {rep["tag"] for rep in reports} == {f"tp{tp}_pp{pp}" for ls in LAYOUTS.values() for tp, pp in ls}
    assert (r["peft_logits"] - r["base_logits"]).abs().max() > 0.1  # the adapters change the output a lot
    adapter = load_file(root / "adapter" / "adapter_model.safetensors")
    for rep in reports:
        tag = rep["tag"]
        assert rep["peft"] <= TOLERANCE, (tag, rep["peft"])
        assert rep["off"] <= TOLERANCE, (tag, rep["off"])
        assert rep["merged"] <= TOLERANCE, (tag, rep["merged"])
        assert rep["restored"], tag
        assert rep["frozen_ok"] and rep["trainable"], tag
        assert all(".lora_a" in n or ".lora_b." in n for n in rep["trainable"]), tag
        assert rep["got_grad"] == rep["trainable"], tag  # every adapter weight (of the last stage), nothing else
        grads = load_file(root / f"grads_{tag}" / "adapter_model.safetensors")
        assert grads.keys() == r["grads"].keys()
        for key, expected in r["grads"].items():
            assert torch.allclose(grads[key], expected, rtol=1e-4, atol=1e-4), (tag, key)
        exported = load_file(root / f"export_{tag}" / "adapter_model.safetensors")
        assert exported.keys() == adapter.keys(), tag
        assert all(torch.equal(exported[k], adapter[k]) for k in adapter), tag
        config = json.loads((root / f"export_{tag}" / "adapter_config.json").read_text())
        assert sorted(config["target_modules"]) == sorted(HF_TARGETS), tag
        # PEFT itself loads the export onto the HF base model and reproduces its own logits
        loaded = peft.PeftModel.from_pretrained(tiny_model(r["kind"], seed=1), root / f"export_{tag}").eval()
        assert (hf_logits(loaded, r["ids"]) - r["peft_logits"]).abs().max() <= 1e-6, tag
        merged = _merged_state(root / f"merged_{tag}")
        for key, expected in r["merged"].items():
            if key == "lm_head.weight" and r["tied"]:  # HF checkpoints keep a tied head as the embedding
                continue
            assert torch.allclose(merged[key], expected, rtol=0, atol=1e-6), (tag, key)


def _merged_state(path) -> dict:
    state = {}
    for file in path.glob("*.safetensors"):
        state.update(load_file(file))
    return state
