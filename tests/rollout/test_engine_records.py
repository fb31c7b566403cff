"""Every registered rollout engine's record names a builder that resolves, and its facts agree with it."""

from pathlib import Path

import pytest
import torch
from packaging.specifiers import SpecifierSet

from hybridflow.config.rollout import RolloutConfig
from hybridflow.engines import AUTO, engine_names, get_engine
from hybridflow.errors import UserError
from hybridflow.placement import ParallelDims, RoleMesh
from hybridflow.roles.rollout_role import resolve_builder
from hybridflow.rollout.base import EngineSetup
from megatron_adapters.bridge import TargetFormat


def test_native_engine_first_and_auto_is_no_engine():
    assert engine_names()[0] == "megatron" and "vllm" in engine_names()
    with pytest.raises(UserError, match=r"^rollout\.engine: auto is resolved by the planner"):
        get_engine(AUTO)
    with pytest.raises(UserError, match=r"^rollout\.engine: 'sglang' is unknown; use one of megatron, vllm, auto"):
        get_engine("sglang")


@pytest.mark.parametrize("name", engine_names())
def test_builder_resolves_and_matches_the_traits(name):
    record = get_engine(name)
    builder = resolve_builder(record.builder)
    assert isinstance(builder.target, TargetFormat) and callable(builder.build)
    # an engine in a process of its own is fed through a staging buffer; one in the training process in place
    assert builder.staged == record.traits.separate_process
    # only an engine that holds Megatron's layout can read the actor's tensors in place
    assert not record.traits.shares_actor_weights or builder.target == TargetFormat.MEGATRON
    assert (record.process_host_bytes() > 0) == record.traits.separate_process
    assert record.traits.parity_every >= 1 and (record.traits.parity_every == 1) == record.traits.logprobs_free


def test_setup_extras_pin_what_the_records_require():
    setup = (Path(__file__).resolve().parents[2] / "setup.py").read_text()
    for name in engine_names():
        need = get_engine(name).traits.package
        if need is not None:
            assert f'"{need.extra}": ["{need.distribution}{need.versions}"]' in setup, name
            SpecifierSet(need.versions)  # a valid specifier


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_vllm_builder_refuses_a_machine_without_cuda():
    # the run refuses what the planner refuses on a cpu cluster, before any engine process starts
    mesh = RoleMesh("rollout", (0,), ParallelDims(1, 1, 1))
    setup = EngineSetup(rollout=RolloutConfig(engine="vllm"), mesh=mesh, groups=None,
                        hf_dir="unused", dtype=torch.bfloat16, device=torch.device("cpu"), seed=0)
    with pytest.raises(UserError, match=r"^rollout\.engine: vllm runs on CUDA GPUs only and this machine has none"):
        resolve_builder(get_engine("vllm").builder).start(setup)
