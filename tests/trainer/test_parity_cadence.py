"""The parity gate's cadence (`trainer.parity_every`) and which batches the rollout is asked log-probs for.

The rollout is asked for log-probs only for the batches something reads them from: the gate's steps, or every
step with truncated IS; at lag 1 the batch generated in step k is trained on in step k+1. The gate runs on
its steps only and refuses a batch without log-probs instead of comparing against zeros. One in-process gloo
rank drives `RLTrainer.step` with a fake rollout (no model: this rank is outside the training group).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hybridflow.algorithms import build_algorithm
from hybridflow.config import load_experiment
from hybridflow.data.step_batch import StepBatch
from hybridflow.roles.rollout_role import LocalSamples
from hybridflow.trainer.rl_step import ParityError
from hybridflow.trainer.rl_trainer import RLTrainer
from tests.single_turn import single_turn_kinds


def trainer(*overrides: str, lag: int = 0, **fields) -> RLTrainer:
    cfg = load_experiment("tiny_cpu", list(overrides))
    cfg.trainer.rollout_lag = lag  # the placement rule for lag 1 is the planner's business, not this test's
    none = dict.fromkeys(("roles", "meshes", "rollout", "scorer", "kl_ctl", "device", "training"))
    return RLTrainer(cfg=cfg, **(none | {"algorithm": build_algorithm(cfg)} | fields))


def test_parity_every_defaults_to_the_engines_own():
    assert load_experiment("tiny_cpu", []).trainer.parity_every == 1  # native: log-probs come free
    assert load_experiment("tiny_cpu", ["rollout.engine=vllm"]).trainer.parity_every == 10
    assert load_experiment("tiny_cpu", ["rollout.engine=vllm", "trainer.parity_every=0"]).trainer.parity_every == 0


@pytest.mark.parametrize("overrides,want", [
    (("trainer.parity_every=3",), [True, False, False, True, False, False, True]),
    (("trainer.parity_every=0",), [False] * 7),
    (("trainer.parity_every=0", "algorithm.tis_cap=2.0"), [True] * 7),  # truncated IS reads them every step
])
def test_logprobs_are_read_on_gate_steps_and_with_truncated_is(overrides, want):
    t = trainer(*overrides)
    assert [t.reads_rollout_logprobs(step) for step in range(7)] == want


def batch(logprobs: torch.Tensor | None) -> StepBatch:
    mask = torch.tensor([[0, 1, 1, 0]])
    return StepBatch(rows=[{}], tokens=torch.zeros(1, 4, dtype=torch.long), prompt_lens=torch.tensor([1]),
                     token_kinds=single_turn_kinds(torch.tensor([1]), mask), rollout_logprobs=logprobs,
                     old_logprobs=torch.tensor([[0, -1.0, -2.0, 0]]))


def test_gate_runs_only_on_its_steps_and_refuses_missing_logprobs():
    t = trainer("trainer.parity_every=2")
    far = torch.tensor([[0, -1.5, -2.0, 0]])  # 0.5 off: fails the gate wherever it runs
    t.steps_done = 0
    with pytest.raises(ParityError, match="trainer.parity_max_abs"):
        t.gate(batch(far))
    with pytest.raises(RuntimeError, match="trainer.parity_every: the batch was generated without"):
        t.gate(batch(None))  # never compared against zeros
    t.steps_done = 1
    assert t.gate(batch(far)) == {} and t.gate(batch(None)) == {}
    t.steps_done = 2
    assert t.gate(batch(torch.tensor([[0, -1.0, -2.0 + 1e-6, 0]])))["parity/max_abs"] == pytest.approx(1e-6, abs=1e-7)


def test_gate_at_lag_1_reports_offpolicy_and_skips_a_batch_restored_without_logprobs():
    t = trainer("trainer.parity_every=2", lag=1)
    assert t.gate(batch(torch.tensor([[0, -1.5, -2.0, 0]]))) == {"offpolicy/max_abs": 0.5, "offpolicy/mean_abs": 0.25}
    assert t.gate(batch(None)) == {}  # the checkpoint's batch, generated under an older cadence


class FakeRollout:
    """Records the log-prob flag of each generation; shares a one-token response per row."""

    engine = None
    memory: dict[str, float] = {}
    turn_metrics: dict[str, float] = {}  # single turn

    def __init__(self):
        self.asked: list[bool] = []

    def generate_local(self, batch: StepBatch, logprobs: bool = False) -> LocalSamples:
        self.asked.append(logprobs)
        return LocalSamples(None, None, None, logprobs)

    def share(self, batch: StepBatch, local: LocalSamples) -> None:
        mask = torch.zeros_like(batch.tokens)
        mask[:, 2] = 1
        batch.token_kinds = single_turn_kinds(batch.prompt_lens, mask)
        batch.rollout_logprobs = torch.zeros(batch.tokens.shape) if local.with_logprobs else None

    def sync(self, actor) -> None:
        pass


class FakeScorer:
    def local(self, batch: StepBatch) -> None:
        return None

    def share(self, local, batch: StepBatch) -> torch.Tensor:
        return torch.zeros(batch.size)


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def prompts() -> StepBatch:
    return StepBatch(rows=[{}] * 2, tokens=torch.ones(2, 8, dtype=torch.long), prompt_lens=torch.tensor([2, 2]))


@pytest.mark.parametrize("lag,want", [(0, [True, False, False, True, False]),
                                      (1, [True, False, False, True, False, False])])  # prime first, then one ahead
def test_step_asks_the_rollout_for_logprobs_for_the_batch_of_a_gate_step(one_rank, lag, want):
    rollout = FakeRollout()
    t = trainer("trainer.parity_every=3", lag=lag, roles={}, rollout=rollout, scorer=FakeScorer(),
                algorithm=type("Alg", (), {"group_filter": None, "tis_cap": 0.0})(),
                training=type("Out", (), {"member": False})())
    if lag:
        t.prime(prompts())
    for _ in range(5):
        t.step(prompts())
    assert rollout.asked == want and t.steps_done == 5
    if lag:  # the batch trained on in step 3 (0-based) was generated in step 2, with log-probs
        assert t.ready.rollout_logprobs is None  # generated in step 4 for step 5: not a gate step


def test_old_logprobs_from_the_rollout_are_recomputed_only_on_gate_steps():
    t = trainer("trainer.parity_every=3", "algorithm.old_logprobs=rollout")
    assert [t.reads_rollout_logprobs(step) for step in range(4)] == [True] * 4  # pi_old comes from them
    with_logprobs, restored = batch(torch.zeros(1, 4)), batch(None)
    recomputed = []
    for step in range(4):
        t.steps_done = step
        recomputed.append(t.recomputes_old_logprobs(with_logprobs))
        assert t.recomputes_old_logprobs(restored)  # nothing to take pi_old from
    assert recomputed == [True, False, False, True]
    assert all(trainer("trainer.parity_every=3").recomputes_old_logprobs(with_logprobs) for _ in range(2))


def test_old_logprobs_from_the_rollout_refuse_truncated_is():
    from hybridflow.errors import UserError

    with pytest.raises(UserError, match="algorithm.tis_cap: with algorithm.old_logprobs=rollout"):
        build_algorithm(load_experiment("tiny_cpu", ["algorithm.old_logprobs=rollout", "algorithm.tis_cap=2.0"]))
