"""How often a base model calls the calculator on `builtin:calc_word_problems`, and how often it is right, with
and without the tool. HF transformers generation (no hybridflow engine), CPU or GPU.

    python -m benchmarks.tool_use_base [--model HF_DIR] [--prompts 64] [--temperatures 0,1] [--device cpu|cuda]
        [--dtype fp32|bf16] [--max-turns 4] [--max-new-tokens 96] [--json OUT.json]

The model defaults to model=smollm2_135m's converted checkpoint (converted on first use). `with tool`: the
task's prompt (system text offering the calculator, solved exchanges using it), rendered as hybridflow renders
it (hybridflow.data.chat.render_chat with the `calculator` environment's tool schemas), and the episodes run
through hybridflow's own turn loop (hybridflow.rollout.turns) with HF `generate` as the sampler, so tool calls
are parsed and answered exactly as in training. `without tool`: the same questions offered no tool
(`builtin:calc_word_problems_plain`), one turn. Printed per temperature: the share of trajectories with a
well-formed calculator call (`tool-call rate`), with any `<tool_call>` block at all, and the accuracy
(hybridflow.rewards.gsm8k on the last assistant turn). Greedy at temperature 0.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.convert.packaged_model import packaged_checkpoint
from hybridflow.data.chat import render_chat
from hybridflow.data.tasks import builtin_task, task_rows
from hybridflow.rewards.gsm8k import gsm8k_score
from hybridflow.rollout.turns import SampledTurn, Sampler, TurnSettings, run_turns, start_episode
from hybridflow.tools import environment_tools, get_environment
from hybridflow.tools.tool_call import ToolCall, parse_tool_calls

STOP_ID = 2  # <|im_end|>, as the SmolLM2 experiments' rollout.stop_token_ids


def hf_sampler(model, pad_id: int, temperature: float, seed: int, batch: int) -> Sampler:
    """A turn-loop sampler over HF `generate`: prefixes left-padded, each row cut after its first stop id and
    at its own limit. Log-probs are not needed here (zeros)."""

    def sample(prefixes: list[list[int]], max_tokens: list[int], turn: int) -> list[SampledTurn]:
        out: list[SampledTurn] = []
        for start in range(0, len(prefixes), batch):
            chunk, limits = prefixes[start:start + batch], max_tokens[start:start + batch]
            width = max(map(len, chunk))
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, prefix in enumerate(chunk):
                ids[row, width - len(prefix):] = torch.tensor(prefix)
                mask[row, width - len(prefix):] = 1
            torch.manual_seed(seed + 7919 * turn + start)
            kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else \
                dict(do_sample=False)
            with torch.no_grad():
                gen = model.generate(input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
                                     max_new_tokens=max(limits), eos_token_id=STOP_ID, pad_token_id=pad_id,
                                     **kwargs)[:, width:].cpu()
            for row, limit in enumerate(limits):
                sampled = gen[row].tolist()[:limit]
                if STOP_ID in sampled:
                    sampled = sampled[: sampled.index(STOP_ID) + 1]
                out.append(SampledTurn(sampled, [0.0] * len(sampled)))
        return out

    return sample


def measure(model, tok, rows: list[dict], tools: list[dict] | None, temperature: float, args) -> dict[str, float]:
    """Run every row to its end (with the calculator environment when `tools`, else one turn) and score it."""
    env = get_environment("calculator")
    settings = TurnSettings(environment=env, tokenizer=tok, prompt_key="prompt",
                            max_turns=args.max_turns if tools else 1, max_new_tokens=args.max_new_tokens,
                            max_tool_tokens=64, budget=args.budget, tools=tools)
    episodes = [start_episode(tok(render_chat(tok, r["prompt"], tools), add_special_tokens=False)["input_ids"],
                              {**r, "prompt_messages": r["prompt"]}, settings) for r in rows]
    run_turns(episodes, hf_sampler(model, tok.pad_token_id, temperature, args.seed, args.batch), settings)
    n_prompt = [len(r["prompt"]) for r in rows]
    turns = [e.messages[n:] for e, n in zip(episodes, n_prompt, strict=True)]
    assistant = [[m["content"] for m in t if m["role"] == "assistant"] for t in turns]
    blocks = [[c for text in a for c in parse_tool_calls(text)] for a in assistant]
    called = [any(isinstance(c, ToolCall) and c.name == "calculator" for c in b) for b in blocks]
    correct = [gsm8k_score(a[-1], r["answer"]) for a, r in zip(assistant, rows, strict=True)]
    n = len(rows)
    return {"tool_call_rate": sum(called) / n, "any_tool_block_rate": sum(bool(b) for b in blocks) / n,
            "accuracy": sum(correct) / n,
            "accuracy_when_called": (sum(c for c, k in zip(correct, called, strict=True) if k) / sum(called)
                                     if any(called) else 0.0),
            "turns_per_trajectory": sum(len(a) for a in assistant) / n,
            "example": turns[0]}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tool_use_base", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--temperatures", default="0,1")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--budget", type=int, default=1152, help="tokens per trajectory (data.seq_length)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--only", default="tool,plain", help="which prompt forms to measure")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.model = args.model or packaged_checkpoint("smollm2_135m")  # converted once into $HYBRIDFLOW_CACHE

    tok = AutoTokenizer.from_pretrained(str(args.model))
    tok.pad_token = tok.pad_token or tok.eos_token
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=dtype).to(args.device).eval()
    forms = {"tool": ("calc_word_problems", environment_tools("calculator")),
             "plain": ("calc_word_problems_plain", None)}
    results = {}
    for form in args.only.split(","):
        task, tools = forms[form]
        rows = task_rows(builtin_task(f"builtin:{task}"), args.prompts, args.seed)
        for temperature in (float(t) for t in args.temperatures.split(",")):
            began = time.perf_counter()
            got = measure(model, tok, rows, tools, temperature, args)
            results[f"{form}@T{temperature:g}"] = got
            print(f"{form:5s} T={temperature:g}: tool-call rate {got['tool_call_rate']:.3f} "
                  f"(any <tool_call> {got['any_tool_block_rate']:.3f}), accuracy {got['accuracy']:.3f} "
                  f"(when called {got['accuracy_when_called']:.3f}), turns {got['turns_per_trajectory']:.2f} "
                  f"[{time.perf_counter() - began:.0f}s]", flush=True)
            print("   e.g.", json.dumps(got["example"])[:600], flush=True)
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "prompts": args.prompts, "seed": args.seed,
                                         "results": results}, indent=1))


if __name__ == "__main__":
    main()
