"""`python -m hybridflow.run` with `roles.actor.lora` on tiny_cpu (4 gloo ranks, actor TP2 x DP2, native rollout
at TP2 on the actor's base tensors, fed adapters only through the bridge: roles.actor.lora.sync's default there;
the reference as the actor with adapters off): the rollout's log-probs equal the actor's on every step (the
parity gate, at its 1e-4 default), checkpoints hold adapters only and a resumed run repeats the uninterrupted one
bit for bit, and the run ends with a merged HF model and a PEFT adapter that HF PEFT loads onto the base to give
the merged model's logits."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.run_helpers import algorithmic, rl_records, run

pytestmark = pytest.mark.slow
peft = pytest.importorskip("peft")

COMMON = ("data.train_batch_size=16", "algorithm.mini_batch_size=16", "roles.actor.micro_batch_size=8",
          "roles.critic.micro_batch_size=4", "trainer.warmup_sft_steps=1", "trainer.save_every=2",
          "roles.actor.lora.rank=8", "roles.actor.lora.alpha=16")


def test_lora_run_syncs_checkpoints_resumes_and_exports(tmp_path):
    from megatron.core import dist_checkpointing
    from transformers import AutoModelForCausalLM

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(straight, *COMMON, "trainer.total_steps=4")
    records = rl_records(straight)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["parity/max_abs"] <= 1e-4 for r in records)  # the engine's adapters == trainer's model
    assert all(r["kl"] > 0 for r in records)  # the reference (adapters off) differs from the actor

    keys = dist_checkpointing.load_tensors_metadata(str(straight / "checkpoints" / "step_000002"))
    actor = [k for k in keys if k.startswith(("actor.decoder.", "actor.embedding.", "actor.output_layer."))]
    assert actor and all(".lora_a" in k or ".lora_b." in k for k in actor), actor  # the model's; optimizer apart
    assert any(k.startswith("critic.decoder.") and k.endswith(".weight") for k in keys)  # the critic trains fully

    run(resumed, *COMMON, "trainer.total_steps=2")
    run(resumed, *COMMON, "trainer.total_steps=4", "trainer.resume=auto")
    expected = {r["step"]: algorithmic(r) for r in records}
    got = {r["step"]: algorithmic(r) for r in rl_records(resumed)}
    assert got[3] == expected[3] and got[4] == expected[4]

    base = AutoModelForCausalLM.from_pretrained(straight / "init_model", torch_dtype=torch.float32)
    adapted = peft.PeftModel.from_pretrained(base, straight / "final_adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(straight / "final_hf", torch_dtype=torch.float32).eval()
    ids = torch.randint(0, merged.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        via_peft, via_merged = adapted(ids).logits, merged(ids).logits
    torch.testing.assert_close(via_peft, via_merged, rtol=1e-4, atol=1e-4)
    with adapted.disable_adapter(), torch.no_grad():
        assert (adapted(ids).logits - via_merged).abs().max() > 1e-3  # the adapters did train


def test_merged_sync_to_the_native_engine_runs_within_the_parity_gate(tmp_path):
    # roles.actor.lora.sync=merged: the native engine keeps a model of its own and every sync writes W + s B A into
    # it through the bridge (the other choice the next GPU lease times against adapters); fp32, so the merged
    # weights' log-probs stay within the gate's 1e-4 of the trainer's unmerged W x + s B A x
    run(tmp_path, *COMMON, "trainer.total_steps=2", "trainer.save_every=0", "roles.actor.lora.sync=merged")
    records = rl_records(tmp_path)
    assert [r["step"] for r in records] == [1, 2]
    assert all(0 < r["parity/max_abs"] <= 1e-4 for r in records)
