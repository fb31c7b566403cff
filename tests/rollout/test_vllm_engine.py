"""The vLLM rollout engine: contract tests without vLLM, checks against real vLLM where importable, GPU tests.

Three tiers:
- always: engine/sampling argument mapping, output conversion from RequestOutput-shaped objects, the engine
  host's layout check against fake models holding vLLM's parameter names and shapes (recorded from vLLM 0.33
  in data/vllm_param_shapes.json by data/record_vllm_param_shapes.py), and the sleep/wake state machine;
- vLLM importable: real SamplingParams/EngineArgs accept our arguments; vLLM's own model classes, built on
  CPU (VLLM_TARGET_DEVICE=cpu) at TP 1 and 2, load an HF checkpoint into exactly the recorded layout;
- vLLM + CUDA (@pytest.mark.gpu): the engine in its own process fed by the bridge: generation, log-probs
  against HF, sleep/wake with a weight sync between.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hybridflow.errors import UserError
from hybridflow.placement import ParallelDims, RoleMesh
from hybridflow.rollout.base import RolloutBatch, SamplingParams
from hybridflow.rollout.engine_host import StagingLayout, WeightLayoutMismatch, check_layout
from hybridflow.rollout.vllm_engine import (
    VllmEngineSpec,
    VllmRolloutEngine,
    engine_kwargs,
    engine_seed,
    outputs_to_batch,
    request_seed,
    sampling_kwargs,
)

DATA = Path(__file__).with_name("data")
SHAPES = json.loads((DATA / "vllm_param_shapes.json").read_text())
HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (optional extra: pip install .[vllm])")


def load_recorder():
    """data/record_vllm_param_shapes.py (the tiny models and the layout rules), importable by name so that
    its spawned ranks can unpickle `rank_main`."""
    if str(DATA) not in sys.path:
        sys.path.insert(0, str(DATA))
    return importlib.import_module("record_vllm_param_shapes")


# ---------------------------------------------------------------------------------------------- engine args


def test_engine_kwargs_fix_the_colocation_args_and_pass_the_rest_through():
    spec = VllmEngineSpec(
        "/models/tiny",
        tp=2,
        dtype="bf16",
        gpu_memory_utilization=0.4,
        seed=7,
        engine_args={
            "max_num_seqs": 64,
            "max_model_len": 512,
            "enforce_eager": True,
            "skip_tokenizer_init": False,
        },
    )
    kw = engine_kwargs(spec, known_args=["max_num_seqs", "max_model_len", "enforce_eager", "skip_tokenizer_init"])
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert kw["enable_sleep_mode"] is True and kw["load_format"] == "dummy"
    assert (kw["model"], kw["tensor_parallel_size"], kw["dtype"], kw["seed"]) == (
        "/models/tiny",
        2,
        "bfloat16",
        7,
    )
    assert kw["gpu_memory_utilization"] == 0.4
    assert (kw["max_num_seqs"], kw["max_model_len"], kw["enforce_eager"]) == (64, 512, True)
    assert kw["skip_tokenizer_init"] is False  # user value beats our default
    assert kw["logprobs_mode"] == "processed_logprobs"


@pytest.mark.parametrize("key", ["tensor_parallel_size", "load_format", "distributed_executor_backend", "seed"])
def test_engine_kwargs_refuse_reserved_keys(key):
    with pytest.raises(UserError, match=f"rollout.engine_args.{key}"):
        engine_kwargs(VllmEngineSpec("/m", tp=1, engine_args={key: 1}))


def test_engine_kwargs_name_unknown_and_contradicting_keys():
    with pytest.raises(UserError, match="rollout.engine_args.max_num_seq: not a vLLM"):
        engine_kwargs(VllmEngineSpec("/m", tp=1, engine_args={"max_num_seq": 8}), known_args=["max_num_seqs"])
    with pytest.raises(UserError, match="gpu_memory_utilization"):
        engine_kwargs(
            VllmEngineSpec("/m", tp=1, gpu_memory_utilization=0.5, engine_args={"gpu_memory_utilization": 0.9})
        )
    same = engine_kwargs(
        VllmEngineSpec("/m", tp=1, gpu_memory_utilization=0.5, engine_args={"gpu_memory_utilization": 0.5})
    )
    assert same["gpu_memory_utilization"] == 0.5
    with pytest.raises(UserError, match="rollout.sleep_level"):
        engine_kwargs(VllmEngineSpec("/m", tp=1, sleep_level=3))
    with pytest.raises(UserError, match="rollout.seed_mode"):
        engine_kwargs(VllmEngineSpec("/m", tp=1, seed_mode="per_step"))


def test_engine_seed_is_one_per_dp_replica():
    # a replica's TP ranks share the engine seed (they must sample alike); replicas differ (per_batch draws
    # from this generator); replica 0 keeps trainer.seed itself
    kw = [engine_kwargs(VllmEngineSpec("/m", tp=2, seed=7), dp_rank=dp)["seed"] for dp in range(4)]
    assert kw[0] == 7 and len(set(kw)) == 4 and kw == [engine_seed(7, dp) for dp in range(4)]
    assert all(0 <= s < 2**32 for s in kw)


# ------------------------------------------------------------------------------------------------- sampling


def test_sampling_kwargs_map_every_field():
    s = SamplingParams(max_new_tokens=16, temperature=0.7, top_p=1.0, top_k=0, stop_token_ids=(2, 5), seed=3)
    kw = sampling_kwargs(s, max_tokens=9, seed=1234)
    assert kw == {
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": 0,
        "max_tokens": 9,
        "stop_token_ids": [2, 5],
        "ignore_eos": True,
        "logprobs": 0,
        "seed": 1234,
        "detokenize": False,
    }


def test_sampling_kwargs_without_seed_or_logprobs_leave_those_keys_out():
    s = SamplingParams(max_new_tokens=16, temperature=0.7, stop_token_ids=(2,), logprobs=False)
    kw = sampling_kwargs(s, max_tokens=9, seed=None)
    assert "seed" not in kw and "logprobs" not in kw  # vLLM: no per-request generator, no log-prob pass
    assert (kw["max_tokens"], kw["stop_token_ids"], kw["ignore_eos"]) == (9, [2], True)
    assert sampling_kwargs(SamplingParams(max_new_tokens=4), 4, seed=None)["logprobs"] == 0
    with warnings.catch_warnings():  # no log-probs, so nothing renormalised to warn about
        warnings.simplefilter("error")
        sampling_kwargs(SamplingParams(max_new_tokens=4, top_k=20, logprobs=False), 4, seed=None)


def test_sampling_kwargs_map_top_k_off_to_zero_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert sampling_kwargs(SamplingParams(max_new_tokens=4, top_k=-1), max_tokens=4, seed=0)["top_k"] == 0


def test_sampling_kwargs_keep_top_k_and_warn_that_logprobs_are_filtered():
    with pytest.warns(UserWarning, match="renormalised"):
        kw = sampling_kwargs(SamplingParams(max_new_tokens=4, top_k=20, top_p=0.9), max_tokens=4, seed=0)
    assert (kw["top_k"], kw["top_p"]) == (20, 0.9)


def test_request_seeds_differ_per_row_and_dp_rank_and_repeat():
    seeds = {request_seed(11, dp, row) for dp in range(4) for row in range(64)}
    assert len(seeds) == 4 * 64
    assert request_seed(11, 2, 5) == request_seed(11, 2, 5) != request_seed(12, 2, 5)
    assert all(0 <= s < 2**63 for s in seeds)


# -------------------------------------------------------------------------------------- output conversion


def fake_output(prompt, ids, logps):
    """RequestOutput-shaped: outputs[0].token_ids and per-position {token id: Logprob} dicts."""
    positions = [
        {t: SimpleNamespace(logprob=lp), t + 1: SimpleNamespace(logprob=-9.0)} for t, lp in zip(ids, logps, strict=True)
    ]
    return SimpleNamespace(
        prompt_token_ids=list(prompt), outputs=[SimpleNamespace(token_ids=tuple(ids), logprobs=positions)]
    )


def prompt_batch(prompts, width, pad=0):
    tokens = torch.full((len(prompts), width), pad, dtype=torch.long)
    for row, p in enumerate(prompts):
        tokens[row, : len(p)] = torch.tensor(p)
    return RolloutBatch(tokens, torch.tensor([len(p) for p in prompts]))


def test_outputs_fill_response_columns_mask_and_sampled_logprobs():
    batch = prompt_batch([[5, 6, 7], [8]], width=6, pad=0)
    sampling = SamplingParams(max_new_tokens=3, pad_token_id=0, stop_token_ids=(2,))
    outs = [fake_output([5, 6, 7], [3, 2], [-0.5, -0.25]), fake_output([8], [4, 4, 9], [-1.0, -2.0, -3.0])]
    got = outputs_to_batch(batch, outs, sampling)
    assert got.tokens.tolist() == [[5, 6, 7, 3, 2, 0], [8, 4, 4, 9, 0, 0]]
    assert got.loss_mask.tolist() == [[0, 0, 0, 1, 1, 0], [0, 1, 1, 1, 0, 0]]
    assert got.logprobs.tolist() == [[0, 0, 0, -0.5, -0.25, 0], [0, -1.0, -2.0, -3.0, 0, 0]]
    assert got.prompt_lens.tolist() == [3, 1] and got.logprobs.dtype == torch.float32


def test_outputs_leave_rows_without_room_as_prompt_only():
    batch = prompt_batch([[1, 2, 3, 4]], width=4)
    got = outputs_to_batch(batch, [None], SamplingParams(max_new_tokens=2))
    assert got.tokens.tolist() == [[1, 2, 3, 4]] and got.loss_mask.sum() == 0


def test_outputs_fail_loudly_on_wrong_prompt_or_length_or_missing_logprobs():
    batch = prompt_batch([[5, 6]], width=4)
    sampling = SamplingParams(max_new_tokens=2)
    with pytest.raises(RuntimeError, match="another prompt"):
        outputs_to_batch(batch, [fake_output([5, 7], [1], [-1.0])], sampling)
    with pytest.raises(RuntimeError, match="room 2"):
        outputs_to_batch(batch, [fake_output([5, 6], [1, 1, 1], [-1.0] * 3)], sampling)
    no_logprobs = fake_output([5, 6], [1], [-1.0])
    no_logprobs.outputs[0].logprobs = None
    with pytest.raises(RuntimeError, match="log-probs missing"):
        outputs_to_batch(batch, [no_logprobs], sampling)
    with pytest.raises(RuntimeError, match="answered 0 requests"):
        outputs_to_batch(batch, [], sampling)


def test_outputs_without_logprobs_asked_for_give_none():
    batch = prompt_batch([[5, 6]], width=5)
    out = fake_output([5, 6], [3, 4], [-1.0, -2.0])
    out.outputs[0].logprobs = None  # what vLLM returns when SamplingParams.logprobs is None
    got = outputs_to_batch(batch, [out], SamplingParams(max_new_tokens=3, logprobs=False))
    assert got.logprobs is None
    assert got.tokens.tolist() == [[5, 6, 3, 4, 0]] and got.loss_mask.tolist() == [[0, 0, 1, 1, 0]]


# ------------------------------------------------------------------- engine layout = the bridge's layout


def module_from_shapes(shapes: dict[str, list[int]], tied: bool) -> torch.nn.Module:
    """A module whose named_parameters() are exactly `shapes` (vLLM's names), lm_head tied if asked."""
    root = torch.nn.Module()
    for name, shape in shapes.items():
        *path, leaf = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        mod.register_parameter(leaf, torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16)))
    if tied:
        root.add_module("lm_head", torch.nn.Module())
        root.lm_head.weight = root.model.embed_tokens.weight
    return root


