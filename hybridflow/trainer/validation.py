"""Validation during training: generate on held-out prompts (greedy by default) and score them with the
step's own reward, logged as `val/*` metrics.

Every rank calls `Validator.run` at the same points, because it goes through the same collectives as the RL
step: the rollout role's generate (which shares tokens with every rank) and the scorer's share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from hybridflow.config import ExperimentConfig
from hybridflow.data import collate_prompts, fit_prompts, load_prompt_dataset
from hybridflow.data.chat import render_chat_rows
from hybridflow.data.prompts import PromptDataset
from hybridflow.data.step_batch import StepBatch
from hybridflow.data.tasks import builtin_task, held_out_rows, is_builtin
from hybridflow.errors import UserError
from hybridflow.role_records import Role
from hybridflow.rollout.turns import turn_metrics
from hybridflow.tools import environment_tools

NUM_BUILTIN_TRAIN = 8192  # load_prompt_dataset's default size of a built-in training set


def validation_set(cfg: ExperimentConfig, tokenizer) -> tuple[PromptDataset, int]:
    """`data.val_size` rows of `data.val_source`, or of a held-out split of the built-in training task, less
    those longer than `data.max_prompt_length` (per `data.overlong_prompts`); and how many were dropped."""
    d = cfg.data
    if d.val_source:
        dataset = load_prompt_dataset(d.val_source, d.prompt_key, seed=cfg.trainer.seed, field="data.val_source")
    elif is_builtin(d.source):
        rows = held_out_rows(builtin_task(d.source), d.val_size, cfg.trainer.seed, NUM_BUILTIN_TRAIN)
        dataset = PromptDataset(rows, "prompt")
    else:
        raise UserError(
            f"data.val_source: validation is on but data.source={d.source!r} is a file with no held-out split; "
            "set data.val_source to a .jsonl/.parquet of validation prompts, or trainer.val_every=0 and "
            "trainer.val_before_train=false"
        )
    dataset = PromptDataset(render_chat_rows(dataset.rows[: d.val_size], dataset.prompt_key, tokenizer,
                                             environment_tools(cfg.rollout.environment)), dataset.prompt_key)
    source = f"data.val_source={d.val_source}" if d.val_source else f"the held-out split of {d.source}"
    return fit_prompts(dataset, tokenizer, d.max_prompt_length, d.overlong_prompts, source)


def validation_wanted(cfg: ExperimentConfig) -> bool:
    """`trainer.val_every` or `trainer.val_before_train` asks for validation."""
    return bool(cfg.trainer.val_every or cfg.trainer.val_before_train)


@dataclass
class Validator:
    rows: list[dict[str, Any]]
    prompt_key: str
    tokenizer: Any
    cfg: ExperimentConfig
    first_batch: StepBatch | None = None  # the last run's first chunk, generated and scored (sample logging)

    @classmethod
    def build(cls, cfg: ExperimentConfig, tokenizer) -> Validator | None:
        """None when neither `trainer.val_every` nor `trainer.val_before_train` asks for validation."""
        if not validation_wanted(cfg):
            return None
        dataset, _ = validation_set(cfg, tokenizer)
        return cls(dataset.rows, dataset.prompt_key, tokenizer, cfg)

    def due(self, step: int) -> bool:
        """After every `val_every`-th RL step and after the last one."""
        every = self.cfg.trainer.val_every
        return bool(every) and (step % every == 0 or step == self.cfg.trainer.total_steps)

    def run(self, trainer) -> dict[str, float]:
        """`val/reward_mean` and `val/accuracy` (share of responses with full reward, >= 1) over the rows; with
        `rollout.environment`, the turn and tool metrics of the held-out trajectories too (`val/turns/*`,
        `val/tools/*`: how often the policy calls its tools, unsampled)."""
        rollout, cfg = trainer.rollout, self.cfg
        # The training sampler's settings and step counter are put back, so a run's RL samples are the same
        # with validation on or off (and a resumed run matches an uninterrupted one).
        saved_sampling, saved_step = rollout.sampling, rollout.step
        rollout.sampling = replace(saved_sampling, temperature=cfg.trainer.val_temperature)
        chunk = cfg.data.train_batch_size * cfg.rollout.n_samples_per_prompt
        # Every replica of a role takes an equal share of a batch (as a training batch, whose size the config
        # checks): a chunk is padded with copies of its rows to a multiple of every role's DP size, and the copies'
        # results are dropped.
        multiple = math.lcm(*(mesh.dp for mesh in trainer.meshes.values()))
        scores, turn_stats = [], []
        try:
            for start in range(0, len(self.rows), chunk):
                real = self.rows[start : start + chunk]
                rows = real + [real[i % len(real)] for i in range(-len(real) % multiple)]
                prompts = collate_prompts(self.tokenizer, [r[self.prompt_key] for r in rows],
                                          cfg.data.max_prompt_length, rows, total_len=cfg.data.seq_length)
                batch = StepBatch(rows=rows, tokens=prompts.input_ids, prompt_lens=prompts.prompt_lens)
                rollout.generate(batch)
                batch.scores = trainer.scorer.share(trainer.scorer.local(batch), batch)
                scores.append(batch.scores[: len(real)])
                if rollout.turns is not None:  # multi-turn: the chunk's per-trajectory counts (every rank has them)
                    turn_stats.append(rollout.turn_stats[: len(real)])
                if start == 0:
                    self.first_batch = batch
        finally:
            rollout.sampling, rollout.step = saved_sampling, saved_step
        # generate put the engine to sleep; a sync wakes it with the actor's weights, as after an RL step.
        rollout.sync(trainer.roles.get(Role.ACTOR))
        all_scores = torch.cat(scores).float()
        turns = {f"val/{k}": v for k, v in turn_metrics(torch.cat(turn_stats)).items()} if turn_stats else {}
        return {"val/reward_mean": float(all_scores.mean()),
                "val/accuracy": float((all_scores >= 1.0).float().mean()), "val/num_prompts": float(len(self.rows)),
                **turns}
