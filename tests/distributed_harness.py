"""Run a function in N gloo ranks forked from the (already imported) pytest process.

Importing torch + megatron costs ~8 s per process; forking from a parent that has imported them makes a
launch cost well under a second, so tests run many checks per launch. Usage:

    from tests.distributed_harness import run_distributed

    def _check(scale):                       # module level; runs in every rank
        import torch.distributed as dist
        return dist.get_rank() * scale

    def test_ranks():
        assert run_distributed(_check, world_size=2, args=(10,)) == [0, 10]

The parent is switched to one intra-op thread (`torch.set_num_threads(1)`) before forking, because
OpenMP's pool is not fork-safe; for the same reason a forked rank starts torch.compile's compile thread
pool afresh. Each rank: sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT,
initialises gloo on a free port and enables megatron_adapters.cpu_backend (or nccl with
`device="cuda"`), seeds torch with `seed` (the same in every rank, like a real SPMD launch), runs
`fn(*args, **kwargs)`, and sends the return value back (pickled by value, so tensors are fine). A rank
that raises makes `run_distributed` raise `DistributedTestError` with that rank's traceback; a rank that
hangs fails the call after `timeout_s`.

`HYBRIDFLOW_TEST_DEVICE=cuda` makes nccl the default of every call that passes no `device` (an explicit
`device=` still wins), so a test whose ranks build their tensors on
`megatron_adapters.cpu_backend.compute_device()` runs on GPUs as it is. CUDA ranks turn TF32 off (matmul
and cuDNN), so fp32 tests keep their CPU tolerances; tensors in `args`/`kwargs` arrive on the rank's GPU,
and tensors in the return value come back on the CPU (inside dicts, lists and tuples), so the parent
compares them with CPU references.

Why not `hybridflow.launch.launch_ranks` (the launcher the run and convert CLIs use): torch's elastic agent
redirects each rank's stdout/stderr by file descriptor, which fails under pytest's `capsys` (no fileno), it
reports a failing rank only through an error file after SIGTERMing its peers, and it has no wall-clock
limit for a hung rank. A test wants the failing rank's full traceback as its assertion message, a per-call
`timeout_s`, and tensors moved to and from the rank's GPU; that is what this harness adds.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from hybridflow.launch.ports import free_port

DEVICE_ENV = "HYBRIDFLOW_TEST_DEVICE"
DEVICES = ("cpu", "cuda")


class DistributedTestError(AssertionError):
    """A rank raised, died or timed out; the message carries its rank and traceback."""


def default_device() -> str:
    """The device of `run_distributed` calls that pass none: `$HYBRIDFLOW_TEST_DEVICE`, else "cpu"."""
    device = os.environ.get(DEVICE_ENV, "").strip() or "cpu"
    if device not in DEVICES:
        raise ValueError(f"{DEVICE_ENV}={device!r}: use 'cpu' (gloo) or 'cuda' (nccl), or unset it")
    return device


def disable_tf32() -> None:
    """fp32 matmuls and convolutions in full fp32 (TF32 keeps 10 mantissa bits: ~1e-3 relative error)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def move_tensors(value: Any, device) -> Any:
    """`value` with every tensor inside dicts, lists and tuples moved to `device` (other objects as they are).

    Moved tensors are detached leaves that keep `requires_grad`, so they pickle like the originals.
    """
    import torch

    if isinstance(value, torch.Tensor):
        moved = value.detach().to(device)
        return moved.requires_grad_() if value.requires_grad else moved
    if type(value) is dict:
        return {k: move_tensors(v, device) for k, v in value.items()}
    if type(value) is list:
        return [move_tensors(v, device) for v in value]
    if isinstance(value, tuple):
        items = [move_tensors(v, device) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _rank_main(rank, world_size, port, fn, args, kwargs, seed, device, timeout_s, results):
    import torch
    import torch.distributed as dist

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    # Gloo would otherwise resolve the hostname, which may not map to a reachable interface in sandboxes.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    # torch.compile builds CPU kernels on a cached thread pool that torch's own at-fork hook does not reset: in
    # a rank forked after the parent compiled, that pool has no threads and the first compile waits forever.
    compile_pools = sys.modules.get("torch._inductor.async_compile")
    if compile_pools is not None:
        compile_pools.AsyncCompile.pool.cache_clear()
    try:
        timeout = timedelta(seconds=timeout_s)
        if device == "cuda":
            torch.cuda.set_device(rank)
            disable_tf32()
            dist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=timeout)
            args, kwargs = move_tensors((args, kwargs), torch.device("cuda", rank))
        else:
            dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout)
            from megatron_adapters.cpu_backend import enable_cpu_backend

            # force: CPU tests run the CPU path on every machine, GPU or not.
            enable_cpu_backend(force=True)
        torch.manual_seed(seed)
        value = fn(*args, **kwargs)
        if device == "cuda":
            value = move_tensors(value, torch.device("cpu"))
        payload = (rank, "ok", pickle.dumps(value))
    except BaseException:  # noqa: BLE001 - everything goes back to the parent, which re-raises
        payload = (rank, "error", traceback.format_exc())
    try:
        results.put(payload)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    timeout_s: float = 240.0,
    seed: int = 1234,
    device: str | None = None,
) -> list[Any]:
    """Run `fn(*args, **kwargs)` in `world_size` ranks; return the per-rank results.

    `fn` must be a module-level function and its arguments and return value picklable. Raises
    DistributedTestError naming the first failing rank (with its traceback), ranks that exited without
    reporting, or ranks still running after `timeout_s` (those are killed). `device="cpu"`: gloo + the
    CPU backend, on any machine. `device="cuda"`: nccl, rank r on GPU r (needs `world_size` GPUs).
    `device=None` (default): `default_device()`, i.e. `$HYBRIDFLOW_TEST_DEVICE` or "cpu".

    Ranks are forked where CUDA is absent (CI, dev boxes: fast). Where CUDA exists they are spawned
    (a few seconds of imports per launch): neither an initialised CUDA context nor autograd's per-device
    threads survive fork, and the pytest parent may have started either.
    """
    import torch

    # OpenMP's thread pool is not fork-safe: a child forked after the parent ran a multi-threaded op hangs in
    # its first parallel region. One intra-op thread in the parent (and so in every child) avoids the pool;
    # the machines that run these tests have 2 cores for several processes anyway.
    torch.set_num_threads(1)
    ctx = multiprocessing.get_context("spawn" if torch.cuda.is_available() else "fork")
    source = "device" if device is not None else DEVICE_ENV
    device = default_device() if device is None else device
    if device not in DEVICES:
        raise ValueError(f"device: {device!r}; use 'cpu' or 'cuda'")
    if device == "cuda" and torch.cuda.device_count() < world_size:
        raise ValueError(
            f"{source}: 'cuda' runs rank r on GPU r, so world_size={world_size} needs {world_size} GPUs; "
            f"this machine has {torch.cuda.device_count()} (use device='cpu' or unset {DEVICE_ENV})"
        )
    results = ctx.Queue()
    port = free_port("127.0.0.1")
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(
                rank,
                world_size,
                port,
                fn,
                args,
                kwargs or {},
                seed,
                device,
                timeout_s,
                results,
            ),
            # Not daemonic: dist_checkpointing may start helper processes, which daemons may not have.
            daemon=False,
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    try:
        reports = _collect(results, procs, timeout_s)
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    # Reports are kept in arrival order: the first error is usually the cause, later ones its echoes.
    errors = [(rank, text) for rank, (status, text) in reports.items() if status == "error"]
    if errors:
        rank, text = errors[0]
        others = f" (then ranks {sorted(r for r, _ in errors[1:])} failed too)" if len(errors) > 1 else ""
        raise DistributedTestError(f"rank {rank} of {world_size} raised{others}:\n{text}")
    return [pickle.loads(reports[rank][1]) for rank in range(world_size)]


