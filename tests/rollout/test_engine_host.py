"""Rollout engines in processes of their own (hybridflow/rollout/engine_host.py), on CPU with gloo.

- The staging layout: one buffer, buckets reuse it, every view aligned.
- The transport alone, one rank: a dict-of-tensors engine receives every bucket exactly; errors in the
  engine process come back with its traceback, and a layout mismatch fails at start.
- The real use: a native Megatron engine at TP2 hosted on ranks [1, 2] of a 3-rank job (the rollout is a
  subset that does not hold rank 0), fed by the bridge through the staging buffer in several buckets, samples
  exactly what the same engine samples inside the training processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hybridflow.rollout.base import RolloutBatch, SamplingParams
from hybridflow.rollout.engine_host import ALIGN, StagingLayout
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model

SHAPES = [{"a": (3, 5), "b": (7,)}, {"c": (2, 2, 2)}, {"d": (100,), "e": (1,)}]


def test_staging_layout_reuses_one_buffer_per_bucket():
    layout = StagingLayout.of(SHAPES)
    assert layout.numel == 2 * ALIGN + ALIGN  # bucket 0 and bucket 2 each need two aligned slots; 128 > 100
    buffer = torch.arange(layout.numel, dtype=torch.float32)
    views = layout.views(buffer)
    assert {n: tuple(v.shape) for n, v in views.items()} == {n: s for b in SHAPES for n, s in b.items()}
    assert all(v.data_ptr() % (ALIGN * 4) == buffer.data_ptr() % (ALIGN * 4) for v in views.values())
    assert views["a"].data_ptr() == views["c"].data_ptr() == views["d"].data_ptr()  # buckets share the buffer
    assert views["b"].data_ptr() - views["a"].data_ptr() == ALIGN * 4  # 15 elements round up to one slot


class DictEngine:
    """The smallest RolloutEngine: zero tensors of the given shapes; `generate` reports what it holds."""

    def __init__(self, shapes: dict, mesh):
        self.tensors = {n: torch.zeros(s) for n, s in shapes.items()}
        self.mesh = mesh
        self.written = 0

    def generate(self, batch: RolloutBatch, sampling: SamplingParams) -> RolloutBatch:
        if sampling.seed < 0:
            raise ValueError("negative seed reached the engine")
        sums = torch.tensor([float(t.sum()) for t in self.tensors.values()])
        world = torch.distributed.get_world_size()
        logprobs = torch.cat([sums, torch.tensor([world])]) if sampling.logprobs else None
        return RolloutBatch(batch.tokens + 1, batch.prompt_lens, logprobs=logprobs)

    def weight_tensors(self):
        return self.tensors

    def bucket_written(self, index):
        pass

    def weights_written(self):
        self.written += 1

    def sleep(self):
        pass

    def wake_up(self, tags=("weights", "kv_cache")):
        pass


def _dict_engine(shapes, mesh):
    return DictEngine(shapes, mesh)


def _transport_one_rank():
    import torch.distributed as dist

    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.rollout.engine_host import EngineProcessError
    from tests.rollout.hosted_engine import start_hosted_engine

    mesh = RoleMesh("rollout", (0,), ParallelDims(1, 1, 1))
    every = {n: s for b in SHAPES for n, s in b.items()}
    engine = start_hosted_engine(_dict_engine, (every,), mesh, SHAPES, torch.float32, torch.device("cpu"), 60)
    expected = {}
    views = engine.weight_tensors()
    for i, bucket in enumerate(SHAPES):
        for name in bucket:  # the bridge's part: write the bucket into the staging views
            expected[name] = torch.randn(bucket[name])
            views[name].copy_(expected[name])
        engine.bucket_written(i)
    engine.weights_written()
    batch = RolloutBatch(torch.tensor([[4, 5]]), torch.tensor([2]))
    out = engine.generate(batch, SamplingParams(max_new_tokens=1))
    with pytest.raises(EngineProcessError, match=r"(?s)in generate.*ValueError: negative seed"):
        engine.generate(batch, SamplingParams(max_new_tokens=1, seed=-1))
    again = engine.generate(batch, SamplingParams(max_new_tokens=1))  # the engine process survives an error
    bare = engine.generate(batch, SamplingParams(max_new_tokens=1, logprobs=False))  # absent log-probs travel
    try:
        start_hosted_engine(_dict_engine, ({"a": (3, 4)},), mesh, SHAPES, torch.float32, torch.device("cpu"), 60)
    except EngineProcessError as e:
        mismatch = str(e)
    engine.close()
    assert dist.get_world_size() == 1
    return out, again, bare, expected, mismatch


@pytest.mark.slow  # a process-level run: out of the default tier's 10 minutes
def test_engine_process_gets_every_bucket_and_reports_errors():
    out, again, bare, expected, mismatch = run_distributed(_transport_one_rank, world_size=1, timeout_s=240)[0]
    assert out.tokens.tolist() == [[5, 6]] and torch.equal(again.tokens, out.tokens)
    assert bare.logprobs is None and torch.equal(bare.tokens, out.tokens)
    sums = torch.tensor([float(t.sum()) for t in expected.values()])
    torch.testing.assert_close(out.logprobs[:-1], sums)  # every bucket arrived whole, none overwrote another
    assert out.logprobs[-1] == 1  # the engine's own world
    assert "WeightLayoutMismatch" in mismatch and "missing in the engine ['b', 'c', 'd', 'e']" in mismatch


def _spawned_early(probe: str):
    """Spawn with a preload, let "the models build" (a sleep), then build: the preload ran meanwhile."""
    import functools
    import time

    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.rollout.engine_host import EngineProcessError, _stop, build_hosted_engine, spawn_engine_process
    from tests.rollout.warm_probe import record_warm

    os.environ["PRELOAD_PROBE"] = probe
    mesh = RoleMesh("rollout", (0,), ParallelDims(1, 1, 1))
    every = {n: s for b in SHAPES for n, s in b.items()}
    spawned = spawn_engine_process(mesh, torch.device("cpu"), preload=("tests.rollout.preload_probe",),
                                   timeout_s=60, env_defaults={"PRELOAD_DEFAULT": "set", "PRELOAD_PROBE": "lost"},
                                   warm=functools.partial(record_warm, probe + ".warm"))
    time.sleep(8)  # the models build here: the engine process's imports and warm-up run meanwhile
    asked = time.time()
    engine = build_hosted_engine(spawned, _dict_engine, (every,), SHAPES, torch.float32)
    out = engine.generate(RolloutBatch(torch.tensor([[4, 5]]), torch.tensor([2])), SamplingParams(max_new_tokens=1))
    engine.close()
    unused = spawn_engine_process(mesh, torch.device("cpu"), timeout_s=60)  # the models failed: never built
    _stop(unused.process, unused.conn)  # what the exit hook does
    broken = spawn_engine_process(mesh, torch.device("cpu"), preload=("tests.rollout.no_such_module",), timeout_s=60)
    try:
        build_hosted_engine(broken, _dict_engine, (every,), SHAPES, torch.float32)
        failure = ""
    except EngineProcessError as e:
        failure = str(e)
    return asked, out.tokens.tolist(), failure, unused.process.exitcode


@pytest.mark.slow  # a process-level run: out of the default tier's 10 minutes
def test_engine_process_imports_while_the_models_build_and_reports_import_failures_at_build(tmp_path):
    probe = tmp_path / "imported.json"
    asked, tokens, failure, unused_exit = run_distributed(_spawned_early, world_size=1, args=(str(probe),),
                                                          timeout_s=240)[0]
    imported = json.loads(probe.read_text())
    warmed = json.loads((tmp_path / "imported.json.warm").read_text())
    assert imported["at"] <= warmed["at"] < asked  # imports, then the warm-up, before the engine was asked for
    assert imported["default"] == "set" and imported["probe"] == str(probe)  # the job's own variable wins
    assert tokens == [[5, 6]]  # and the engine built afterwards works
    assert unused_exit == 0  # a process closed before its build ends cleanly
    assert "before the engine build" in failure and "No module named 'tests.rollout.no_such_module'" in failure


# ---- a native engine hosted on a subset of the ranks ---------------------------------------------------
def _native_engine(hf_dir: str, mesh):
    """Runs in the engine process: the native engine at the mesh's TP, random weights until the bridge writes."""
    from hybridflow.rollout.megatron_engine import MegatronRolloutEngine
    from megatron_adapters.cpu_backend import enable_cpu_backend
    from megatron_adapters.model import build_gpt, model_shape
    from megatron_adapters.process_groups import build_role_groups

    torch.set_num_threads(1)
    enable_cpu_backend()
    torch.manual_seed(123)
    groups = build_role_groups(mesh.ranks, tp=mesh.tp, pp=1, dp=mesh.dp)
    model = build_gpt(hf_dir, groups, head="lm", dtype=torch.float32, spec="decode")
    return MegatronRolloutEngine(model, groups.tp, vocab_size=model_shape(hf_dir).vocab_size)


