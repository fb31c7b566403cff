"""benchmarks/predict.py: a plan's prediction at the config's lengths and at a run's measured lengths."""

import pytest

from benchmarks.predict import predict_plan
from hybridflow.config import load_experiment
from hybridflow.placement import plan_placement


def test_prediction_at_measured_lengths_counts_their_tokens_and_generates_less():
    cfg = load_experiment("ppo_llama_1b_h200", ["placement=colocated"])
    plan = plan_placement(cfg)
    full = predict_plan(cfg, plan)
    short = predict_plan(cfg, plan, (10.4, 1024.0))  # builtin:add prompts are ~10 tokens
    samples = cfg.data.train_batch_size * cfg.rollout.n_samples_per_prompt
    assert full["lengths"] == {"prompt": cfg.data.max_prompt_length, "response": cfg.data.seq_length
                               - cfg.data.max_prompt_length}
    assert short["lengths"] == {"prompt": 10, "response": 1024}
    assert short["tokens_per_step"] == samples * 1034 and full["tokens_per_step"] == samples * cfg.data.seq_length
    # every decode step attends over ~1000 fewer cached tokens and training sees shorter rows
    assert short["stage_time_s"]["generation"] < full["stage_time_s"]["generation"]
    assert short["stage_time_s"]["training"] < full["stage_time_s"]["training"]
    assert short["step_time_s"] == pytest.approx(sum(short["stage_time_s"].values()))
