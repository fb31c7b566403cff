"""benchmarks/tool_curve.py on metrics.jsonl files as a run writes them: the curves per run, the table's start
and end figures, the PNG; a run without tools has no tool-call curve, and a run that never started is left out."""

from __future__ import annotations

import json

from benchmarks.tool_curve import main


def _write_run(path, with_tools: bool) -> None:
    path.mkdir()
    lines = []
    for step, (acc, calls) in enumerate([(0.1, 0.2), (0.3, 0.5), (0.6, 0.9)]):
        val = {"step": step * 10, "phase": "val", "val/accuracy": acc}
        rl = {"step": step * 10 + 1, "phase": "rl", "reward/mean": acc / 2}
        if with_tools:
            val["val/tools/calling_share"], rl["tools/calling_share"] = calls, calls / 2
        lines += [json.dumps(val), json.dumps(rl)]
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_tool_curve_tables_and_plots_each_run(tmp_path):
    _write_run(tmp_path / "a", True)
    _write_run(tmp_path / "b", False)
    assert main(["--out", str(tmp_path / "out"), f"tool={tmp_path / 'a'}", f"plain={tmp_path / 'b'}",
                 f"failed={tmp_path / 'missing'}"]) == 0
    curves = json.loads((tmp_path / "out" / "tools.json").read_text())
    assert set(curves) == {"tool", "plain"}
    assert curves["tool"]["val_tool_calls"] == [[0, 0.2], [10, 0.5], [20, 0.9]]
    assert curves["tool"]["tool_calls"] == [[1, 0.1], [11, 0.25], [21, 0.45]] and curves["plain"]["tool_calls"] == []
    table = (tmp_path / "out" / "tools.md").read_text()
    assert "| tool | 0.100 -> 0.600 | 0.200 -> 0.900 | 0.100 -> 0.450 | 0.050 -> 0.300 |" in table
    assert "| plain | 0.100 -> 0.600 | - | - |" in table
    assert (tmp_path / "out" / "tools.png").stat().st_size > 0
