"""Time to held-out accuracy, the headline of a real-task race (issue #43), from a `benchmarks.trl_curve` output.

    python -m benchmarks.time_to_accuracy DIR [--threshold 0.45]

For every framework and seed in DIR/compare.json: the held-out accuracy curve against samples trained on and
against training wall time (the sum of the RL steps' times before each evaluation: evaluation and start-up are
left out on both sides), the first evaluation at or above the threshold (samples and seconds; no interpolation:
evaluations are every `eval_every` steps, so a crossing is known only to that resolution), and the accuracy at
equal samples (each evaluation step) as mean and range over the seeds, and where that seed-mean curve first reaches
the threshold (the steadier headline: one seed's crossing moves with evaluation noise). Written to DIR:
time_to_accuracy.json, time_to_accuracy.md, accuracy_vs_time.png and accuracy_vs_samples.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import accumulate
from pathlib import Path

from benchmarks.run_summary import read_rl_records
from hybridflow.errors import UserError, cli_errors


def read_compare(directory: Path) -> dict:
    """`directory`/compare.json ({"meta", "runs"}) as benchmarks.trl_curve writes it, or one clear error."""
    compare = directory / "compare.json"
    if not compare.is_file():
        raise UserError(f"{compare}: not found; pass the --out directory of benchmarks.trl_curve")
    return json.loads(compare.read_text())


def step_times(run_dir: Path, side: dict, name: str) -> list[float]:
    """Seconds of RL steps 1..N of one side: its own `step_times_s`, else the hybridflow run's metrics.jsonl."""
    if "step_times_s" in side:
        return list(side["step_times_s"])
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise UserError(f"{name}: no step_times_s in compare.json and no {metrics}; rerun benchmarks.trl_curve")
    return [r["step_time_s"] for r in read_rl_records(metrics)]


def curve(side: dict, times: list[float]) -> list[dict]:
    """The side's evaluations with the training seconds spent before each (step 0: none)."""
    elapsed = [0.0, *accumulate(times)]
    points = []
    for point in side.get("accuracy", []):
        if point["step"] >= len(elapsed):
            raise UserError(f"evaluation at step {point['step']} but only {len(times)} step times were recorded")
        points.append({**point, "train_seconds": elapsed[point["step"]]})
    return points


def first_reaching(points: list[dict], threshold: float) -> dict | None:
    """The first evaluation whose accuracy is at least `threshold`, or None."""
    return next((p for p in points if p["accuracy"] >= threshold), None)


def summarize(runs: list[dict], out: Path, threshold: float) -> dict:
    """Per framework: each seed's curve and crossing, and the accuracy at each evaluation step over seeds."""
    frameworks: dict[str, dict] = {}
    for run in runs:
        for name, side in run.items():
            if not isinstance(side, dict) or "accuracy" not in side:
                continue
            points = curve(side, step_times(out / f"{name}_s{run['seed']}", side, name))
            entry = frameworks.setdefault(name, {"framework": side.get("framework", name), "seeds": {}})
            entry["seeds"][run["seed"]] = {"curve": points, "reached": first_reaching(points, threshold),
                                           "shared_gpu": bool(side.get("shared_gpu"))}
    for entry in frameworks.values():
        by_step: dict[int, list[dict]] = {}
        for seed in entry["seeds"].values():
            for p in seed["curve"]:
                by_step.setdefault(p["step"], []).append(p)
        entry["at_step"] = {step: _over_seeds(ps) for step, ps in sorted(by_step.items())}
        entry["mean_reached"] = mean_curve_reaching(entry, threshold)
    # runs from 3ba2a63 on record the prompt length TRL's side used to draw hybridflow's prompts (paired sides)
    paired = bool(runs) and all(run.get("work", {}).get("max_prompt_length") is not None for run in runs)
    return {"threshold": threshold, "frameworks": frameworks, "minus_trl": paired_differences(frameworks),
            "paired": paired}


