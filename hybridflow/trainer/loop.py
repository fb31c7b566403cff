"""The run: build, resume or warm up, RL steps with metrics and checkpoints, export the actor to HF."""

from __future__ import annotations

import shutil
from functools import partial
from pathlib import Path

import torch.distributed as dist

from hybridflow.config import ExperimentConfig
from hybridflow.data import PromptLoader, collate_prompts, collate_sft
from hybridflow.data.step_batch import StepBatch, pad_columns
from hybridflow.placement import Plan
from hybridflow.role_records import Role
from hybridflow.roles.model_role import copy_weights
from hybridflow.tools import environment_tools
from hybridflow.trainer import checkpointing
from hybridflow.trainer.build import build_run
from hybridflow.trainer.metrics import MetricsLog
from hybridflow.trainer.preflight import check_sft_answers
from hybridflow.trainer.profiling import profiled
from hybridflow.trainer.resume import (
    FINAL_ADAPTER,
    FINAL_HF,
    SFT_MODEL_DIR,
    drop_records_after,
    fingerprint,
    resume_point,
    sft_model_dir,
)
from hybridflow.trainer.samples import sample_records
from hybridflow.trainer.validation import Validator


def next_step_batch(loader: PromptLoader, tokenizer, cfg: ExperimentConfig) -> StepBatch:
    """The next prompts, each repeated n_samples_per_prompt times (a prompt's samples stay contiguous)."""
    n = cfg.rollout.n_samples_per_prompt
    rows = [row for row in loader.next_rows() for _ in range(n)]
    prompts = collate_prompts(tokenizer, [row[cfg.data.prompt_key] for row in rows], cfg.data.max_prompt_length,
                              rows, total_len=cfg.data.seq_length)
    return StepBatch(rows=rows, tokens=prompts.input_ids, prompt_lens=prompts.prompt_lens)


def warmup(trainer, loader: PromptLoader, tokenizer, cfg: ExperimentConfig, log: MetricsLog, sft_dir: Path,
           hf_dir: str) -> None:
    """Supervised steps on the dataset's answers so the policy starts with non-zero reward; the result
    becomes the reference model too (KL is measured against the SFT policy, as in RLHF). With roles.actor.lora
    the warm-up trains the adapters and the reference stays the base model, the adapters off (KL against the
    model before the warm-up, as TRL's reference is with a PEFT adapter trained on)."""
    steps = cfg.trainer.warmup_sft_steps
    if not steps:
        return
    actor = trainer.roles.get(Role.ACTOR)
    for step in range(steps):
        rows = loader.next_rows() * cfg.rollout.n_samples_per_prompt
        check_sft_answers(rows)
        sft = collate_sft(tokenizer, [r[cfg.data.prompt_key] for r in rows], [r["answer"] for r in rows],
                          cfg.data.seq_length)
        tensors = {"input_ids": pad_columns(sft.input_ids, cfg.data.seq_length, tokenizer.pad_token_id),
                   "loss_mask": pad_columns(sft.loss_mask, cfg.data.seq_length, 0.0)}
        if actor is not None:
            with actor.learning_rate(cfg.trainer.sft_lr or cfg.trainer.lr):
                metrics = trainer.warmup(tensors)
        log.log(step + 1, metrics if actor is not None else {}, phase="sft")
    copy_weights(actor, trainer.roles.get(Role.REF), sft_dir, hf_dir)
    trainer.rollout.sync(actor)


def _log_samples(log: MetricsLog, tokenizer, cfg: ExperimentConfig, stop_token_ids: tuple[int, ...],
                 batch: StepBatch, step: int, split: str) -> None:
    """The first `trainer.num_log_samples` samples of `batch`, decoded and written on the logging rank only."""
    if log.active and cfg.trainer.num_log_samples:
        log.log_samples(sample_records(tokenizer, batch, step, split, cfg.trainer.num_log_samples, stop_token_ids))


def _resume_reference(trainer, saved: Path, sft_dir: Path) -> None:
    """Load the warm-up's SFT model (the reference) from the run that wrote the checkpoint. Resumed into
    another output directory, rank 0 also copies it there, so that a later resume of this directory finds
    it beside its own checkpoints (written aside and renamed: a copy cut short is never read)."""
    if Role.REF in trainer.roles:
        trainer.roles[Role.REF].load_hf(saved)
    if dist.get_rank() == 0 and saved.is_dir() and not sft_dir.exists():
        aside = sft_dir.with_name(f".{sft_dir.name}.copy")
        shutil.rmtree(aside, ignore_errors=True)
        shutil.copytree(saved, aside)
        aside.rename(sft_dir)


