"""Writers for the throughput benchmark: a markdown table comparing placements and a stage-time bar chart."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.predict import group_measured  # noqa: E402


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def _parity(m: dict) -> str:
    if m.get("parity_max_abs") is None:  # rollout_lag=1: the samples are one update stale, nothing to compare
        return f"- (off-policy max {m['offpolicy_max_abs']:.2e})" if m.get("offpolicy_max_abs") is not None else "-"
    return f"{m['parity_max_abs']:.2e} / {m['parity_mean_abs']:.2e}"


MEASURED_HEADER = ("| placement | status | GPUs | tokens/s | tokens/s/GPU | step s | generation s | preparation s "
                   "| training s | actor MFU | peak GiB | parity max / mean | predicted tokens/s | predicted step s "
                   "| predicted gen / prep / train s |")


def measured_table(runs: list[dict]) -> str:
    """One row per placement: measured figures, the cost model's prediction next to them, or why skipped."""
    lines = [MEASURED_HEADER, "|" + "---|" * (MEASURED_HEADER.count("|") - 1)]
    for run in runs:
        pred = run.get("predicted") or {}
        pstages = pred.get("stage_time_s", {})
        predicted = [_num(pred.get("throughput_tokens_per_s")), _num(pred.get("step_time_s"), 2),
                     " / ".join(_num(pstages.get(s), 2) for s in ("generation", "preparation", "training"))
                     if pstages else "-"]
        m = run.get("measured")
        if m is None:
            reason = run.get("reason", "").replace("|", "/")
            status = f"{run['status']}: {reason}" if reason else run["status"]
            lines.append(f"| {run['placement']} | {status} | {run.get('gpus', '-')} |"
                         + " - |" * 9 + " " + " | ".join(predicted) + " |")
            continue
        g = group_measured(m["stage_time_s"])
        cells = [run["placement"], run["status"], str(run["gpus"]), _num(m["throughput_tokens_per_s"]),
                 _num(m["throughput_tokens_per_s_per_gpu"]), _num(m["step_time_s"], 2),
                 _num(g["generation"], 2), _num(g["preparation"], 2), _num(g["training"], 2),
                 _pct(m["actor_update"]["mfu"]), _num(m["peak_memory_gib"], 2),
                 _parity(m), *predicted]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def stage_table(runs: list[dict]) -> str:
    """Mean seconds per trainer stage (columns) for each measured placement (rows)."""
    measured = [r for r in runs if r.get("measured")]
    if not measured:
        return ""
    stages = list(dict.fromkeys(s for r in measured for s in r["measured"]["stage_time_s"]))
    lines = ["| placement | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
    for r in measured:
        st = r["measured"]["stage_time_s"]
        lines.append(f"| {r['placement']} | " + " | ".join(_num(st.get(s), 3) for s in stages) + " |")
    return "\n".join(lines) + "\n"


SIMULATED_HEADER = ("| setup | placement | chosen | GPUs | predicted tokens/s | tokens/s/GPU | step s | generation s "
                    "| preparation s | training s | actor MFU | strategies |")


def simulated_table(rows: list[dict]) -> str:
    """Cost-model predictions for clusters we cannot run; a setup that fits nowhere says why."""
    lines = [SIMULATED_HEADER, "|" + "---|" * (SIMULATED_HEADER.count("|") - 1)]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['setup']} | skipped: {r['skipped'].replace('|', '/')} | | {r['gpus']} |"
                         + " |" * 8)
            continue
        st = r["stage_time_s"]
        strategies = "; ".join(f"{k}: {v}" for k, v in r.get("strategies", {}).items()).replace("|", "/")
        cells = [r["setup"], r["placement"], "yes" if r["chosen"] else "", str(r["gpus"]),
                 _num(r["throughput_tokens_per_s"]), _num(r["throughput_tokens_per_s_per_gpu"]),
                 _num(r["step_time_s"], 1), _num(st["generation"], 1), _num(st["preparation"], 1),
                 _num(st["training"], 1), _pct(r["actor_update_mfu"]), strategies]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_stage_times(runs: list[dict], path: Path) -> bool:
    """Stacked horizontal bars: mean seconds per trainer stage, one bar per measured placement.

    Returns False (and writes nothing) when no placement was measured.
    """
    measured = [r for r in runs if r.get("measured")]
    if not measured:
        return False
    stages = list(dict.fromkeys(s for r in measured for s in r["measured"]["stage_time_s"]))
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.6 * len(measured)))
    left = [0.0] * len(measured)
    names = [r["placement"] for r in measured]
    for stage in stages:
        widths = [r["measured"]["stage_time_s"].get(stage, 0.0) for r in measured]
        ax.barh(names, widths, left=left, label=stage)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.set(xlabel="seconds per step (mean over timed steps)", title="stage times per placement")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
