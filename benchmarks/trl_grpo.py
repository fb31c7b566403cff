"""The TRL side of the peer comparison: the same GRPO work through Hugging Face TRL's `GRPOTrainer`.

`grpo_config_kwargs(work)` maps the shared work onto `GRPOConfig` fields (checked without TRL installed);
`run_trl(work)` imports TRL, trains, and times each generate-score-update cycle (one hybridflow RL step).
Run as `python -m benchmarks.trl_grpo --spec SPEC.json --out RESULT.json` (a fresh process, so the GPU
memory hybridflow held is free). Checked against trl 1.16.0 (GRPOConfig / GRPOTrainer).

Mapping (P prompts x G samples per step, mini-batch M samples per optimizer step, micro-batch u, E epochs):
per_device_train_batch_size = u, gradient_accumulation_steps = M / u, steps_per_generation = P * G / u,
num_generations = G, num_iterations = E, so one generation batch is P * G samples and is followed by
P * G * E / M optimizer steps, as in hybridflow; min_new_tokens = max_completion_length = R makes every
response R tokens long (hybridflow: no stop tokens).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.token_count import rates, trl_step_tokens


@dataclass(frozen=True)
class SharedWork:
    """The work both frameworks do, in one place."""

    model_dir: str  # HF checkpoint + tokenizer both sides load
    prompts: int  # P: prompts per RL step
    samples_per_prompt: int  # G
    response_length: int  # R: tokens generated per sample (no early stop)
    mini_batch_size: int  # M: samples per optimizer step
    micro_batch_size: int  # u
    ppo_epochs: int  # E
    lr: float
    kl_coef: float  # TRL beta; > 0 loads the reference model on both sides
    cliprange: float
    temperature: float
    warmup_steps: int
    steps: int
    seed: int
    task: str = "builtin:add"
    reward: str = "char_match"  # a key of SCORES: "gsm8k" (`#### n` must equal the answer), "word_order"
    stop_at_eos: bool = False  # True: responses end at eos (a real task); False: exactly R tokens each
    eval_every: int = 0  # RL steps between held-out evaluations (and one before training); 0 = none
    eval_rows: int = 0  # held-out prompts per evaluation (hybridflow's validation set for `seed`)
    # TRL's generation: "vllm-colocate" (use_vllm=True, vllm_mode="colocate": what TRL users pick for speed)
    # or "hf" (transformers generate)
    trl_generation: str = "vllm-colocate"
    # TRL's policy weights: "fp32" under the Trainer's bf16 autocast (mixed precision, as hybridflow's fp32 master
    # weights; the default) or "bf16" (pure bf16: faster, but lr-sized updates round away, see run_trl)
    trl_dtype: str = "fp32"
    # TRL's training prompts: None = the task's rows in order; a length = the prompts hybridflow's run trains on
    # (its loader at this data.max_prompt_length, seed `seed`), step for step, so the two sides are paired
    max_prompt_length: int | None = None

    @property
    def samples(self) -> int:
        return self.prompts * self.samples_per_prompt

    @property
    def optimizer_steps_per_rl_step(self) -> int:
        return self.samples * self.ppo_epochs // self.mini_batch_size

    def check(self) -> None:
        """The divisibility both trainers need; ValueError names the flag to change."""
        if self.mini_batch_size % self.micro_batch_size:
            raise ValueError(f"--micro-batch: {self.micro_batch_size} does not divide --mini-batch "
                             f"{self.mini_batch_size}; pick a divisor")
        if self.samples % self.mini_batch_size:
            raise ValueError(f"--mini-batch: {self.mini_batch_size} does not divide prompts x samples = "
                             f"{self.samples}; pick a divisor")
        if self.mini_batch_size % self.samples_per_prompt:
            raise ValueError(f"--mini-batch: {self.mini_batch_size} is not a multiple of --samples-per-prompt "
                             f"{self.samples_per_prompt} (TRL needs whole groups per optimizer step)")


def grpo_config_kwargs(work: SharedWork, output_dir: str, on_gpu: bool = True) -> dict:
    """GRPOConfig(**kwargs) for `work` (see the module docstring for the mapping)."""
    work.check()
    optimizer_steps = (work.warmup_steps + work.steps) * work.optimizer_steps_per_rl_step
    floor = 0 if work.stop_at_eos else work.response_length
    if work.trl_generation == "vllm-colocate":
        # vLLM's SamplingParams spells the floor min_tokens; 0.3 of the GPU is TRL's default colocate budget
        generation = dict(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=0.3,
                          generation_kwargs={"min_tokens": floor} if floor else {})
    elif work.trl_generation == "hf":
        generation = dict(use_vllm=False, generation_kwargs={"min_new_tokens": floor} if floor else {})
    else:
        raise ValueError(f"--trl-generation: {work.trl_generation!r} is not vllm-colocate or hf")
    return dict(**generation,
        output_dir=output_dir, per_device_train_batch_size=work.micro_batch_size,
        gradient_accumulation_steps=work.mini_batch_size // work.micro_batch_size,
        steps_per_generation=work.samples // work.micro_batch_size, num_generations=work.samples_per_prompt,
        num_iterations=work.ppo_epochs, max_completion_length=work.response_length,
        temperature=work.temperature, top_p=1.0,
        # loss_type "dapo" (TRL's default, spelled out): token mean over the mini-batch, hybridflow's token-mean
        top_k=0, beta=work.kl_coef, epsilon=work.cliprange, loss_type="dapo", learning_rate=work.lr,
        lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, max_steps=optimizer_steps,
        bf16=on_gpu, use_cpu=not on_gpu, gradient_checkpointing=False, shuffle_dataset=False,
        remove_unused_columns=False, logging_steps=1, report_to="none", save_strategy="no", seed=work.seed,
        dataloader_num_workers=0, log_completions=False,
    )


def prompt_rows(work: SharedWork) -> list[dict]:
    """The prompts hybridflow's built-in task gives, enough for every RL step (text, or chat messages that TRL
    renders with the tokenizer's template as hybridflow does). With `work.max_prompt_length`: the ones hybridflow's
    run draws, in its order (its PromptLoader over the task's rows for `work.seed`, over-long prompts dropped)."""
    from hybridflow.data.tasks import builtin_task, task_rows

    steps = work.warmup_steps + work.steps
    if work.max_prompt_length is None:
        return task_rows(builtin_task(work.task), work.prompts * steps, work.seed)
    from transformers import AutoTokenizer

    from hybridflow.data.loader import PromptLoader
    from hybridflow.data.prompts import load_prompt_dataset

    loader = PromptLoader(load_prompt_dataset(work.task, seed=work.seed), AutoTokenizer.from_pretrained(work.model_dir),
                          work.prompts, work.max_prompt_length, seed=work.seed)
    # the loader renders chat prompts to text and keeps the messages beside them: TRL gets the messages back
    rows = [row for _ in range(steps) for row in loader.next_rows()]
    return [{**{k: v for k, v in row.items() if k != "prompt_messages"},
             "prompt": row.get("prompt_messages", row["prompt"])} for row in rows]


def held_out(work: SharedWork) -> list[dict]:
    """The held-out rows hybridflow validates on for the same task and seed."""
    from hybridflow.data.tasks import builtin_task, held_out_rows
    from hybridflow.trainer.validation import NUM_BUILTIN_TRAIN

    return held_out_rows(builtin_task(work.task), work.eval_rows, work.seed, NUM_BUILTIN_TRAIN)


def text_of(completion) -> str:
    """A completion's text: TRL hands chat prompts' completions over as [{"role": "assistant", "content": ...}]."""
    return completion if isinstance(completion, str) else completion[0]["content"]



def scorer(reward: str):
    """The per-sample rule `(response, answer) -> score` named by SharedWork.reward, as hybridflow's reward uses it."""
    from hybridflow.rewards.answer_match import char_match
    from hybridflow.rewards.gsm8k import gsm8k_score
    from hybridflow.rewards.word_order import word_order_score

    return {"char_match": char_match, "gsm8k": gsm8k_score, "word_order": word_order_score}[reward]


def greedy_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int, score, batch: int = 128) -> float:
    """Share of `rows` whose greedy response scores 1 under `score` (transformers' generate, left-padded,
    stopping at the tokenizer's eos)."""
    import torch

    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    correct = 0
    try:
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            texts = [r["prompt"] if isinstance(r["prompt"], str)
                     else tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False)
                     for r in chunk]
            enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
            responses = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            correct += sum(score(text, r["answer"]) for text, r in zip(responses, chunk, strict=True))
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return correct / len(rows)


