"""vLLM's own LoRA path (`roles.actor.lora.sync=adapters` with rollout.engine=vllm), without vLLM: the engine
arguments turn LoRA on at a rank vLLM accepts, every request runs with the adapter last loaded (a new id per
load, so vLLM does not serve the cached old one), the base weights keep their plain names under vLLM's LoRA
wrappers; and the rollout role ships the base once through the bridge, then writes the actor's adapters as a
PEFT directory that the engine loads on every sync (CPU, one gloo rank, a real LoRA actor). The argument names are
vLLM 0.20's as documented (enable_lora, max_lora_rank, max_loras, LoRARequest(lora_name, lora_int_id,
lora_path), LLM.generate(..., lora_request=)); not yet run on a GPU."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from hybridflow.errors import UserError
from hybridflow.rollout.base import RolloutBatch, SamplingParams
from hybridflow.rollout.vllm_engine import VllmEngineSpec, VllmRolloutEngine, engine_kwargs
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model, token_batch


@dataclass(frozen=True)
class FakeLoRARequest:
    """vllm.lora.request.LoRARequest's fields that the engine sets."""

    lora_name: str
    lora_int_id: int
    lora_path: str


class FakeLLM:
    """generate() answers [7, 8] per prompt and records the lora_request it got."""

    def __init__(self, module: torch.nn.Module):
        self.module, self.requests = module, []

    def apply_model(self, func):
        return [func(self.module)]

    def generate(self, prompts, params, use_tqdm, lora_request=None):
        from tests.rollout.test_vllm_engine import fake_output

        self.requests.append(lora_request)
        return [fake_output(p["prompt_token_ids"], [7, 8], [-0.5, -0.5]) for p in prompts]


@pytest.mark.parametrize("rank, max_rank", [(4, 8), (8, 8), (32, 32), (33, 64), (1, 1)])
def test_engine_arguments_turn_lora_on_at_a_rank_vllm_accepts(rank, max_rank):
    kw = engine_kwargs(VllmEngineSpec("/m", tp=1, lora_rank=rank))
    assert (kw["enable_lora"], kw["max_lora_rank"], kw["max_loras"]) == (True, max_rank, 1)
    assert not {"enable_lora", "max_lora_rank", "max_loras"} & set(engine_kwargs(VllmEngineSpec("/m", tp=1)))


def test_too_large_a_rank_and_user_lora_arguments_are_refused():
    with pytest.raises(UserError, match=r"^roles\.actor\.lora\.rank: 600 exceeds vLLM's largest max_lora_rank 512"):
        engine_kwargs(VllmEngineSpec("/m", tp=1, lora_rank=600))
    with pytest.raises(UserError, match=r"^rollout\.engine_args\.enable_lora: set by hybridflow's vLLM engine"):
        engine_kwargs(VllmEngineSpec("/m", tp=1, engine_args={"enable_lora": True}))


def test_requests_run_with_the_adapter_last_loaded_under_a_new_id():
    module = torch.nn.Module()
    module.qkv_proj = torch.nn.Module()
    module.qkv_proj.base_layer = torch.nn.Linear(4, 6, bias=False)  # vLLM's LoRA wrapper keeps the base here
    llm = FakeLLM(module)
    engine = VllmRolloutEngine(llm, dict, VllmEngineSpec("/m", tp=1, lora_rank=8), dp_rank=0,
                               lora_request_cls=FakeLoRARequest)
    batch = RolloutBatch(torch.tensor([[5, 6, 0, 0]]), torch.tensor([2]))
    sampling = SamplingParams(max_new_tokens=2)
    engine.generate(batch, sampling)
    assert llm.requests == [None]  # no adapter yet: the base model
    engine.load_adapter("/run/rollout_adapter")
    engine.generate(batch, sampling)
    engine.load_adapter("/run/rollout_adapter")
    engine.generate(batch, sampling)
    assert llm.requests[1:] == [FakeLoRARequest("actor-1", 1, "/run/rollout_adapter"),
                                FakeLoRARequest("actor-2", 2, "/run/rollout_adapter")]
    assert list(engine.weight_tensors()) == ["qkv_proj.weight"]  # the name the bridge writes
    without = VllmRolloutEngine(llm, dict, VllmEngineSpec("/m", tp=1), dp_rank=0)
    with pytest.raises(RuntimeError, match="built without LoRA"):
        without.load_adapter("/run/rollout_adapter")


