"""Start one machine's ranks through torch's elastic agent (the machinery behind torchrun).

`launch_local` is what `python -m hybridflow.run` calls outside any launcher: one worker per planned rank,
CUDA_VISIBLE_DEVICES from the plan, MASTER_ADDR/MASTER_PORT from `distributed`, logs per rank, and no
restarts: when a rank dies the agent stops the others and we raise `LaunchError` naming the failed rank
and its log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import socket
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, Std
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from hybridflow.errors import UserError
from hybridflow.launch.console import RankConsole
from hybridflow.launch.failure_report import describe_failure, first_error, keep_traceback_in_log
from hybridflow.launch.lifeline import LAUNCHER_PID_VARIABLE, run_with_launcher
from hybridflow.launch.ports import free_port, store_socket
from hybridflow.launch.rendezvous import BACKEND, LISTENER

if TYPE_CHECKING:
    from hybridflow.config import DistributedConfig
    from hybridflow.placement import Plan

class LaunchError(RuntimeError):
    """A worker failed; the message names the rank, how it ended, its log file and the log's last lines.

    `first_error` is the exception text that rank raised ("" when it died without one), e.g. for a caller
    that turns a rank's bad-input error into its own one-line message.
    """

    def __init__(self, message: str, first_error: str = "") -> None:
        super().__init__(message)
        self.first_error = first_error


class LaunchInterrupted(Exception):
    """The launcher got SIGINT/SIGTERM/SIGHUP/SIGQUIT (Ctrl-C, scancel); the agent has stopped every rank."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process ended by that signal (130 for Ctrl-C)


class RankLogsSpecs(DefaultLogsSpecs):
    """torch's default per-rank log files (no tee: `RankConsole` shows rank 0's), remembering which global
    rank wrote which file."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir=log_dir, redirects=Std.ALL, tee=Std.NONE)
        self.stderr_of_rank: dict[int, str] = {}
        self.stdout_of_rank: dict[int, str] = {}

    def reify(self, envs):  # type: ignore[no-untyped-def]  (signature fixed by LogsSpecs)
        dest = super().reify(envs)
        for local_rank, env in envs.items():
            rank = int(env["RANK"])
            self.stderr_of_rank[rank] = dest.stderrs.get(local_rank, "")
            self.stdout_of_rank[rank] = dest.stdouts.get(local_rank, "")
        return dest


def visible_devices(local_indices: Sequence[int], inherited: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for the plan's GPUs on this node.

    Plan indices count the GPUs this process may use: when the user already narrowed them (e.g.
    CUDA_VISIBLE_DEVICES=4,5,6,7), plan GPU 0 is physical GPU 4.
    """
    if inherited:
        allowed = [d.strip() for d in inherited.split(",") if d.strip()]
        if max(local_indices) >= len(allowed):
            raise UserError(f"cluster.gpus_per_node: the plan uses GPU index {max(local_indices)} but "
                            f"CUDA_VISIBLE_DEVICES={inherited} allows {len(allowed)}; widen "
                            "CUDA_VISIBLE_DEVICES or lower cluster.gpus_per_node")
        return ",".join(allowed[i] for i in local_indices)
    return ",".join(str(i) for i in local_indices)


TRACKER_LEAK_WARNING = "ignore::UserWarning:multiprocessing.resource_tracker"
# torch's logger that prints a failed rank's whole traceback (twice wrapped, one prefix per line): our one line
# names the error and the rank's log holds the traceback (failure_report.keep_traceback_in_log).
RANK_FAILURE_LOGGER = "torch.distributed.elastic.multiprocessing.api"


@contextlib.contextmanager
def _agent_logs_quieted(silence: bool) -> Iterator[None]:
    """The elastic agent's own log lines for the call: errors only (its "Received 2 death signal",
    "Closing process ..." and "Terminating process ..." warnings repeat what our one line says) and never its
    traceback of a failed rank (which `LaunchError` reports), none at all with `silence`. torch sets a level on
    each of its `torch.distributed.elastic.*` loggers, so each is raised."""
    names = {n for n in logging.root.manager.loggerDict if n.startswith("torch.distributed.elastic")}
    names |= {RANK_FAILURE_LOGGER, "torch.multiprocessing.spawn"}  # spawn's: "Terminating process N via SIGTERM"
    saved = {name: logging.getLogger(name).level for name in names}
    for name in names:
        quiet = silence or name == RANK_FAILURE_LOGGER
        logging.getLogger(name).setLevel(logging.CRITICAL if quiet else logging.ERROR)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