RECORDED = [(m, tp, r) for m, v in SHAPES["models"].items() for tp, ranks in v["tp"].items() for r in ranks]


def recorded(model_key, tp, rank):
    entry = SHAPES["models"][model_key]
    return entry["tp"][tp][rank], entry["hf_config"]["tie_word_embeddings"]


def random_shards(shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen) for n, s in shapes.items()}


@pytest.mark.parametrize("model_key,tp,rank", RECORDED)
def test_engine_host_accepts_every_recorded_vllm_layout(model_key, tp, rank):
    shapes, tied = recorded(model_key, tp, rank)
    engine_tensors = {n: p.data for n, p in module_from_shapes(shapes, tied).named_parameters()}
    check_layout(engine_tensors, StagingLayout.of([{n: tuple(s) for n, s in shapes.items()}]))


def test_engine_host_refuses_any_layout_mismatch_at_start():
    shapes, tied = recorded("llama_gqa", "2", "1")
    held = {n: p.data for n, p in module_from_shapes(shapes, tied).named_parameters()}
    qkv, gate = "model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight"
    sent = {n: tuple(s) for n, s in shapes.items() if n != gate}
    sent[qkv] = (sent[qkv][0] + 1, sent[qkv][1])
    sent["model.layers.0.self_attn.q_proj.weight"] = (4, 4)
    with pytest.raises(WeightLayoutMismatch, match=r"missing in the engine \['model.layers.0.self_attn.q_proj.weight'\]"
                       r", never written \['model.layers.0.mlp.gate_up_proj.weight'\], shape differs .*qkv_proj"):
        check_layout(held, StagingLayout.of([sent]))


