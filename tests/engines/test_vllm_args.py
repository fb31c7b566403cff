"""rollout.engine_args are checked when the experiment loads (plan time), not first by vLLM on the GPU ranks."""

from __future__ import annotations

import pytest

from hybridflow.config import load_experiment
from hybridflow.engines.vllm_args import KNOWN, RESERVED, check_engine_args
from hybridflow.errors import UserError


@pytest.mark.parametrize("override, message", [
    ("max_num_seqs=0", r"rollout.engine_args.max_num_seqs: 0 is not valid; set an integer >= 1"),
    ("max_num_seqs=-5", r"rollout.engine_args.max_num_seqs: -5 is not valid"),
    ("max_num_seqs=abc", r"rollout.engine_args.max_num_seqs: 'abc' is not valid; set an integer"),
    ("max_num_seqs=true", r"rollout.engine_args.max_num_seqs: True is not valid"),
    ("enforce_eager=3", r"rollout.engine_args.enforce_eager: 3 is not valid; set true or false"),
    ("kv_cache_dtype=int4", r"kv_cache_dtype: 'int4' is not valid; set one of auto, float16"),
    ("gpu_memory_utilization=2", r"gpu_memory_utilization: 2 is not valid; set a number > 0 and <= 1"),
    ("bogus_key=1", r"rollout.engine_args.bogus_key: not a vLLM engine argument .*use one of .*max_num_seqs"),
    ("model=/x", r"rollout.engine_args.model: set by hybridflow's vLLM engine .*remove it"),
    ("dtype=float16", r"rollout.engine_args.dtype: .*set rollout.dtype"),
])
def test_bad_engine_args_are_refused_when_the_experiment_loads(override, message):
    with pytest.raises(UserError, match=message):
        load_experiment("tiny_cpu", [f"+rollout.engine_args.{override}"])


def test_good_engine_args_load():
    cfg = load_experiment("tiny_cpu", ["+rollout.engine_args.max_num_seqs=64", "+rollout.engine_args.cpu_offload_gb=0",
                                       "+rollout.engine_args.enforce_eager=true",
                                       "+rollout.engine_args.compilation_config=3"])
    assert cfg.rollout.engine_args == {"max_num_seqs": 64, "cpu_offload_gb": 0, "enforce_eager": True,
                                       "compilation_config": 3}


def test_shipped_vllm_config_passes():
    cfg = load_experiment("tiny_cpu", ["rollout=vllm"])
    assert cfg.rollout.engine_args["max_num_seqs"] == 256


def test_engine_args_gpu_memory_utilization_must_agree_with_the_rollout_field():
    check_engine_args({"gpu_memory_utilization": 0.5}, 0.5)
    with pytest.raises(UserError, match="contradicts rollout.gpu_memory_utilization=0.5; set only"):
        check_engine_args({"gpu_memory_utilization": 0.9}, 0.5)


def test_reserved_keys_are_not_tunable():
    assert not set(RESERVED) & set(KNOWN)


def test_a_key_without_plus_is_told_to_use_plus():
    with pytest.raises(UserError, match=r"rollout.engine_args.max_num_seqs: .*free-form map; add the key with "
                                        r"\+rollout.engine_args.max_num_seqs=VALUE"):
        load_experiment("tiny_cpu", ["rollout.engine_args.max_num_seqs=4"])


def test_every_key_is_a_field_of_the_installed_vllms_engine_args():
    """The table against vLLM's own EngineArgs where vLLM is installed (the GPU machine); checked by hand against
    vLLM 0.20.2's wheel (vllm/engine/arg_utils.py) on 2026-12-06, which has no `swap_space`."""
    import dataclasses

    vllm = pytest.importorskip("vllm")
    fields = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
    assert set(KNOWN) <= fields and set(RESERVED) <= fields
