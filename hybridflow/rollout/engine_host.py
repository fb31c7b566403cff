"""A rollout engine in a process of its own, one per rollout rank, started and fed by that training rank.

Why a process: vLLM's in-process engine (`external_launcher`) takes the torch.distributed world of the
process it lives in and cuts it into TP groups of consecutive ranks. In the training job that world is every
rank, so vLLM could only serve a rollout that spans the whole job with exactly those groups. Here each
rollout rank starts one engine process; the engine processes form a world of their own, numbered in the
bridge's generation order (`RoleMesh.ranks` of the rollout), so consecutive engine ranks are the plan's TP
groups, on any subset of the GPUs and at any TP the planner accepts.

- World: engine rank = position of the parent's rank in the rollout mesh; the master is position 0's host
  (127.0.0.1 for parents on that host) at a port free there; LOCAL_RANK = the parent's device.
- Weights: the parent allocates one staging buffer (the largest bucket of the bridge's program on this rank)
  and shares it once (CUDA IPC on GPUs, shared memory on CPU). The bridge writes a bucket into it; the engine
  process copies the bucket into its own weights and answers before the next one overwrites it. The other
  direction is not possible: vLLM's sleep-mode allocator holds weights in cuMem allocations, which torch
  cannot export.
- Start: a rank spawns its engine process before building its models (`spawn_engine_process`); the process
  imports the engine's modules (vLLM's take ~27 s) and joins its world meanwhile, and builds the engine only
  when asked (`build_hosted_engine`), after the models, so GPU memory is taken in the planned order.
- Calls (generate, sleep, wake_up, ...) go over a pipe with CPU tensors; an error in the engine process
  comes back as its traceback in a RuntimeError.
"""

from __future__ import annotations

import importlib
import math
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import util as mp_util
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybridflow.launch.lifeline import die_with_parent, watch
from hybridflow.launch.ports import free_port, store_socket
from hybridflow.placement import RoleMesh
from hybridflow.role_records import Role
from hybridflow.rollout.base import RolloutBatch, RolloutEngine, SamplingParams

ALIGN = 64  # staging offsets in elements: keeps every view aligned for vectorised copies
# The parent's job variables the engine world must not inherit: torch reads them (with
# TORCHELASTIC_USE_AGENT_STORE, env:// joins the launcher's store instead of starting its own).
JOB_VARIABLES = ("GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE", "GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_NAME")
JOB_PREFIXES = ("TORCHELASTIC_", "TORCH_ELASTIC_")


class EngineProcessError(RuntimeError):
    """The engine process failed (its traceback is the message) or went away."""


class WeightLayoutMismatch(RuntimeError):
    """The bridge's tensors are not the ones the engine holds (a bug, not bad input)."""


