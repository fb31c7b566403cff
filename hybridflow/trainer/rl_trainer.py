"""The RL step: produce a generated + scored batch, consume it (ref -> values -> old log-probs -> exchange ->
advantages -> update critic -> update actor), sync the actor's weights to the rollout.

Every rank runs the same step; each stage runs on the ranks of its role and ends with its results shared
(`share`), so roles on disjoint ranks work concurrently. Producing is two halves: `generate_local` (the
engine's work on the rollout ranks, collective only inside the rollout's own groups) and `produce` (the
rollout's samples land on every rank through world broadcasts, then the batch is trimmed and scored; a
batch filter (dynamic sampling) then drops groups and generates more prompts until the batch is full).
Consuming runs on the training group only (the ranks holding actor, critic, ref or reward; its exchanges
are broadcasts over that group), so a rank that holds only the rollout never enters it.

`trainer.rollout_lag=0`: generate batch k, land it, consume it, sync w_k (the weights after update k). The
scores (a world collective) are shared where first read, after the ref / value / old log-prob passes
(`land_scores`), so a reward model on its own GPUs scores meanwhile; ranks outside the training group join
that share after skipping `consume`. With a batch filter the scores decide the batch: shared at once.

`trainer.rollout_lag=1` (one-step-off; the rollout on GPUs the actor does not hold, checked at plan time):
step k generates batch k+1 with the weights before update k (`generate_local`), consumes batch k (landed in
step k-1: `ready`), then lands batch k+1 (`produce`) and syncs w_k. docs/rollout_lag.md gives the order of
every collective and why it cannot deadlock. The landed batch is in the checkpoint (`state_dict`).

The RL step itself (what `consume` runs, and the parity gate) is hybridflow.trainer.rl_step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hybridflow.algorithms import Algorithm, KLController
from hybridflow.config import ExperimentConfig
from hybridflow.config.data import TRIM_MULTIPLE
from hybridflow.data.step_batch import StepBatch
from hybridflow.placement import RoleMesh
from hybridflow.role_records import Role
from hybridflow.roles.groups import TrainingGroup
from hybridflow.roles.model_role import ModelRole
from hybridflow.roles.rollout_role import RolloutRole
from hybridflow.token_kinds import observation_share
from hybridflow.trainer.device_memory import device_memory_gib
from hybridflow.trainer.dynamic_sampling import fill_batch
from hybridflow.trainer.rl_step import RLStep, StageTimer
from hybridflow.trainer.scorer import Scorer


@dataclass
class RLTrainer(RLStep):
    cfg: ExperimentConfig
    roles: dict[str, ModelRole]  # the model roles this rank holds (actor, critic, ref, reward)
    meshes: dict[str, RoleMesh]  # every enabled role's mesh (also for roles this rank does not hold)
    rollout: RolloutRole
    scorer: Scorer
    kl_ctl: KLController
    algorithm: Algorithm
    device: torch.device
    training: TrainingGroup
    ready: StepBatch | None = None  # lag 1: the batch landed in the last step, consumed by the next
    sampling_metrics: dict[str, float] = field(default_factory=dict)  # dynamic sampling's, last produce
    last_batch: StepBatch | None = None  # the batch the last step trained on (sample logging reads it)
    steps_done: int = 0  # RL steps trained so far (a resumed run sets it): the parity gate's cadence counts them
    # lag 0: this rank's part of the batch's scores (scorer.local), shared by land_scores where first read
    unshared_scores: torch.Tensor | None = None

    # ---- one step -------------------------------------------------------------------------------
    def step(self, prompts: StepBatch, draw: Callable[[], StepBatch] | None = None) -> dict[str, float]:
        """Train on `prompts` (lag 0), or on the batch landed last step while `prompts` generate (lag 1);
        `draw` gives more prompts when a batch filter wants them."""
        timer = StageTimer()
        metrics: dict[str, float] = {}
        with timer("generate"):  # the rollout ranks only; nobody waits for it
            generating = self.rollout.generate_local(prompts, self.reads_rollout_logprobs(self.steps_done + self.lag))
        engine_s = timer.seconds["generate"]
        if self.lag:
            batch = self.ready  # generated during the last step, by the weights before its update
        else:
            batch = self.produce(prompts, generating, timer, "generate", draw, defer_scores=True)
        self.last_batch = batch
        metrics = self.consume(batch, timer) if self.training.member else {}
        self.land_scores(batch)  # outside the training group: the first read is the metrics below
        if self.lag:
            self.ready = self.produce(prompts, generating, timer, "wait_rollout", draw)
        metrics |= self.sampling_metrics  # the batch filter's figures of the batch produced in this step
        metrics |= self.rollout.turn_metrics  # multi-turn: turns/*, tools/* of the last batch shared (filter: drawn)
        with timer("sync"):
            self.rollout.sync(self.roles.get(Role.ACTOR))
        self.steps_done += 1
        if self.rollout.engine is not None:
            metrics["rollout/generate_s"] = engine_s
        metrics |= self.rollout.memory  # sleep/wake figures of this rank's engine (empty off the rollout)
        return self._step_metrics(batch, metrics, timer)

    def prime(self, prompts: StepBatch, draw: Callable[[], StepBatch] | None = None) -> None:
        """Lag 1, before the first step: generate and land its batch with the current weights."""
        generating = self.rollout.generate_local(prompts, self.reads_rollout_logprobs(self.steps_done))
        self.ready = self.produce(prompts, generating, StageTimer(), "generate", draw)

    def reads_rollout_logprobs(self, step: int) -> bool:
        """Whether the batch trained on at `step` needs the rollout's log-probs (the gate, truncated IS, pi_old)."""
        return bool(self.algorithm.tis_cap) or self.parity_due(step) or self.cfg.algorithm.old_logprobs == Role.ROLLOUT

    def produce(self, prompts: StepBatch, generating: tuple, timer: StageTimer, stage: str,
                draw: Callable[[], StepBatch] | None = None, defer_scores: bool = False) -> StepBatch:
        """The generated + scored batch: samples landed on every rank (collective over the world), trimmed,
        scored, and, with a batch filter, its dropped groups replaced by newly drawn ones
        (trainer/dynamic_sampling.py; every rank decides the same from the shared scores). `defer_scores`
        (lag 0, no batch filter): the scores stay on their ranks until `land_scores`."""
        with timer(stage):
            self.rollout.share(prompts, generating)
            prompts.trim_columns(TRIM_MULTIPLE, self.cfg.data.seq_length)
        with timer("reward"):
            local = self.scorer.local(prompts)
            if defer_scores and self.algorithm.group_filter is None:
                self.unshared_scores = local
                return prompts
            prompts.scores = self.scorer.share(local, prompts)
        if self.algorithm.group_filter is None:
            return prompts
        if draw is None:
            raise ValueError("RLTrainer.step: a batch filter needs `draw` to fetch more prompts")

        def generated_and_scored() -> StepBatch:
            more = draw()
            self.rollout.generate(more, generating.with_logprobs)  # as the batch it joins
            more.trim_columns(TRIM_MULTIPLE, self.cfg.data.seq_length)
            more.scores = self.scorer.share(self.scorer.local(more), more)
            return more

        with timer("dynamic_sampling"):
            batch, self.sampling_metrics = fill_batch(prompts, generated_and_scored, self.algorithm.group_filter)
        return batch

    # ---- checkpoint state -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the trainer beyond the roles' weights: the RL steps trained, the KL
        controller, the rollout's sampling step, and at lag 1 the batch landed but not yet trained on (the
        weights that generated it are gone after the update, so a resumed run could not regenerate it)."""
        return {"step": self.steps_done, "kl": self.kl_ctl.state_dict(), "rollout_step": self.rollout.step,
                "ready": self.ready}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state` (`state_dict` of the run that wrote the checkpoint)."""
        self.steps_done = state["step"]
        self.kl_ctl.load_state_dict(state["kl"])
        self.rollout.step = state["rollout_step"]
        self.ready = state.get("ready")

    # ---- metrics --------------------------------------------------------------------------------
    def _step_metrics(self, batch, metrics, timer) -> dict[str, float]:
        lengths = batch.loss_mask.float().sum(1)  # the tokens the policy wrote
        tokens = float(batch.seq_lens.sum())
        step_time = sum(timer.seconds.values())
        world = dist.get_world_size()
        out = {
            "reward/mean": float(batch.scores.mean()), "reward/std": float(batch.scores.std()),
            "response_length": float(lengths.mean()),
            "observation_token_share": observation_share(batch.token_kinds),
            "prompt_length": float(batch.prompt_lens.float().mean()),
            "tokens_per_s": tokens / step_time, "tokens_per_s_per_gpu": tokens / step_time / world,
            "step_time_s": step_time, **_from_every_rank(metrics),
            **{f"time/{k}": v for k, v in timer.seconds.items()},
        }
        return out | device_memory_gib()


def _from_every_rank(role_metrics: dict[str, float]) -> dict[str, float]:
    """The role metrics of every rank, merged: in a split placement the rank that logs (global rank 0) does
    not hold every role, and each role's ranks already agree on its figures (DP-averaged)."""
    parts: list[dict[str, float] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, role_metrics)
    merged: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            merged.setdefault(key, value)
    return dict(sorted(merged.items()))
