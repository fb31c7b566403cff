"""The RL step on one generated, scored batch, top to bottom (`RLStep.consume`): reference log-probs, values
and old log-probs (each on its role's ranks, concurrently where the roles hold different ranks), their exchange
over the training group, the parity gate, rewards and advantages, the critic update, the actor update. Every
stage is timed. hybridflow.trainer.rl_trainer decides when a batch is generated and consumed (the schedule);
the step reads only the batch and the roles. Its collectives are the training group's, and the scores' share
(`land_scores`, over the world), which ranks outside the group join from the schedule.

Off-policy correction: PPO's ratio is against the actor's old log-probs (w_{k-1}, before the update);
`algorithm.tis_cap` > 0 also weights each token's policy loss by min(pi_old / pi_rollout, cap)
(hybridflow.algorithms.losses.truncated_is). The parity gate compares the rollout's log-probs with the actor's and
needs both from the same weights: it holds at lag 0; at lag 1 the gap is the one-update drift, reported as
`offpolicy/*` and not gated. It runs on steps 0, N, 2N, ... (`trainer.parity_every` = N, 0 = never), and the
rollout returns log-probs only for the batches something reads them from (those steps, or every step with
truncated IS): vLLM computes them at a cost, and a step without them never compares against zeros.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from hybridflow.algorithms import (
    ActorLossConfig,
    Algorithm,
    CriticLossConfig,
    KLController,
    actor_loss,
    critic_loss,
    kl_penalized_rewards,
    last_token_scores,
    loss_agg,
    sequence_kl,
    sft_loss,
)
from hybridflow.algorithms.losses.truncated_is import truncated_is_weights
from hybridflow.config import ExperimentConfig
from hybridflow.data.packing import as_rows, row_layout
from hybridflow.data.step_batch import StepBatch
from hybridflow.placement import RoleMesh
from hybridflow.role_records import Role
from hybridflow.roles.groups import TrainingGroup
from hybridflow.roles.model_role import ModelRole, per_token_logprobs, per_token_values
from hybridflow.roles.replica_results import share_from_role
from hybridflow.trainer.scorer import Scorer
from megatron_adapters.cpu_backend import compute_device


class ParityError(RuntimeError):
    """The rollout's log-probs disagree with the actor's beyond `trainer.parity_max_abs`."""


class StageTimer:
    """Wall time per stage on this rank (CUDA work is synchronised at each boundary)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        with torch.profiler.record_function(f"stage/{stage}"):  # a profiled step's ranges (trainer/profiling.py)
            yield
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start


