"""benchmarks.training_curves: both sides' per-RL-step curves from a trl_curve output (CPU, hand-made files)."""

import json

import pytest

from benchmarks import training_curves as tc


def _dir(tmp_path):
    run = tmp_path / "hybridflow-megatron_s1"
    run.mkdir()
    records = [{"step": s, "phase": "rl", "reward/mean": 0.1 * s, "actor/kl_loss": 0.01 * s,
                "actor/entropy": 2.0 - 0.1 * s, "response_length": 50.0 - s} for s in (1, 2)]
    records.append({"step": 2, "phase": "val", "val/accuracy": 0.3})  # not a training step
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")
    # 2 optimizer steps per RL step (8 x 4 samples, mini-batch 16); TRL's closing summary has no "step" key
    log = [{"step": i, "reward": r, "kl": k, "entropy": 1.5, "completions/mean_length": 40.0}
           for i, r, k in ((1, 0.1, 0.0), (2, 0.3, 0.02), (3, 0.5, 0.04), (4, 0.7, 0.06))] + [{"train_loss": 0.1}]
    work = {"prompts": 8, "samples_per_prompt": 4, "ppo_epochs": 1, "mini_batch_size": 16}
    runs = [{"seed": 1, "work": work, "hybridflow-megatron": {"accuracy": []},
             "trl": {"accuracy": [], "log_history": log}}]
    (tmp_path / "compare.json").write_text(json.dumps({"runs": runs}))
    return runs


def test_trl_optimizer_steps_average_into_rl_steps(tmp_path):
    curves = tc.collect(_dir(tmp_path), tmp_path)
    trl = curves["trl"][1]
    assert trl["reward"] == {1: pytest.approx(0.2), 2: pytest.approx(0.6)}
    assert trl["kl"] == {1: pytest.approx(0.01), 2: pytest.approx(0.05)}
    hf = curves["hybridflow-megatron"][1]
    assert hf["response_length"] == {1: 49.0, 2: 48.0} and hf["kl"] == {1: 0.01, 2: 0.02}


def test_cli_writes_table_and_plot(tmp_path):
    _dir(tmp_path)
    assert tc.main([str(tmp_path)]) == 0
    text = (tmp_path / "training_curves.md").read_text()
    assert "| trl | reward | 0.2 | 0.6 |" in text and "| hybridflow-megatron | entropy | 1.9 | 1.8 |" in text
    assert (tmp_path / "training_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_nothing_to_plot_is_one_clear_line(tmp_path, capsys):
    (tmp_path / "compare.json").write_text(json.dumps({"runs": [{"seed": 1, "work": {}, "trl": {"accuracy": []}}]}))
    with pytest.raises(SystemExit) as exc:
        tc.main([str(tmp_path)])
    assert exc.value.code != 0 and "no per-step records" in capsys.readouterr().err