def _hosted_vs_in_process(hf_dir: str):
    import torch.distributed as dist

    from hybridflow.config.rollout import RolloutConfig
    from hybridflow.data.step_batch import StepBatch
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.rollout_role import RolloutRole, build_rollout_role
    from hybridflow.rollout.base import EngineSetup
    from megatron_adapters.bridge import TargetFormat, WeightBridge, build_reshard_plan
    from megatron_adapters.hf_safetensors import load_hf_weights
    from megatron_adapters.model import build_gpt, model_shape
    from megatron_adapters.process_groups import build_role_groups
    from tests.rollout.hosted_engine import start_hosted_engine

    cpu, fp32 = torch.device("cpu"), torch.float32
    mesh = RoleMesh("rollout", (1, 2), ParallelDims(2, 1, 1))
    plan = build_reshard_plan(RoleMesh("actor", (1, 2), ParallelDims(2, 1, 1)), mesh)
    actor_groups = build_role_groups([1, 2], tp=2, pp=1, dp=1)
    rollout_groups = build_role_groups([1, 2], tp=2, pp=1, dp=1)
    actor = None
    if actor_groups is not None:
        model = build_gpt(hf_dir, actor_groups, head="lm", dtype=fp32)
        load_hf_weights(model, hf_dir)
        actor = SimpleNamespace(model=model)
    sampling = SamplingParams(max_new_tokens=5, temperature=1.0, seed=11)
    setup = EngineSetup(rollout=RolloutConfig(), mesh=mesh, groups=rollout_groups, hf_dir=hf_dir, dtype=fp32,
                        device=cpu, seed=0)
    here = build_rollout_role("megatron", setup, plan, sampling, bucket_bytes=32 << 10)
    bridge = WeightBridge(plan, model_shape(hf_dir), TargetFormat.MEGATRON, dtype=fp32, bucket_bytes=32 << 10,
                          device=cpu, staged=True)
    hosted = RolloutRole(mesh, start_hosted_engine(_native_engine, (hf_dir,), mesh, bridge.bucket_shapes(), fp32,
                                                   cpu, 120), bridge, sampling, cpu)
    buckets = len(bridge.bucket_shapes())
    prompts = torch.zeros(3, 12, dtype=torch.long)
    for row, p in enumerate(([5, 9, 13], [3, 4, 8, 1], [11])):
        prompts[row, : len(p)] = torch.tensor(p)
    results = []
    for role in (here, hosted):
        role.sync(actor)
        batch = StepBatch(rows=[{}] * 3, tokens=prompts.clone(), prompt_lens=torch.tensor([3, 4, 1]))
        role.generate(batch, logprobs=True)
        results.append((batch.tokens, batch.rollout_logprobs))
    bare = StepBatch(rows=[{}] * 3, tokens=prompts.clone(), prompt_lens=torch.tensor([3, 4, 1]))
    hosted.generate(bare, logprobs=False)  # every rank shares tokens and masks only, off the rollout too
    results.append((bare.tokens, bare.rollout_logprobs))
    if hosted.engine is not None:
        hosted.engine.close()
    return dist.get_rank(), buckets, results, hosted.engine is None


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama_host")
    save_tiny_model("llama", path, seed=5)
    return str(path)


