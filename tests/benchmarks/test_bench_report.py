"""Table and plot writers of the throughput benchmark, and the summary of a metrics.jsonl."""

import json

import pytest

from benchmarks.placement_run import Sweep, run_name, run_overrides
from benchmarks.predict import group_measured
from benchmarks.report import measured_table, plot_stage_times, simulated_table, stage_table
from benchmarks.run_summary import read_rl_records, summarize
from hybridflow.config import load_experiment
from hybridflow.placement import plan_placement


def _measured(placement: str, generate: float) -> dict:
    stages = {"generate": generate, "ref": 0.5, "update_actor": 1.0, "sync": 0.25}
    return {"placement": placement, "status": "measured", "gpus": 4,
            "measured": {"throughput_tokens_per_s": 1234.5, "throughput_tokens_per_s_per_gpu": 308.6,
                         "step_time_s": 2.0, "stage_time_s": stages, "actor_update": {"mfu": 0.125},
                         "peak_memory_gib": None, "parity_max_abs": 1e-6, "parity_mean_abs": 1e-7},
            "predicted": {"throughput_tokens_per_s": 1000.0, "step_time_s": 2.5,
                          "stage_time_s": {"generation": 1.0, "preparation": 0.5, "training": 1.0}}}


def _rows(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.strip().splitlines()]


def test_measured_table_rows_and_columns():
    runs = [_measured("colocated", 0.25), {"placement": "split", "status": "skipped", "reason": "GPU 4 | no"}]
    rows = _rows(measured_table(runs))
    assert len(rows) == 4 and all(len(r) == len(rows[0]) for r in rows)  # header, rule, 2 placements
    header, colocated, split = rows[0], rows[2], rows[3]
    cell = dict(zip(header, colocated, strict=True))
    assert cell["tokens/s"] == "1,234.5" and cell["actor MFU"] == "12.50 %"
    assert cell["generation s"] == "0.50"  # generate 0.25 + sync 0.25
    assert cell["predicted tokens/s"] == "1,000.0"
    assert split[1].startswith("skipped: GPU 4 / no")  # a '|' in a reason must not break the table


def test_group_measured_sums_into_cost_model_stages():
    g = group_measured({"generate": 1.0, "sync": 0.5, "ref": 2.0, "values": 1.0, "update_actor": 3.0})
    assert g == {"generation": 1.5, "preparation": 3.0, "training": 3.0}


def test_stage_table_and_plot(tmp_path):
    runs = [_measured("colocated", 0.25), _measured("auto", 0.75), {"placement": "split", "status": "skipped"}]
    rows = _rows(stage_table(runs))
    assert rows[0] == ["placement", "generate", "ref", "update_actor", "sync"]
    assert rows[3][:2] == ["auto", "0.750"]
    png = tmp_path / "stages.png"
    assert plot_stage_times(runs, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plot_stage_times(runs[2:], tmp_path / "none.png") and not (tmp_path / "none.png").exists()


def test_simulated_table_marks_chosen_and_skipped():
    row = {"setup": "s7b", "placement": "{actor, ref} x8", "chosen": True, "gpus": 8,
           "throughput_tokens_per_s": 10.0, "throughput_tokens_per_s_per_gpu": 1.25, "step_time_s": 3.0,
           "stage_time_s": {"generation": 1.0, "preparation": 1.0, "training": 1.0}, "actor_update_mfu": 0.4,
           "strategies": {"actor": "tp4 pp1 dp2 | gen tp2 dp4"}}
    rows = _rows(simulated_table([row, {"setup": "s70b", "gpus": 8, "skipped": "does not fit"}]))
    assert len(rows) == 4 and all(len(r) == len(rows[0]) for r in rows)
    assert rows[2][2] == "yes" and rows[2][10] == "40.00 %" and "/ gen tp2" in rows[2][11]
    assert rows[3][1] == "skipped: does not fit"


def test_summarize_drops_warmup_and_derives_tokens(tmp_path):
    cfg = load_experiment("tiny_cpu", ["data.train_batch_size=8", "rollout.n_samples_per_prompt=1",
                                       "algorithm.mini_batch_size=8", "roles.actor.micro_batch_size=2",
                                       "roles.critic.micro_batch_size=2", "roles.ref.micro_batch_size=2"])
    plan = plan_placement(cfg)
    lines = [{"step": 1, "phase": "sft", "loss": 1.0}]
    for step, (tok_s, step_s) in enumerate([(10.0, 10.0), (100.0, 2.0), (50.0, 2.0)], start=1):
        lines.append({"step": step, "phase": "rl", "tokens_per_s": tok_s, "step_time_s": step_s,
                      "time/generate": step_s / 2, "time/update_actor": step_s / 2, "parity/max_abs": step * 1e-6,
                      "parity/mean_abs": 1e-7, "reward/mean": 0.5})
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    records = read_rl_records(path)
    assert [r["step"] for r in records] == [1, 2, 3]
    out = summarize(records, 1, cfg, plan)
    assert out["timed_steps"] == 2
    assert out["throughput_tokens_per_s"] == pytest.approx((200 + 100) / 4)  # tokens = tokens_per_s * step_time
    assert out["throughput_tokens_per_s_per_gpu"] == pytest.approx(75 / plan.world_size)
    assert out["stage_time_s"]["generate"] == pytest.approx(1.0) and out["stage_time_s"]["values"] == 0.0
    assert out["parity_max_abs"] == pytest.approx(3e-6)
    assert out["actor_update"]["gpus"] == len(plan.meshes["actor"].ranks)
    with pytest.raises(ValueError, match="none left"):
        summarize(records, 3, cfg, plan)


def test_summarize_and_table_at_rollout_lag_1(tmp_path):
    cfg = load_experiment("tiny_cpu", ["placement=split_rollout", "trainer.rollout_lag=1"])
    plan = plan_placement(cfg)
    lines = [{"step": s, "phase": "rl", "tokens_per_s": 10.0, "step_time_s": 2.0, "time/generate": 0.0,
              "time/wait_rollout": 0.25 * s, "time/update_actor": 1.0, "offpolicy/max_abs": 0.1 * s,
              "rollout/generate_s": 1.5, "reward/mean": 0.5} for s in (1, 2, 3)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    out = summarize(read_rl_records(path), 1, cfg, plan)
    assert out["parity_max_abs"] is None  # the samples are one update stale: no parity to report
    assert out["offpolicy_max_abs"] == pytest.approx(0.3) and out["rollout_generate_s"] == pytest.approx(1.5)
    assert group_measured(out["stage_time_s"])["generation"] == pytest.approx(0.625)  # the wait is generation's
    run = {"placement": "split_rollout@lag1", "status": "measured", "gpus": 4, "measured": out}
    cell = dict(zip(*_rows(measured_table([run]))[::2], strict=True))
    assert cell["parity max / mean"] == "- (off-policy max 3.00e-01)"


def test_placement_spec_sets_the_rollout_lag(tmp_path):
    sweep = Sweep("tiny_cpu", ("data.train_batch_size=16",), 1, 2, tmp_path)
    lag1 = run_overrides(sweep, "split_rollout:megatron@lag1", tmp_path / "x", None)
    assert lag1[:4] == ["data.train_batch_size=16", "placement=split_rollout", "rollout=megatron",
                        "trainer.rollout_lag=1"]
    assert not any("rollout_lag" in o for o in run_overrides(sweep, "split_rollout", tmp_path / "x", None))
    assert run_name("split_rollout:megatron@lag1") == "split_rollout_megatron_lag1"
