"""rollout.engine=auto: the planner keeps the engine whose plan the cost model predicts faster, says why, and
the plan carries the choice to the ranks."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.config import load_experiment
from hybridflow.config.experiment import with_engine
from hybridflow.engines import engine_names, get_engine
from hybridflow.errors import UserError
from hybridflow.placement import plan_placement
from hybridflow.placement.auto.from_config import plan_candidate
from hybridflow.placement.engine_choice import choose_engine

REPO = Path(__file__).resolve().parents[2]


def _predicted(cfg):
    """Each engine's predicted step, priced through the explicit path (engine set, plan, cost model)."""
    out = {}
    for name in engine_names():
        one = with_engine(cfg, name)
        out[name] = plan_candidate(one, plan_placement(one)).total
    return out


def test_choice_flips_with_the_batch_where_the_cost_model_says():
    # One H200, every role on GPU 0. The native engine's decode step costs a fixed 1.6 ms plus a term per
    # batch row (NATIVE_DECODE, hybridflow/engines/megatron.py); vLLM's a fixed 4.2 ms but streams weights and
    # KV at a higher share of HBM: small batches favour the native engine, large ones vLLM.
    small = load_experiment("ppo_llama_1b_h200", ["rollout.engine=auto"])
    large = load_experiment("ppo_llama_1b_h200", ["rollout.engine=auto", "data.train_batch_size=256"])
    chosen = []
    for cfg in (small, large):
        choice = choose_engine(cfg)
        predicted = _predicted(cfg)
        assert choice.predicted_s == pytest.approx(predicted)
        assert choice.chosen == min(predicted, key=predicted.get)
        assert choice.plan.rollout_engine == choice.chosen == choice.config.rollout.engine
        # generation is where the engines differ: the why names it, with the loser's extra seconds
        loser = next(name for name in predicted if name != choice.chosen)
        extra = choice.stage_s[loser]["generation"] - choice.stage_s[choice.chosen]["generation"]
        assert extra > 0 and f"{loser} {predicted[loser]:.2f} s (generation {extra:+.2f} s)" in choice.why()
        chosen.append(choice.chosen)
    assert chosen == ["megatron", "vllm"]


def test_plan_placement_carries_the_choice_and_the_run_resolves_to_it():
    cfg = load_experiment("ppo_llama_1b_h200", ["rollout.engine=auto", "data.train_batch_size=256"])
    assert cfg.trainer.parity_every is None  # the engine's default waits for the choice
    plan = plan_placement(cfg)
    assert plan.rollout_engine == "vllm" and plan.to_json()["rollout_engine"] == "vllm"
    run_cfg = with_engine(cfg, plan.rollout_engine)  # what trainer.loop.train does on every rank
    assert run_cfg.rollout.engine == "vllm" and run_cfg.trainer.parity_every == get_engine("vllm").traits.parity_every


def test_cpu_cluster_picks_the_native_engine_and_says_why():
    choice = choose_engine(load_experiment("tiny_cpu", ["rollout.engine=auto"]))
    assert choice.chosen == "megatron" and set(choice.predicted_s) == {"megatron"}
    assert choice.refused["vllm"].startswith("rollout.engine: vllm runs on CUDA GPUs only and cluster.gpu_type is cpu")
    assert "vllm refused: rollout.engine: vllm runs on CUDA GPUs only" in choice.format()


def test_no_engine_plans_names_every_reason():
    # 8B on one 4 GiB "cpu" device: the native engine does not fit, vLLM is GPU-only
    with pytest.raises(UserError, match=r"^rollout\.engine: auto found no engine that plans here \(megatron: "
                                        r"cluster\.gpu_memory_gib: .*; vllm: rollout\.engine: vllm runs on CUDA"):
        plan_placement(load_experiment("tiny_cpu", ["rollout.engine=auto", "model=llama3_8b"]))


def test_plan_cli_prints_the_choice(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hybridflow.plan", "+experiment=tiny_cpu", "rollout.engine=auto"],
                          cwd=tmp_path, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "rollout engine (rollout.engine=auto): megatron - megatron predicts" in proc.stdout
    assert "vllm refused: rollout.engine: vllm runs on CUDA GPUs only" in proc.stdout
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["rollout_engine"] == "megatron" and data["engine_choice"]["chosen"] == "megatron"
