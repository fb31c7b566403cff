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


def test_dry_run_takes_a_model_shape_and_one_run_per_engine(tmp_path, capsys):
    """--model shapes the checkpoint and the run; every --placement entry is planned before anything runs."""
    assert trl_compare.main(["--out", str(tmp_path), "--dry-run", "--model", "llama3_2_3b",
                             "--placement", "colocated:megatron,colocated:vllm"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["hybridflow_overrides"][0] == "model=llama3_2_3b"
    assert (shown["hybridflow_resolved"]["hidden_size"], shown["hybridflow_resolved"]["layers"]) == (3072, 28)
    config = json.loads((tmp_path / "dry_run_model" / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (3072, 28, 24)


def test_sides_from_separate_calls_meet_in_one_comparison(tmp_path):
    """A hybridflow run per engine and a TRL run written by different calls give one table with a ratio per run."""
    work = _work()
    for placement, tps in (("colocated:megatron", 300.0), ("colocated:vllm", 200.0)):
        run = {"placement": placement, "status": "measured", "command": "python -m hybridflow.run",
               "measured": {"throughput_tokens_per_s": tps, "step_time_s": 1.0, "tokens_per_step": tps,
                            "peak_memory_gib": 1.0, "stage_time_s": {}, "actor_update": {}}}
        (tmp_path / f"hybridflow_{placement.replace(':', '_')}.json").write_text(json.dumps(run))
    (tmp_path / "hybridflow_colocated_split.json").write_text(json.dumps({"placement": "x", "status": "failed"}))
    (tmp_path / "trl_spec.json").write_text(json.dumps({"prompts": 8}))
    assert trl_compare.collect(tmp_path, work)["ratio"] == {"colocated:megatron": {}, "colocated:vllm": {}}
    for file, tps in (("trl.json", 100.0), ("trl_bf16.json", 150.0)):
        (tmp_path / file).write_text(json.dumps({"throughput_tokens_per_s": tps, "step_time_s": 3.0,
                                                 "tokens_per_step": 300.0, "framework": file}))
    result = trl_compare.collect(tmp_path, work)
    assert result["ratio"] == {"colocated:megatron": {"trl": 3.0, "trl_bf16": 2.0},
                               "colocated:vllm": {"trl": 2.0, "trl_bf16": 200 / 150}}
    table = trl_compare.compare_markdown(result)
    # tokens/s, samples/s (32 samples per step / step time), step s, tokens/step, peak GiB, ratios
    assert "| hybridflow colocated:megatron | 300 | 32.0 | 1.00 | 300 | 1.0 | **3.00x** | **2.00x** |" in table
    assert "| trl.json | 100 | 10.7 | 3.00 | 300 | - | - | - |" in table and "| vs trl | vs trl_bf16 |" in table
    assert trl_compare.trl_file(work) == "trl.json"
    assert trl_compare.trl_file(_work(trl_dtype="bf16")) == "trl_bf16.json"


def test_bad_sides_is_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        trl_compare.main(["--out", str(tmp_path), "--dry-run", "--sides", "verl"])
    assert exc.value.code == 2 and "--sides" in capsys.readouterr().err


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
                                     num_key_value_heads=1, vocab_size=128), model_dir, 1, dtype="fp32")
    build_char_tokenizer(model_dir)
    work = _work(model_dir=str(model_dir), prompts=2, samples_per_prompt=2, response_length=4, mini_batch_size=4,
                 micro_batch_size=2, ppo_epochs=1, warmup_steps=1, steps=1, trl_generation="hf")  # no vLLM on CPU
    out = run_trl(work, str(tmp_path / "trl"))
    assert out["timed_steps"] == 1 and out["step_time_s"] > 0
    assert any("loss" in e for e in out["log_history"])  # TRL's own per-step log comes back
    prompts = [r["prompt"] for r in prompt_rows(work)[2:4]]  # the timed (second) step's prompts, unshuffled
    # 4 samples x 4 response tokens + each sample's prompt (its characters + <bos>)
    assert out["tokens_per_step"] == 4 * 4 + 2 * sum(len(p) + 1 for p in prompts)
