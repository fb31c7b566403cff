"""benchmarks.time_to_accuracy: crossings, training seconds before each evaluation, equal-sample table, plots."""

import json

import pytest

from benchmarks import time_to_accuracy as tta


def _write_run_dir(tmp_path, name, seed, step_times):
    run = tmp_path / f"{name}_s{seed}"
    run.mkdir()
    # the last record of a step wins (a resumed run may repeat one); validation records are not steps
    lines = [{"step": i + 1, "phase": "rl", "step_time_s": t} for i, t in enumerate(step_times)]
    lines.insert(1, {"step": 1, "phase": "val", "val/accuracy": 0.0})
    lines.insert(0, {"step": 1, "phase": "rl", "step_time_s": 99.0})
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def _compare(tmp_path):
    runs = []
    curves = {1: ([0.2, 0.3, 0.5], [0.2, 0.46, 0.5]), 2: ([0.2, 0.4, 0.44], [0.2, 0.3, 0.3])}
    for seed, (hf_acc, trl_acc) in curves.items():
        _write_run_dir(tmp_path, "hybridflow-megatron", seed, [1.0, 2.0, 3.0, 4.0])
        acc = lambda a: [{"step": 2 * i, "samples": 2 * i * 16, "accuracy": x} for i, x in enumerate(a)]  # noqa: E731
        runs.append({"seed": seed, "work": {},
                     "hybridflow-megatron": {"framework": "hybridflow", "accuracy": acc(hf_acc)},
                     "trl": {"framework": "trl", "accuracy": acc(trl_acc), "step_times_s": [5.0, 5.0, 5.0, 5.0]}})
    (tmp_path / "compare.json").write_text(json.dumps({"meta": {"device": "cpu"}, "runs": runs}))


def test_train_seconds_before_each_evaluation_and_first_crossing(tmp_path):
    _compare(tmp_path)
    summary = tta.summarize(json.loads((tmp_path / "compare.json").read_text())["runs"], tmp_path, 0.45)
    hf, trl = summary["frameworks"]["hybridflow-megatron"], summary["frameworks"]["trl"]
    # hybridflow's seconds come from metrics.jsonl (the duplicate step-1 record replaced by the later one)
    assert [p["train_seconds"] for p in hf["seeds"][1]["curve"]] == [0.0, 3.0, 10.0]
    assert hf["seeds"][1]["reached"]["step"] == 4 and hf["seeds"][2]["reached"] is None
    assert trl["seeds"][1]["reached"] == {"step": 2, "samples": 32, "accuracy": 0.46, "train_seconds": 10.0}
    assert trl["at_step"][2] == {"mean": pytest.approx(0.38), "min": 0.3, "max": 0.46, "seeds": 2, "samples": 32,
                                 "train_seconds": {"mean": 10.0, "min": 10.0, "max": 10.0}}


def test_the_seed_mean_curve_crossing_and_its_time_against_trls(tmp_path):
    _compare(tmp_path)
    runs = json.loads((tmp_path / "compare.json").read_text())["runs"]
    # hybridflow's seed mean: 0.2, 0.35, 0.47 (seconds 0, 3, 10); TRL's: 0.2, 0.38, 0.4 (seconds 0, 10, 20)
    at_45 = tta.summarize(runs, tmp_path, 0.45)["frameworks"]
    assert at_45["hybridflow-megatron"]["mean_reached"]["step"] == 4 and at_45["trl"]["mean_reached"] is None
    summary = tta.summarize(runs, tmp_path, 0.39)
    hf, trl = (summary["frameworks"][n]["mean_reached"] for n in ("hybridflow-megatron", "trl"))
    assert (hf["step"], hf["samples"], hf["train_seconds"]["mean"]) == (4, 64, 10.0)
    assert (trl["step"], trl["train_seconds"]["mean"]) == (4, 20.0)
    assert "| hybridflow-megatron | 4 | 64 | 0.470 | 10 [10, 10] | 0.50x |" in tta.markdown(summary, {})
    # a step that not every seed reached does not count: drop seed 2's last evaluation
    del runs[1]["hybridflow-megatron"]["accuracy"][-1]
    assert tta.summarize(runs, tmp_path, 0.45)["frameworks"]["hybridflow-megatron"]["mean_reached"] is None


def test_cli_writes_table_and_both_plots(tmp_path):
    _compare(tmp_path)
    assert tta.main([str(tmp_path), "--threshold", "0.45"]) == 0
    text = (tmp_path / "time_to_accuracy.md").read_text()
    assert "| trl | 2 | not reached | not reached | 0.300 |" in text
    for png in ("accuracy_vs_time.png", "accuracy_vs_samples.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"


def test_evaluation_past_the_recorded_steps_is_one_clear_error(tmp_path):
    side = {"accuracy": [{"step": 5, "samples": 80, "accuracy": 0.5}]}
    with pytest.raises(Exception, match="only 2 step times"):
        tta.curve(side, [1.0, 1.0])


def test_paired_differences_against_trl_per_seed(tmp_path):
    _compare(tmp_path)
    summary = tta.summarize(json.loads((tmp_path / "compare.json").read_text())["runs"], tmp_path, 0.45)
    diffs = summary["minus_trl"]["hybridflow-megatron"]
    # step 2: seed 1 0.3 - 0.46, seed 2 0.4 - 0.3; step 4: 0.5 - 0.5, 0.44 - 0.3
    assert diffs[2] == {"mean": pytest.approx(-0.03), "min": pytest.approx(-0.16), "max": pytest.approx(0.1),
                        "seeds": 2, "at_least": 1}
    assert diffs[4]["at_least"] == 2 and diffs[4]["mean"] == pytest.approx(0.07)
    assert "trl" not in summary["minus_trl"]
    text = tta.markdown(summary, {})
    assert "| hybridflow-megatron | +0.000 [+0.000, +0.000] 2/2 | -0.030 [-0.160, +0.100] 1/2 |" in text
    assert not summary["paired"] and "NOT paired" in text  # the fixture's runs record no max_prompt_length
    runs = json.loads((tmp_path / "compare.json").read_text())["runs"]
    for run in runs:
        run["work"]["max_prompt_length"] = 160
    assert "paired: the same prompts" in tta.markdown(tta.summarize(runs, tmp_path, 0.45), {})
