"""Extension by registration: a toy algorithm, rollout engine and model family, each defined and registered
in user code alone (no hybridflow file edited), are accepted by the config check and planned by name.

Runs in a fresh interpreter so the toy records never enter this process's registries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TOYS = '''
import dataclasses
from hybridflow.algorithms import AlgorithmRecord, GroupNormalized, register_algorithm, check_algorithm
from hybridflow.algorithms.record import token_clip, with_reward_side
from hybridflow.engines import register_engine
from hybridflow.engines.megatron import MegatronEngine
from hybridflow.families import ModelFamily, decoder_layer_weights, register_family

register_algorithm(AlgorithmRecord("toy_alg", lambda cfg: with_reward_side(cfg, GroupNormalized(2), token_clip(cfg)),
                                   critic=False, groups=True))
register_engine(dataclasses.replace(MegatronEngine(), name="toy_engine"))
register_family(ModelFamily("toy", "ToyForCausalLM", "ToyForSequenceClassification", decoder_layer_weights))

from hybridflow.algorithms import build_algorithm
from hybridflow.config import load_experiment
from hybridflow.placement import plan_placement

cfg = load_experiment("grpo_tiny_cpu", ["algorithm.name=toy_alg", "rollout.engine=toy_engine",
                                        "model.architecture=ToyForCausalLM"])
assert check_algorithm(cfg).name == "toy_alg" and build_algorithm(cfg).estimator == GroupNormalized(2)
assert cfg.model.family.name == "toy" and cfg.trainer.parity_every == 1  # the engine's default, filled
plan = plan_placement(cfg)
assert plan.rollout_engine == "toy_engine", plan.rollout_engine
auto = plan_placement(load_experiment("grpo_tiny_cpu", ["rollout.engine=auto", "algorithm.name=toy_alg"]))
print("ok", auto.rollout_engine)
'''


def test_toy_algorithm_engine_and_family_register_and_plan_by_name():
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", TOYS], env=env, text=True, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[0] == "ok"


def test_an_unknown_name_is_one_line_listing_the_known_ones_for_every_kind():
    import pytest

    from hybridflow.algorithms import algorithm_record
    from hybridflow.engines import get_engine
    from hybridflow.errors import UserError
    from hybridflow.families import family

    for lookup, field in [(algorithm_record, "algorithm.name"), (get_engine, "rollout.engine"),
                          (family, "model_type")]:
        with pytest.raises(UserError) as err:
            lookup("nope")
        assert str(err.value).startswith(f"{field}: 'nope' is unknown; use one of ") and "\n" not in str(err.value)