@dataclass(frozen=True)
class StagingLayout:
    """Where each bucket's tensors sit in the staging buffer: buckets reuse the same elements."""

    buckets: tuple[tuple[tuple[str, int, tuple[int, ...]], ...], ...]  # (name, element offset, shape)
    numel: int

    @classmethod
    def of(cls, bucket_shapes: Sequence[Mapping[str, tuple[int, ...]]]) -> StagingLayout:
        buckets, numel = [], 0
        for shapes in bucket_shapes:
            offset, items = 0, []
            for name, shape in shapes.items():
                items.append((name, offset, tuple(shape)))
                offset += -(-math.prod(shape) // ALIGN) * ALIGN
            buckets.append(tuple(items))
            numel = max(numel, offset)
        return cls(tuple(buckets), numel)

    def bucket(self, buffer: torch.Tensor, index: int) -> list[tuple[str, torch.Tensor]]:
        return [(name, buffer[o : o + math.prod(s)].view(s)) for name, o, s in self.buckets[index]]

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every tensor's view (views of different buckets overlap: write one bucket at a time)."""
        return {name: view for i in range(len(self.buckets)) for name, view in self.bucket(buffer, i)}


# An engine builder runs in the engine process: (its args..., the rollout mesh over engine ranks) -> engine.
EngineBuilder = Callable[..., RolloutEngine]


class HostedEngine:
    """The RolloutEngine protocol, answered by the engine process this rank started."""

    def __init__(self, process: Any, conn: Any, staging: torch.Tensor, layout: StagingLayout,
                 device: torch.device, timeout_s: float):
        self.process, self.conn, self.staging, self.layout = process, conn, staging, layout
        self.device, self.timeout_s = device, timeout_s

    def generate(self, batch: RolloutBatch, sampling: SamplingParams) -> RolloutBatch:
        out = self._call("generate", _to(batch, torch.device("cpu")), sampling)
        return _to(out, batch.tokens.device)

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        return self.layout.views(self.staging)

    def bucket_written(self, index: int) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the engine process reads the buffer on its own stream
        self._call("load_bucket", index)

    def weights_written(self) -> None:
        self._call("weights_written")

    def load_adapter(self, path: str) -> None:
        """The engine's own LoRA path: it reads the PEFT adapter in directory `path` (vLLM)."""
        self._call("load_adapter", path)

    def sleep(self) -> None:
        self._call("sleep")

    def wake_up(self, tags: tuple[str, ...] = ("weights", "kv_cache")) -> None:
        if self.device.type == "cuda":
            # What this process freed (an update's activations, the bridge's buckets) stays reserved by torch's
            # caching allocator, out of the engine process's reach: an H100 run's wake after its first update
            # found no room for 2.3 GiB of weights. In one process vLLM's own sleep emptied this cache.
            torch.cuda.empty_cache()
        self._call("wake_up", tuple(tags))

    def close(self) -> None:
        """Stop the engine process (also when it hangs)."""
        _stop(self.process, self.conn)

    def _call(self, method: str, *args: Any) -> Any:
        try:
            self.conn.send((method, args))
        except (BrokenPipeError, OSError) as e:
            raise EngineProcessError(f"rollout engine process is gone (exit code {self.process.exitcode})") from e
        return _answer(self.conn, self.process, self.timeout_s, method)


def _answer(conn: Any, process: Any, timeout_s: float, what: str) -> Any:
    if not conn.poll(timeout_s):
        raise EngineProcessError(f"rollout engine process: no answer to {what} within {timeout_s:g} s "
                                 "(distributed.timeout_s)")
    try:
        kind, value = conn.recv()
    except EOFError as e:
        raise EngineProcessError(f"rollout engine process died during {what} (exit code "
                                 f"{process.exitcode}); its log is in this rank's output") from e
    if kind == "error":
        raise EngineProcessError(f"rollout engine process failed in {what}:\n{value}")
    return value


@dataclass
class EngineProcess:
    """A started engine process that has not built its engine yet (its imports and world run meanwhile)."""

    process: Any
    conn: Any
    rank: int  # in the engine world
    mesh: RoleMesh  # the rollout mesh renumbered 0..n-1 in generation order
    device: torch.device
    timeout_s: float
    spawned_at: float  # time.perf_counter() at spawn


def join_engine_world(env: Mapping[str, str], backend: str, timeout_s: float) -> None:
    """Join the engine processes' world. Its rank 0 holds the store, listening on MASTER_ADDR only (loopback
    when the world is on one host): torch's env:// store listened on every interface, whatever MASTER_ADDR said."""
    addr, port, rank, size = env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["RANK"]), int(env["WORLD_SIZE"])
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:  # the store's server owns the descriptor from here on
        store = dist.TCPStore(addr, port, size, True, timeout, master_listen_fd=store_socket(addr, port).detach())
    else:
        store = dist.TCPStore(addr, port, size, False, timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)


