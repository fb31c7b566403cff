"""builtin:calc_word_problems: word problems offering the calculator tool, scored by hybridflow.rewards.gsm8k; one
episode played through the `calculator` environment with SmolLM2's real tokenizer and template."""

from __future__ import annotations

import json
import re

from hybridflow.data import PromptLoader, builtin_task, load_prompt_dataset, load_tokenizer, task_rows
from hybridflow.data.tasks import CALC_EXAMPLES, CALC_REQUEST, CALC_SYSTEM, held_out_rows
from hybridflow.rewards.gsm8k import extract_final_answer, gsm8k_score
from hybridflow.tools import get_environment
from hybridflow.tools.calculator import evaluate_arithmetic, format_number
from hybridflow.tools.observation_tokens import observation_ids, render_ids
from hybridflow.tools.tool_call import ToolCall, parse_tool_calls
from tests.packaged_model import smollm2_checkpoint


def test_rows_are_deterministic_chat_with_calculator_checkable_answers():
    task = builtin_task("builtin:calc_word_problems")
    rows = task_rows(task, 300, seed=1)
    assert rows == task_rows(task, 300, seed=1) and rows != task_rows(task, 300, seed=2)
    assert len({json.dumps(r["prompt"]) for r in rows}) > 290
    for row in rows:
        system, *example, user = row["prompt"]
        assert system == {"role": "system", "content": CALC_SYSTEM} and tuple(example) == CALC_EXAMPLES
        assert user["role"] == "user" and user["content"].endswith("?" + CALC_REQUEST)
        work, final = row["answer"].split("\n")
        expression, value = work.split(" = ")
        assert evaluate_arithmetic(expression) == int(value) >= 0  # the tool agrees with the task's arithmetic
        assert set(re.findall(r"\d+", expression)) <= set(re.findall(r"\d+", user["content"]))
        assert final == f"#### {value}" and extract_final_answer(row["answer"]) == value
        assert gsm8k_score(f"#### {value}", row["answer"]) == 1.0 and gsm8k_score(f"#### {value}1", row["answer"]) == 0
    # Each example's call is in the parser's format, its result is the calculator's, its answer that result.
    assert len(CALC_EXAMPLES) == 5 * 4
    for question, call_turn, result, answer in zip(*[iter(CALC_EXAMPLES)] * 4, strict=True):
        (call,) = parse_tool_calls(call_turn["content"])
        expression = call.arguments["expression"]
        assert call.name == "calculator" and question["content"].endswith(CALC_REQUEST)
        assert result == {"role": "tool", "content": format_number(evaluate_arithmetic(expression))}
        assert answer["content"] == f"{expression} = {result['content']}\n#### {result['content']}"
    assert parse_tool_calls(CALC_EXAMPLES[1]["content"]) == [ToolCall("calculator", {"expression": "23 * 47"})]
    held_out = held_out_rows(task, 32, seed=1, num_train=300)
    assert not {json.dumps(r["prompt"]) for r in held_out} & {json.dumps(r["prompt"]) for r in rows}


def test_the_plain_variant_asks_the_same_questions_without_the_tool():
    rows = task_rows(builtin_task("builtin:calc_word_problems"), 50, seed=3)
    plain = task_rows(builtin_task("builtin:calc_word_problems_plain"), 50, seed=3)
    assert [r["answer"] for r in plain] == [r["answer"] for r in rows]
    assert [r["prompt"][-1]["content"] + CALC_REQUEST for r in plain] == [r["prompt"][-1]["content"] for r in rows]
    assert not any("tool" in json.dumps(r["prompt"]) or m["role"] == "tool" for r in plain for m in r["prompt"])


def test_one_episode_through_the_calculator_environment_with_smollm2():
    tokenizer = load_tokenizer(smollm2_checkpoint())
    row = load_prompt_dataset("builtin:calc_word_problems", seed=0, num_builtin_examples=1).rows[0]
    expression, value = row["answer"].split("\n")[0].split(" = ")
    env = get_environment("calculator")
    messages = list(row["prompt"])
    prompt_ids = render_ids(tokenizer, messages, add_generation_prompt=True)
    assert len(prompt_ids) < 720  # 681..695 tokens over 300 rows: data.max_prompt_length=720 holds them

    first = CALC_EXAMPLES[1]["content"].replace("23 * 47", expression)  # what a model that learned the format writes
    messages.append({"role": "assistant", "content": first})
    step = env.step(messages, row)
    assert not step.done and step.messages == [{"role": "tool", "content": value}]
    assert step.metrics == {"tool_calls": 1}
    sampled = tokenizer.encode(first, add_special_tokens=False) + [tokenizer.eos_token_id]
    observed = observation_ids(tokenizer, messages, sampled, step.messages)
    assert tokenizer.decode(observed) == f"\n<|im_start|>tool\n{value}<|im_end|>\n<|im_start|>assistant\n"
    messages += step.messages

    final = f"{expression} = {value}\n#### {value}"
    messages.append({"role": "assistant", "content": final})
    last = env.step(messages, row)
    assert last.done and last.messages == [] and gsm8k_score(final, row["answer"]) == 1.0


def test_prompt_loader_renders_the_task_with_smollm2_template():
    tokenizer = load_tokenizer(smollm2_checkpoint())
    dataset = load_prompt_dataset("builtin:calc_word_problems", seed=0, num_builtin_examples=16)
    loader = PromptLoader(dataset, tokenizer, batch_size=16, max_prompt_length=720, shuffle=False)
    assert loader.num_dropped == 0
    text = loader.dataset.rows[0]["prompt"]
    assert "<|im_start|>tool\n1081<|im_end|>\n" in text and text.endswith("<|im_start|>assistant\n")