@pytest.mark.slow  # a process-level run: out of the default tier's 10 minutes
def test_native_engine_hosted_on_a_subset_samples_what_it_samples_in_process(hf_dir):
    ranks = run_distributed(_hosted_vs_in_process, world_size=3, args=(hf_dir,), timeout_s=400)
    assert [r[3] for r in ranks] == [True, False, False]  # rank 0 holds no engine process
    assert ranks[0][1] == 0 and ranks[1][1] == ranks[2][1] > 1  # several buckets through one staging buffer
    _, _, ((tokens, logps), (hosted_tokens, hosted_logps), (bare_tokens, bare_logps)), _ = ranks[0]
    assert torch.equal(hosted_tokens, tokens)  # shared with every rank
    assert all(r[2][2][1] is None for r in ranks)  # absent log-probs: None on every rank, nothing hung
    assert bare_tokens.shape == tokens.shape and (bare_tokens[:, 4:] != 0).any()  # responses still came back
    torch.testing.assert_close(hosted_logps, logps, atol=1e-5, rtol=0)
    assert (logps != 0).any()


# ---- under the job's launcher ----------------------------------------------------------------------------
def _launched_rank():
    """A rank of `launch_local`: rank 1 alone hosts an engine (the rollout is a subset), then the rank exits."""
    from hybridflow.config import DistributedConfig
    from hybridflow.launch import init_distributed
    from hybridflow.placement import ParallelDims, RoleMesh
    from tests.rollout.hosted_engine import start_hosted_engine

    launcher = init_distributed(DistributedConfig(master_port=int(os.environ["MASTER_PORT"])))
    every = {n: s for b in SHAPES for n, s in b.items()}
    engine = start_hosted_engine(_dict_engine, (every,), RoleMesh("rollout", (1,), ParallelDims(1, 1, 1)), SHAPES,
                                 torch.float32, torch.device("cpu"), 60)
    if engine is None:
        return None
    out = engine.generate(RolloutBatch(torch.tensor([[1, 2]]), torch.tensor([2])), SamplingParams(max_new_tokens=1))
    return launcher.rank, out.tokens.tolist(), out.logprobs[-1].item()  # no close(): exiting must stop it