def spawn_engine_process(mesh: RoleMesh, device: torch.device, preload: tuple[str, ...] = (),
                         timeout_s: float = 1800.0, env_defaults: Mapping[str, str] | None = None,
                         warm: Callable[[], Any] | None = None) -> EngineProcess | None:
    """Start this rank's engine process (None off the rollout). Collective over the job: every rank calls it.

    The process imports `preload` (an engine's heavy modules), calls `warm` (a picklable callable: work of the
    engine build that needs no GPU memory, such as filling a cache) and joins the engine world at once, then
    waits for `build_hosted_engine`: a rank spawns it before building its models, so all that overlaps with
    the model build while the engine itself (and its GPU memory) still comes after the models, as planned.
    `env_defaults` are set in the process where the job's environment does not set them.
    """
    rank = dist.get_rank()
    address: list[Any] = [None]
    if rank == mesh.ranks[0]:
        address = [(socket.gethostname(), free_port())]
    dist.broadcast_object_list(address, src=mesh.ranks[0])
    if rank not in mesh.ranks:
        return None
    host, port = address[0]
    env = {k: v for k, v in os.environ.items() if k not in JOB_VARIABLES and not k.startswith(JOB_PREFIXES)}
    env = {**(env_defaults or {}), **env}
    env.update(RANK=str(mesh.ranks.index(rank)), WORLD_SIZE=str(mesh.size), MASTER_PORT=str(port),
               LOCAL_RANK=str(device.index or 0) if device.type == "cuda" else "0",
               MASTER_ADDR="127.0.0.1" if host == socket.gethostname() else host)
    engine_mesh = RoleMesh(Role.ROLLOUT, tuple(range(mesh.size)), mesh.dims)
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    process = ctx.Process(target=serve, args=(child_conn, env, device.type, tuple(preload), timeout_s, warm),
                          name=f"rollout-engine-{env['RANK']}")
    process.start()
    child_conn.close()
    spawned = EngineProcess(process, conn, int(env["RANK"]), engine_mesh, device, timeout_s, time.perf_counter())
    # Stop it before exit, also when the models fail to build before the engine is: multiprocessing's exit
    # hook (which runs in launcher-spawned ranks, unlike atexit) joins every child, and the engine process
    # waits on its pipe until told to stop.
    mp_util.Finalize(None, _stop, args=(process, conn), exitpriority=10)
    return spawned


def build_hosted_engine(spawned: EngineProcess | None, build: EngineBuilder, args: tuple, bucket_shapes,
                        dtype: torch.dtype) -> HostedEngine | None:
    """Build the engine in `spawned` (None off the rollout: returns None) and share the staging buffer.

    `build(*args, engine_mesh)` runs in the engine process; `engine_mesh` is the rollout mesh renumbered 0..n-1
    in generation order. `bucket_shapes` is the bridge's `bucket_shapes()`. Collective over the rollout ranks.
    """
    if spawned is None:
        return None
    layout = StagingLayout.of(bucket_shapes)
    asked = time.perf_counter()
    staging = torch.empty(max(layout.numel, 1), dtype=dtype, device=spawned.device)
    try:
        spawned.conn.send(("build", (build, args, spawned.mesh, layout)))
        spawned.conn.send(staging)  # shared once: CUDA IPC handle / shared-memory file
    except (BrokenPipeError, OSError):
        pass  # it failed before: its answer below says why
    engine = HostedEngine(spawned.process, spawned.conn, staging, layout, spawned.device, spawned.timeout_s)
    took = _answer(spawned.conn, spawned.process, spawned.timeout_s, "engine start")
    done = time.perf_counter()
    print(f"rollout: engine process {spawned.rank} of {spawned.mesh.size} up {done - asked:.0f} s after the "
          f"models ({done - spawned.spawned_at:.0f} s since spawn: {start_times(took)})",
          file=sys.stderr, flush=True)
    return engine


def start_times(took: Mapping[str, float]) -> str:
    """The engine process's start phases, e.g. "imports 27.1 s, world 0.2 s, engine 41.0 s"."""
    return ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in took.items())


