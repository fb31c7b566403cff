"""The RL step, top to bottom: generate -> reward -> [batch filter: drop groups, generate more] -> ref ->
values -> advantages -> update critic -> update actor -> sync weights to the rollout. Every rank runs it; each
stage runs on the ranks of its role and ends with its results shared to every rank (`share`), so roles on
disjoint ranks work concurrently.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hybridflow.algorithms import (
    ActorLossConfig,
    Algorithm,
    CriticLossConfig,
    actor_loss,
    critic_loss,
    kl_estimator,
    kl_penalized_rewards,
    last_token_scores,
    loss_agg,
    masked_mean,
    sft_loss,
)
from hybridflow.config import ExperimentConfig
from hybridflow.data.packing import as_rows
from hybridflow.roles.exchange import share_from_role
from hybridflow.roles.model_role import ModelRole, per_token_logprobs, per_token_values
from hybridflow.trainer.batch import StepBatch
from hybridflow.trainer.dynamic_sampling import fill_batch
from hybridflow.trainer.rewarding import Scorer
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
        yield
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - start


# Training width is rounded up to this many columns: divisible by any TP degree (sequence parallelism
# splits the sequence over TP) and a friendly size for the kernels.
TRIM_MULTIPLE = 64


@dataclass
class RLTrainer:
    cfg: ExperimentConfig
    roles: dict[str, ModelRole]  # the model roles this rank holds (actor, critic, ref, reward)
    meshes: dict  # every enabled role's RoleMesh (also for roles this rank does not hold)
    rollout: object  # hybridflow.roles.rollout_role.RolloutRole
    scorer: Scorer
    kl_ctl: object
    algorithm: Algorithm
    device: torch.device

    # ---- one step -------------------------------------------------------------------------------
    def step(self, batch: StepBatch, draw: Callable[[], StepBatch] | None = None) -> dict[str, float]:
        """One RL step on `batch`'s prompts; `draw` gives the next prompts when a batch filter wants more."""
        timer = StageTimer()
        metrics: dict[str, float] = {}
        with timer("generate"):
            self._generate(batch)
        with timer("reward"):
            scores = self.scorer.local(batch)
        if self.algorithm.group_filter is not None:
            with timer("dynamic_sampling"):
                batch, sampling = self._filled(batch, scores, draw)
            metrics |= sampling
        temperature = self.cfg.rollout.temperature or 1.0
        with timer("ref"):
            ref = self._infer("ref", batch, lambda r: per_token_logprobs(r, temperature))
        with timer("values"):
            values = self._infer("critic", batch, lambda r: per_token_values)
        with timer("old_logprobs"):
            old = self._infer("actor", batch, lambda r: per_token_logprobs(r, temperature))
        with timer("exchange"):
            if batch.scores is None:  # already shared when a batch filter needed them
                batch.scores = self.scorer.share(scores, batch)
            batch.old_logprobs = self.share("actor", old, batch)
            batch.ref_logprobs = self.share("ref", ref, batch) if "ref" in self.meshes else None
            batch.values = self.share("critic", values, batch) if "critic" in self.meshes else None
        parity = self.parity(batch)
        with timer("advantages"):
            kl = self.assign_rewards(batch)
            adv = self.algorithm.estimator(batch.token_rewards, batch.response_mask, batch.values)
            batch.advantages, batch.returns = adv.advantages, adv.returns
        with timer("update_critic"):
            if "critic" in self.roles:
                metrics |= self._update("critic", batch, self._critic_loss, ("values", "returns"))
        with timer("update_actor"):
            if "actor" in self.roles:
                metrics |= self._update("actor", batch, self._actor_loss(temperature),
                                        ("old_logprobs", "advantages") + (("ref_logprobs",) if self._kl_loss else ()))
        with timer("sync"):
            self.rollout.sync(self.roles.get("actor"))
        metrics |= self.rollout.memory  # sleep/wake figures of this rank's engine (empty off the rollout)
        self.kl_ctl.update(kl, batch.size)
        return self._step_metrics(batch, metrics, parity, kl, timer)

    @property
    def _kl_loss(self) -> bool:
        return "ref" in self.meshes and not self.cfg.algorithm.kl_in_reward and self.cfg.algorithm.kl_coef > 0

    # ---- stages ---------------------------------------------------------------------------------
    def _generate(self, batch: StepBatch) -> None:
        self.rollout.generate(batch)
        batch.trim_columns(TRIM_MULTIPLE, self.cfg.data.seq_length)

    def _filled(self, batch: StepBatch, scores: torch.Tensor | None,
                draw: Callable[[], StepBatch] | None) -> tuple[StepBatch, dict[str, float]]:
        """The generated, scored batch with the filter's dropped groups replaced by newly drawn ones
        (trainer/dynamic_sampling.py). The filter needs every score on every rank, so the scores are
        shared here rather than after the other roles' inference."""
        if draw is None:
            raise ValueError("RLTrainer.step: a batch filter needs `draw` to fetch more prompts")

        def generated_and_scored() -> StepBatch:
            more = draw()
            self._generate(more)
            more.scores = self.scorer.share(self.scorer.local(more), more)
            return more

        batch.scores = self.scorer.share(scores, batch)
        return fill_batch(batch, generated_and_scored, self.algorithm.group_filter)

    def _infer(self, role: str, batch: StepBatch, per_token) -> torch.Tensor | None:
        if role not in self.roles:
            return None
        r = self.roles[role]
        return r.forward(batch.tensors(rows=r.local_rows(batch.size)), per_token(r))

    def share(self, role: str, local: torch.Tensor | None, batch: StepBatch) -> torch.Tensor:
        return share_from_role(local, self.meshes[role], batch.size, tuple(batch.tokens.shape[1:]),
                               torch.float32, self.device).cpu()

    def parity(self, batch: StepBatch) -> dict[str, float]:
        """Compare the rollout's log-probs of its samples with the actor's recomputation; fail loudly."""
        mask = batch.response_mask.bool()
        diff = (batch.rollout_logprobs - batch.old_logprobs).abs()[mask]
        out = {"parity/max_abs": float(diff.max()) if diff.numel() else 0.0,
               "parity/mean_abs": float(diff.mean()) if diff.numel() else 0.0}
        if out["parity/max_abs"] > self.cfg.trainer.parity_max_abs:
            raise ParityError(
                f"trainer.parity_max_abs: rollout vs actor log-prob max abs diff {out['parity/max_abs']:.3g} > "
                f"{self.cfg.trainer.parity_max_abs:g} (mean {out['parity/mean_abs']:.3g}); the engines disagree "
                "(weights out of sync, or dtype); raise the threshold for bf16 engines"
            )
        return out

    def assign_rewards(self, batch: StepBatch) -> float:
        """Token rewards from the scores (and the KL penalty when it lives in the reward); returns mean KL."""
        mask = batch.response_mask
        shaping = self.algorithm.shaping
        scores = batch.scores if shaping is None else shaping(batch.scores, mask)  # metrics keep the raw ones
        if batch.ref_logprobs is None:
            batch.token_rewards = last_token_scores(scores, mask)
            return 0.0
        if self.cfg.algorithm.kl_in_reward:
            batch.token_rewards, kl = kl_penalized_rewards(
                scores, batch.old_logprobs, batch.ref_logprobs, mask, self.kl_ctl.value,
                kl_estimator(self.cfg.algorithm.kl_estimator))
        else:
            batch.token_rewards = last_token_scores(scores, mask)
            kl = batch.old_logprobs - batch.ref_logprobs
        return float(masked_mean(kl, mask))

    def _update(self, role: str, batch: StepBatch, loss_fn, fields: tuple[str, ...]) -> dict[str, float]:
        """PPO epochs x mini-batches; each mini-batch is split over the role's DP replicas."""
        r, alg = self.roles[role], self.cfg.algorithm
        collected: dict[str, list[float]] = {}
        for _ in range(alg.ppo_epochs):
            for start in range(0, batch.size, alg.mini_batch_size):
                mine = r.local_rows(alg.mini_batch_size)  # this replica's share of the mini-batch
                rows = slice(start + mine.start, start + mine.stop)
                tensors = batch.tensors("response_mask", *fields, rows=rows)
                micro = r.micro_batches(tensors)
                scale = self._loss_scale(r, tensors["response_mask"], len(micro))
                for k, v in r.train(micro, lambda out, mb, s=scale: loss_fn(out, mb, s)).items():
                    collected.setdefault(f"{role}/{k}", []).append(v)
        return {k: sum(v) / len(v) for k, v in collected.items()}

    def _actor_loss(self, temperature: float):
        alg, actor = self.cfg.algorithm, self.roles["actor"]
        cfg = ActorLossConfig(policy=self.algorithm.policy_loss, entropy_coef=alg.entropy_coef,
                              kl_loss_coef=alg.kl_coef if self._kl_loss else 0.0,
                              kl_loss_estimator=alg.kl_loss_estimator)

        def fn(logits, mb, scale):
            logp, ent = actor.logprobs(logits, mb["input_ids"], temperature, with_entropy=True)
            out = actor_loss(logp, mb["old_logprobs"], mb["advantages"], mb["response_mask"], cfg,
                             entropy=ent, ref_logprobs=mb.get("ref_logprobs"))
            return self._aggregate(out, mb, scale)

        return fn

    def _critic_loss(self, values, mb, scale):
        cfg = CriticLossConfig(cliprange_value=self.cfg.algorithm.cliprange_value)
        v = per_token_values(values, mb)
        return self._aggregate(critic_loss(v, mb["values"], mb["returns"], mb["response_mask"], cfg), mb, scale)

    def _loss_scale(self, role, mask: torch.Tensor, n_micro: int) -> float:
        """loss_agg.micro_batch_scale for this mini-batch: the count is summed over the role's DP replicas."""
        count = loss_agg.local_count(mask, self.cfg.algorithm.loss_agg_mode).to(compute_device())
        dist.all_reduce(count, group=role.groups.dp)
        return loss_agg.micro_batch_scale(n_micro, role.mesh.dp, float(count))

    def _aggregate(self, out, mb, scale: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The micro-batch loss megatron's schedule gets; metrics stay token sums plus the token count.
        A packed micro-batch's per-token loss goes back to rows first (per-sequence modes sum per row)."""
        mode = self.cfg.algorithm.loss_agg_mode
        loss = loss_agg.numerator(as_rows(out.token_loss, mb), as_rows(out.mask, mb), mode) * scale
        return loss, {**out.metrics, "num_tokens": out.num_tokens.float()}

    def warmup(self, tensors: dict[str, torch.Tensor]) -> dict[str, float]:
        """One supervised step on the actor (prompt + answer tokens, loss on the answer)."""
        actor = self.roles["actor"]

        def fn(logits, mb):
            return _mean_loss(sft_loss(actor.logprobs(logits, mb["input_ids"]), mb["loss_mask"]))

        rows = actor.local_rows(tensors["input_ids"].shape[0])
        return actor.train(actor.micro_batches({k: v[rows] for k, v in tensors.items()}), fn)

    # ---- metrics --------------------------------------------------------------------------------
    def _step_metrics(self, batch, metrics, parity, kl, timer) -> dict[str, float]:
        mask = batch.response_mask.float()
        lengths = mask.sum(1)
        tokens = float((batch.prompt_lens + lengths).sum())
        step_time = sum(timer.seconds.values())
        world = dist.get_world_size()
        out = {
            "reward/mean": float(batch.scores.mean()), "reward/std": float(batch.scores.std()),
            "kl": kl, "kl_coef": float(self.kl_ctl.value), "response_length": float(lengths.mean()),
            "prompt_length": float(batch.prompt_lens.float().mean()),
            "tokens_per_s": tokens / step_time, "tokens_per_s_per_gpu": tokens / step_time / world,
            "step_time_s": step_time, **parity, **_from_every_rank(metrics),
            **{f"time/{k}": v for k, v in timer.seconds.items()},
        }
        if torch.cuda.is_available():
            out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        return out


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


def _mean_loss(out) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """megatron's schedule wants a per-micro-batch mean; metrics stay token sums plus the token count."""
    tokens = out.num_tokens.clamp(min=1)
    return out.loss_sum / tokens, {**out.metrics, "num_tokens": out.num_tokens.float()}
