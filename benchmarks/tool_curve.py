"""GRPO with a tool vs without, from finished runs' metrics.jsonl: held-out accuracy and tool-call rate over
training, as a table and a PNG.

    python -m benchmarks.tool_curve --out DIR LABEL=RUN_DIR [LABEL=RUN_DIR ...]

Each run validated greedily on the held-out split (`trainer.val_every`, `val_before_train=true`). Read per run:
`val/accuracy` and, with `rollout.environment`, `val/tools/calling_share` (share of held-out trajectories with a
tool call) at every validation; `tools/calling_share` and `reward/mean` of every RL step (sampled at the rollout
temperature). Written to DIR: tools.md (one row per run: start and end of each curve) and tools.png (accuracy
and tool-call rate against RL steps). Whether the policy learns to skip the tool shows as a falling tool-call
rate with a flat or falling accuracy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.run_summary import read_rl_records


def run_curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """(step, value) series of one run: val accuracy and tool-call rate, RL-step tool-call rate and reward."""
    path = run_dir / "metrics.jsonl"
    val = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    val = [r for r in val if r.get("phase") == "val"]
    rl = read_rl_records(path)

    def series(records: list[dict], key: str) -> list[tuple[int, float]]:
        return [(int(r["step"]), float(r[key])) for r in records if key in r]

    return {"val_accuracy": series(val, "val/accuracy"), "val_tool_calls": series(val, "val/tools/calling_share"),
            "tool_calls": series(rl, "tools/calling_share"), "reward": series(rl, "reward/mean")}


def _ends(points: list[tuple[int, float]]) -> str:
    return f"{points[0][1]:.3f} -> {points[-1][1]:.3f}" if points else "-"


def tools_markdown(curves: dict[str, dict]) -> str:
    lines = ["| run | val accuracy (step 0 -> last) | val tool-call rate | train tool-call rate | reward |",
             "|---|---|---|---|---|"]
    for label, c in curves.items():
        lines.append(f"| {label} | {_ends(c['val_accuracy'])} | {_ends(c['val_tool_calls'])} | "
                     f"{_ends(c['tool_calls'])} | {_ends(c['reward'])} |")
    return "\n".join(lines) + "\n"


def plot_tools(curves: dict[str, dict], path: Path) -> None:
    """tools.png: held-out accuracy (left) and tool-call rate (right, held-out solid, training dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, calls) = plt.subplots(1, 2, figsize=(10, 4))
    for i, (label, c) in enumerate(curves.items()):
        color = f"C{i}"  # one colour per run in both panels (runs without the tool have no right-hand curve)
        if c["val_accuracy"]:
            acc.plot(*zip(*c["val_accuracy"], strict=True), "-o", color=color, label=label)
        if c["val_tool_calls"]:
            calls.plot(*zip(*c["val_tool_calls"], strict=True), "-o", color=color,
                       label=f"{label} (held-out, greedy)")
        if c["tool_calls"]:
            calls.plot(*zip(*c["tool_calls"], strict=True), ":", color=color, label=f"{label} (training samples)")
    acc.set(xlabel="RL step", ylabel="held-out accuracy (greedy)")
    calls.set(xlabel="RL step", ylabel="share of trajectories calling the tool", ylim=(0, 1.05))
    for ax in (acc, calls):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tool_curve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("runs", nargs="+", help="LABEL=RUN_DIR (a run's trainer.output_dir)")
    args = parser.parse_args(argv)
    curves = {}
    for item in args.runs:
        label, _, run_dir = item.partition("=")
        if (Path(run_dir) / "metrics.jsonl").is_file():  # a run that failed early is left out, not fatal
            curves[label] = run_curves(Path(run_dir))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tools.json").write_text(json.dumps(curves, indent=1))
    (args.out / "tools.md").write_text(tools_markdown(curves))
    if curves:
        plot_tools(curves, args.out / "tools.png")
    print(tools_markdown(curves))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
