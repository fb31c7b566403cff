"""Step metrics on rank 0: a progress bar, a JSONL file, TensorBoard events, sample generations and PNG plots
at the end."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402
from tqdm import tqdm  # noqa: E402

from hybridflow.trainer.samples import samples_markdown  # noqa: E402


class MetricsLog:
    """Writes metrics; a no-op on ranks other than 0. Appends, so a resumed run continues one file."""

    def __init__(self, out_dir: Path, total_steps: int, start_step: int, active: bool):
        self.active, self.out_dir = active, out_dir
        if not active:
            return
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "metrics.jsonl"
        self.writer = SummaryWriter(str(out_dir / "tensorboard"))
        self.bar = tqdm(total=total_steps, initial=start_step, desc="rl steps", dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, float], phase: str = "rl") -> None:
        if not self.active:
            return
        record = {"step": step, "phase": phase, **metrics}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for key, value in metrics.items():
            # Keys that already carry their phase (val/accuracy) are not prefixed twice.
            self.writer.add_scalar(key if key.startswith(f"{phase}/") else f"{phase}/{key}", value, step)
        if phase == "rl":
            self.bar.update(1)
            self.bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", kl=f"{metrics['kl']:.4f}",
                                 tok_s=f"{metrics['tokens_per_s']:.0f}")

    def log_samples(self, records: list[dict]) -> None:
        """Append sample generations (hybridflow.trainer.samples) to samples.jsonl and TensorBoard text."""
        if not self.active or not records:
            return
        with (self.out_dir / "samples.jsonl").open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        self.writer.add_text(f"samples/{records[0]['split']}", samples_markdown(records), records[0]["step"])

    def close(self) -> None:
        if not self.active:
            return
        self.bar.close()
        self.writer.close()
        plot_run(self.path, self.out_dir)


def read_metrics(path: Path, phase: str = "rl") -> list[dict]:
    """The records of one phase, the last record per step winning (a resumed run re-logs nothing twice)."""
    by_step = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("phase") == phase:
            by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]


def plot_validation(path: Path, out_dir: Path) -> None:
    """validation.png: val/reward_mean and val/accuracy per step, when the run validated."""
    records = read_metrics(path, phase="val")
    if not records:
        return
    steps = [r["step"] for r in records]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(steps, [r["val/reward_mean"] for r in records], marker="o", label="reward (mean)")
    ax.plot(steps, [r["val/accuracy"] for r in records], marker="s", label="accuracy")
    ax.set(title="validation", xlabel="step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "validation.png", dpi=120)
    plt.close(fig)


def plot_run(path: Path, out_dir: Path) -> None:
    """reward_kl.png (reward mean and KL per step), stage_times.png (mean seconds per stage), validation.png."""
    plot_validation(path, out_dir)
    records = read_metrics(path)
    if not records:
        return
    steps = [r["step"] for r in records]
    fig, (ax_r, ax_k) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax_r.plot(steps, [r["reward/mean"] for r in records], marker="o")
    ax_r.set(title="reward (mean)", xlabel="step")
    ax_k.plot(steps, [r["kl"] for r in records], marker="o", color="tab:red")
    ax_k.set(title="KL to reference", xlabel="step")
    fig.tight_layout()
    fig.savefig(out_dir / "reward_kl.png", dpi=120)
    plt.close(fig)
    stages = sorted({k for r in records for k in r if k.startswith("time/")})
    means = [sum(r.get(k, 0.0) for r in records) / len(records) for k in stages]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.barh([s.removeprefix("time/") for s in stages], means)
    ax.set(title="seconds per step by stage (mean)", xlabel="s")
    fig.tight_layout()
    fig.savefig(out_dir / "stage_times.png", dpi=120)
    plt.close(fig)
