"""grpo_smollm2_tools_cpu end to end (SmolLM2-135M-Instruct, the first 4 layers, on one gloo process): every
trajectory's turns are the engine's sampled ids and the ids the chat template adds for each observation, checked
against the template's own rendering (apply_chat_template of the same messages, as text, encoded apart); the
observation tokens carry no loss; the turn and tool metrics are in every step's record.

The run uses a user environment (tests/rollout/nudged_calculator.py) that answers a turn without a tool call
with a tool message until the third turn, so trajectories are multi-turn whatever the truncated model writes.
"""

from __future__ import annotations

import json

import pytest

from hybridflow.config.trainer import TrainerConfig
from hybridflow.data import load_prompt_dataset, load_tokenizer
from hybridflow.tools import environment_tools
from tests.packaged_model import smollm2_checkpoint
from tests.trainer.run_helpers import rl_records, run

pytestmark = pytest.mark.slow

TURN_METRICS = ("turns/per_trajectory", "turns/max", "tools/calls_per_trajectory", "tools/errors_per_call",
                "turns/ended_done", "turns/ended_max_turns", "turns/ended_budget", "observation_token_share")


def _template_adds(tok, messages, replies, tools) -> tuple[str, str]:
    """How the template closes the assistant turn `messages[-1]`, and the text it writes after it for `replies`
    up to the next assistant turn's opening: rendered as text by apply_chat_template, no ids involved."""
    before = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    after = tok.apply_chat_template([*messages, *replies], tools=tools, tokenize=False, add_generation_prompt=True)
    assert after.startswith(before) and before.endswith(messages[-1]["content"] + tok.eos_token + "\n")
    return tok.eos_token + "\n", after[len(before):]


def test_tool_run_keeps_sampled_ids_and_the_templates_observation_ids(tmp_path):
    checkpoint = smollm2_checkpoint()
    run(tmp_path, "+experiment=grpo_smollm2_tools_cpu", "model.keep_layers=4",
        "imports=[tests.rollout.nudged_calculator]", "rollout.environment=nudged_calculator", timeout=1800)
    check_run(tmp_path, load_tokenizer(checkpoint))


def check_run(tmp_path, tok) -> None:
    """The assertions on a finished run's samples.jsonl and metrics.jsonl."""
    tools = environment_tools("calculator")
    records = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert records and all("turns" in r for r in records)  # every trajectory has an observation
    seed = TrainerConfig().seed  # the experiment keeps trainer.seed's default
    dataset = load_prompt_dataset("builtin:calc_word_problems", seed=seed)  # the run's rows
    questions = {row["prompt"][-1]["content"]: row["prompt"] for row in dataset.rows}
    for record in records:
        turns = record["turns"]
        assert 2 <= sum(t["kind"] == "assistant" for t in turns) <= 3 and turns[0]["kind"] == "assistant"
        messages = list(next(v for q, v in questions.items() if q in record["prompt"]))
        for index, turn in enumerate(turns):
            if turn["kind"] == "assistant":
                messages.append({"role": "assistant", "content": tok.decode(turn["ids"], skip_special_tokens=True)})
                continue
            # the observation: the closing the sampled turn lacks, then the template's tool message and opening
            replies = _replies(turn["text"])
            closing, adds = _template_adds(tok, messages, replies, tools)
            # the template closes a turn with <|im_end|> and a newline; the engine sampled the <|im_end|> (its
            # stop token) unless the turn hit max_new_tokens
            missing = closing.removeprefix(tok.eos_token) if turns[index - 1]["ids"][-1] == tok.eos_token_id \
                else closing
            assert turn["ids"] == tok.encode(missing + adds, add_special_tokens=False)
            messages.extend(replies)
        # the loss mask covers the sampled ids and nothing of the observations
        assert record["response_tokens"] == sum(len(t["ids"]) for t in turns if t["kind"] == "assistant")
        # the whole trajectory as text is the template's rendering of the same conversation
        rendered = tok.apply_chat_template(messages, tools=tools, tokenize=False)
        if all(i not in tok.all_special_ids for t in turns if t["kind"] == "assistant" for i in t["ids"][:-1]):
            text = record["prompt"] + "".join(t["text"] for t in turns)
            assert (text + "\n" == rendered) if turns[-1]["ids"][-1] == tok.eos_token_id else rendered.startswith(text)
    for record in rl_records(tmp_path):
        assert set(TURN_METRICS) <= set(record)
        assert 2 <= record["turns/per_trajectory"] <= 3 and record["observation_token_share"] > 0
        assert record["parity/max_abs"] < 1e-3  # engine and trainer agree on every assistant token of every turn


def _replies(observation_text: str) -> list[dict[str, str]]:
    """The tool messages inside an observation's text (SmolLM2's template: `<|im_start|>tool\\n...<|im_end|>`)."""
    parts = observation_text.split("<|im_start|>tool\n")[1:]
    return [{"role": "tool", "content": p.split("<|im_end|>")[0]} for p in parts]