def run_trl(work: SharedWork, output_dir: str) -> dict:
    """Train with TRL's GRPOTrainer and time each RL step (generation batch + its optimizer steps).

    Meant for a GPU (bf16); without CUDA it runs in fp32 on CPU, which only checks that it works.
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    score = scorer(work.reward)
    tokenizer = AutoTokenizer.from_pretrained(work.model_dir)
    on_gpu = torch.cuda.is_available()
    # fp32 weights, bf16 autocast (GRPOConfig bf16=True): the Trainer's mixed precision, as hybridflow keeps fp32
    # master weights. Loaded in bf16, AdamW's ~lr-sized updates (1e-6..1e-5) round away against bf16 weights
    # (spacing ~1e-4 at |w| ~ 0.02): on the H200 (2026-12-04) such a TRL run did not learn at all.
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[work.trl_dtype]
    model = AutoModelForCausalLM.from_pretrained(work.model_dir, dtype=dtype)
    tokens_per_rl_step: list[int] = []

    def answer_reward(completions, answer, **_):
        return [score(text_of(c), a) for c, a in zip(completions, answer, strict=True)]

    eval_rows = held_out(work) if work.eval_every else []
    accuracy: list[dict] = []  # {"step": RL steps done, "samples": samples trained on, "accuracy": ...}

    class CycleTimer(TrainerCallback):
        """Marks each RL-step boundary; evaluations run right after a mark and their time moves the mark."""

        def __init__(self):
            self.marks: list[float] = []

        def mark(self):
            if on_gpu:
                torch.cuda.synchronize()
            self.marks.append(time.perf_counter())

        def evaluate(self, rl_step: int, model):
            if work.eval_every and rl_step % work.eval_every == 0:
                acc = greedy_accuracy(model, tokenizer, eval_rows, work.response_length, score)
                accuracy.append({"step": rl_step, "samples": rl_step * work.samples, "accuracy": acc})
                self.marks[-1] = time.perf_counter()  # eval time stays out of the next step's time

        def on_train_begin(self, args, state, control, model=None, **kw):
            self.mark()
            self.evaluate(0, model)

        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step % work.optimizer_steps_per_rl_step == 0:
                self.mark()
                self.evaluate(state.global_step // work.optimizer_steps_per_rl_step, model)

    timer = CycleTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=answer_reward,
                          args=GRPOConfig(**grpo_config_kwargs(work, output_dir, on_gpu)),
                          train_dataset=Dataset.from_list(prompt_rows(work)), processing_class=tokenizer,
                          callbacks=[timer])
    generate_and_score = trainer._generate_and_score_completions

    def counted(inputs):
        """One generation batch (one RL step): its tokens counted from the ids TRL trains on, padding left out."""
        batch = generate_and_score(inputs)
        tokens_per_rl_step.append(trl_step_tokens(batch))
        return batch

    trainer._generate_and_score_completions = counted
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    step_s = [b - a for a, b in zip(timer.marks, timer.marks[1:], strict=False)][work.warmup_steps:]
    tokens = tokens_per_rl_step[work.warmup_steps:len(step_s) + work.warmup_steps]
    import trl

    how = "vLLM colocate" if work.trl_generation == "vllm-colocate" else "transformers generate"
    how += ", pure bf16 weights" if work.trl_dtype == "bf16" else ""
    return {"framework": f"trl {trl.__version__} GRPOTrainer ({how})", "timed_steps": len(step_s),
            **rates(tokens, step_s, work.samples),
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None,
            "step_times_s": step_s, "accuracy": accuracy,
            # TRL's own per-optimizer-step log (loss, KL, entropy, completion length, clip and IS-ratio figures), to
            # set beside hybridflow's metrics.jsonl step by step
            "log_history": trainer.state.log_history}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", type=Path, required=True, help="SharedWork as JSON (trl_compare writes it)")
    parser.add_argument("--out", type=Path, required=True, help="result JSON")
    args = parser.parse_args(argv)
    work = SharedWork(**json.loads(args.spec.read_text()))
    result = run_trl(work, str(args.out.parent / "trl_output"))
    args.out.write_text(json.dumps({"work": asdict(work), **result}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
