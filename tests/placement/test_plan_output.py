"""What `python -m hybridflow.plan` prints: a predicted step time for explicit plans too (the auto search's
cost model), the absolute plan.json path and the next command; and the auto explanation's memory per set
is the per-GPU table's figure."""

from __future__ import annotations

import json
import re

import pytest

from hybridflow import plan as plan_cli
from hybridflow.config import load_experiment
from hybridflow.placement.auto.from_config import plan_candidate, search_config, search_placement

AUTO = ("+experiment=ppo_llama3_8b_4gpu", "placement=auto")


def _plan_output(args, tmp_path, monkeypatch, capsys) -> str:
    monkeypatch.chdir(tmp_path)
    assert plan_cli.main(list(args)) == 0
    return capsys.readouterr().out


def test_explicit_plan_prints_step_time_path_and_next_command(tmp_path, monkeypatch, capsys):
    out = _plan_output(["+experiment=ppo_llama3_8b_4gpu", "--out", "sub/p.json"], tmp_path, monkeypatch, capsys)
    step = re.search(r"^predicted step time: ([\d.]+) s \(generation [\d.]+ s, preparation [\d.]+ s, "
                     r"training [\d.]+ s; cost model for H100\)$", out, re.M)
    assert step and float(step.group(1)) > 0, out
    written = tmp_path / "sub" / "p.json"
    assert f"wrote {written.resolve()}\n" in out
    assert out.rstrip().endswith("next: python -m hybridflow.run +experiment=ppo_llama3_8b_4gpu")
    stage_s = json.loads(written.read_text())["predicted_stage_s"]
    assert sum(stage_s.values()) == pytest.approx(float(step.group(1)), abs=0.05)


def test_prediction_of_the_auto_plan_is_the_search_s_own():
    # The predictor composes stage times as the search does: on the plan the search chose, it must give
    # the search's own numbers (else explicit and auto plans would be costed differently).
    cfg = load_experiment(None, list(AUTO))
    result = search_config(cfg)
    plan, _ = search_placement(cfg)
    assert plan_candidate(cfg, plan).stage_times == pytest.approx(result.chosen.stage_times, rel=1e-9)


def test_auto_explanation_memory_matches_the_table(tmp_path, monkeypatch, capsys):
    out = _plan_output(AUTO, tmp_path, monkeypatch, capsys)
    header = next(line for line in out.splitlines() if line.strip().startswith("gpu  node  roles"))
    total_col = header.split().index("total")
    totals = {}
    for line in out.splitlines():
        cells = line.split()
        if len(cells) == len(header.split()) + (1 if line.endswith("OVER") else 0) and cells[0].isdigit():
            totals[int(cells[0])] = float(cells[total_col])
    sets = dict(re.findall(r"^  memory (\{[^}]*\}): ([\d.]+) GiB/GPU$", out, re.M))
    assert totals and sets, out
    plan = json.loads((tmp_path / "plan.json").read_text())
    for label, gib in sets.items():
        roles = label.strip("{}").split(", ")
        ranks = {r for role in roles for r in plan["meshes"][role]["ranks"]}
        assert float(gib) == pytest.approx(max(totals[r] for r in ranks), abs=0.006), (label, gib, totals)


def test_the_search_prices_its_chosen_plan_at_the_offload_share_the_plan_picks():
    # An unset offload_fraction is searched at 1.0 but build_plan picks one share from the chosen layouts
    # (0.85 here, on 88 GiB GPUs): the search's figure for its choice must be the plan's, not the 1.0 one.
    cfg = load_experiment(None, [*AUTO, "cluster.gpu_memory_gib=88"])
    result = search_config(cfg)
    plan, explanation = search_placement(cfg)
    assert 0 < min(plan.offload_fractions.values()) < 1.0
    assert result.chosen.total == pytest.approx(plan_candidate(cfg, plan).total, rel=1e-9)
    assert result.chosen in [p.best for p in result.partitions]  # the explanation ranks the repriced choice


@pytest.mark.parametrize("environment", [None, "calculator"])
def test_a_plan_without_stop_ids_says_what_each_limit_bounds(environment, tmp_path, monkeypatch, capsys):
    # with rollout.environment, max_new_tokens bounds each assistant turn, not the whole response
    if environment:  # the run's checks refuse tiny_cpu's prompts for a tool environment (not chat): the text is tested
        import hybridflow.plan_report

        monkeypatch.setattr(hybridflow.plan_report, "checks_before_launch", lambda *args, **kwargs: (None, []))
    out = _plan_output(["+experiment=tiny_cpu", "rollout.stop_token_ids=[]", f"rollout.environment={environment}",
                        "--out", "p.json"] if environment else
                       ["+experiment=tiny_cpu", "rollout.stop_token_ids=[]", "--out", "p.json"],
                       tmp_path, monkeypatch, capsys)
    if environment is None:
        assert "every response is rollout.max_new_tokens=8 tokens" in out
    else:
        assert "every assistant turn is rollout.max_new_tokens=8 tokens (up to rollout.max_turns=" in out
        assert "every response is" not in out
