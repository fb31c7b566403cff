"""Token-in-token-out: a 3-turn tool trajectory built from sampled ids and the ids `observation_ids` returns
equals, token by token, the chat template's own rendering of the same messages; sampled ids are kept verbatim.
Real SmolLM2-135M-Instruct tokenizer and template, and a Qwen2-style template on a tiny BPE tokenizer."""

from __future__ import annotations

import pytest

from hybridflow.data import load_tokenizer
from hybridflow.tools.calculator import CALCULATOR
from hybridflow.tools.observation_tokens import TemplateMismatch, observation_ids, render_ids
from hybridflow.tools.trajectory import TrajectoryTokens
from tests.packaged_model import smollm2_checkpoint
from tests.tools.chat_tokenizers import QWEN_STYLE_TEMPLATE, qwen_style_tokenizer


def _call(expression: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


PROMPT = [{"role": "system", "content": "You are a helpful assistant. Use the calculator tool for arithmetic."},
          {"role": "user", "content": "A box holds 24 pencils and the school orders 37 boxes, then 12 more."}]
# Each turn: what the assistant wrote, then the observation messages that answer it (none after the last).
TURNS = [(_call("37 * 24"), [{"role": "tool", "content": "888"}]),
         (_call("888 + 12 * 24") + "\n" + _call("12 * 24"),
          [{"role": "tool", "content": "1176"}, {"role": "tool", "content": "288"}]),
         ("The school has 1176 pencils.\n#### 1176", [])]


def _sample(tokenizer, text: str) -> list[int]:
    """Stand-in for the engine: the turn's ids as the model would emit them, ending with the stop token."""
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


def _trajectory(tokenizer, tools=None, sample=_sample):
    messages = list(PROMPT)
    trajectory = TrajectoryTokens(render_ids(tokenizer, messages, tools, add_generation_prompt=True), budget=4096)
    sampled_turns = []
    for text, replies in TURNS:
        sampled = sample(tokenizer, text)
        sampled_turns.append(sampled)
        trajectory.add_assistant(sampled)
        messages.append({"role": "assistant", "content": text})
        if replies:
            assert trajectory.add_observation(observation_ids(tokenizer, messages, sampled, replies, tools))
            messages.extend(replies)
    return trajectory, messages, sampled_turns


def _assert_matches_template(tokenizer, tools=None):
    trajectory, messages, sampled_turns = _trajectory(tokenizer, tools)
    rendered = render_ids(tokenizer, messages, tools)
    n = len(trajectory.ids)
    for i, (got, want) in enumerate(zip(trajectory.ids, rendered, strict=False)):
        assert got == want, f"token {i}: {tokenizer.convert_ids_to_tokens([got, want])}"
    # The rendering goes on only with the newline the template writes after the last <|im_end|>.
    assert tokenizer.convert_ids_to_tokens(rendered[n:]) == ["Ċ"]
    # Every assistant turn is followed by that newline, then the next turn's <|im_start|>.
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    for segment in trajectory.segments[1:-1]:
        if segment.source == "assistant":
            assert trajectory.ids[segment.end - 1] == tokenizer.eos_token_id
            assert tokenizer.convert_ids_to_tokens(trajectory.ids[segment.end]) == "Ċ"
            assert trajectory.ids[segment.end + 1] == im_start
    sampled = [trajectory.ids[s.start:s.end] for s in trajectory.segments if s.source == "assistant"]
    assert sampled == sampled_turns
    assert trajectory.loss_mask == [int(s.source == "assistant") for s in trajectory.segments
                                    for _ in range(s.end - s.start)]
    return trajectory


def test_smollm2_three_turn_trajectory_equals_template_rendering():
    tokenizer = load_tokenizer(smollm2_checkpoint())
    trajectory = _assert_matches_template(tokenizer)
    assert trajectory.turns == 3 and 0 < trajectory.observation_share() < 1


def test_qwen_style_template_with_tools_and_grouped_tool_results(tmp_path):
    tokenizer = qwen_style_tokenizer(tmp_path)
    tools = [CALCULATOR.schema()]
    trajectory = _assert_matches_template(tokenizer, tools)
    text = tokenizer.decode(render_ids(tokenizer, PROMPT, tools))
    assert '"name": "calculator"' in text and "<tools>" in text  # the schema reached the template
    # The second turn's two results were rendered together: one user turn holding both responses.
    second = [s for s in trajectory.segments if s.source == "observation"][1]
    observed = tokenizer.decode(trajectory.ids[second.start:second.end])
    assert observed == ("\n<|im_start|>user\n<tool_response>\n1176\n</tool_response>\n<tool_response>\n288\n"
                        "</tool_response><|im_end|>\n<|im_start|>assistant\n")


def test_sampled_ids_are_kept_verbatim_not_retokenized():
    tokenizer = load_tokenizer(smollm2_checkpoint())

    def one_char_at_a_time(tok, text):  # a valid but non-canonical tokenization the model could sample
        return [i for ch in text for i in tok.encode(ch, add_special_tokens=False)] + [tok.eos_token_id]

    canonical, _, _ = _trajectory(tokenizer)
    spelled, _, sampled_turns = _trajectory(tokenizer, sample=one_char_at_a_time)
    assert [spelled.ids[s.start:s.end] for s in spelled.segments if s.source == "assistant"] == sampled_turns
    assert len(spelled.ids) > len(canonical.ids)  # re-encoding the history would have merged them back

    def observations(t):
        return [t.ids[s.start:s.end] for s in t.segments if s.source == "observation"]

    assert observations(spelled) == observations(canonical)


def test_turn_cut_before_its_stop_token_gets_the_whole_closing():
    tokenizer = load_tokenizer(smollm2_checkpoint())
    messages = [*PROMPT, {"role": "assistant", "content": _call("2 + 2")}]
    cut = tokenizer.encode(_call("2 + 2"), add_special_tokens=False)  # stopped on max tokens: no <|im_end|>
    ids = observation_ids(tokenizer, messages, cut, [{"role": "tool", "content": "4"}])
    assert tokenizer.convert_ids_to_tokens(ids[:3]) == ["<|im_end|>", "Ċ", "<|im_start|>"]
    assert tokenizer.decode(ids[2:]) == "<|im_start|>tool\n4<|im_end|>\n<|im_start|>assistant\n"


def test_template_rewriting_earlier_turns_is_refused(tmp_path):
    # Like templates that drop earlier reasoning: an assistant turn followed by more messages is shortened.
    rewriting = QWEN_STYLE_TEMPLATE.replace(
        "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}",
        "{{- '<|im_start|>' + m['role'] + '\\n' + (m['content'] if loop.last else m['content'][:5]) "
        "+ '<|im_end|>\\n' }}")
    assert rewriting != QWEN_STYLE_TEMPLATE
    tokenizer = qwen_style_tokenizer(tmp_path, rewriting)
    messages = [*PROMPT, {"role": "assistant", "content": _call("3 * 3")}]
    with pytest.raises(TemplateMismatch, match="data.tokenizer"):
        observation_ids(tokenizer, messages, _sample(tokenizer, _call("3 * 3")), [{"role": "tool", "content": "9"}])
