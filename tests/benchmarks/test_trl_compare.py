"""The TRL comparison's argument handling and config mapping (its --dry-run), on CPU."""

import json

import pytest

from benchmarks import trl_compare
from benchmarks.trl_grpo import SharedWork, grpo_config_kwargs


def _work(**kw) -> SharedWork:
    base = dict(model_dir="/m", prompts=8, samples_per_prompt=4, response_length=16, mini_batch_size=16,
                micro_batch_size=2, ppo_epochs=2, lr=1e-6, kl_coef=0.04, cliprange=0.2, temperature=1.0,
                warmup_steps=1, steps=2, seed=3)
    return SharedWork(**{**base, **kw})


def test_grpo_mapping_matches_hybridflow_step():
    kw = grpo_config_kwargs(_work(trl_generation="hf"), "/out")
    # 32 samples per RL step, 16 per optimizer step, micro-batch 2, 2 epochs -> 4 optimizer steps per RL step
    assert kw["per_device_train_batch_size"] == 2 and kw["gradient_accumulation_steps"] == 8
    assert kw["steps_per_generation"] == 16 and kw["num_generations"] == 4 and kw["num_iterations"] == 2
    assert kw["max_steps"] == 3 * 4
    assert kw["max_completion_length"] == 16 and kw["generation_kwargs"] == {"min_new_tokens": 16}
    assert kw["beta"] == 0.04 and kw["bf16"] and not kw["use_vllm"]


def test_trl_defaults_to_its_colocated_vllm_with_the_same_fixed_length():
    kw = grpo_config_kwargs(_work(), "/out")
    assert kw["use_vllm"] and kw["vllm_mode"] == "colocate" and kw["generation_kwargs"] == {"min_tokens": 16}
    with pytest.raises(ValueError, match="--trl-generation"):
        grpo_config_kwargs(_work(trl_generation="fast"), "/out")


@pytest.mark.parametrize("bad, flag", [({"micro_batch_size": 3}, "--micro-batch"),
                                       ({"mini_batch_size": 24}, "--mini-batch"),
                                       ({"mini_batch_size": 2, "micro_batch_size": 1}, "--mini-batch")])
def test_work_checks_name_the_flag(bad, flag):
    with pytest.raises(ValueError, match=flag):
        _work(**bad).check()


def test_dry_run_composes_hybridflow_config_and_grpo_kwargs(tmp_path, capsys):
    assert trl_compare.main(["--out", str(tmp_path), "--dry-run", "--prompts", "8", "--samples-per-prompt", "4",
                             "--response-length", "32", "--mini-batch", "16", "--micro-batch", "2"]) == 0
    shown = json.loads(capsys.readouterr().out)
    over = shown["hybridflow_overrides"]
    assert "algorithm=grpo" in over and "rollout.max_new_tokens=32" in over and "rollout.stop_token_ids=[]" in over
    resolved = shown["hybridflow_resolved"]
    assert resolved["algorithm"] == "grpo" and not resolved["critic"] and resolved["stop_token_ids"] == []
    assert (resolved["prompts"], resolved["samples_per_prompt"], resolved["max_new_tokens"]) == (8, 4, 32)
    assert resolved["hidden_size"] == 2048  # the experiment's ~1B shape, from the dry run's config.json
    assert shown["grpo_config"]["steps_per_generation"] == 16 and shown["grpo_config"]["use_cpu"]
    assert shown["grpo_config_check"].startswith(("ok", "not checked"))
    spec = json.loads((tmp_path / "trl_spec.json").read_text())
    assert spec["prompts"] == 8 and spec["model_dir"].endswith("dry_run_model")
    assert not list((tmp_path / "dry_run_model").glob("*.safetensors"))  # no weights on a dry run


def test_bad_flag_combination_is_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        trl_compare.main(["--out", str(tmp_path), "--dry-run", "--mini-batch", "6", "--micro-batch", "4"])
    assert exc.value.code == 2 and "--micro-batch" in capsys.readouterr().err


def test_trl_side_runs_on_cpu_when_trl_is_installed(tmp_path):
    """TRL's GRPOTrainer on a tiny random model: every response is exactly R tokens, one RL step timed."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    from benchmarks.trl_grpo import prompt_rows, run_trl
    from hybridflow.config import ModelConfig
    from hybridflow.data import build_char_tokenizer
    from hybridflow.trainer.model_files import random_hf_checkpoint

    model_dir = tmp_path / "model"
    random_hf_checkpoint(ModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                     num_key_value_heads=1, vocab_size=128), model_dir, 1)
    build_char_tokenizer(model_dir)
    work = _work(model_dir=str(model_dir), prompts=2, samples_per_prompt=2, response_length=4, mini_batch_size=4,
                 micro_batch_size=2, ppo_epochs=1, warmup_steps=1, steps=1, trl_generation="hf")  # no vLLM on CPU
    out = run_trl(work, str(tmp_path / "trl"))
    assert out["timed_steps"] == 1 and out["step_time_s"] > 0
    prompts = [r["prompt"] for r in prompt_rows(work)[2:4]]  # the timed (second) step's prompts, unshuffled
    # 4 samples x 4 response tokens + each sample's prompt (its characters + <bos>)
    assert out["tokens_per_step"] == 4 * 4 + 2 * sum(len(p) + 1 for p in prompts)
