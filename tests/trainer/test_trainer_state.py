"""The trainer's part of a checkpoint: `RLTrainer.state_dict` / `load_state_dict` carry the RL steps trained, the
KL controller, the rollout's sampling step and lag 1's landed batch, in the keys checkpoints have always held."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from hybridflow.algorithms.kl.controller import AdaptiveKLController
from hybridflow.data.step_batch import StepBatch
from tests.trainer.test_parity_cadence import trainer


def _trained(lag: int):
    t = trainer("algorithm.kl_controller=adaptive", lag=lag, kl_ctl=AdaptiveKLController(0.2, 6.0, 100),
                rollout=SimpleNamespace(step=0))
    t.kl_ctl.update(9.0, 64)  # moves the coefficient away from its start
    t.rollout.step, t.steps_done = 7, 5
    if lag:
        t.ready = StepBatch(rows=[{"x": 1}] * 2, tokens=torch.arange(16).view(2, 8), prompt_lens=torch.tensor([2, 3]))
    return t


def test_a_fresh_trainer_continues_where_the_saved_one_stopped():
    for lag in (0, 1):
        saved = _trained(lag)
        state = saved.state_dict()
        assert set(state) == {"step", "kl", "rollout_step", "ready"}  # what loop.train saved before, key by key
        fresh = trainer("algorithm.kl_controller=adaptive", lag=lag, kl_ctl=AdaptiveKLController(0.2, 6.0, 100),
                        rollout=SimpleNamespace(step=0))
        fresh.load_state_dict(state)
        assert (fresh.steps_done, fresh.rollout.step) == (5, 7)
        start = AdaptiveKLController(0.2, 6.0, 100).state_dict()
        assert fresh.kl_ctl.state_dict() == saved.kl_ctl.state_dict() != start
        assert fresh.ready is saved.ready and (fresh.ready is None) == (lag == 0)


def test_a_checkpoint_without_a_landed_batch_resumes_with_none():
    t = _trained(1)
    state = {k: v for k, v in _trained(0).state_dict().items() if k != "ready"}  # written before lag 1 existed
    t.load_state_dict(state)
    assert t.ready is None and t.steps_done == 5


def test_the_actor_loss_takes_the_adaptive_controllers_coefficient(monkeypatch):
    """Before: the KL loss term used algorithm.kl_coef whatever the controller did (the logged kl_coef moved, the
    gradients did not)."""
    import hybridflow.trainer.rl_step as rl_step
    from hybridflow.role_records import Role

    seen: dict = {}
    monkeypatch.setattr(rl_step, "ActorLossConfig", lambda **kw: seen.update(kw))
    ctl = AdaptiveKLController(0.2, 6.0, 100)
    ctl.update(9.0, 64)
    t = trainer("algorithm.kl_controller=adaptive", "algorithm.kl_coef=0.2", "algorithm.kl_in_reward=false",
                kl_ctl=ctl, roles={Role.ACTOR: None}, meshes={Role.REF: None})
    t._actor_loss(1.0)
    assert seen["kl_loss_coef"] == ctl.value != 0.2
