"""A two-turn trajectory (prompt, assistant, observation, assistant) through the RL step's consumers: the
observation tokens count in the lengths but get no policy loss, KL, entropy, value target, reward or
advantage, and the parity gate compares every assistant token of both turns and nothing else.

The check is by perturbation: whatever the observation columns of the inputs hold, the losses, their
gradients at the assistant tokens and the gate's figures stay those of a batch with zeros there.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hybridflow.algorithms import (
    ActorLossConfig,
    CriticLossConfig,
    actor_loss,
    build_algorithm,
    build_kl_controller,
    critic_loss,
)
from hybridflow.config import load_experiment
from hybridflow.token_kinds import TokenKind
from hybridflow.trainer.rl_step import ParityError, StageTimer
from hybridflow.trainer.rl_trainer import RLTrainer
from tests.test_token_kinds import two_turn_batch
from tests.trainer.test_parity_cadence import trainer

OBS = (0, slice(5, 7))  # row 0's observation columns in two_turn_batch


def _observed(x: torch.Tensor, value: float) -> torch.Tensor:
    """`x` with the observation columns set to `value` (what an engine or a role might leave there)."""
    x = x.clone()
    x[OBS] = value
    return x


def _actor(inputs: dict[str, torch.Tensor], mask: torch.Tensor, cfg: ActorLossConfig):
    logp = inputs["logp"].clone().requires_grad_()
    entropy = inputs["entropy"].clone().requires_grad_()
    out = actor_loss(logp, inputs["old"], inputs["adv"], mask, cfg, entropy=entropy, ref_logprobs=inputs["ref"])
    out.loss_sum.backward()
    return out, logp.grad, entropy.grad


def test_actor_loss_kl_and_entropy_ignore_observation_tokens():
    batch = two_turn_batch()
    gen = torch.Generator().manual_seed(0)
    mask = batch.loss_mask
    clean = {k: torch.randn(2, 12, generator=gen) * mask for k in ("logp", "old", "adv", "ref", "entropy")}
    for k in ("logp", "old", "ref"):
        clean[k] = -clean[k].abs()
    noisy = {k: _observed(v, -9.0 if k != "adv" else 5.0) for k, v in clean.items()}
    cfg = ActorLossConfig(entropy_coef=0.01, kl_loss_coef=0.1)
    (a, grad_a, ent_a), (b, grad_b, ent_b) = _actor(clean, mask, cfg), _actor(noisy, mask, cfg)
    assert torch.equal(a.loss_sum, b.loss_sum) and int(a.num_tokens) == 9  # 5 + 4 assistant tokens
    assert {k: float(v) for k, v in a.metrics.items()} == {k: float(v) for k, v in b.metrics.items()}
    assert torch.equal(grad_a, grad_b) and torch.equal(ent_a, ent_b)
    assert grad_b[OBS].abs().sum() == 0 and ent_b[OBS].abs().sum() == 0
    assert grad_b[0, 7:9].abs().sum() > 0  # the second turn is trained


def test_value_targets_ignore_observation_tokens():
    batch = two_turn_batch()
    gen = torch.Generator().manual_seed(1)
    values, old, returns = (torch.randn(2, 12, generator=gen) for _ in range(3))
    outs = []
    for fill in (0.0, 50.0):
        v = _observed(values, fill).requires_grad_()
        out = critic_loss(v, _observed(old, -fill), _observed(returns, fill), batch.loss_mask, CriticLossConfig())
        out.loss_sum.backward()
        outs.append((out.loss_sum, v.grad))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    assert outs[1][1][OBS].abs().sum() == 0 and outs[1][1][0, 7:9].abs().sum() > 0


def _rl_trainer(experiment: str) -> RLTrainer:
    cfg = load_experiment(experiment, ["rollout.n_samples_per_prompt=2"])  # GRPO: the 2 rows are one group
    alg = cfg.algorithm
    none = dict.fromkeys(("roles", "meshes", "rollout", "scorer", "device", "training"))
    return RLTrainer(cfg=cfg, algorithm=build_algorithm(cfg), **none,
                     kl_ctl=build_kl_controller(alg.kl_controller, alg.kl_coef, alg.kl_target, alg.kl_horizon))


@pytest.mark.parametrize("experiment", ["tiny_cpu", "grpo_tiny_cpu"])  # KL in the reward; KL as a loss term
def test_rewards_and_kl_ignore_observation_tokens(experiment):
    t = _rl_trainer(experiment)
    gen = torch.Generator().manual_seed(2)
    old = -torch.rand(2, 12, generator=gen)
    ref = old - 0.1 * torch.rand(2, 12, generator=gen)
    figures = []
    for fill in (0.0, -7.0):
        batch = two_turn_batch()
        batch.scores = torch.tensor([1.0, 0.5])
        batch.old_logprobs, batch.ref_logprobs = _observed(old, fill), _observed(ref, 3 * fill)
        kl = t.assign_rewards(batch)
        values = _observed(old, 4 * fill) if experiment == "tiny_cpu" else None  # PPO's critic; GRPO has none
        adv = t.algorithm.estimator(batch.token_rewards, batch.loss_mask, values)
        figures.append((kl, batch.token_rewards, adv.advantages))
    assert figures[0][0] == pytest.approx(figures[1][0], abs=0, rel=1e-6)
    off = batch.loss_mask == 0
    assert torch.equal(figures[0][1], figures[1][1]) and figures[1][1][off].abs().sum() == 0
    assert torch.allclose(figures[0][2], figures[1][2], atol=1e-6) and figures[1][2][off].abs().sum() == 0
    assert float(figures[1][1][0, 8]) != 0.0  # the score lands on the last assistant token of the second turn


def test_parity_gate_compares_every_assistant_token_and_ignores_observations():
    t = trainer("trainer.parity_every=1")
    batch = two_turn_batch()
    sampled = -torch.rand(2, 12, generator=torch.Generator().manual_seed(4)) * batch.loss_mask
    batch.rollout_logprobs = sampled  # the engine samples no observation token: 0 there
    batch.old_logprobs = _observed(sampled, -12.0)  # the actor scores every token
    assert t.gate(batch) == {"parity/max_abs": 0.0, "parity/mean_abs": 0.0}
    batch.old_logprobs[0, 8] -= 0.5  # the second turn's last token disagrees
    with pytest.raises(ParityError, match="max abs diff 0.5"):
        t.gate(batch)


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_metrics_count_assistant_tokens_and_the_observation_share(one_rank):
    batch = two_turn_batch()
    batch.scores = torch.tensor([1.0, 0.0])
    timer = StageTimer()
    timer.seconds["generate"] = 2.0
    out = trainer()._step_metrics(batch, {}, timer)
    assert out["response_length"] == 4.5  # (5 + 4) assistant tokens over 2 samples
    assert out["observation_token_share"] == 2 / 11
    assert out["tokens_per_s"] == (9 + 7) / 2.0  # every token of each sequence, observations too
    assert int((batch.token_kinds == TokenKind.OBSERVATION).sum()) == 2