# ------------------------------------------------------------------------- recorded layout follows the rules


def rule_shapes(cfg: dict, tp: int, vocab_pad: int) -> dict[str, list[int]]:
    """vLLM's per-rank shapes from the HF config alone: the layout the bridge must produce."""
    hidden, heads, kv, inter = (
        cfg[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size")
    )
    head_dim = cfg.get("head_dim", hidden // heads)  # Qwen3's checkpoints name it (32 here, not 64 // 4)
    kv_per_rank = max(kv // tp, 1)  # below one head per rank, heads are replicated
    qkv_rows = (heads // tp + 2 * kv_per_rank) * head_dim
    vocab_rows = math.ceil(cfg["vocab_size"] / vocab_pad) * vocab_pad // tp
    shapes = {"model.embed_tokens.weight": [vocab_rows, hidden], "model.norm.weight": [hidden]}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = [vocab_rows, hidden]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.input_layernorm.weight": [hidden],
            f"{p}.post_attention_layernorm.weight": [hidden],
            f"{p}.self_attn.qkv_proj.weight": [qkv_rows, hidden],
            f"{p}.self_attn.o_proj.weight": [hidden, heads * head_dim // tp],
            f"{p}.mlp.gate_up_proj.weight": [2 * inter // tp, hidden],
            f"{p}.mlp.down_proj.weight": [hidden, inter // tp],
        }
        if cfg["architecture"] == "Qwen2ForCausalLM":
            shapes[f"{p}.self_attn.qkv_proj.bias"] = [qkv_rows]
        if cfg["architecture"] == "Qwen3ForCausalLM":  # one RMSNorm over a head's dims, whole on every rank
            shapes |= {f"{p}.self_attn.q_norm.weight": [head_dim], f"{p}.self_attn.k_norm.weight": [head_dim]}
    return shapes


@pytest.mark.parametrize("model_key,tp,rank", RECORDED)
def test_recorded_vllm_layout_equals_the_layout_rules(model_key, tp, rank):
    shapes, _ = recorded(model_key, tp, rank)
    assert shapes == rule_shapes(SHAPES["models"][model_key]["hf_config"], int(tp), SHAPES["vocab_pad"])


# --------------------------------------------------------------------------- engine over a fake vLLM `LLM`


class FakeLLM:
    """The slice of vllm.LLM the engine uses; generates [7, 8, stop] for every prompt."""

    def __init__(self, model):
        self.calls = []
        self.module = model

    def apply_model(self, func):
        return [func(self.module)]

    def generate(self, prompts, params, use_tqdm):
        self.calls.append(("generate", prompts, params))
        outs = []
        for prompt, p in zip(prompts, params, strict=True):
            ids = [7, 8, *p["stop_token_ids"][:1]][: p["max_tokens"]]
            out = fake_output(prompt["prompt_token_ids"], ids, [-0.5] * len(ids))
            if "logprobs" not in p:  # as vLLM: no log-probs unless asked for
                out.outputs[0].logprobs = None
            outs.append(out)
        return outs

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tags))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


def fake_engine(sleep_level=1, seed_mode="per_request"):
    shapes, tied = recorded("llama_gqa", "1", "0")
    llm = FakeLLM(module_from_shapes(shapes, tied))
    spec = VllmEngineSpec("/m", tp=1, sleep_level=sleep_level, seed_mode=seed_mode)
    engine = VllmRolloutEngine(llm, dict, spec, dp_rank=1)
    return engine, llm, shapes


def test_generate_sends_each_row_its_room_and_seed():
    engine, llm, _ = fake_engine(seed_mode="per_request")
    batch = prompt_batch([[5, 6, 7], [8], [1, 2, 3, 4, 5, 6]], width=6)
    got = engine.generate(batch, SamplingParams(max_new_tokens=4, stop_token_ids=(2,), seed=9))
    _, prompts, params = llm.calls[-1]
    assert [p["prompt_token_ids"] for p in prompts] == [[5, 6, 7], [8]]  # row 2 has no room left
    assert [p["max_tokens"] for p in params] == [3, 4]
    assert [p["seed"] for p in params] == [request_seed(9, 1, 0), request_seed(9, 1, 1)]
    assert got.tokens.tolist() == [[5, 6, 7, 7, 8, 2], [8, 7, 8, 2, 0, 0], [1, 2, 3, 4, 5, 6]]
    assert got.loss_mask.tolist() == [[0, 0, 0, 1, 1, 1], [0, 1, 1, 1, 0, 0], [0] * 6]
    assert got.logprobs.tolist()[1] == [0, -0.5, -0.5, -0.5, 0, 0]


@pytest.mark.parametrize("logprobs", [True, False])
def test_generate_per_batch_sends_no_seed_and_logprobs_only_when_asked(logprobs):
    engine, llm, _ = fake_engine(seed_mode="per_batch")
    batch = prompt_batch([[5, 6, 7], [8]], width=6)
    got = engine.generate(batch, SamplingParams(max_new_tokens=4, stop_token_ids=(2,), seed=9, logprobs=logprobs))
    _, _, params = llm.calls[-1]
    assert all("seed" not in p for p in params)  # vLLM's engine-wide generator samples
    assert all(("logprobs" in p) == logprobs for p in params)
    assert got.tokens.tolist() == [[5, 6, 7, 7, 8, 2], [8, 7, 8, 2, 0, 0]]
    assert (got.logprobs is not None) == logprobs


@pytest.mark.parametrize("level", [1, 2])
def test_sleep_sync_wake_cycle(level):
    engine, llm, shapes = fake_engine(sleep_level=level)
    batch = prompt_batch([[5, 6]], width=4)
    sampling = SamplingParams(max_new_tokens=2)
    engine.sleep()
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(batch, sampling)
    with pytest.raises(RuntimeError, match="weights are asleep"):
        engine.weight_tensors()
    engine.wake_up(("weights",))
    shards = random_shards(shapes, seed=1)
    with torch.no_grad():
        for name, tensor in engine.weight_tensors().items():  # what the engine host does per bucket
            tensor.copy_(shards[name])
    engine.weights_written()
    with pytest.raises(RuntimeError, match="kv_cache"):
        engine.generate(batch, sampling)
    engine.wake_up(("kv_cache",))
    engine.generate(batch, sampling)
    assert [c[0] for c in llm.calls] == ["sleep", "wake_up", "reset_prefix_cache", "wake_up", "generate"]
    assert llm.calls[0] == ("sleep", level) and llm.calls[1] == ("wake_up", ["weights"])
    qkv = "model.layers.1.self_attn.qkv_proj.weight"
    assert torch.equal(dict(engine.model().named_parameters())[qkv].float(), shards[qkv].bfloat16().float())
    with pytest.raises(ValueError, match="not in"):
        engine.wake_up(("kv",))


# ------------------------------------------------------------------------------------- real vLLM (CPU)


@needs_vllm
def test_real_vllm_accepts_our_sampling_and_engine_args():
    import dataclasses

    import vllm

    kw = sampling_kwargs(SamplingParams(max_new_tokens=8, temperature=0.9, stop_token_ids=(3,)), 8, seed=5)
    params = vllm.SamplingParams(**kw)
    assert (params.max_tokens, params.logprobs, params.seed, params.stop_token_ids) == (8, 0, 5, [3])
    bare = vllm.SamplingParams(**sampling_kwargs(SamplingParams(max_new_tokens=8, logprobs=False), 8, seed=None))
    assert (bare.logprobs, bare.seed) == (None, None)
    assert params.top_k == 0 and params.ignore_eos
    spec = VllmEngineSpec("/m", tp=2, engine_args={"max_num_seqs": 32, "enforce_eager": True, "max_model_len": 256})
    args = vllm.EngineArgs(**engine_kwargs(spec, [f.name for f in dataclasses.fields(vllm.EngineArgs)]))
    assert (args.distributed_executor_backend, args.load_format, args.enable_sleep_mode) == (
        "external_launcher",
        "dummy",
        True,
    )
    assert (args.max_num_seqs, args.tensor_parallel_size, args.logprobs_mode) == (32, 2, "processed_logprobs")


@needs_vllm
def test_real_vllm_has_the_modules_the_engine_process_imports_early():
    import importlib

    from hybridflow.rollout.vllm_engine import VLLM_IMPORTS

    for module in VLLM_IMPORTS:  # a missing one would fail every vLLM run at the engine build
        importlib.import_module(module)
    assert hasattr(importlib.import_module(VLLM_IMPORTS[0]), "LLM")


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("tp", [1, 2])
def test_real_vllm_model_classes_load_into_the_recorded_layout(tp, monkeypatch):
    """vLLM's Llama/Qwen2 built on CPU gloo ranks: load_weights(HF) == layout rules == recorded JSON."""
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")  # the CUDA wheel has no attention backend without a GPU
    recorder = load_recorder()
    for key, spec in recorder.TINY_MODELS.items():
        ranks = recorder.record(tp, spec)
        for rank, res in ranks.items():
            assert "error" not in res, res.get("error")
            assert res["mismatches"] == [], res["mismatches"]
            assert res["params"] == SHAPES["models"][key]["tp"][str(tp)][str(rank)]


# ------------------------------------------------------------------------------------- real vLLM (GPU)


@pytest.fixture
def single_rank_world(monkeypatch):
    import torch.distributed as dist

    for k, v in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(load_recorder().free_port()),
    }.items():
        monkeypatch.setenv(k, v)
    dist.init_process_group("nccl", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@needs_vllm
@pytest.mark.gpu
def test_gpu_generation_logprobs_and_sleep_wake(tmp_path, single_rank_world):
    """vLLM in its engine process, fed by the bridge through the staging buffer (several buckets): greedy
    tokens equal HF's; sampled-token log-probs match HF; a sleep/sync/wake cycle keeps them."""
    import transformers

    from megatron_adapters.bridge import TargetFormat, WeightBridge, build_reshard_plan
    from megatron_adapters.hf_weights import ShardSpec, hf_to_mcore_shard
    from megatron_adapters.model import model_shape, padded_vocab_size
    from tests.megatron_adapters.bridge.bridge_fixtures import hf_reader
    from tests.rollout.hosted_engine import start_hosted_engine

    recorder = load_recorder()
    hf_state = recorder.write_hf_checkpoint(recorder.TINY_MODELS["llama_gqa"], tmp_path)
    shape, cuda = model_shape(str(tmp_path)), torch.device("cuda", 0)
    plan = build_reshard_plan(RoleMesh("actor", (0,), ParallelDims(1, 1, 1)),
                              RoleMesh("rollout", (0,), ParallelDims(1, 1, 1)))
    bridge = WeightBridge(plan, shape, TargetFormat.VLLM, dtype=torch.float32, bucket_bytes=64 << 10, device=cuda,
                          staged=True)
    spec = ShardSpec(1, 0, padded_vocab_size(shape.vocab_size, 1))
    src = {t.entry.mcore: hf_to_mcore_shard(t.entry, hf_reader(hf_state), shape, spec).float().cuda()
           for t in bridge.tensors}
    engine_spec = VllmEngineSpec(str(tmp_path), tp=1, dtype="fp32", gpu_memory_utilization=0.2, sleep_level=2,
                                 seed_mode="per_request",  # the seeded-repeat check below needs request seeds
                                 engine_args={"max_model_len": 64, "max_num_seqs": 8, "enforce_eager": True})
    engine = start_hosted_engine(VllmRolloutEngine.create, (engine_spec,),
                                 RoleMesh("rollout", (0,), ParallelDims(1, 1, 1)),
                                 bridge.bucket_shapes(), torch.float32, cuda, 300)
    assert len(bridge.bucket_shapes()) > 1

    def sync():
        bridge.reshard(src, engine.weight_tensors(), engine.bucket_written)
        engine.weights_written()

    sync()
    batch = prompt_batch([[1, 5, 9, 13], [2, 4]], width=12)
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    first = engine.generate(batch, greedy)

    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    for row in range(2):
        p = int(batch.prompt_lens[row])
        want = hf.generate(
            batch.tokens[row : row + 1, :p],
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
        assert first.tokens[row, : p + 8].tolist() == want[0].tolist()
        with torch.no_grad():
            logits = hf(first.tokens[row : row + 1, : p + 8]).logits[0, p - 1 : p + 7]
        ref = torch.log_softmax(logits, -1).gather(-1, first.tokens[row, p : p + 8, None])[:, 0]
        torch.testing.assert_close(first.logprobs[row, p : p + 8].cpu(), ref, atol=1e-3, rtol=0)

    engine.sleep()
    engine.wake_up(("weights",))
    sync()  # level 2 dropped the weights: the sync must restore all of them
    engine.wake_up(("kv_cache",))
    again = engine.generate(batch, greedy)
    assert torch.equal(again.tokens, first.tokens)
    sampled = engine.generate(batch, SamplingParams(max_new_tokens=8, temperature=1.0, seed=3))
    assert torch.equal(sampled.tokens, engine.generate(batch, SamplingParams(max_new_tokens=8, seed=3)).tokens)
    bare = engine.generate(batch, SamplingParams(max_new_tokens=8, seed=3, logprobs=False))
    assert bare.logprobs is None and torch.equal(bare.tokens, sampled.tokens)  # same seeds, no log-prob pass
    engine.close()