def _collect(results, procs, timeout_s: float) -> dict[int, tuple[str, Any]]:
    reports: dict[int, tuple[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(reports) < len(procs):
        try:
            rank, status, body = results.get(timeout=1.0)
            reports[rank] = (status, body)
            if status == "error":
                # Peers of a failed rank usually block in a collective: give them a moment, then stop.
                deadline = min(deadline, time.monotonic() + 5.0)
            continue
        except queue.Empty:
            pass
        lost = [r for r, p in enumerate(procs) if r not in reports and not p.is_alive()]
        if lost:
            _drain(results, reports, wait_s=2.0)  # a rank's last report may still be in the pipe
            lost = [r for r in lost if r not in reports]
        if lost or time.monotonic() > deadline:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
            if any(status == "error" for status, _ in reports.values()):
                return reports
            missing = [r for r in range(len(procs)) if r not in reports]
            if lost:
                codes = {r: procs[r].exitcode for r in lost}
                raise DistributedTestError(f"ranks exited without reporting (exit codes {codes})")
            raise DistributedTestError(f"timed out after {timeout_s:.0f}s waiting for ranks {missing}")
    return reports


def _drain(results, reports: dict, wait_s: float) -> None:
    end = time.monotonic() + wait_s
    while time.monotonic() < end:
        try:
            rank, status, body = results.get(timeout=0.2)
        except queue.Empty:
            continue
        reports[rank] = (status, body)
