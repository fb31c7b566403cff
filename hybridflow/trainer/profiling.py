"""`trainer.profile_step=N`: torch.profiler over RL step N on every rank, to see where a step's time goes.

Each rank writes `<output_dir>/profile/step<N>.rank<r>.json.gz` (a Chrome trace: open it in Perfetto or
chrome://tracing) and `step<N>.rank<r>.txt`: per stage of the step (generate, ref, old_logprobs, update_actor,
...), its device time and the ops that take most of it (self device time on a GPU, self host time on a CPU),
with the host reads (`.item()` and friends, each a device sync) counted. The stages are the `StageTimer`'s, marked
in the trace as `stage/<name>` ranges. The profiled step runs slower (the profiler's own cost), so leave it out of
timings (the benchmark harness profiles a warm-up step).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

STAGE_PREFIX = "stage/"
HOST_READ = "aten::_local_scalar_dense"  # what .item(), float(), int() and bool() of a tensor run


@contextlib.contextmanager
def profiled(out_dir: Path | None, step: int, rank: int) -> Iterator[None]:
    """Profile the block into `out_dir` (named for `step` and `rank`); a no-op when `out_dir` is None."""
    if out_dir is None:
        yield
        return
    on_gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    with profile(activities=activities) as prof:
        yield
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"step{step}.rank{rank}"
    prof.export_chrome_trace(f"{stem}.json.gz")
    Path(f"{stem}.txt").write_text(stage_table(prof.events(), on_gpu))


def _stage_of(event) -> str:
    node = event
    while node is not None:
        if node.name.startswith(STAGE_PREFIX):
            return node.name.removeprefix(STAGE_PREFIX)
        node = node.cpu_parent
    return "(outside stages)"


def stage_table(events, on_gpu: bool, top: int = 12) -> str:
    """Per stage: its total self time (device on a GPU, host on a CPU), the `top` ops by it, and host reads."""
    unit = "device" if on_gpu else "host"
    per_op: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    calls: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    host_reads: dict[str, int] = defaultdict(int)
    for event in events:
        if event.name.startswith(STAGE_PREFIX):
            continue
        stage = _stage_of(event)
        self_us = event.self_device_time_total if on_gpu else event.self_cpu_time_total
        if self_us > 0:
            per_op[stage][event.name] += self_us
            calls[stage][event.name] += 1
        host_reads[stage] += event.name == HOST_READ
    lines = [f"self {unit} time per stage (ms), top {top} ops each; host reads = {HOST_READ} calls", ""]
    for stage, ops in sorted(per_op.items(), key=lambda kv: -sum(kv[1].values())):
        lines.append(f"== {stage}: {sum(ops.values()) / 1e3:.1f} ms {unit}, {host_reads[stage]} host reads")
        for name, us in sorted(ops.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"  {us / 1e3:10.2f} ms  {calls[stage][name]:7d} x  {name[:100]}")
        lines.append("")
    return "\n".join(lines)