LAUNCH_DRIVER = """
import json, sys
from hybridflow.config import DistributedConfig
from hybridflow.launch import launch_local
from hybridflow.launch.ports import free_port
from tests.launch.launch_fakes import fake_plan
from tests.rollout.test_engine_host import _launched_rank
print(json.dumps(launch_local(fake_plan(1, 2), _launched_rank, [], DistributedConfig(master_port=free_port()),
                              sys.argv[1])))
"""


@pytest.mark.slow  # a process-level run: out of the default tier's 10 minutes
def test_engine_process_under_the_launcher_joins_its_own_world_and_stops_with_its_rank(tmp_path):
    # torch's launcher tells env:// to join its own store (TORCHELASTIC_USE_AGENT_STORE): the engine world
    # must not inherit that; and a launched rank runs multiprocessing's exit hook, which waits for children.
    proc = subprocess.run([sys.executable, "-c", LAUNCH_DRIVER, str(tmp_path)], capture_output=True, text=True,
                          timeout=180, cwd=str(Path(__file__).resolve().parents[2]))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results["0"] is None and results["1"] == [1, [[2, 3]], 1.0]


class _RecordingConn:
    """A pipe end that answers every request at once and logs what happened, in order."""

    def __init__(self, events: list[str]):
        self.events = events

    def send(self, message):
        self.events.append(f"send {message[0]}")

    def poll(self, timeout):
        return True

    def recv(self):
        return "ok", None


@pytest.mark.parametrize("device, emptied", [("cuda", True), ("cpu", False)])
def test_waking_a_hosted_engine_first_hands_back_torchs_cached_memory(monkeypatch, device, emptied):
    """Memory this process freed stays in torch's caching allocator, where the engine process cannot take it
    (an H100 run's first wake after an update went out of memory): on a GPU the cache is emptied first."""
    from hybridflow.rollout.engine_host import HostedEngine

    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    engine = HostedEngine(SimpleNamespace(exitcode=None), _RecordingConn(events), torch.zeros(1),
                          StagingLayout.of(SHAPES), torch.device(device), timeout_s=1)
    engine.wake_up(("weights",))
    engine.sleep()
    assert events == (["empty_cache"] if emptied else []) + ["send wake_up", "send sleep"]


class _Registry:
    def __init__(self, fail: bool = False):
        self.calls, self.fail = [], fail

    def inspect_model_cls(self, architectures, model_config):
        if self.fail:
            raise AttributeError("no such thing in this vLLM")
        self.calls.append((architectures, model_config.model_impl, model_config.convert_type))


def test_vllm_warm_up_inspects_the_checkpoints_architecture_and_never_fails_the_engine(monkeypatch, tmp_path, capsys):
    """The engine process fills vLLM's model-info cache while the models build (a cache miss costs LLM(...) a
    fresh Python process that imports vLLM again); a vLLM that answers otherwise only loses the head start."""
    import transformers

    from hybridflow.rollout.vllm_engine import checkpoint_architectures, warm_model_info

    transformers.Qwen3Config(architectures=["Qwen3ForCausalLM"]).save_pretrained(tmp_path)
    assert checkpoint_architectures(str(tmp_path)) == ("Qwen3ForCausalLM",)
    registry = _Registry()
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(ModelRegistry=registry))
    warm_model_info(("Qwen3ForCausalLM",))
    assert registry.calls == [(["Qwen3ForCausalLM"], "auto", "none")]
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace(ModelRegistry=_Registry(fail=True)))
    warm_model_info(("Qwen3ForCausalLM",))
    assert "model info was not inspected ahead (AttributeError" in capsys.readouterr().err


def _listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp{,6} writes them) of sockets listening on `port`."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def test_engine_world_store_listens_on_loopback_only(tmp_path):
    """Before: the engine processes joined their world with env://, whose store listened on every interface
    although MASTER_ADDR was 127.0.0.1 (servers bind to loopback unless told otherwise)."""
    import torch.distributed as dist

    from hybridflow.launch.ports import free_port
    from hybridflow.rollout.engine_host import join_engine_world

    port = free_port()
    join_engine_world({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": "0", "WORLD_SIZE": "1"},
                      "gloo", 30)
    try:
        assert _listening_addresses(port) == {"0100007F"}  # 127.0.0.1, and no wildcard (IPv4 or IPv6) beside it
        dist.all_reduce(torch.ones(1))  # the world works
    finally:
        dist.destroy_process_group()
