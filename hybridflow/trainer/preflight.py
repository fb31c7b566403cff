"""Checks that run before any process starts or any file is written, so bad input costs one line."""

from __future__ import annotations

from pathlib import Path

import torch

from hybridflow.config import ExperimentConfig
from hybridflow.config.cluster import default_headroom_gib
from hybridflow.config.experiment import engine_of
from hybridflow.data import PromptLoader, load_prompt_dataset
from hybridflow.data.batching import collate_sft
from hybridflow.data.loader import check_prompt_count
from hybridflow.data.vocabulary import check_run_tokens
from hybridflow.errors import UserError
from hybridflow.placement import Plan
from hybridflow.rewards import resolve_reward_fn
from hybridflow.role_records import Role
from hybridflow.rollout.turns import check_chat_rows
from hybridflow.tools import environment_tools
from hybridflow.trainer.rank_state import rank_file, read_rank_state
from hybridflow.trainer.validation import validation_set, validation_wanted
from hybridflow.units import GIB

# A card counts as the planned size down to this share of cluster.gpu_memory_gib: nominal sizes round up (an
# "80 GB" H100 reports 79.6 GiB, a "141 GB" H200 140.4).
SAME_SIZE_SHARE = 0.98


def check_devices(cfg: ExperimentConfig, plan: Plan) -> None:
    """This machine has the GPUs per node the plan places ranks on, with the memory the plan needs of each;
    raises UserError naming the field."""
    if cfg.cluster.gpu_type != "cpu":
        have = torch.cuda.device_count()
        if have < plan.gpus_per_node:
            raise UserError(
                f"cluster.gpus_per_node: the experiment needs {plan.gpus_per_node} GPUs per node, this machine "
                f"has {have}; run on a machine with them or use +experiment=tiny_cpu"
            )
        smallest = min((torch.cuda.get_device_properties(i) for i in range(plan.gpus_per_node)),
                       key=lambda p: p.total_memory)
        check_device_memory(cfg, plan, smallest.total_memory, smallest.name)


def check_device_memory(cfg: ExperimentConfig, plan: Plan, total_bytes: int, name: str) -> None:
    """The plan's largest per-GPU estimate fits a GPU of `total_bytes`, less the headroom at that size. A plan made for
    a larger card than this machine's (cluster.gpu_type) would otherwise run out of memory mid-step."""
    if total_bytes >= SAME_SIZE_SHARE * plan.capacity_bytes or not plan.memory:
        return  # the card the plan was checked against
    need = max(_on_card(cfg, plan, rank, total_bytes) for rank in plan.memory)
    c = cfg.cluster  # a default headroom is that of this card's size; one the user set stays as set
    defaulted = c.gpu_memory_headroom_gib == default_headroom_gib(c.gpu_type, c.gpu_memory_gib)
    headroom = int(default_headroom_gib(c.gpu_type, total_bytes / GIB) * GIB) if defaulted else plan.headroom_bytes
    if need > total_bytes - headroom:
        raise UserError(
            f"cluster.gpu_type: the plan needs {need / GIB:.1f} GiB per GPU, planned for {cfg.cluster.gpu_type} "
            f"({plan.capacity_bytes / GIB:g} GiB); this machine's {name} has {total_bytes / GIB:.1f} GiB, "
            f"{(total_bytes - headroom) / GIB:.1f} after the {headroom / GIB:.2f} GiB headroom; "
            "set cluster.gpu_type to this GPU's kind (e.g. cluster.gpu_type=H100) so the planner fits the plan to it"
        )


def _on_card(cfg: ExperimentConfig, plan: Plan, rank: int, total_bytes: int) -> int:
    """Rank `rank`'s planned bytes on a card of `total_bytes`: an engine that takes a share of the card (vLLM's
    rollout.gpu_memory_utilization) takes that share of this one, so its KV cache is asked of its record again.
    Planned at the H200's size, grpo_smollm2's vLLM cache (0.3 x 141 GiB) alone was refused on an H100."""
    rollout = plan.role_memory.get(rank, {}).get(Role.ROLLOUT)
    if rollout is None:
        return plan.memory[rank].total
    # The record's batch_kv is the planned cache: an engine that sizes its cache for the batch returns it as is.
    kv = engine_of(cfg).kv_cache_bytes(cfg.rollout.gpu_memory_utilization, total_bytes / GIB, rollout.weights,
                                       rollout.kv_cache)
    return plan.memory[rank].total - rollout.kv_cache + kv


