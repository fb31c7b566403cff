"""benchmarks.trl_curve: the experiment's GRPO work as both frameworks run it, and its report (CPU, no TRL)."""

import json

import pytest

from benchmarks import trl_curve
from benchmarks.trl_grpo import grpo_config_kwargs
from hybridflow.config import load_experiment

# grpo_smollm2's shape without resolving the packaged checkpoint (model.path stands in for it)
OVERRIDES = ["model.packaged=null", "model.path=null"]


def test_work_follows_the_experiment_and_trl_stops_at_eos():
    cfg = load_experiment("grpo_smollm2", OVERRIDES)
    work = trl_curve.shared_work(cfg, steps=40, eval_every=10, seed=3, trl_generation="vllm-colocate")
    assert (work.prompts, work.samples_per_prompt, work.response_length) == (
        cfg.data.train_batch_size, cfg.rollout.n_samples_per_prompt, cfg.rollout.max_new_tokens)
    assert (work.lr, work.kl_coef, work.mini_batch_size) == (cfg.trainer.lr, cfg.algorithm.kl_coef,
                                                             cfg.algorithm.mini_batch_size)
    assert work.reward == "gsm8k" and work.stop_at_eos and work.eval_rows == cfg.data.val_size
    kw = grpo_config_kwargs(work, "/out")
    assert kw["generation_kwargs"] == {}  # no min_tokens floor: responses end at eos as in hybridflow
    assert kw["max_steps"] == 40 * work.optimizer_steps_per_rl_step and kw["loss_type"] == "dapo"


def test_the_second_task_scores_with_its_own_rule_on_both_sides():
    from benchmarks.trl_grpo import scorer
    from hybridflow.rewards.word_order import word_order_score

    cfg = load_experiment("grpo_smollm2_word_order", OVERRIDES)
    work = trl_curve.shared_work(cfg, steps=40, eval_every=10, seed=1, trl_generation="hf")
    assert work.task == "builtin:word_order" and scorer(work.reward) is word_order_score
    with pytest.raises(Exception, match="reward.fn"):
        trl_curve.shared_work(load_experiment("grpo_smollm2", [*OVERRIDES, "reward.fn=my.mod:fn"]), steps=40,
                              eval_every=10, seed=1, trl_generation="hf")


def test_eval_every_must_divide_the_steps():
    cfg = load_experiment("grpo_smollm2", OVERRIDES)
    with pytest.raises(Exception, match="--eval-every"):
        trl_curve.shared_work(cfg, steps=40, eval_every=15, seed=1, trl_generation="hf")


def test_hybridflow_result_reads_throughput_after_the_first_step_and_the_val_curve(tmp_path):
    cfg = load_experiment("grpo_smollm2", OVERRIDES)
    work = trl_curve.shared_work(cfg, steps=2, eval_every=1, seed=1, trl_generation="hf")
    records = [{"step": 0, "phase": "val", "val/accuracy": 0.2},
               {"step": 1, "phase": "rl", "prompt_length": 100.0, "response_length": 50.0, "step_time_s": 10.0},
               {"step": 1, "phase": "val", "val/accuracy": 0.3},
               {"step": 2, "phase": "rl", "prompt_length": 100.5, "response_length": 20.25, "step_time_s": 2.0},
               {"step": 2, "phase": "val", "val/accuracy": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    result = trl_curve.hybridflow_result(tmp_path, work)
    # step 2 only: its per-sample mean lengths x the samples of a step, over its step time
    tokens = work.samples * (100.5 + 20.25)
    assert result["timed_steps"] == 1 and result["tokens_per_step"] == pytest.approx(tokens)
    assert result["throughput_tokens_per_s"] == pytest.approx(tokens / 2.0)
    assert result["samples_per_s"] == pytest.approx(work.samples / 2.0) and result["step_time_s"] == 2.0
    assert [a["accuracy"] for a in result["accuracy"]] == [0.2, 0.3, 0.5]
    assert result["accuracy"][2]["samples"] == 2 * work.samples


def test_report_has_a_ratio_per_engine_and_a_plot(tmp_path):
    side = lambda tok, acc: {"framework": "x", "throughput_tokens_per_s": tok, "step_time_s": 1.0,  # noqa: E731
                             "accuracy": [{"step": 0, "samples": 0, "accuracy": 0.1},
                                          {"step": 4, "samples": 64, "accuracy": acc}]}
    runs = [{"seed": 1, "work": {"model_dir": "m", "task": "t", "prompts": 2, "samples_per_prompt": 8,
                                 "response_length": 16, "mini_batch_size": 8, "micro_batch_size": 4, "lr": 1e-6,
                                 "kl_coef": 0.0, "steps": 4, "eval_rows": 8, "eval_every": 4},
             "hybridflow-megatron": side(300.0, 0.5), "hybridflow-vllm": side(200.0, 0.4), "trl": side(100.0, 0.3)}]
    text = trl_curve.compare_markdown({"device": "cpu", "date": "d", "commit": "c"}, runs)
    assert "**3.00x**" in text and "**2.00x**" in text and "0.100 -> 0.500" in text
    assert "samples/s" in text and "| 16.0 |" in text  # 16 samples per step in 1.0 s, beside tokens/s
    trl_curve.plot_accuracy(runs, tmp_path / "accuracy.png")
    assert (tmp_path / "accuracy.png").stat().st_size > 1000


def test_a_labelled_variant_is_a_side_of_its_own():
    assert trl_curve.side_name("megatron") == "hybridflow-megatron"
    name = trl_curve.side_name("megatron", "shuffle")
    run = {"seed": 1, "hybridflow-megatron": {}, name: {}, "trl": {}}
    assert trl_curve.sides_of(run) == ["hybridflow-megatron", "hybridflow-megatron-shuffle", "trl"]


def test_trl_trains_on_the_prompts_hybridflow_draws_in_its_order():
    """Paired sides: TRL's prompts are hybridflow's loader's for the seed (a permutation of the task's 8192 rows
    from the seed, when none is too long), chat messages and all; unpaired, the task's first rows."""
    import dataclasses

    import torch

    from benchmarks.trl_grpo import prompt_rows
    from hybridflow.data.tasks import builtin_task, task_rows
    from tests.packaged_model import smollm2_checkpoint

    cfg = load_experiment("grpo_smollm2", ["model.packaged=null", f"model.path={smollm2_checkpoint()}"])
    work = dataclasses.replace(trl_curve.shared_work(cfg, steps=2, eval_every=1, seed=5, trl_generation="hf"),
                               prompts=3, max_prompt_length=100_000)
    raw = task_rows(builtin_task("builtin:gsm8k_easy"), 8192, 5)
    order = torch.randperm(8192, generator=torch.Generator().manual_seed(5))[:6].tolist()
    assert prompt_rows(work) == [raw[i] for i in order]
    assert isinstance(prompt_rows(work)[0]["prompt"], list)  # messages, which TRL renders itself
    assert prompt_rows(dataclasses.replace(work, max_prompt_length=None)) == task_rows(
        builtin_task("builtin:gsm8k_easy"), 6, 5)
    assert trl_curve.shared_work(cfg, steps=2, eval_every=1, seed=5, trl_generation="hf").max_prompt_length == 160