@contextlib.contextmanager
def _environ(updates: dict[str, str]) -> Iterator[None]:
    """Set variables for the agent (workers inherit its environment) and restore them afterwards."""
    saved = {k: os.environ.get(k) for k in updates}
    os.environ.update(updates)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _entrypoint(entrypoint: Callable[..., Any] | str, args: Sequence[Any]) -> tuple[Any, list[Any]]:
    """A callable runs as is; 'pkg.module' runs as `python -m pkg.module`; 'x.py' runs as a script."""
    if callable(entrypoint):
        return entrypoint, list(args)
    if entrypoint.endswith(".py"):
        return sys.executable, ["-u", entrypoint, *map(str, args)]
    return sys.executable, ["-u", "-m", entrypoint, *map(str, args)]


def launch_local(plan: Plan, entrypoint: Callable[..., Any] | str, args: Sequence[Any],
                 dist_cfg: DistributedConfig, log_dir: str | os.PathLike[str],
                 run_id: str | None = None, stop_grace_s: int = 10) -> dict[int, Any]:
    """Run `entrypoint(*args)` in one process per rank of a one-node plan; return {rank: return value}.

    Workers call `hybridflow.launch.init_distributed(dist_cfg)` to join the group. Callables are forked from a
    fork server on machines without CUDA (fast: it imported their module once) and spawned otherwise (CUDA
    cannot be forked).
    `stop_grace_s` is how long surviving ranks get between SIGTERM and SIGKILL once one rank has failed.
    """
    if plan.nodes != 1:
        raise UserError(f"cluster.nodes: the plan spans {plan.nodes} nodes and a local launch starts one; "
                        "submit it with `python -m hybridflow.sbatch` or run torchrun on every node")
    local = [gpu.local_index for gpu in plan.gpus if gpu.node == 0]
    devices = visible_devices(local, os.environ.get("CUDA_VISIBLE_DEVICES"))
    return launch_ranks(len(local), entrypoint, args, dist_cfg, log_dir, devices, run_id=run_id,
                        stop_grace_s=stop_grace_s)


def _listen_for_store(dist_cfg: DistributedConfig) -> socket.socket:
    """The store's listening socket on distributed.master_addr:master_port, or a UserError naming the fix."""
    addr, port = dist_cfg.master_addr, dist_cfg.master_port
    try:
        return store_socket(addr, port)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise UserError(f"distributed.master_port: port {port} is in use on {addr}; "
                            f"set distributed.master_port={free_port(addr)} (free now)") from None
        raise UserError(f"distributed.master_addr: the rendezvous store cannot listen on {addr}:{port} "
                        f"({err.strerror or err}); set an address of this machine (127.0.0.1 for a "
                        "single-node run)") from None


def check_store_address(dist_cfg: DistributedConfig) -> None:
    """Refuse, as the launch would, an address or port the store cannot listen on: called before a run writes
    anything (its lock, plan.json, moving a previous run aside), so a refusal leaves the directory as it was."""
    _listen_for_store(dist_cfg).close()


def launch_ranks(nproc: int, entrypoint: Callable[..., Any] | str, args: Sequence[Any],
                 dist_cfg: DistributedConfig, log_dir: str | os.PathLike[str], devices: str, *,
                 run_id: str | None = None, stop_grace_s: int = 10, start_method: str | None = None,
                 quiet: bool = False) -> dict[int, Any]:
    """Run `entrypoint(*args)` in `nproc` local ranks through torch's elastic agent; {rank: return value}.

    The one way hybridflow starts local ranks (`launch_local` for a plan, `hybridflow.convert` for its
    conversion ranks). `devices` is the workers' CUDA_VISIBLE_DEVICES ("" hides every GPU);
    `start_method` defaults to forkserver without CUDA and spawn with it. Rank 0's output is shown here as it is
    written (`RankConsole`); every rank's is in its log file. `quiet`: the ranks' output goes only to their log
    files and the agent prints nothing, so the caller alone reports (a CLI's one-line error).
    The rendezvous store listens on `dist_cfg.master_addr` only (hybridflow/launch/rendezvous.py); a busy port
    is refused with a free one named. Raises `LaunchError` naming the rank that failed first,
    `LaunchInterrupted` when this process was signalled (the ranks are stopped by then).
    """
    listener = _listen_for_store(dist_cfg)
    try:
        return _launch_agent(nproc, entrypoint, args, dist_cfg, log_dir, devices, listener, run_id=run_id,
                             stop_grace_s=stop_grace_s, start_method=start_method, quiet=quiet)
    finally:
        listener.close()  # a no-op once the store took it over (detached)