def _stop(process: Any, conn: Any) -> None:
    if process.is_alive():
        try:
            conn.send(("close", ()))
        except (BrokenPipeError, OSError):
            pass
        process.join(timeout=30)
    if process.is_alive():
        process.kill()
        process.join()


# ---- the engine process ----------------------------------------------------------------------------
def serve(conn: Any, env: dict[str, str], device_type: str, preload: tuple[str, ...], timeout_s: float,
          warm: Callable[[], Any] | None = None) -> None:
    """The engine process: import `preload`, call `warm`, join the engine world, wait for the engine to build,
    build it, then answer calls until `close` or EOF. A failure before the build is answered when the build is
    asked."""

    die_with_parent()  # the training rank started us from its main thread: end with it, even on SIGKILL
    watch(os.getppid())
    os.environ.clear()
    os.environ.update(env)
    took: dict[str, float] = {}
    failed = None
    try:
        start = time.perf_counter()
        cuda = device_type == "cuda"
        if cuda:
            torch.cuda.set_device(int(env["LOCAL_RANK"]))
        for module in preload:
            importlib.import_module(module)
        took["imports"] = time.perf_counter() - start
        if warm is not None:
            start = time.perf_counter()
            warm()
            took["warm-up"] = time.perf_counter() - start
        start = time.perf_counter()
        join_engine_world(env, "nccl" if cuda else "gloo", timeout_s)
        took["world"] = time.perf_counter() - start
    except Exception:
        failed = traceback.format_exc()
    try:
        method, payload = conn.recv()
        if method != "build":  # closed before the engine was asked for (the models failed to build)
            return
        build, args, mesh, layout = payload
        staging = conn.recv()
    except EOFError:  # the training rank went away before asking for the engine
        return
    try:
        if failed:
            raise RuntimeError(f"before the engine build:\n{failed}")
        start = time.perf_counter()
        engine = build(*args, mesh)
        check_layout(engine.weight_tensors(), layout)
        took["engine"] = time.perf_counter() - start
        conn.send(("ok", took))
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    targets: dict[str, torch.Tensor] = {}
    while True:
        try:
            method, call_args = conn.recv()
        except EOFError:  # the training rank is gone
            break
        if method == "close":
            break
        try:
            if method == "load_bucket":
                (index,) = call_args
                if index == 0:
                    targets = engine.weight_tensors()  # after wake_up: the tensors may be new
                with torch.no_grad():
                    for name, view in layout.bucket(staging, index):
                        targets[name].copy_(view)
                if staging.is_cuda:
                    torch.cuda.synchronize()  # before the parent overwrites the buffer
                result = None
            else:
                result = getattr(engine, method)(*call_args)
            if isinstance(result, RolloutBatch):
                result = _to(result, torch.device("cpu"))
            conn.send(("ok", result))
        except Exception:
            conn.send(("error", traceback.format_exc()))
    dist.destroy_process_group()


def check_layout(targets: Mapping[str, torch.Tensor], layout: StagingLayout) -> None:
    """Fail at start, not at the first sync, when the bridge's tensors are not the engine's."""
    sent = {name: shape for bucket in layout.buckets for name, _, shape in bucket}
    held = {name: tuple(t.shape) for name, t in targets.items()}
    if sent != held:
        wrong = sorted(n for n in sent.keys() & held.keys() if sent[n] != held[n])[:4]
        raise WeightLayoutMismatch(
            f"the bridge writes tensors the engine does not hold: missing in the engine "
            f"{sorted(sent.keys() - held.keys())[:4]}, never written {sorted(held.keys() - sent.keys())[:4]}, "
            f"shape differs {[(n, sent[n], held[n]) for n in wrong]}")


def _to(batch: RolloutBatch, device: torch.device) -> RolloutBatch:
    def move(t):
        return None if t is None else t.to(device)

    return RolloutBatch(move(batch.tokens), move(batch.prompt_lens), move(batch.token_kinds), move(batch.logprobs))