def _file_sync(hf_dir: str, adapter_dir: str, ids: torch.Tensor) -> dict:
    from safetensors.torch import load_file

    from hybridflow.config.parallel import LoraConfig
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import OptimizerSettings, build_model_role, lora_settings
    from hybridflow.roles.rollout_role import RolloutRole
    from megatron_adapters.bridge import ReshardStats
    from megatron_adapters.checkpoint import unwrap
    from megatron_adapters.hf_safetensors import stage_entries
    from megatron_adapters.lora import adapter_modules
    from megatron_adapters.peft_export import ADAPTER_WEIGHTS
    from megatron_adapters.process_groups import build_role_groups

    mesh = RoleMesh("actor", (0,), ParallelDims(1, 1, 1))
    actor = build_model_role("actor", mesh, build_role_groups([0], tp=1, pp=1, dp=1), hf_dir, "lm", torch.float32,
                             2, optimizer=OptimizerSettings(lr=1e-2), seed=1, lora=lora_settings(LoraConfig(rank=4)))
    model = unwrap(actor.model)
    params = dict(model.named_parameters())
    base = {entry.mcore: params[name].detach().clone() for entry, name in stage_entries(model)}

    class Bridge:  # records what the base sync ships
        shipped: list = []

        def reshard(self, src, dst, on_bucket):
            self.shipped.append({k: v.clone() for k, v in src.items()})
            return dst, ReshardStats(0.0, 0, 1, 0)

    class Engine:  # the slice of the hosted vLLM engine that a sync calls
        loaded: list = []

        def wake_up(self, tags):
            pass

        def weight_tensors(self):
            return {}

        def bucket_written(self, index):
            pass

        def weights_written(self):
            pass

        def load_adapter(self, path):
            self.loaded.append((path, load_file(f"{path}/{ADAPTER_WEIGHTS}")))

    rollout = RolloutRole(mesh, Engine(), Bridge(), None, torch.device("cpu"), adapter_dir=Path(adapter_dir),
                          hf_dir=hf_dir)
    rollout.sync(actor)
    actor.train(actor.micro_batches({"input_ids": ids}), lambda logits, mb: (
        -actor.logprobs(logits, mb["input_ids"]).mean(), {"num_tokens": torch.tensor(1.0)}))
    rollout.sync(actor)
    qkv = next(m for name, m in adapter_modules(model) if name.endswith("layers.0.self_attention.linear_qkv"))
    return {"shipped": Bridge.shipped, "base": base, "loaded": Engine.loaded, "q_b": qkv.lora_b[0].detach().clone(),
            "last": rollout.last_sync}


def test_rollout_role_ships_the_base_once_then_the_adapter_directory(tmp_path):
    hf = save_tiny_model("llama", tmp_path / "hf", seed=3)
    ids = token_batch(hf.config.vocab_size, batch=2, seq=10, seed=5)
    out = run_distributed(_file_sync, world_size=1, args=(str(tmp_path / "hf"), str(tmp_path / "ad"), ids))[0]
    assert len(out["shipped"]) == 1  # the frozen base, once, without the adapters
    assert out["shipped"][0].keys() == out["base"].keys()
    assert all(torch.equal(out["shipped"][0][k], v) for k, v in out["base"].items())
    assert [path for path, _ in out["loaded"]] == [str(tmp_path / "ad")] * 2  # every sync loads the directory
    key = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"
    first, second = (tensors[key] for _, tensors in out["loaded"])
    assert not first.any() and torch.equal(second, out["q_b"])  # B starts at 0, then the trained one is shipped
    assert out["last"].bytes_written == (tmp_path / "ad" / "adapter_model.safetensors").stat().st_size