def _launch_agent(nproc: int, entrypoint: Callable[..., Any] | str, args: Sequence[Any],
                  dist_cfg: DistributedConfig, log_dir: str | os.PathLike[str], devices: str,
                  listener: socket.socket, *, run_id: str | None, stop_grace_s: int, start_method: str | None,
                  quiet: bool) -> dict[int, Any]:
    logs = RankLogsSpecs(str(log_dir))
    target, target_args = _entrypoint(entrypoint, args)
    if start_method is None:
        start_method = "spawn" if torch.cuda.is_available() else "forkserver"
    if start_method == "forkserver" and callable(target):
        # Not plain fork: the agent's store thread resolves peer addresses (getnameinfo) while later ranks
        # are forked, and a child forked while it holds glibc's resolver lock hangs in its own store connect
        # (seen: 1 launch in 3 on the CI machine, whose DNS lookups time out). The fork server is
        # single-threaded; it imports the entrypoint's module once, so ranks still start without re-importing
        # (`fork_server` first: the known warnings of those imports are not printed raw there).
        multiprocessing.get_context("forkserver").set_forkserver_preload(["hybridflow.launch.fork_server",
                                                                          target.__module__])
        # The fork server imports those modules with its own default sys.path (Python 3.12 does not hand it ours)
        # and skips them silently when it cannot: then every rank imports torch afresh. Start the server here,
        # with our sys.path on its PYTHONPATH, so the module is found wherever this process found it.
        # The resource tracker it starts unlinks what stopped ranks leave behind (after Ctrl-C, the semaphore of
        # a rank's checkpoint Manager) and warns about each: expected after a stop, and cleaned up.
        warnings_filter = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), TRACKER_LEAK_WARNING]))
        with _environ({"PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "PYTHONWARNINGS": warnings_filter}):
            multiprocessing.forkserver.ensure_running()
    if callable(target):  # ranks end when this process dies, even by SIGKILL (hybridflow/launch/lifeline.py)
        target, target_args = run_with_launcher, [os.getpid(), target, *target_args]
    options = dict(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc,
        run_id=run_id or f"hybridflow-{uuid.uuid4().hex[:8]}",
        rdzv_backend=BACKEND, rdzv_endpoint=f"{dist_cfg.master_addr}:{dist_cfg.master_port}",
        rdzv_configs={"timeout": dist_cfg.timeout_s, LISTENER: listener},
        max_restarts=0, monitor_interval=0.5, logs_specs=logs, start_method=start_method,
    )
    if "shutdown_timeout" in {f.name for f in dataclasses.fields(LaunchConfig)}:  # newer torch only
        options["shutdown_timeout"] = stop_grace_s
    config = LaunchConfig(**options)
    env = {"CUDA_VISIBLE_DEVICES": devices, LAUNCHER_PID_VARIABLE: str(os.getpid())}

    def rank0_files() -> tuple[str, str] | None:
        return (logs.stdout_of_rank[0], logs.stderr_of_rank[0]) if 0 in logs.stdout_of_rank else None

    console = contextlib.nullcontext() if quiet else RankConsole(rank0_files)
    try:
        with _environ(env), _agent_logs_quieted(quiet), console:
            return elastic_launch(config, target)(*target_args)
    except ChildFailedError as err:
        keep_traceback_in_log(err, logs.stderr_of_rank)  # rank 0's console has stopped: the log alone gets it
        raise LaunchError(describe_failure(err, logs.stderr_of_rank),
                          first_error=first_error(err, logs.stderr_of_rank)) from None
    except SignalException as err:
        raise LaunchInterrupted(int(err.sigval)) from None
