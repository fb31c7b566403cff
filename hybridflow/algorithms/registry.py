"""`algorithm.name` -> its `AlgorithmRecord`; the only place the name is looked at.

Every module of `hybridflow/algorithms/builtin/` registers its `ALGORITHM` under its own name; code outside
the package adds one with `register_algorithm(name, record)` before the run is checked. `check_algorithm`
asks the record what the algorithm needs (a critic, groups, a loss aggregation) and refuses the config in
one line before anything is planned; `build_algorithm` builds its pieces.
"""

from __future__ import annotations

import importlib
import pkgutil

import hybridflow.algorithms.builtin as builtin
from hybridflow.algorithms.record import Algorithm, AlgorithmRecord
from hybridflow.config import ExperimentConfig
from hybridflow.errors import UserError

_RECORDS: dict[str, AlgorithmRecord] = {}


def register_algorithm(name: str, record: AlgorithmRecord) -> None:
    """Make `algorithm.name=<name>` mean `record`; a name is registered once."""
    if name in _RECORDS and _RECORDS[name] is not record:
        raise ValueError(f"algorithm {name!r} is registered already")
    _RECORDS[name] = record


def registered_algorithms() -> tuple[str, ...]:
    return tuple(sorted(_RECORDS))


def algorithm_record(name: str) -> AlgorithmRecord:
    """The record `name` names; UserError listing the registered names otherwise."""
    if name not in _RECORDS:
        raise UserError(f"algorithm.name: {name!r} is unknown; use one of {', '.join(registered_algorithms())}")
    return _RECORDS[name]


def check_algorithm(cfg: ExperimentConfig) -> AlgorithmRecord:
    """Refuse, in one line naming the field, a config the algorithm it names cannot run (before planning)."""
    alg, name = cfg.algorithm, cfg.algorithm.name
    record = algorithm_record(name)
    critic_on = cfg.roles.critic.enabled
    if record.critic and not critic_on:
        critic_free = ", ".join(n for n in registered_algorithms() if not _RECORDS[n].critic)
        raise UserError(f"roles.critic.enabled: {name} needs a critic for GAE; set it to true or choose a "
                        f"critic-free algorithm ({critic_free})")
    if critic_on and not record.critic:
        raise UserError(f"roles.critic.enabled: {name} uses no critic (it would train and never be read); "
                        "set roles.critic.enabled=false")
    if record.groups and cfg.rollout.n_samples_per_prompt < 2:
        raise UserError(
            f"rollout.n_samples_per_prompt: {name} compares the samples of a prompt, got "
            f"{cfg.rollout.n_samples_per_prompt}; set it to >= 2"
        )
    if alg.loss_agg_mode not in record.loss_agg_modes:
        raise UserError(f"algorithm.loss_agg_mode: {name} is defined with {' or '.join(record.loss_agg_modes)}, "
                        f"got {alg.loss_agg_mode!r}; set one of those")
    if alg.overlong_buffer and not record.shapes_overlong:
        shapers = [n for n in registered_algorithms() if _RECORDS[n].shapes_overlong]
        raise UserError(f"algorithm.overlong_buffer: {name} does not shape over-long rewards ({', '.join(shapers)} "
                        f"does); set it to 0 or algorithm={shapers[0]}")
    return record


def build_algorithm(cfg: ExperimentConfig) -> Algorithm:
    """The pieces of the algorithm `cfg.algorithm.name` names, after `check_algorithm`."""
    return check_algorithm(cfg).build(cfg)


for _module in pkgutil.iter_modules(builtin.__path__):
    register_algorithm(_module.name, importlib.import_module(f"{builtin.__name__}.{_module.name}").ALGORITHM)
