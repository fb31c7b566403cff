"""Built-in verifiable tasks, generated locally and deterministically from a seed.

Each example is a row {"prompt", "answer"}: the prompt is what the policy sees, the answer is the reference
the reward compares the response with, and prompt + answer (+ eos) is the supervised warm-up target.
Example i depends only on (seed, i), so any process regenerates the same dataset without files.
A prompt is a string, or chat messages (`WordProblems`) that the loader renders with the tokenizer's template.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from hybridflow.errors import UserError
from hybridflow.tools.calculator import CALCULATOR, evaluate_arithmetic, format_number
from hybridflow.tools.tool_call import CLOSE as TOOL_CALL_CLOSE
from hybridflow.tools.tool_call import OPEN as TOOL_CALL_OPEN

BUILTIN_PREFIX = "builtin:"
# Every character a built-in task writes: its character tokenizer needs nothing else (17 ids with specials).
BUILTIN_ALPHABET = "0123456789+=>"


@dataclass(frozen=True)
class SortDigits:
    """ "3142>" -> "1234": sort a random string of digits ascending."""

    min_digits: int = 3
    max_digits: int = 5

    def example(self, rng: random.Random) -> dict[str, str]:
        digits = [rng.choice("0123456789") for _ in range(rng.randint(self.min_digits, self.max_digits))]
        return {"prompt": "".join(digits) + ">", "answer": "".join(sorted(digits))}


@dataclass(frozen=True)
class AddNumbers:
    """ "17+25=" -> "42": add two non-negative integers."""

    max_value: int = 99

    def example(self, rng: random.Random) -> dict[str, str]:
        a, b = rng.randint(0, self.max_value), rng.randint(0, self.max_value)
        return {"prompt": f"{a}+{b}=", "answer": str(a + b)}


@dataclass(frozen=True)
class MaxDigit:
    """ "31427>" -> "7": the largest digit. One answer token: quick to learn on a CPU, and RL has a clear
    signal once the warm-up has made the policy answer with a digit."""

    min_digits: int = 3
    max_digits: int = 6

    def example(self, rng: random.Random) -> dict[str, str]:
        digits = [rng.choice("0123456789") for _ in range(rng.randint(self.min_digits, self.max_digits))]
        return {"prompt": "".join(digits) + ">", "answer": max(digits)}


WORD_PROBLEM_SYSTEM = ("Solve the math word problem. Finish with the final answer on its own line as '#### <number>', "
                       "for example '#### 42'.")
# One solved example before the question: SmolLM2-135M-Instruct then answers greedily in the `#### n` form on
# 64 of 64 held-out prompts (with the instruction alone on 13 of 16; with neither on 0 of 64), so RL starts from
# a reward it can improve rather than from none.
WORD_PROBLEM_EXAMPLE = ({"role": "user", "content": "Tom has 3 pens and gets 4 more. How many pens does Tom have now?"},
                        {"role": "assistant", "content": "3 + 4 = 7\n#### 7"})
_NAMES = ("Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jack", "Lily", "Maya", "Noah", "Omar")
_ITEMS = ("apples", "books", "marbles", "stickers", "pencils", "cookies", "shells", "cards", "coins", "stamps")


@dataclass(frozen=True)
class WordProblems:
    """GSM8K-style word problems of one or two operations on small numbers, as chat messages (a system turn
    asking for `#### <number>`, one solved example exchange, the problem as the last user turn). The answer is
    a one-line worked solution ending in `#### n`, the form `hybridflow.rewards.gsm8k` scores; every answer is
    a non-negative integer."""

    max_value: int = 20

    def example(self, rng: random.Random) -> dict:
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        a, b, c = rng.randint(2, self.max_value), rng.randint(2, self.max_value), rng.randint(2, 9)
        kinds = {  # (question, worked expression, its value)
            "add": (f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
                    f"{a} + {b}", a + b),
            "sub": (f"{name} has {a + b} {item} and gives {b} away. How many {item} are left?",
                    f"{a + b} - {b}", a),
            "mul": (f"{name} buys {c} boxes with {b} {item} in each box. How many {item} is that?",
                    f"{c} * {b}", c * b),
            "div": (f"{name} shares {b * c} {item} equally among {c} friends. How many {item} does each friend "
                    "get?", f"{b * c} / {c}", b),
            "add_sub": (f"{name} has {a + c} {item}, finds {b} more, then loses {c}. How many {item} does {name} "
                        "have now?", f"{a + c} + {b} - {c}", a + b),
            "add_mul": (f"{name} has {a} {item} and buys {c} packs of {b} {item}. How many {item} does {name} "
                        "have now?", f"{a} + {c} * {b}", a + c * b),
        }
        question, expression, value = kinds[rng.choice(sorted(kinds))]
        prompt = [{"role": "system", "content": WORD_PROBLEM_SYSTEM}, *WORD_PROBLEM_EXAMPLE,
                  {"role": "user", "content": question}]
        return {"prompt": prompt,
                "answer": f"{expression} = {value}\n#### {value}"}


def _calculator_call(expression: str) -> str:
    """The assistant text that calls the calculator tool on `expression` (hybridflow.tools.tool_call's form)."""
    call = {"name": CALCULATOR.name, "arguments": {"expression": expression}}
    return TOOL_CALL_OPEN + json.dumps(call) + TOOL_CALL_CLOSE


CALC_SYSTEM = ("Solve the math word problem. You have a calculator: to use it, write "
               + _calculator_call("<arithmetic>") + " and stop; its result comes back in a tool message. "
               "Finish with the final answer on its own line as '#### <number>'.")
# Appended to every question that offers the tool (solved examples included): SmolLM2-135M-Instruct follows an
# instruction in the user turn far more often than one in the system turn alone (see CalculatorWordProblems).
CALC_REQUEST = " Use the calculator."


def _solved_with_tool(question: str, expression: str) -> tuple[dict[str, str], ...]:
    """One solved exchange that uses the tool: the question, the call, the tool's result, the final answer."""
    value = format_number(evaluate_arithmetic(expression))
    return ({"role": "user", "content": question + CALC_REQUEST},
            {"role": "assistant", "content": _calculator_call(expression)},
            {"role": "tool", "content": value},
            {"role": "assistant", "content": f"{expression} = {value}\n#### {value}"})


# One solved exchange per question form of the task (mul, mul_sub, add3, div, add_mul), each calling the tool.
_CALC_SOLVED = (
    ("A shop has 23 boxes with 47 pens in each box. How many pens is that?", "23 * 47"),
    ("Sam packs 38 boxes with 64 cards in each box and gives 517 cards away. How many cards are left?",
     "38 * 64 - 517"),
    ("Zoe collects 312 coins on Monday, 845 on Tuesday and 129 on Wednesday. How many coins is that in all?",
     "312 + 845 + 129"),
    ("Lily shares 1554 stamps equally among 42 friends. How many stamps does each friend get?", "1554 / 42"),
    ("Omar has 245 shells and buys 17 packs of 36 shells. How many shells does Omar have now?", "245 + 17 * 36"),
)
CALC_EXAMPLES = tuple(m for question, expression in _CALC_SOLVED for m in _solved_with_tool(question, expression))
# The same exchanges solved without the tool (`calc_word_problems_plain`).
PLAIN_CALC_EXAMPLES = tuple(m for question, expression in _CALC_SOLVED
                            for m in ({"role": "user", "content": question},
                                      _solved_with_tool(question, expression)[-1]))


@dataclass(frozen=True)
class CalculatorWordProblems:
    """Word problems on two- and three-digit numbers (products a 135M model rarely gets right in its head),
    as chat messages that offer the `calculator` tool (hybridflow.tools): the system text, five solved
    exchanges using it (`CALC_EXAMPLES`, one per question form), the question; every question ends in
    `CALC_REQUEST`. The answer is the worked expression and `#### n` (hybridflow.rewards.gsm8k scores it);
    every answer is a non-negative integer. `offer_tool=False` (`builtin:calc_word_problems_plain`): the same
    questions and answers with the word-problem prompt of `gsm8k_easy` and the same exchanges solved without
    the tool (the baseline for "with the tool vs without").

    Why this prompt (SmolLM2-135M-Instruct, HF fp32 on CPU, prompts rendered as the loader renders them;
    SmolLM2's template renders no tool schemas, only `tool` messages; benchmarks/tool_use_base.py): with one
    solved exchange and the call syntax in the system text only, it called the tool on 0 of 16 prompts at
    temperature 1 and 1 of 16 greedily (accuracy 0 of 16). Screening the first turn at temperature 1 (16
    prompts, 48 tokens): three solved exchanges gave a `<tool_call>` block on 3 of 16 (none well-formed
    within the limit); three with `CALC_REQUEST` in every user turn on 6 of 16 (5 well-formed); five with
    it on 10 of 16, all well-formed (the prompt grows from ~210 to ~690 tokens). README, "Multi-turn
    rollouts with tools", has the rates of this prompt measured over whole episodes."""

    offer_tool: bool = True

    def example(self, rng: random.Random) -> dict:
        name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
        a, b = rng.randint(12, 99), rng.randint(12, 99)
        c = rng.randint(100, a * b - 1)
        d, e = rng.randint(100, 999), rng.randint(100, 999)
        kinds = {  # (question, worked expression, its value)
            "mul": (f"{name} packs {a} boxes with {b} {item} in each box. How many {item} is that?",
                    f"{a} * {b}", a * b),
            "mul_sub": (f"{name} packs {a} boxes with {b} {item} in each box and gives {c} {item} away. How many "
                        f"{item} are left?", f"{a} * {b} - {c}", a * b - c),
            "add_mul": (f"{name} has {c} {item} and buys {a} packs of {b} {item}. How many {item} does {name} "
                        "have now?", f"{c} + {a} * {b}", c + a * b),
            "div": (f"{name} shares {a * b} {item} equally among {a} friends. How many {item} does each friend "
                    "get?", f"{a * b} / {a}", b),
            "add3": (f"{name} collects {c} {item} on Monday, {d} on Tuesday and {e} on Wednesday. How many {item} "
                     "is that in all?", f"{c} + {d} + {e}", c + d + e),
        }
        question, expression, value = kinds[rng.choice(sorted(kinds))]
        if self.offer_tool:
            prompt = [{"role": "system", "content": CALC_SYSTEM}, *CALC_EXAMPLES,
                      {"role": "user", "content": question + CALC_REQUEST}]
        else:
            prompt = [{"role": "system", "content": WORD_PROBLEM_SYSTEM}, *PLAIN_CALC_EXAMPLES,
                      {"role": "user", "content": question}]
        return {"prompt": prompt, "answer": f"{expression} = {value}\n#### {value}"}


WORD_ORDER_SYSTEM = "Put the words in alphabetical order. Answer with the ordered words only, separated by commas."
WORD_ORDER_EXAMPLE = ({"role": "user", "content": "Words: pear, apple, melon, fig"},
                      {"role": "assistant", "content": "apple, fig, melon, pear"})
# Common short words; several share a first letter (bat, bell, bird; cat, cow, cup; ...), so ordering needs
# the second letter too, which is what keeps a 135M model from solving most prompts at the start.
_WORDS = ("ant", "bat", "bell", "bird", "cat", "cow", "cup", "dog", "door", "egg", "fish", "fog", "goat", "hat",
          "hill", "ink", "jam", "kite", "lamp", "leaf", "moon", "mud", "nest", "owl", "pen", "pig", "rain", "rose",
          "sun", "sock", "tree", "toy", "van", "web", "wolf", "yak", "zoo")


@dataclass(frozen=True)
class WordOrder:
    """ "Words: owl, cat, cow, ant" -> "ant, cat, cow, owl": a chat task of another kind than the word problems
    (ordering, no arithmetic). The answer is the ordered list, which `hybridflow.rewards.word_order` compares
    with the response's last line."""

    min_words: int = 3
    max_words: int = 4

    def example(self, rng: random.Random) -> dict:
        words = rng.sample(_WORDS, rng.randint(self.min_words, self.max_words))
        ordered = ", ".join(sorted(words))
        prompt = [{"role": "system", "content": WORD_ORDER_SYSTEM}, *WORD_ORDER_EXAMPLE,
                  {"role": "user", "content": "Words: " + ", ".join(words)}]
        return {"prompt": prompt, "answer": ordered}


BuiltinTask = SortDigits | AddNumbers | MaxDigit | WordProblems | CalculatorWordProblems | WordOrder
BUILTIN_TASKS: dict[str, BuiltinTask] = {"sort_digits": SortDigits(), "add": AddNumbers(), "max_digit": MaxDigit(),
                                         "gsm8k_easy": WordProblems(), "calc_word_problems": CalculatorWordProblems(),
                                         "calc_word_problems_plain": CalculatorWordProblems(offer_tool=False),
                                         "word_order": WordOrder()}


def _prompt_key(prompt: str | list[dict[str, str]]) -> str:
    """A hashable form of a prompt (text, or chat messages) for the train / held-out disjointness check."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def is_builtin(source: str) -> bool:
    """Whether `data.source` names a built-in task rather than a file."""
    return source.startswith(BUILTIN_PREFIX)


def builtin_task(source: str) -> BuiltinTask:
    """The task named by `data.source=builtin:<name>`."""
    name = source.removeprefix(BUILTIN_PREFIX)
    if name not in BUILTIN_TASKS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_TASKS)
        raise UserError(f"data.source: unknown built-in task {source!r}; set one of {known}")
    return BUILTIN_TASKS[name]


def task_rows(task: BuiltinTask, num_examples: int, seed: int) -> list[dict[str, str]]:
    """`num_examples` rows of `task`; row i is a function of (seed, i) only."""
    # A string seed is hashed with SHA-512 by `random`, so it is stable across processes and platforms.
    return [task.example(random.Random(f"{seed}:{i}")) for i in range(num_examples)]


def held_out_rows(task: BuiltinTask, num_examples: int, seed: int, num_train: int) -> list[dict[str, str]]:
    """`num_examples` rows whose prompts are not among the first `num_train` (the training set), drawn from
    indices past `num_train` so they are as deterministic as the training rows."""
    train = {_prompt_key(row["prompt"]) for row in task_rows(task, num_train, seed)}
    rows, i = [], num_train
    # A task with few distinct prompts could be exhausted; stop well past any sensible search.
    while len(rows) < num_examples and i < num_train + 100 * num_examples:
        row = task.example(random.Random(f"{seed}:{i}"))
        if _prompt_key(row["prompt"]) not in train:
            train.add(_prompt_key(row["prompt"]))  # no repeats inside the validation set either
            rows.append(row)
        i += 1
    if len(rows) < num_examples:
        raise UserError(f"data.val_size: the built-in task has only {len(rows)} prompts outside the training "
                        f"set; set data.val_size<={len(rows)} or data.val_source to a file")
    return rows