class RLStep:
    """The stages of one RL step. RLTrainer (hybridflow.trainer.rl_trainer) is one: these read the fields it
    declares and documents, named here for the type checker."""

    cfg: ExperimentConfig
    roles: dict[str, ModelRole]
    meshes: dict[str, RoleMesh]
    scorer: Scorer
    kl_ctl: KLController
    algorithm: Algorithm
    device: torch.device
    training: TrainingGroup
    steps_done: int
    unshared_scores: torch.Tensor | None

    def consume(self, batch: StepBatch, timer: StageTimer) -> dict[str, float]:
        """Everything after scoring up to the updates, on the training group; this rank's role metrics, the
        KL per response and the parity (lag 0) or off-policy (lag 1) figures."""
        temperature = self.cfg.rollout.temperature or 1.0
        with timer("ref"):
            ref = self._infer(Role.REF, batch, lambda r: per_token_logprobs(r, temperature))
        with timer("values"):
            values = self._infer(Role.CRITIC, batch, lambda r: per_token_values)
        recompute = self.recomputes_old_logprobs(batch)
        with timer("old_logprobs"):
            old = self._infer(Role.ACTOR, batch, lambda r: per_token_logprobs(r, temperature)) if recompute else None
        with timer("exchange"):
            batch.old_logprobs = self.share(Role.ACTOR, old, batch) if recompute else batch.rollout_logprobs.clone()
            batch.ref_logprobs = self.share(Role.REF, ref, batch) if Role.REF in self.meshes else None
            batch.values = self.share(Role.CRITIC, values, batch) if Role.CRITIC in self.meshes else None
            self.land_scores(batch)
        metrics = self.gate(batch)
        with timer("advantages"):
            kl = self.assign_rewards(batch)
            adv = self.algorithm.estimator(batch.token_rewards, batch.loss_mask, batch.values)
            batch.advantages, batch.returns = adv.advantages, adv.returns
            if self.algorithm.tis_cap:
                _require_rollout_logprobs(batch, "algorithm.tis_cap")
                batch.is_weights = truncated_is_weights(batch.old_logprobs, batch.rollout_logprobs,
                                                        self.algorithm.tis_cap)
        with timer("update_critic"):
            if Role.CRITIC in self.roles:
                metrics |= self._update(Role.CRITIC, batch, self._critic_loss, ("values", "returns"))
        with timer("update_actor"):
            if Role.ACTOR in self.roles:
                metrics |= self._update(Role.ACTOR, batch, self._actor_loss(temperature), self._actor_fields())
        self.kl_ctl.update(kl, batch.size)
        return metrics | {"kl": kl, "kl_coef": float(self.kl_ctl.value)}

    def recomputes_old_logprobs(self, batch: StepBatch) -> bool:
        """Whether the actor recomputes pi_old for `batch` (algorithm.old_logprobs); the same on every rank (the
        step count and the shared batch decide). A batch without the rollout's log-probs (at lag 1, the one a
        checkpoint held from before a change of setting) is recomputed."""
        return (self.cfg.algorithm.old_logprobs == Role.ACTOR or batch.rollout_logprobs is None
                or self.parity_due(self.steps_done))

    def land_scores(self, batch: StepBatch) -> None:
        """Share the scores `produce` left on their ranks (a no-op once shared); collective over the world."""
        if batch.scores is None:
            batch.scores = self.scorer.share(self.unshared_scores, batch)
            self.unshared_scores = None

    @property
    def lag(self) -> int:
        return self.cfg.trainer.rollout_lag

    def parity_due(self, step: int) -> bool:
        """Whether the parity gate (off-policy figures at lag 1) runs at RL step `step` (0-based)."""
        every = self.cfg.trainer.parity_every
        return bool(every) and step % every == 0

    @property
    def _kl_loss(self) -> bool:
        return Role.REF in self.meshes and self.algorithm.reward_kl is None and self.cfg.algorithm.kl_coef > 0

    # ---- stages ---------------------------------------------------------------------------------
    def _infer(self, role: str, batch: StepBatch, per_token) -> torch.Tensor | None:
        if role not in self.roles:
            return None
        r = self.roles[role]
        # the loss mask lets an LM head run at the tokens a loss reads only (ModelRole.logits_at_loss_tokens)
        return r.forward(batch.tensors("loss_mask", rows=r.local_rows(batch.size)), per_token(r))

    def share(self, role: str, local: torch.Tensor | None, batch: StepBatch) -> torch.Tensor:
        """The role's per-token results on every rank of the training group."""
        return share_from_role(local, self.meshes[role], batch.size, tuple(batch.tokens.shape[1:]),
                               torch.float32, self.device, group=self.training.group).cpu()

    def gate(self, batch: StepBatch) -> dict[str, float]:
        """The parity figures (and gate) of this step's batch on the steps `trainer.parity_every` picks."""
        # At lag 1 the first batch after a resume was generated before it, under the cadence then (the
        # checkpoint holds it); any other batch lacking log-probs it asked for, generate_local refused.
        restored_without = self.lag and batch.rollout_logprobs is None
        return self.parity(batch) if self.parity_due(self.steps_done) and not restored_without else {}

    def parity(self, batch: StepBatch) -> dict[str, float]:
        """Compare the rollout's log-probs of the tokens it sampled (every assistant token of every turn) with
        the actor's recomputation; fail loudly at lag 0 (at lag 1 they come from weights one update apart:
        `offpolicy/*`, not gated)."""
        _require_rollout_logprobs(batch, "trainer.parity_every")
        mask = batch.loss_mask.bool()
        diff = (batch.rollout_logprobs - batch.old_logprobs).abs()[mask]
        prefix = "offpolicy" if self.lag else "parity"
        out = {f"{prefix}/max_abs": float(diff.max()) if diff.numel() else 0.0,
               f"{prefix}/mean_abs": float(diff.mean()) if diff.numel() else 0.0}
        if not self.lag and out["parity/max_abs"] > self.cfg.trainer.parity_max_abs:
            raise ParityError(
                f"trainer.parity_max_abs: rollout vs actor log-prob max abs diff {out['parity/max_abs']:.3g} > "
                f"{self.cfg.trainer.parity_max_abs:g} (mean {out['parity/mean_abs']:.3g}); the engines disagree "
                "(weights out of sync, or dtype); raise the threshold for bf16 engines"
            )
        return out

    def assign_rewards(self, batch: StepBatch) -> float:
        """Token rewards from the scores (and the KL penalty when it lives in the reward); returns the KL per
        response (`sequence_kl`) that the controller steers."""
        mask = batch.loss_mask
        shaping = self.algorithm.shaping
        scores = batch.scores if shaping is None else shaping(batch.scores, mask)  # metrics keep the raw ones
        if batch.ref_logprobs is None:
            batch.token_rewards = last_token_scores(scores, mask)
            return 0.0
        if self.algorithm.reward_kl is not None:
            batch.token_rewards, kl = kl_penalized_rewards(
                scores, batch.old_logprobs, batch.ref_logprobs, mask, self.kl_ctl.value, self.algorithm.reward_kl)
        else:
            batch.token_rewards = last_token_scores(scores, mask)
            kl = batch.old_logprobs - batch.ref_logprobs
        return float(sequence_kl(kl, mask))

    def _update(self, role: str, batch: StepBatch, loss_fn, fields: tuple[str, ...]) -> dict[str, float]:
        """PPO epochs x mini-batches; each mini-batch is split over the role's DP replicas."""
        r, alg = self.roles[role], self.cfg.algorithm
        collected: dict[str, list[float]] = {}
        for epoch in range(alg.ppo_epochs):
            order = self.sample_order(batch.size, epoch)
            for start in range(0, batch.size, alg.mini_batch_size):
                mine = r.local_rows(alg.mini_batch_size)  # this replica's share of the mini-batch
                rows = slice(start + mine.start, start + mine.stop)
                tensors = batch.tensors("loss_mask", *fields, rows=rows if order is None else order[rows])
                micro = r.micro_batches(tensors)
                scale = self._loss_scale(r, tensors["loss_mask"], len(micro))
                for k, v in r.train(micro, lambda out, mb, s=scale: loss_fn(out, mb, s)).items():
                    collected.setdefault(f"{role}/{k}", []).append(v)
        return {k: sum(v) / len(v) for k, v in collected.items()}

    def sample_order(self, size: int, epoch: int) -> torch.Tensor | None:
        """The order mini-batches are cut from this step's `size` samples in PPO epoch `epoch`: None = batch
        order, else (algorithm.shuffle_mini_batches) a permutation from trainer.seed, the step and the epoch, the
        same on every rank and in a run resumed with the same trainer.seed."""
        if not self.cfg.algorithm.shuffle_mini_batches:
            return None
        seed = (self.cfg.trainer.seed * 1_000_003 + self.steps_done * 1_009 + epoch) % 2**62
        return torch.randperm(size, generator=torch.Generator().manual_seed(seed))

    def _actor_fields(self) -> tuple[str, ...]:
        return ("old_logprobs", "advantages") + (("ref_logprobs",) if self._kl_loss else ()) \
            + (("is_weights",) if self.algorithm.tis_cap else ())

    def _actor_loss(self, temperature: float):
        alg, actor = self.cfg.algorithm, self.roles[Role.ACTOR]
        cfg = ActorLossConfig(policy=self.algorithm.policy_loss, entropy_coef=alg.entropy_coef,
                              # the controller's coefficient: an adaptive one moves it (the config's is its start)
                              kl_loss_coef=float(self.kl_ctl.value) if self._kl_loss else 0.0,
                              kl_loss_estimator=alg.kl_loss_estimator)

        def fn(logits, mb, scale):
            logp, ent = actor.logprobs(logits, mb["input_ids"], temperature, with_entropy=True,
                                       positions=mb.get("logit_positions"))
            # A packed micro-batch goes back to one row per sample first: a sequence-level loss (GSPO's ratio,
            # the per-sequence aggregation modes) takes each sample's own tokens, not the whole pack's.
            layout = row_layout(mb)
            rows = {k: as_rows(mb[k], mb, layout=layout) for k in (*self._actor_fields(), "loss_mask")}
            out = actor_loss(as_rows(logp, mb, layout=layout), rows["old_logprobs"], rows["advantages"],
                             rows["loss_mask"], cfg, entropy=as_rows(ent, mb, layout=layout),
                             ref_logprobs=rows.get("ref_logprobs"), is_weights=rows.get("is_weights"))
            return self._aggregate(out, scale)

        return fn

    def _critic_loss(self, values, mb, scale):
        cfg = CriticLossConfig(cliprange_value=self.cfg.algorithm.cliprange_value)
        layout = row_layout(mb)
        v, old, returns, mask = (as_rows(x, mb, layout=layout)
                                 for x in (per_token_values(values, mb), mb["values"], mb["returns"], mb["loss_mask"]))
        return self._aggregate(critic_loss(v, old, returns, mask, cfg), scale)

    def _loss_scale(self, role, mask: torch.Tensor, n_micro: int) -> float:
        """loss_agg.micro_batch_scale for this mini-batch: the count is summed over the role's DP replicas."""
        count = loss_agg.local_count(mask, self.cfg.algorithm.loss_agg_mode).to(compute_device())
        dist.all_reduce(count, group=role.groups.dp)
        return loss_agg.micro_batch_scale(n_micro, role.mesh.dp, float(count))

    def _aggregate(self, out, scale: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch loss megatron's schedule gets (from one row per sample: per-sequence modes sum per
        row); metrics stay token sums plus the token count."""
        mode = self.cfg.algorithm.loss_agg_mode
        loss = loss_agg.numerator(out.token_loss, out.mask, mode) * scale
        return loss, {**out.metrics, "num_tokens": out.num_tokens.float()}

    def warmup(self, tensors: dict[str, torch.Tensor]) -> dict[str, float]:
        """One supervised step on the actor (prompt + answer tokens, loss on the answer)."""
        actor = self.roles[Role.ACTOR]

        def fn(logits, mb):
            logp = actor.logprobs(logits, mb["input_ids"], positions=mb.get("logit_positions"))
            return _mean_loss(sft_loss(logp, mb["loss_mask"]))

        rows = actor.local_rows(tensors["input_ids"].shape[0])
        return actor.train(actor.micro_batches({k: v[rows] for k, v in tensors.items()}), fn)


def _require_rollout_logprobs(batch: StepBatch, reader: str) -> None:
    """Reading the rollout's log-probs of a batch generated without them: fail, never read zeros."""
    if batch.rollout_logprobs is None:
        raise RuntimeError(f"{reader}: the batch was generated without the rollout's log-probs "
                           "(RLTrainer.reads_rollout_logprobs decides which batches get them)")


def _mean_loss(out) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """megatron's schedule wants a per-micro-batch mean; metrics stay token sums plus the token count."""
    tokens = out.num_tokens.clamp(min=1)
    return out.loss_sum / tokens, {**out.metrics, "num_tokens": out.num_tokens.float()}
