"""A reward model's scores are shared where they are first read, so it scores while the other roles run their
passes (lag 0, no batch filter): on a training rank the score share comes after the ref / value / old log-prob
passes and their exchange, on a rank outside the training group after the step's consume is skipped; with a
batch filter they are shared at once (the filter reads them). One in-process gloo rank drives `RLTrainer.step`
with a fake rollout and scorer that log the order of events."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from tests.trainer.test_parity_cadence import FakeRollout, prompts, trainer


class LoggingScorer:
    def __init__(self, events: list[str]):
        self.events = events

    def local(self, batch):
        self.events.append("score")
        return torch.full((batch.size,), 0.5)

    def share(self, local, batch):
        self.events.append("share_scores")
        return local


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _logging_trainer(events: list[str], member: bool, group_filter=None):
    alg = SimpleNamespace(group_filter=group_filter, tis_cap=0.0,
                          estimator=lambda *a: SimpleNamespace(advantages=None, returns=None))
    t = trainer("trainer.parity_every=0", roles={}, meshes={}, rollout=FakeRollout(), scorer=LoggingScorer(events),
                algorithm=alg, training=SimpleNamespace(member=member),
                kl_ctl=SimpleNamespace(update=lambda *a: None, value=0.0))
    t._infer = lambda role, batch, per_token: events.append(f"pass_{role}")
    t.share = lambda role, local, batch: events.append(f"exchange_{role}") or torch.zeros(batch.tokens.shape)

    def assign_rewards(batch):
        assert batch.scores is not None  # the first read: shared by now
        events.append("advantages")
        return 0.0

    t.assign_rewards = assign_rewards
    return t


def test_scores_are_shared_after_the_other_roles_passes(one_rank):
    events: list[str] = []
    t = _logging_trainer(events, member=True)
    metrics = t.step(prompts())
    assert events == ["score", "pass_ref", "pass_critic", "pass_actor", "exchange_actor", "share_scores",
                      "advantages"]
    assert metrics["reward/mean"] == 0.5 and t.unshared_scores is None


def test_outside_the_training_group_the_scores_land_before_the_metrics(one_rank):
    events: list[str] = []
    t = _logging_trainer(events, member=False)
    assert t.step(prompts())["reward/mean"] == 0.5 and events == ["score", "share_scores"]


def test_a_batch_filter_gets_the_scores_at_once(one_rank):
    events: list[str] = []

    class KeepAll:
        group_size, max_extra_draws = 1, 0

        def keep(self, scores):
            events.append("filter")
            return torch.ones(scores.shape[0], dtype=torch.bool)

    t = _logging_trainer(events, member=True, group_filter=KeepAll())
    t.step(prompts(), draw=prompts)
    assert events.index("share_scores") < events.index("filter") < events.index("pass_ref")