def _spread(values: list[float]) -> dict:
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def _over_seeds(points: list[dict]) -> dict:
    """One evaluation step's points (one per seed): accuracy spread, seeds, samples, training-seconds spread."""
    return {**_spread([p["accuracy"] for p in points]), "seeds": len(points), "samples": points[0]["samples"],
            "train_seconds": _spread([p["train_seconds"] for p in points])}


def mean_curve_reaching(entry: dict, threshold: float) -> dict | None:
    """The first evaluation step whose accuracy averaged over every seed is at least `threshold`, with its samples
    and the seeds' training seconds there. One seed's crossing moves by a step or two with evaluation noise
    (128 greedy prompts: a binomial sd of ~0.044 near 0.45); the mean over seeds moves less."""
    return next(({"step": step, **a} for step, a in every_seed_steps(entry).items() if a["mean"] >= threshold), None)


def every_seed_steps(entry: dict) -> dict[int, dict]:
    """The framework's evaluation steps (step -> `_over_seeds`) that every one of its seeds reached."""
    return {step: a for step, a in entry["at_step"].items() if a["seeds"] == len(entry["seeds"])}


def paired_differences(frameworks: dict) -> dict:
    """Per hybridflow side and evaluation step: its accuracy minus TRL's on the same seed, as mean, [min, max] and
    how many seeds are at least TRL's (sharpest when the sides are paired: the same prompts, step for step)."""
    trl = frameworks.get("trl")
    out: dict[str, dict] = {}
    for name, entry in frameworks.items():
        if name == "trl" or trl is None:
            continue
        by_step: dict[int, list[float]] = {}
        for seed, s in entry["seeds"].items():
            theirs = {p["step"]: p["accuracy"] for p in trl["seeds"].get(seed, {}).get("curve", [])}
            for p in s["curve"]:
                if p["step"] in theirs:
                    by_step.setdefault(p["step"], []).append(p["accuracy"] - theirs[p["step"]])
        out[name] = {step: {**_spread(d), "seeds": len(d), "at_least": sum(x >= 0 for x in d)}
                     for step, d in sorted(by_step.items())}
    return out


SHARED_NOTE = (" 'GPU shared': that run shared its GPU with others (benchmarks.merge_curves @shared): its seconds"
               " are not a solo run's.")


