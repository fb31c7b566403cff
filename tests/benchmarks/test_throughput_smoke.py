"""The throughput harness end to end on tiny_cpu (one measured placement, one the planner rejects), and
`--simulate`. Asserts the outputs exist and are well formed; no figure is asserted."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Small and explicit, so the test does not depend on the experiment file's tuning.
SMALL = ["data.train_batch_size=4", "algorithm.mini_batch_size=4", "rollout.max_new_tokens=4",
         "rollout.n_samples_per_prompt=1", "data.max_prompt_length=16", "data.seq_length=32",
         "roles.actor.micro_batch_size=1", "roles.critic.micro_batch_size=1", "trainer.seed=7"]


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks.throughput", "+experiment=tiny_cpu", *SMALL, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _table_rows(path: Path) -> list[list[str]]:
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("|")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


@pytest.mark.slow
def test_tiny_cpu_benchmark_outputs(tmp_path):
    out = tmp_path / "bench"
    proc = _run(["--placements", "colocated,split", "--warmup-steps", "1", "--steps", "1", "--out", str(out)], 170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    colocated = json.loads((out / "colocated.json").read_text())
    assert colocated["status"] == "measured", colocated.get("reason")
    m = colocated["measured"]
    assert m["timed_steps"] == 1 and m["throughput_tokens_per_s"] > 0 and m["step_time_s"] > 0
    assert {"generate", "update_actor", "sync"} <= set(m["stage_time_s"])
    assert 0 < m["actor_update"]["mfu"] < 1 and m["actor_update"]["flops"] > 0
    assert colocated["predicted"]["step_time_s"] > 0 and colocated["commit"] and colocated["date"]
    # the table's prediction is for the lengths the run had; the config-length one is kept beside it
    lengths = colocated["predicted"]["lengths"]
    assert lengths == {"prompt": max(1, round(m["prompt_length"])), "response": max(1, round(m["response_length"]))}
    assert colocated["predicted_at_config_lengths"]["lengths"] == {"prompt": 16, "response": 16}
    split = json.loads((out / "split.json").read_text())
    assert split["status"] == "skipped" and "placement.resources" in split["reason"]
    assert "\n" not in split["reason"]
    summary = json.loads((out / "summary.json").read_text())
    assert [r["placement"] for r in summary["runs"]] == ["colocated", "split"]
    rows = _table_rows(out / "table.md")
    assert [r[0] for r in rows[2:4]] == ["colocated", "split"] and all(len(r) == len(rows[0]) for r in rows[:4])
    assert (out / "stage_times.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "colocated" / "metrics.jsonl").is_file()


def test_simulate_runs_nothing_and_predicts(tmp_path):
    out = tmp_path / "sim"
    proc = _run(["--simulate", "--placements", "colocated,split", "--simulate-sizes", "7b",
                 "--simulate-gpus", "16", "--out", str(out)], 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    colocated = json.loads((out / "colocated.json").read_text())
    assert colocated["status"] == "predicted" and "measured" not in colocated
    assert not (out / "colocated").exists()  # nothing was launched
    grid = json.loads((out / "simulated.json").read_text())
    assert grid and all(r["gpus"] == 16 for r in grid) and sum(bool(r.get("chosen")) for r in grid) == 1
    assert set(grid[0]["stage_time_s"]) == {"generation", "preparation", "training"}
    rows = _table_rows(out / "simulated.md")
    assert len(rows) == 2 + len(grid) and all(len(r) == len(rows[0]) for r in rows)


def test_bad_override_is_one_line_error(tmp_path):
    proc = _run(["--simulate", "--placements", "colocated", "--out", str(tmp_path), "trainer.no_such_key=1"], 60)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "trainer.no_such_key" in proc.stderr


@pytest.mark.slow
def test_variants_run_each_placement_once_per_variant(tmp_path):
    # sequence packing off and on in one command: two measured rows with actor-update MFU and step time each
    out = tmp_path / "bench"
    proc = _run(["--placements", "colocated", "--warmup-steps", "0", "--steps", "1", "--out", str(out),
                 "--variant", "padded:", "--variant",
                 "packed:roles.actor.max_tokens_per_micro_batch=40 roles.critic.max_tokens_per_micro_batch=40"], 600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    padded, packed = (json.loads((out / f"colocated_{v}.json").read_text()) for v in ("padded", "packed"))
    assert (padded["placement"], packed["placement"]) == ("colocated (padded)", "colocated (packed)")
    assert "roles.actor.max_tokens_per_micro_batch=40" in packed["overrides"]
    assert not any("max_tokens" in o for o in padded["overrides"]) and "max_tokens" in packed["command"]
    for run in (padded, packed):
        assert run["status"] == "measured", run.get("reason")
        assert 0 < run["measured"]["actor_update"]["mfu"] < 1 and run["measured"]["step_time_s"] > 0
    rows = _table_rows(out / "table.md")
    assert [r[0] for r in rows[2:4]] == ["colocated (padded)", "colocated (packed)"]


def test_variants_are_planned_per_placement(tmp_path):
    proc = _run(["--simulate", "--placements", "colocated,split", "--simulate-sizes", "7b", "--simulate-gpus", "16",
                 "--out", str(tmp_path), "--variant", "padded:", "--variant",
                 "packed:roles.actor.max_tokens_per_micro_batch=40 trainer.total_steps=9"], 120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trainer.total_steps" in proc.stderr  # the harness owns it, in a variant too
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(r["placement"], r["variant"]) for r in summary["runs"]] == [
        ("colocated (padded)", "padded"), ("colocated (packed)", "packed"),
        ("split (padded)", "padded"), ("split (packed)", "packed")]
    packed = json.loads((tmp_path / "colocated_packed.json").read_text())
    assert packed["overrides"][-1] == "roles.actor.max_tokens_per_micro_batch=40"
    assert [r[0] for r in _table_rows(tmp_path / "table.md")[2:6]] == [r["placement"] for r in summary["runs"]]
    bad = _run(["--simulate", "--placements", "colocated", "--out", str(tmp_path), "--variant", "nocolon"], 60)
    assert bad.returncode == 2 and "--variant takes NAME:OVERRIDES" in bad.stderr