def export_final(trainer, work_dir: Path, hf_dir: str) -> None:
    """The actor as an HF checkpoint (`FINAL_HF`, merged with any LoRA adapters) and its adapters in PEFT's format
    (`FINAL_ADAPTER`, if any). Every stage's writer writes into `<name>.partial`; once all have, rank 0 renames it
    over the old one: a run killed while exporting leaves no directory that looks complete. Collective."""
    partial = {name: work_dir / f"{name}.partial" for name in (FINAL_HF, FINAL_ADAPTER)}
    if dist.get_rank() == 0:
        for path in partial.values():
            shutil.rmtree(path, ignore_errors=True)
    dist.barrier()
    if Role.ACTOR in trainer.roles:
        trainer.roles[Role.ACTOR].save_hf(partial[FINAL_HF], hf_dir)
        trainer.roles[Role.ACTOR].save_adapter(partial[FINAL_ADAPTER], hf_dir)
    dist.barrier()
    if dist.get_rank() == 0:
        for name, path in partial.items():
            if path.is_dir():
                shutil.rmtree(work_dir / name, ignore_errors=True)
                path.rename(work_dir / name)


def train(cfg: ExperimentConfig, plan: Plan) -> dict[str, float]:
    """Run the experiment on this rank (`cfg` as plan.json carries it: resolved, with the plan's engine);
    returns the last step's metrics."""
    work_dir = Path(cfg.trainer.output_dir)
    built = build_run(cfg, plan, work_dir)
    trainer, tokenizer = built.trainer, built.tokenizer
    if dist.get_rank() == 0 and (line := built.memory.line()):
        # memory outside torch's allocator shows at the stage that made it (36 NCCL communicators, 13.7 GiB, at the
        # groups stage until they were pooled: benchmarks/README.md stop 48); step 1's device_used_gib follows on
        print("  " + line, flush=True)
    loader = PromptLoader(built.dataset, tokenizer, cfg.data.train_batch_size, cfg.data.max_prompt_length,
                          seed=cfg.trainer.seed, overlong_prompts=cfg.data.overlong_prompts,
                          tools=environment_tools(cfg.rollout.environment))
    ckpt_root = work_dir / "checkpoints"
    resume_from = resume_point(cfg)  # the launching process checked it matches this run
    start = 0
    sft_dir = work_dir / SFT_MODEL_DIR
    if resume_from is not None:
        state = checkpointing.load(resume_from, trainer.roles)
        loader.load_state_dict(state["loader"])
        trainer.load_state_dict(state)
        start = trainer.steps_done
        trainer.rollout.sync(trainer.roles.get(Role.ACTOR))  # the restored actor's weights
        if cfg.trainer.warmup_sft_steps:
            _resume_reference(trainer, sft_model_dir(resume_from), sft_dir)
        if dist.get_rank() == 0:  # the interrupted run's records past the checkpoint are logged again below
            drop_records_after(work_dir, start)
    log = MetricsLog(work_dir, cfg.trainer.total_steps, start, active=dist.get_rank() == 0)
    if resume_from is None:
        warmup(trainer, loader.warmup_loader(), tokenizer, cfg, log, sft_dir, built.hf_dir)
    validator = Validator.build(cfg, tokenizer)
    log_samples = partial(_log_samples, log, tokenizer, cfg, trainer.rollout.sampling.stop_token_ids)
    if validator is not None and cfg.trainer.val_before_train and start < cfg.trainer.total_steps:
        log.log(start, validator.run(trainer), phase="val")
        log_samples(validator.first_batch, start, "val")
    draw = partial(next_step_batch, loader, tokenizer, cfg)  # a batch filter may draw more prompts
    if cfg.trainer.rollout_lag and trainer.ready is None:
        trainer.prime(draw(), draw)
    metrics: dict[str, float] = {}
    for step in range(start, cfg.trainer.total_steps):
        profile_dir = work_dir / "profile" if step + 1 == cfg.trainer.profile_step else None
        with profiled(profile_dir, step + 1, dist.get_rank()):
            metrics = trainer.step(draw(), draw)
        log.log(step + 1, metrics)
        if cfg.trainer.log_samples_every and (step + 1) % cfg.trainer.log_samples_every == 0:
            log_samples(trainer.last_batch, step + 1, "train")
        if validator is not None and validator.due(step + 1):
            log.log(step + 1, validator.run(trainer), phase="val")
            log_samples(validator.first_batch, step + 1, "val")
        every = cfg.trainer.save_every
        last = step + 1 == cfg.trainer.total_steps
        if (every and (step + 1) % every == 0) or (last and cfg.trainer.save_last):
            checkpointing.save(ckpt_root, step + 1, trainer.roles, {
                "loader": loader.state_dict(), **trainer.state_dict()}, fingerprint(cfg, plan))
    export_final(trainer, work_dir, built.hf_dir)
    trainer.rollout.close()
    log.close()
    return metrics
