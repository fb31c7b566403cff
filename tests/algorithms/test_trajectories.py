"""Every registered algorithm on multi-turn trajectories (prompt, assistant, observation, assistant, ...): the
reward side (scores, KL), the advantage estimator (GAE with the critic's values for PPO, the group estimators
for the GRPO family), the actor loss with the algorithm's policy loss and loss aggregation, and PPO's critic
loss read assistant tokens only. The reference is independent of the masks: the same batch with the
observation columns deleted (each trajectory's assistant turns joined into one response, a single-turn batch)
must give the same KL, the same advantages, returns and token rewards on every assistant token, the same
losses and the same gradients; on observation tokens rewards, advantages, returns and gradients are zero,
whatever the per-token inputs hold there."""

from __future__ import annotations

import pytest
import torch

from hybridflow.algorithms import (
    ActorLossConfig,
    CriticLossConfig,
    actor_loss,
    algorithm_record,
    build_algorithm,
    build_kl_controller,
    critic_loss,
    loss_agg,
    registered_algorithms,
)
from hybridflow.config import load_experiment
from hybridflow.data.step_batch import StepBatch
from hybridflow.token_kinds import TokenKind
from hybridflow.trainer.rl_trainer import RLTrainer

P, A, O = int(TokenKind.PROMPT), int(TokenKind.ASSISTANT), int(TokenKind.OBSERVATION)
# Two prompts x 2 samples (rows 0-1 and 2-3 are the groups): two- and three-turn trajectories beside single
# turns, observations of different lengths.
KINDS = [[P, P, P, A, A, A, O, O, O, A, A, A],
         [P, P, P, A, A, A, A],
         [P, P, A, A, O, O, A, O, A, A],
         [P, P, A, A, A, A, A, A]]
WIDTH = 14
SCORES = torch.tensor([1.0, 0.0, 0.25, 1.0])
EXPERIMENTS = {"ppo": "tiny_cpu"}  # else <name>_tiny_cpu


