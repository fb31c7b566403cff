"""`algorithm.name` -> its `AlgorithmRecord`; the only place the name is looked at.

Every module of `hybridflow/algorithms/builtin/` registers its record (the record carries its name); code
outside the package adds one with `register_algorithm(record)` before the run is checked (hybridflow.registry:
the convention engines and model families follow too). `check_algorithm`
asks the record what the algorithm needs (a critic, groups, a loss aggregation) and refuses the config in
one line before anything is planned; `build_algorithm` builds its pieces.
"""

from __future__ import annotations

from hybridflow.algorithms.record import Algorithm, AlgorithmRecord
from hybridflow.config import ExperimentConfig
from hybridflow.errors import UserError
from hybridflow.registry import Registry
from hybridflow.role_records import Role

_ALGORITHMS: Registry[AlgorithmRecord] = Registry("algorithm", "algorithm.name")


def register_algorithm(record: AlgorithmRecord) -> AlgorithmRecord:
    """Make `algorithm.name=<record.name>` mean `record` (a name is registered once); returns it."""
    return _ALGORITHMS.add(record.name, record)


def registered_algorithms() -> tuple[str, ...]:
    """The registered names, in registration order (the built-ins alphabetically, then user code's)."""
    return _ALGORITHMS.names()


def algorithm_record(name: str) -> AlgorithmRecord:
    """The record `name` names; UserError listing the registered names otherwise."""
    return _ALGORITHMS.get(name)


def check_algorithm(cfg: ExperimentConfig) -> AlgorithmRecord:
    """Refuse, in one line naming the field, a config the algorithm it names cannot run (before planning)."""
    alg, name = cfg.algorithm, cfg.algorithm.name
    record = algorithm_record(name)
    critic_on = cfg.roles.critic.enabled
    if record.critic and not critic_on:
        critic_free = ", ".join(n for n in registered_algorithms() if not algorithm_record(n).critic)
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
        shapers = [n for n in registered_algorithms() if algorithm_record(n).shapes_overlong]
        raise UserError(f"algorithm.overlong_buffer: {name} does not shape over-long rewards ({', '.join(shapers)} "
                        f"does); set it to 0 or algorithm={shapers[0]}")
    if alg.clip_ratio_c is not None and not record.dual_clip:
        raise UserError(f"algorithm.clip_ratio_c: {name} clips a ratio per sequence, and the dual clip is per token "
                        "(it would be ignored); set algorithm.clip_ratio_c=null")
    if alg.overlong_buffer and cfg.rollout.environment is not None:
        raise UserError(f"algorithm.overlong_buffer: with rollout.environment a trajectory holds several assistant "
                        f"turns, each up to rollout.max_new_tokens={cfg.rollout.max_new_tokens}, and the penalty "
                        "would count them all against that one limit; set algorithm.overlong_buffer=0")
    if alg.kl_coef > 0 and not cfg.roles.ref.enabled:
        raise UserError(f"algorithm.kl_coef: {alg.kl_coef} needs the reference's log-probs and roles.ref.enabled "
                        "is false (the KL term would be left out); set algorithm.kl_coef=0 or roles.ref.enabled=true")
    if alg.old_logprobs == Role.ROLLOUT and alg.tis_cap:
        raise UserError("algorithm.tis_cap: with algorithm.old_logprobs=rollout pi_old is the rollout's own "
                        "log-probs, so every weight min(pi_old / pi_rollout, cap) would be 1; set tis_cap=0 or "
                        "algorithm.old_logprobs=actor")
    return record


def build_algorithm(cfg: ExperimentConfig) -> Algorithm:
    """The pieces of the algorithm `cfg.algorithm.name` names, after `check_algorithm`."""
    return check_algorithm(cfg).build(cfg)