def preflight(cfg: ExperimentConfig, plan: Plan, resume_from: Path | None = None) -> list[str]:
    """Data, tokenizer (against the model's vocabulary), prompt lengths and the reward function are usable, and a
    checkpoint to resume (`resume_from`) was of as many prompts; raises UserError naming the field. Returns notes
    for the user (over-long prompts dropped). Needs no GPU (`check_devices` checks this machine's): the planner
    runs it too, so what it accepts the run does not refuse later.

    The prompts go through the same loader the ranks build (chat template, `data.overlong_prompts`, batch
    size), so a dataset the ranks would refuse is refused here, before the output directory exists.
    """
    dataset = load_prompt_dataset(cfg.data.source, cfg.data.prompt_key, seed=cfg.trainer.seed)
    tokenizer = check_run_tokens(cfg).tokenizer
    d = cfg.data
    loader = PromptLoader(dataset, tokenizer, d.train_batch_size, d.max_prompt_length, seed=cfg.trainer.seed,
                          overlong_prompts=d.overlong_prompts, tools=environment_tools(cfg.rollout.environment))
    notes = [_dropped_note(loader.num_dropped, loader.num_rows, "prompts", d.max_prompt_length)]
    if resume_from is not None:
        check_resumed_prompts(resume_from, len(loader.dataset))
    row_sets = {"data.source": loader.dataset.rows}
    if validation_wanted(cfg):
        val, dropped = validation_set(cfg, tokenizer)
        notes.append(_dropped_note(dropped, len(val) + dropped, "validation prompts", d.max_prompt_length))
        row_sets["the validation set"] = val.rows
    check_rows(cfg, row_sets)
    if cfg.trainer.warmup_sft_steps and resume_from is None:  # a resumed run does not warm up again
        check_warmup_lengths(cfg, loader.warmup_loader(), tokenizer)
    return [note for note in notes if note]


def check_warmup_lengths(cfg: ExperimentConfig, loader: PromptLoader, tokenizer) -> None:
    """The rows the supervised warm-up draws (`PromptLoader.warmup_loader`, as trainer/loop.py) fit data.seq_length with
    their answers; a longer prompt + answer stopped its rank at that warm-up step."""
    for _ in range(cfg.trainer.warmup_sft_steps):
        rows = loader.next_rows()
        collate_sft(tokenizer, [r[cfg.data.prompt_key] for r in rows], [r["answer"] for r in rows],
                    cfg.data.seq_length)


def check_resumed_prompts(ckpt_dir: Path, prompts: int) -> None:
    """The checkpoint's loader (in rank 0's state file) went over `prompts` usable prompts; else its rank would
    refuse it after start-up. A checkpoint from before the loader was saved has nothing to compare."""
    loader = read_rank_state(rank_file(ckpt_dir, 0)).get("loader")
    if loader is not None:
        check_prompt_count(loader["num_rows"], prompts)


def check_rows(cfg: ExperimentConfig, row_sets: dict[str, list[dict]]) -> None:
    """The rows (where -> rows, as the loaders leave them) carry what the run reads of them: chat messages for a
    multi-turn environment, 'answer' for the SFT warm-up, and the fields the reward function declares
    (`hybridflow.rewards.reads_row_fields`). Each would otherwise fail on a rank, after the processes started."""
    for rows in row_sets.values():
        if cfg.rollout.environment:
            check_chat_rows(rows, cfg.rollout.environment, cfg.data.prompt_key)
    if cfg.trainer.warmup_sft_steps:
        check_sft_answers(row_sets["data.source"])
    if cfg.reward.use_model:
        return
    fn = resolve_reward_fn(cfg.reward.fn, cfg.data.source)
    for field in getattr(fn, "row_fields", ()):
        for where, rows in row_sets.items():
            if lacking := _lacking(rows, field):
                raise UserError(f"reward.fn: {fn.__name__} reads each row's {field!r} field, which {lacking} of "
                                f"the {len(rows)} rows of {where} lack; add it or set another reward.fn")


def check_sft_answers(rows: list[dict]) -> None:
    """The supervised warm-up (trainer.warmup_sft_steps) imitates each row's 'answer'."""
    if _lacking(rows, "answer"):
        raise UserError("trainer.warmup_sft_steps: the dataset rows have no 'answer' field to imitate; "
                        "set trainer.warmup_sft_steps=0")


def _lacking(rows: list[dict], field: str) -> int:
    return sum(field not in row for row in rows)


def _dropped_note(dropped: int, total: int, what: str, max_prompt_length: int) -> str:
    if not dropped:
        return ""
    return (f"data: dropped {dropped} of {total} {what} longer than data.max_prompt_length={max_prompt_length} "
            "tokens (data.overlong_prompts=drop)")