def _kinds(rows: list[list[int]]) -> torch.Tensor:
    out = torch.zeros(len(rows), WIDTH, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


def _joined(x: torch.Tensor) -> torch.Tensor:
    """`x` [B, WIDTH] with each row's observation columns deleted (the rest moved left, zero-padded)."""
    out = torch.zeros_like(x)
    for i, row in enumerate(KINDS):
        keep = [t for t, k in enumerate(row) if k != O]
        out[i, : len(keep)] = x[i, keep]
    return out


def _trainer(name: str) -> RLTrainer:
    cfg = load_experiment(EXPERIMENTS.get(name, f"{name}_tiny_cpu"), ["rollout.n_samples_per_prompt=2"])
    assert cfg.algorithm.name == name
    alg = cfg.algorithm
    none = dict.fromkeys(("roles", "meshes", "rollout", "scorer", "device", "training"))
    return RLTrainer(cfg=cfg, algorithm=build_algorithm(cfg), **none,
                     kl_ctl=build_kl_controller(alg.kl_controller, alg.kl_coef, alg.kl_target, alg.kl_horizon))


def _inputs(seed: int) -> dict[str, torch.Tensor]:
    """Per-token inputs with values on every column (an engine or a role may leave anything off the mask)."""
    gen = torch.Generator().manual_seed(seed)
    logp = -torch.rand(4, WIDTH, generator=gen) * 2
    return {"logp": logp, "old": logp + 0.1 * torch.randn(4, WIDTH, generator=gen),
            "ref": logp + 0.2 * torch.randn(4, WIDTH, generator=gen), "entropy": torch.rand(4, WIDTH, generator=gen),
            "values": torch.randn(4, WIDTH, generator=gen), "new_values": torch.randn(4, WIDTH, generator=gen)}


def _run(t: RLTrainer, kinds: torch.Tensor, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the RL step computes from a scored batch: rewards, advantages, and both losses with gradients."""
    critic = algorithm_record(t.cfg.algorithm.name).critic
    batch = StepBatch(rows=[{}] * 4, tokens=torch.ones(4, WIDTH, dtype=torch.long),
                      prompt_lens=(kinds == P).sum(1), token_kinds=kinds)
    batch.scores, batch.old_logprobs, batch.ref_logprobs = SCORES.clone(), inputs["old"], inputs["ref"]
    mask = batch.loss_mask
    kl = t.assign_rewards(batch)
    adv = t.algorithm.estimator(batch.token_rewards, mask, inputs["values"] if critic else None)
    alg, mode = t.cfg.algorithm, t.cfg.algorithm.loss_agg_mode
    cfg = ActorLossConfig(policy=t.algorithm.policy_loss, entropy_coef=0.01,
                          kl_loss_coef=alg.kl_coef if t.algorithm.reward_kl is None else 0.0,
                          kl_loss_estimator=alg.kl_loss_estimator)
    logp = inputs["logp"].clone().requires_grad_()
    out = actor_loss(logp, inputs["old"], adv.advantages, mask, cfg, entropy=inputs["entropy"],
                     ref_logprobs=inputs["ref"])
    actor = loss_agg.numerator(out.token_loss, out.mask, mode) / loss_agg.local_count(mask, mode)
    actor.backward()
    result = {"kl": torch.tensor(kl), "token_rewards": batch.token_rewards, "advantages": adv.advantages,
              "actor_loss": actor.detach(), "actor_grad": logp.grad, "mask": mask}
    if critic:
        values = inputs["new_values"].clone().requires_grad_()
        out = critic_loss(values, inputs["values"], adv.returns, mask, CriticLossConfig(alg.cliprange_value))
        loss = loss_agg.numerator(out.token_loss, out.mask, mode) / loss_agg.local_count(mask, mode)
        loss.backward()
        result |= {"returns": adv.returns, "critic_loss": loss.detach(), "critic_grad": values.grad}
    return result


@pytest.mark.parametrize("name", registered_algorithms())
def test_the_algorithm_on_trajectories_equals_it_on_the_turns_joined(name):
    t = _trainer(name)
    kinds = _kinds(KINDS)
    inputs = _inputs(0)
    multi = _run(t, kinds, inputs)
    single = _run(t, _joined(kinds), {k: _joined(v) for k, v in inputs.items()})
    assert torch.equal(_joined(multi["mask"]), single["mask"]) and int(multi["mask"].sum()) == 21
    assert float(multi["kl"]) == pytest.approx(float(single["kl"]), rel=1e-5, abs=1e-7)
    for key in ("actor_loss", "critic_loss"):
        if key in multi:
            assert float(multi[key]) == pytest.approx(float(single[key]), rel=1e-5, abs=1e-7), key
    observation = kinds == O
    for key in ("token_rewards", "advantages", "returns", "actor_grad", "critic_grad"):
        if key not in multi:
            continue
        assert torch.allclose(_joined(multi[key]), single[key], atol=1e-6), key
        assert multi[key][observation].abs().sum() == 0, key
    # both turns of a multi-turn trajectory are trained: a nonzero gradient on the last token of each turn
    assert multi["actor_grad"][0, 5] != 0 and multi["actor_grad"][0, 11] != 0
    assert multi["actor_grad"][2, 3] != 0 and multi["actor_grad"][2, 6] != 0 and multi["actor_grad"][2, 9] != 0


@pytest.mark.parametrize("name", registered_algorithms())
def test_what_observation_columns_hold_changes_nothing(name):
    t = _trainer(name)
    kinds = _kinds(KINDS)
    clean = _inputs(1)
    noisy = {k: torch.where(kinds == O, torch.full_like(v, -30.0 if k != "entropy" else 9.0), v)
             for k, v in clean.items()}
    a, b = _run(t, kinds, clean), _run(t, kinds, noisy)
    for key in a:
        assert torch.equal(a[key], b[key]), key
