"""A parity gate the run's first gated step would fail is refused when the experiment is resolved: a gate meant for
exact log-probs (trainer.parity_max_abs below 1e-2, default 1e-4) with an engine whose 16-bit log-probs are not
the trainer's computation. On one H100 (benchmarks/README.md, stop 47) vLLM and the native engine given merged LoRA
weights parted from the trainer by a max of 0.7-0.9 in bf16; the native engine with its adapters by 2.4e-6."""

from __future__ import annotations

import pytest

from hybridflow.config import load_experiment
from hybridflow.errors import UserError
from hybridflow.placement.engine_choice import choose_engine

TIGHT = "trainer.parity_max_abs=1e-4"


@pytest.mark.parametrize("overrides, why", [
    (["rollout=vllm"], "its own kernels"),
    (["roles.actor.lora.rank=8", "roles.actor.lora.sync=merged"], "merged LoRA weights"),
    (["rollout.dtype=fp32"], "a fp32 copy of the bf16 actor"),
])
def test_a_gate_for_exact_logprobs_is_refused_where_the_engine_cannot_meet_it(overrides, why):
    with pytest.raises(UserError, match=rf"^trainer.parity_max_abs: 0.0001 .*{why}.* set trainer.parity_max_abs="):
        load_experiment("ppo_llama_1b_h200", [*overrides, TIGHT])


def test_bf16_on_the_cpu_backend_is_refused_a_gate_for_exact_logprobs():
    # Before: tiny_cpu with model.dtype=bf16 started, and its first RL step failed the gate on a rank (max 0.0078).
    with pytest.raises(UserError, match=r"^trainer.parity_max_abs: 0.0001 .*the CPU backend's bf16 kernels"):
        load_experiment("tiny_cpu", ["model.dtype=bf16"])
    load_experiment("tiny_cpu", ["model.dtype=bf16", "trainer.parity_max_abs=2.0"])
    load_experiment("tiny_cpu", [])  # fp32


@pytest.mark.parametrize("overrides", [
    [],  # the native engine samples from the actor's own modules
    ["roles.actor.lora.rank=8"],  # ... with the actor's adapter modules (sync=adapters, its default)
    ["roles.actor.lora.rank=8", "roles.actor.lora.sync=merged", "model.dtype=fp32"],  # fp32 merged: ~1e-6 on CPU
    ["rollout=vllm", "trainer.parity_every=0"],  # no gate
    ["rollout=vllm", "trainer.parity_max_abs=2.0"],  # a gate set for a bf16 engine
])
def test_gates_the_engine_can_meet_are_accepted(overrides):
    load_experiment("ppo_llama_1b_h200", [TIGHT, *overrides])


def test_auto_leaves_out_the_engine_that_would_fail_the_gate():
    choice = choose_engine(load_experiment("ppo_llama_1b_h200", ["rollout.engine=auto", "data.train_batch_size=256",
                                                                  TIGHT]))
    # at this batch the cost model prefers vLLM (tests/placement/test_engine_choice.py); the gate rules it out
    assert choice.chosen == "megatron" and "trainer.parity_max_abs" in choice.refused["vllm"]
