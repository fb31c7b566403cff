"""Both sides' training curves per RL step, from a `benchmarks.trl_curve` output (issue #43: where per-sample
learning parts).

    python -m benchmarks.training_curves DIR

For every framework and seed in DIR/compare.json, per RL step: the training reward mean, the per-token KL to the
reference (k3 on both sides; TRL's is weighted by its policy ratio, ~1), the per-token entropy and the mean response
length. hybridflow's come from its run's metrics.jsonl; TRL's from `log_history` in trl_s<seed>.json (runs from
bef3852 on), one entry per optimizer step, averaged over each RL step's optimizer steps. Written to DIR:
training_curves.md (mean over seeds at a few steps) and training_curves.png (2 x 2 panels, one line per framework
and seed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmarks.run_summary import read_rl_records
from benchmarks.time_to_accuracy import read_compare
from hybridflow.errors import UserError, cli_errors

# quantity -> (hybridflow metrics.jsonl key, TRL log_history key)
QUANTITIES = {
    "reward": ("reward/mean", "reward"),
    "kl": ("actor/kl_loss", "kl"),
    "entropy": ("actor/entropy", "entropy"),
    "response_length": ("response_length", "completions/mean_length"),
}


def hybridflow_series(run_dir: Path) -> dict[str, dict[int, float]]:
    """Per quantity, RL step -> value, from a hybridflow run's metrics.jsonl."""
    records = read_rl_records(run_dir / "metrics.jsonl")
    return {q: {r["step"]: float(r[key]) for r in records if key in r} for q, (key, _) in QUANTITIES.items()}


def trl_series(log_history: list[dict], optimizer_steps_per_rl_step: int) -> dict[str, dict[int, float]]:
    """Per quantity, RL step -> the mean over that RL step's optimizer steps of TRL's logged value."""
    sums: dict[str, dict[int, list[float]]] = {q: {} for q in QUANTITIES}
    for entry in log_history:
        if "step" not in entry:
            continue
        rl_step = (entry["step"] - 1) // optimizer_steps_per_rl_step + 1
        for q, (_, key) in QUANTITIES.items():
            if key in entry:
                sums[q].setdefault(rl_step, []).append(float(entry[key]))
    return {q: {s: sum(v) / len(v) for s, v in sorted(by_step.items())} for q, by_step in sums.items()}


def optimizer_steps_per_rl_step(work: dict) -> int:
    return work["prompts"] * work["samples_per_prompt"] * work.get("ppo_epochs", 1) // work["mini_batch_size"]


def collect(runs: list[dict], out: Path) -> dict[str, dict[int, dict[str, dict[int, float]]]]:
    """framework -> seed -> quantity -> {RL step: value}, for the sides whose per-step records exist."""
    curves: dict[str, dict[int, dict]] = {}
    for run in runs:
        for name, side in run.items():
            if not isinstance(side, dict) or "accuracy" not in side:
                continue
            if name == "trl":
                if "log_history" not in side:
                    continue  # a run from before bef3852 kept no log
                series = trl_series(side["log_history"], optimizer_steps_per_rl_step(run["work"]))
            else:
                run_dir = out / f"{name}_s{run['seed']}"
                if not (run_dir / "metrics.jsonl").is_file():
                    continue
                series = hybridflow_series(run_dir)
            curves.setdefault(name, {})[run["seed"]] = series
    if not curves:
        raise UserError(f"{out}: no per-step records (hybridflow run directories or TRL log_history) to plot")
    return curves


def markdown(curves: dict, steps: list[int]) -> str:
    lines = ["# Training curves per RL step (mean over seeds)", "",
             "| framework | quantity | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|---|---|" + "---|" * len(steps)]
    for name, seeds in curves.items():
        for q in QUANTITIES:
            cells = []
            for step in steps:
                values = [s[q][step] for s in seeds.values() if step in s[q]]
                cells.append(f"{sum(values) / len(values):.3g}" if values else "-")
            lines.append(f"| {name} | {q} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, q in zip(axes.flat, QUANTITIES, strict=True):
        for colour, (name, seeds) in zip(colours * 4, curves.items(), strict=False):
            for i, (_, series) in enumerate(sorted(seeds.items())):
                points = sorted(series[q].items())
                ax.plot([s for s, _ in points], [v for _, v in points], color=colour, alpha=0.8,
                        label=name if i == 0 else None)
        ax.set_title(q.replace("_", " "))
        ax.set_xlabel("RL step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.training_curves", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path, help="a benchmarks.trl_curve --out directory")
    with cli_errors():
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        curves = collect(read_compare(args.dir)["runs"], args.dir)
        last = max(s for seeds in curves.values() for series in seeds.values() for s in series["reward"])
        text = markdown(curves, sorted({1, *range(10, last + 1, 10), last}))
        (args.dir / "training_curves.md").write_text(text)
        plot(curves, args.dir / "training_curves.png")
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
