"""benchmarks.merge_curves: trl_curve outputs from several calls filed under labels, then time_to_accuracy."""

import json

import pytest

from benchmarks import merge_curves, time_to_accuracy
from hybridflow.errors import UserError


def _curve_dir(path, seeds, accuracy, step_time):
    runs = []
    for seed in seeds:
        run = path / f"hybridflow-megatron_s{seed}"
        run.mkdir(parents=True)
        run.joinpath("metrics.jsonl").write_text(
            "".join(json.dumps({"step": i, "phase": "rl", "step_time_s": step_time}) + "\n" for i in (1, 2)))
        runs.append({"seed": seed, "work": {}, "hybridflow-megatron": {
            "framework": "hybridflow", "accuracy": [{"step": 0, "samples": 0, "accuracy": 0.2},
                                                    {"step": 2, "samples": 32, "accuracy": accuracy}]}})
    path.joinpath("compare.json").write_text(json.dumps({"meta": {"commit": "abc", "date": "d", "device": "gpu"},
                                                         "runs": runs}))
    return path


def test_sources_are_filed_under_their_labels_and_shared_runs_are_marked(tmp_path):
    full = _curve_dir(tmp_path / "full", [1, 2, 3], 0.5, 1.0)
    lora1 = _curve_dir(tmp_path / "lora1", [1], 0.4, 2.0)
    lora23 = _curve_dir(tmp_path / "lora23", [2, 3], 0.3, 4.0)
    out = tmp_path / "out"
    assert merge_curves.main([str(out), f"full={full}:hybridflow-megatron:1,3", f"lora={lora1}",
                              f"lora={lora23}@shared"]) == 0
    runs = json.loads((out / "compare.json").read_text())["runs"]
    assert [(r["seed"], sorted(k for k in r if k not in ("seed", "work"))) for r in runs] == [
        (1, ["full", "lora"]), (2, ["lora"]), (3, ["full", "lora"])]
    assert runs[1]["lora"]["shared_gpu"] is True and "shared_gpu" not in runs[0]["lora"]
    assert (out / "lora_s2" / "metrics.jsonl").is_file() and not (out / "full_s2").exists()
    assert time_to_accuracy.main([str(out), "--threshold", "0.45"]) == 0
    text = (out / "time_to_accuracy.md").read_text()
    assert "| full | 1 | 32 | 2 | 0.500 |" in text  # two steps of 1 s each from its own metrics.jsonl
    assert "| lora | 2 | not reached | not reached | 0.300 |" in text and "'GPU shared'" in text


def test_a_seed_given_twice_or_a_malformed_source_is_one_clear_error(tmp_path):
    full = _curve_dir(tmp_path / "full", [1], 0.5, 1.0)
    with pytest.raises(UserError, match="seed 1 given twice"):
        merge_curves.merge([merge_curves.parse_source(f"a={full}"), merge_curves.parse_source(f"a={full}")],
                           tmp_path / "out")
    for bad in ("nolabel", f"a={full}:side:x", "=dir"):
        with pytest.raises(UserError, match="LABEL=DIR"):
            merge_curves.parse_source(bad)
    with pytest.raises(SystemExit) as exit_:
        merge_curves.main([str(tmp_path / "o"), f"a={tmp_path / 'missing'}"])
    assert exit_.value.code != 0
