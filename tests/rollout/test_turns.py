"""The engine-independent turn loop (hybridflow.rollout.turns) with a scripted sampler in place of an engine:
trajectories equal the chat template's own rendering of the same messages token by token (the sampled ids
verbatim), finished trajectories leave the next turn's batch, the limits end episodes, tool errors become
counts, and the batch rows carry PROMPT / ASSISTANT / OBSERVATION kinds and log-probs on assistant tokens."""

from __future__ import annotations

import torch

from hybridflow.rollout.base import RolloutBatch
from hybridflow.rollout.turns import (
    TRAJECTORY_COLUMNS,
    SampledTurn,
    TurnSettings,
    engine_sampler,
    episodes_to_batch,
    run_turns,
    start_episode,
)
from hybridflow.token_kinds import TokenKind
from hybridflow.tools import environment_tools, get_environment
from hybridflow.tools.observation_tokens import render_ids
from tests.tools.chat_tokenizers import qwen_style_tokenizer

SYSTEM = {"role": "system", "content": "You are a helpful assistant. Use the calculator tool for arithmetic."}


def _call(expression: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


# Per episode, what the "model" writes each turn.
SCRIPTS = [
    [_call("37 * 24"), _call("888 + 12"), "The answer is 900.\n#### 900"],  # 3 turns, two tool calls
    ["#### 5"],  # answers at once
    [_call("37 *"), "#### 1"],  # a malformed expression: the calculator's error is the observation
    ['<tool_call>{"name": "abacus", "arguments": {}}</tool_call>', "#### 2"],  # an unknown tool
]


def _settings(tokenizer, **overrides) -> TurnSettings:
    env = get_environment("calculator")
    fields = dict(environment=env, tokenizer=tokenizer, prompt_key="prompt", max_turns=4, max_new_tokens=256,
                  max_tool_tokens=32, budget=1024, tools=environment_tools(env.name))
    return TurnSettings(**(fields | overrides))


def _episodes(tokenizer, settings, n=4):  # one per script
    rows = [{"prompt_messages": [SYSTEM, {"role": "user", "content": f"question {i}"}]} for i in range(n)]
    prompts = [render_ids(tokenizer, r["prompt_messages"], settings.tools, add_generation_prompt=True) for r in rows]
    return [start_episode(p, r, settings) for p, r in zip(prompts, rows, strict=True)]


class ScriptedSampler:
    """Answers each prefix with its episode's next scripted text, spelled one character at a time (a valid but
    non-canonical tokenization: re-encoding the history would merge it) and ending with the stop token."""

    def __init__(self, tokenizer, episodes, scripts=SCRIPTS):
        self.tok, self.episodes, self.scripts = tokenizer, episodes, scripts
        self.calls: list[tuple[int, list[int]]] = []  # (batch size, limits) per call
        self.sampled: dict[int, list[list[int]]] = {}

    def __call__(self, prefixes, max_tokens, turn):
        self.calls.append((len(prefixes), list(max_tokens)))
        out = []
        for prefix, limit in zip(prefixes, max_tokens, strict=True):
            index = next(i for i, e in enumerate(self.episodes) if e.tokens.ids == prefix)
            text = self.scripts[index][turn]
            ids = [i for ch in text for i in self.tok.encode(ch, add_special_tokens=False)]
            ids = (ids + [self.tok.eos_token_id])[:limit]
            self.sampled.setdefault(index, []).append(ids)
            out.append(SampledTurn(ids, [-0.5] * len(ids)))
        return out


def test_trajectories_equal_the_template_rendering_and_finished_ones_leave(tmp_path):
    tok = qwen_style_tokenizer(tmp_path)
    settings = _settings(tok)
    episodes = _episodes(tok, settings)
    sampler = ScriptedSampler(tok, episodes)
    run_turns(episodes, sampler, settings)
    assert [n for n, _ in sampler.calls] == [4, 3, 1]  # episode 1 ends after turn 1, 2 and 3 after turn 2
    for index, episode in enumerate(episodes):
        ids, segments = episode.tokens.ids, episode.tokens.segments
        # the sampled ids verbatim, turn by turn
        assert [ids[s.start:s.end] for s in segments if s.source == "assistant"] == sampler.sampled[index]
        # the observations: exactly what the template adds around each tool message (rendered independently)
        rendered = tok.apply_chat_template(episode.messages, tools=settings.tools, tokenize=False)
        assert tok.decode(ids) + "\n" == rendered  # the template writes a newline after the last <|im_end|>
        for s in segments:
            if s.source == "observation":
                text = tok.decode(ids[s.start:s.end])
                assert text.startswith("\n<|im_start|>user\n<tool_response>\n")
                assert text.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
        assert episode.counts["turns"] == len(SCRIPTS[index]) and episode.counts["ended_done"] == 1
    assert episodes[0].counts["tool_calls"] == 2 and not any(k.startswith("tool_errors") for k in episodes[0].counts)
    assert episodes[2].counts["tool_errors/exception"] == 1
    assert episodes[3].counts["tool_errors/unknown_tool"] == 1
    assert "1080" not in tok.decode(episodes[0].tokens.ids) and "900" in tok.decode(episodes[0].tokens.ids)
    assert "888" in tok.decode(episodes[0].tokens.ids[episodes[0].tokens.segments[2].start:])  # 37 * 24's result


def test_max_turns_and_budget_end_episodes(tmp_path):
    tok = qwen_style_tokenizer(tmp_path)
    settings = _settings(tok, max_turns=2)
    episodes = _episodes(tok, settings, n=1)
    run_turns(episodes, ScriptedSampler(tok, episodes), settings)
    assert episodes[0].counts["turns"] == 2 and episodes[0].counts["ended_max_turns"] == 1
    assert [s.source for s in episodes[0].tokens.segments] == ["prompt", "assistant", "observation", "assistant"]

    # A budget with room for the first turn but not for its observation plus one more token.
    prompt_len = len(_episodes(tok, _settings(tok), n=1)[0].tokens.ids)
    first = len(tok.encode(_call("37 * 24"))) + 1
    settings = _settings(tok, budget=prompt_len + first + 5)
    episodes = _episodes(tok, settings, n=1)
    sampler = ScriptedSampler(tok, episodes)
    run_turns(episodes, sampler, settings)
    assert sampler.calls[0][1] == [first + 5]  # a turn samples at most the room left
    assert episodes[0].counts["ended_budget"] == 1 and episodes[0].counts["turns"] == 1
    assert len(episodes[0].tokens.ids) <= settings.budget


def test_long_tool_output_is_truncated_in_the_middle(tmp_path):
    tok = qwen_style_tokenizer(tmp_path)
    settings = _settings(tok, max_tool_tokens=4)
    episodes = _episodes(tok, settings, n=1)
    big = "123456789 * 987654321 * 123456789 * 987654321"  # 14867566530049990397812181822702361
    run_turns(episodes, ScriptedSampler(tok, episodes, [[_call(big), "#### 1"]]), settings)
    reply = episodes[0].messages[3]["content"]
    head, tail = tok.decode(tok.encode("14867566530049990397812181822702361")[:2]), tok.decode(
        tok.encode("14867566530049990397812181822702361")[-2:])
    assert reply.startswith(head + "\n[... ") and reply.endswith(" tokens truncated ...]\n" + tail)
    observation = episodes[0].tokens.segments[2]
    assert "truncated" in tok.decode(episodes[0].tokens.ids[observation.start:observation.end])


def test_batch_rows_carry_kinds_and_assistant_logprobs(tmp_path):
    tok = qwen_style_tokenizer(tmp_path)
    settings = _settings(tok)
    episodes = _episodes(tok, settings)
    run_turns(episodes, ScriptedSampler(tok, episodes), settings)
    batch = episodes_to_batch(episodes, 1024, tok.pad_token_id, torch.device("cpu"), with_logprobs=True)
    for row, episode in enumerate(episodes):
        n = len(episode.tokens.ids)
        assert batch.tokens[row, :n].tolist() == episode.tokens.ids
        assert (batch.tokens[row, n:] == tok.pad_token_id).all() and (batch.token_kinds[row, n:] == 0).all()
        assert batch.loss_mask[row].tolist()[:n] == episode.tokens.loss_mask
        for s in episode.tokens.segments:
            want = {"prompt": TokenKind.PROMPT, "assistant": TokenKind.ASSISTANT,
                    "observation": TokenKind.OBSERVATION}[s.source]
            assert (batch.token_kinds[row, s.start:s.end] == want).all()
        assert torch.equal(batch.logprobs[row] != 0, batch.loss_mask[row].bool())
    assert batch.prompt_lens.tolist() == [len(e.tokens.prompt_ids) for e in episodes]
    assert len(episodes[0].stats()) == len(TRAJECTORY_COLUMNS)


class LengthEngine:
    """A stand-in engine with the `generate` contract: row b samples token 7 at columns
    [prompt_len, min(prompt_len + max_new_tokens, width)), log-prob -1."""

    def __init__(self):
        self.seeds = []

    def generate(self, batch: RolloutBatch, sampling):
        self.seeds.append(sampling.seed)
        tokens, width = batch.tokens.clone(), batch.tokens.shape[1]
        kinds = torch.zeros_like(tokens)
        logprobs = torch.zeros(tokens.shape)
        for b, n in enumerate(batch.prompt_lens.tolist()):
            end = min(n + sampling.max_new_tokens, width)
            kinds[b, :n], tokens[b, n:end], kinds[b, n:end], logprobs[b, n:end] = 1, 7, 2, -1.0
        return RolloutBatch(tokens, batch.prompt_lens, kinds, logprobs)


def test_engine_sampler_gives_each_prefix_its_own_limit():
    from hybridflow.rollout.base import SamplingParams

    engine = LengthEngine()
    sample = engine_sampler(engine, SamplingParams(max_new_tokens=8, seed=3), 0, torch.device("cpu"))
    out = sample([[1, 2, 3], [1] * 10, [4]], [8, 2, 5], 0)
    assert [len(t.ids) for t in out] == [8, 2, 5] and all(t.logprobs == [-1.0] * len(t.ids) for t in out)
    sample([[1]], [1], 1)
    assert engine.seeds[0] != engine.seeds[1]  # each turn its own draw
