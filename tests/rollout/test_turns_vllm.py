"""The vLLM engine drives the same turns through the same code as the native one (hybridflow.rollout.turns over
`engine_sampler`), here over the fake vLLM `LLM` of test_vllm_engine (vLLM is not installed on CPU machines):
each turn's requests are the unfinished trajectories' whole token prefixes (observations included), each with
its own room, and finished trajectories send no more requests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.rollout.base import SamplingParams
from hybridflow.rollout.turns import TurnSettings, engine_sampler, episodes_to_batch, run_turns, start_episode
from hybridflow.token_kinds import TokenKind
from hybridflow.tools import EnvironmentStep
from hybridflow.tools.observation_tokens import observation_ids, render_ids
from tests.rollout.test_vllm_engine import fake_engine
from tests.tools.chat_tokenizers import qwen_style_tokenizer


@dataclass(frozen=True)
class AnswersUntil:
    """Answers with a tool message until the conversation has `row["turns"]` assistant turns."""

    name: str = "answers_until"
    tools: tuple[str, ...] = ()

    def step(self, messages: list[dict[str, str]], row: Mapping[str, Any]) -> EnvironmentStep:
        done = sum(m["role"] == "assistant" for m in messages) >= row["turns"]
        return EnvironmentStep(messages=[] if done else [{"role": "tool", "content": "42"}], done=done)


def test_vllm_engine_runs_the_turn_loop(tmp_path):
    tok = qwen_style_tokenizer(tmp_path)
    engine, llm, _ = fake_engine(seed_mode="per_request")
    settings = TurnSettings(environment=AnswersUntil(), tokenizer=tok, prompt_key="prompt", max_turns=3,
                            max_new_tokens=8, max_tool_tokens=16, budget=256)
    rows = [{"prompt_messages": [{"role": "user", "content": "What is 37 * 24?"}], "turns": n} for n in (1, 3)]
    episodes = [start_episode(render_ids(tok, r["prompt_messages"], add_generation_prompt=True), r, settings)
                for r in rows]
    sampling = SamplingParams(max_new_tokens=8, stop_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id)
    run_turns(episodes, engine_sampler(engine, sampling, tok.pad_token_id, torch.device("cpu")), settings)

    requests = [call[1] for call in llm.calls if call[0] == "generate"]
    assert [len(r) for r in requests] == [2, 1, 1]  # the one-turn trajectory left after its first turn
    turn = [7, 8, tok.eos_token_id]  # what the fake LLM samples
    long = episodes[1]
    prompt = render_ids(tok, rows[1]["prompt_messages"], add_generation_prompt=True)
    said = {"role": "assistant", "content": tok.decode(turn, skip_special_tokens=True)}
    messages = [*rows[1]["prompt_messages"], said]
    observation = observation_ids(tok, messages, turn, [{"role": "tool", "content": "42"}])
    assert long.tokens.ids == prompt + (turn + observation) * 2 + turn
    assert requests[2][0]["prompt_token_ids"] == prompt + (turn + observation) * 2  # the whole prefix
    params = [call[2] for call in llm.calls if call[0] == "generate"]
    assert params[1][0]["max_tokens"] == 8 and params[1][0]["seed"] != params[0][1]["seed"]  # a new draw per turn
    batch = episodes_to_batch(episodes, 256, tok.pad_token_id, torch.device("cpu"), with_logprobs=True)
    assert int((batch.token_kinds[1] == TokenKind.OBSERVATION).sum()) == 2 * len(observation)
    assert batch.logprobs[1][batch.loss_mask[1].bool()].tolist() == [-0.5] * 9