def markdown(summary: dict, meta: dict) -> str:
    t = summary["threshold"]
    lines = [f"# Time to held-out accuracy {t}, {meta.get('device', '?')}, {meta.get('date', '?')}, "
             f"commit {meta.get('commit', '?')}", "",
             "Training wall time excludes evaluation and start-up on both sides. 'not reached' = no evaluation "
             "of that run got there." + (SHARED_NOTE if _any_shared(summary) else ""),
             *([f"Sources: {'; '.join(meta['sources'])}."] if meta.get("sources") else []), "",
             f"| framework | seed | samples to {t} | train seconds to {t} | final accuracy |", "|---|---|---|---|---|"]
    for name, entry in summary["frameworks"].items():
        for seed, s in sorted(entry["seeds"].items()):
            hit, last = s["reached"], s["curve"][-1]["accuracy"] if s["curve"] else float("nan")
            shared = " (GPU shared)" if s.get("shared_gpu") else ""
            reached = (f"{hit['samples']:,} | {hit['train_seconds']:.0f}{shared}" if hit
                       else "not reached | not reached")
            lines.append(f"| {name} | {seed} | {reached} | {last:.3f} |")
    lines += ["", "Accuracy at equal samples (mean over seeds, [min, max]):", "",
              "| framework | " + " | ".join(f"step {s}" for s in _steps(summary)) + " |",
              "|---|" + "---|" * len(_steps(summary))]
    for name, entry in summary["frameworks"].items():
        cells = [(f"{a['mean']:.3f} [{a['min']:.3f}, {a['max']:.3f}]" if (a := entry["at_step"].get(s)) else "-")
                 for s in _steps(summary)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"The seed-mean curve (each step's accuracy averaged over the seeds) first at or above {t}:", "",
              "| framework | step | samples | mean accuracy | train seconds there, mean [min, max] | / TRL's |",
              "|---|---|---|---|---|---|"]
    trl_hit = summary["frameworks"].get("trl", {}).get("mean_reached")
    for name, entry in summary["frameworks"].items():
        if (hit := entry["mean_reached"]) is None:
            lines.append(f"| {name} | not reached | | | | |")
            continue
        sec = hit["train_seconds"]
        ratio = f"{sec['mean'] / trl_hit['train_seconds']['mean']:.2f}x" if trl_hit and name != "trl" else ""
        lines.append(f"| {name} | {hit['step']} | {hit['samples']:,} | {hit['mean']:.3f} | "
                     f"{sec['mean']:.0f} [{sec['min']:.0f}, {sec['max']:.0f}] | {ratio} |")
    if summary.get("minus_trl"):
        pairing = ("paired: the same prompts step for step" if summary.get("paired") else
                   "NOT paired: the sides drew different prompts for a seed (runs before 3ba2a63)")
        lines += ["", f"Minus TRL on the same seed (mean [min, max]; seeds at least TRL's / seeds; {pairing}):", "",
                  "| framework | " + " | ".join(f"step {s}" for s in _steps(summary)) + " |",
                  "|---|" + "---|" * len(_steps(summary))]
        for name, diffs in summary["minus_trl"].items():
            cells = [(f"{d['mean']:+.3f} [{d['min']:+.3f}, {d['max']:+.3f}] {d['at_least']}/{d['seeds']}"
                      if (d := diffs.get(s)) else "-") for s in _steps(summary)]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _any_shared(summary: dict) -> bool:
    return any(s.get("shared_gpu") for e in summary["frameworks"].values() for s in e["seeds"].values())


def _steps(summary: dict) -> list[int]:
    return sorted({s for e in summary["frameworks"].values() for s in e["at_step"]})


def plot(summary: dict, x_key: str, x_label: str, path: Path) -> None:
    """Held-out accuracy against `x_key` (samples or train_seconds), a thin line per framework and seed and a
    thick one for the framework's seed-mean curve (at the seeds' mean seconds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for colour, (name, entry) in zip(colours * 4, summary["frameworks"].items(), strict=False):
        for _, s in sorted(entry["seeds"].items()):
            ax.plot([p[x_key] for p in s["curve"]], [p["accuracy"] for p in s["curve"]], "-", color=colour,
                    alpha=0.35, linewidth=1)
        everyone = every_seed_steps(entry).values()
        xs = [a["train_seconds"]["mean"] if x_key == "train_seconds" else a[x_key] for a in everyone]
        ax.plot(xs, [a["mean"] for a in everyone], "-o", color=colour, linewidth=2.2, markersize=4,
                label=f"{name} (mean of {len(entry['seeds'])} seeds)")
    ax.axhline(summary["threshold"], color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel(x_label)
    ax.set_ylabel("held-out accuracy (greedy)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.time_to_accuracy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path, help="a benchmarks.trl_curve --out directory")
    parser.add_argument("--threshold", type=float, default=0.45)
    with cli_errors():
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        data = read_compare(args.dir)
        summary = summarize(data["runs"], args.dir, args.threshold)
        (args.dir / "time_to_accuracy.json").write_text(json.dumps(summary, indent=2))
        text = markdown(summary, data.get("meta", {}))
        (args.dir / "time_to_accuracy.md").write_text(text)
        plot(summary, "train_seconds", "training wall time, s (evaluation excluded)", args.dir / "accuracy_vs_time.png")
        plot(summary, "samples", "samples trained on", args.dir / "accuracy_vs_samples.png")
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
