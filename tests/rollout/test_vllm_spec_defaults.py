"""The vLLM engine spec states no default of its own for a rollout setting: each shared field's default is
RolloutConfig's, and the values the spec accepts are the config's declared choices."""

from __future__ import annotations

import dataclasses

import pytest

from hybridflow.config.bounds import check_bounds
from hybridflow.config.rollout import RolloutConfig
from hybridflow.errors import UserError
from hybridflow.rollout.vllm_engine import VllmEngineSpec, engine_kwargs

CONFIG_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RolloutConfig)}
# dtype: the config's None means model.dtype, which the rollout role resolves before it builds a spec.
SPEC_ONLY = {"model_path", "tp", "seed", "engine_args", "dtype", "lora_rank"}  # lora_rank: roles.actor.lora.rank


def test_shared_fields_default_as_the_config_does():
    shared = [f for f in dataclasses.fields(VllmEngineSpec) if f.name not in SPEC_ONLY]
    assert {f.name for f in shared} == {"gpu_memory_utilization", "sleep_level", "seed_mode"}
    for f in shared:
        assert f.default == CONFIG_DEFAULTS[f.name], f.name


@pytest.mark.parametrize("name, good, bad", [("sleep_level", 2, 3), ("seed_mode", "per_request", "per_step")])
def test_the_spec_accepts_what_the_config_accepts(name, good, bad):
    check_bounds(RolloutConfig(**{name: good}), "rollout.")
    engine_kwargs(VllmEngineSpec("/m", tp=1, **{name: good}))
    with pytest.raises(UserError, match=f"rollout.{name}"):
        check_bounds(RolloutConfig(**{name: bad}), "rollout.")
    with pytest.raises(UserError, match=f"rollout.{name}"):
        engine_kwargs(VllmEngineSpec("/m", tp=1, **{name: bad}))
