"""`trainer.compile_logprobs` reaches every model role's log-prob call (the kernels themselves are compared with
the eager ones in tests/megatron_adapters/test_logprobs.py)."""

from types import SimpleNamespace

import pytest
import torch

import hybridflow.roles.model_role as model_role
from hybridflow.config import load_experiment


@pytest.mark.parametrize("compiled", [False, True])
def test_model_role_logprobs_pass_the_setting(monkeypatch, compiled):
    seen = {}

    def fake(logits, targets, group, **kwargs):
        seen.update(kwargs)
        return torch.zeros(targets.shape)

    monkeypatch.setattr(model_role, "token_logprobs", fake)
    role = model_role.ModelRole("actor", mesh=None, groups=SimpleNamespace(tp=None), model=None, micro_batch_size=1,
                                compile_logprobs=compiled)
    out = role.logprobs(torch.zeros(2, 4, 8), torch.zeros(2, 4, dtype=torch.long), temperature=0.5)
    assert out.shape == (2, 4) and seen == {"temperature": 0.5, "with_entropy": False, "compiled": compiled}


def test_the_setting_is_off_by_default_and_can_be_set():
    assert load_experiment("tiny_cpu", []).trainer.compile_logprobs is False
    assert load_experiment("tiny_cpu", ["trainer.compile_logprobs=true"]).trainer.compile_logprobs is True


@pytest.mark.slow
def test_a_run_with_compiled_logprobs_trains_like_the_eager_one(tmp_path):
    import json

    from tests.trainer.run_helpers import run

    common = ("+experiment=grpo_tiny_cpu", "cluster.gpus_per_node=1", "roles.actor.parallel.tp=1",
              "roles.rollout.parallel.tp=1", "trainer.total_steps=2", "trainer.warmup_sft_steps=0",
              "trainer.save_every=0")
    records = {}
    for compiled in ("false", "true"):
        run(tmp_path / compiled, *common, f"trainer.compile_logprobs={compiled}")
        lines = (tmp_path / compiled / "metrics.jsonl").read_text().splitlines()
        records[compiled] = [r for r in map(json.loads, lines) if r["phase"] == "rl"]
    for eager, fused in zip(records["false"], records["true"], strict=True):
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "parity/max_abs", "reward/mean"):
            assert fused[key] == pytest.approx(eager[key], rel=1e-3, abs=1e-5), (fused["step"], key)
