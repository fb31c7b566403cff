"""The native engine driving multi-turn trajectories (hybridflow.rollout.turns through `engine_sampler`) at TP 1
and TP 2 (gloo): the log-probs it returns for every assistant token of every turn equal Hugging Face's
log-softmax over the whole trajectory (prompt, earlier turns and observations as context), the quantity the
trainer recomputes and the parity gate compares; observation tokens carry none."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from hybridflow.tools import EnvironmentStep
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model
from tests.tools.chat_tokenizers import qwen_style_tokenizer

QUESTIONS = ("What is 37 * 24?", "A box holds 24 pencils.", "What is 2?")
TEMPERATURE = 0.8


@dataclass(frozen=True)
class AlwaysAnswers:
    """An environment that answers every turn with the same tool message (never ends the episode itself)."""

    name: str = "always_answers"
    tools: tuple[str, ...] = ()

    def step(self, messages: list[dict[str, str]], row: Mapping[str, Any]) -> EnvironmentStep:
        return EnvironmentStep(messages=[{"role": "tool", "content": "888"}], done=False)


def _turns(hf_dir: str, tok_dir: str, tp: int):
    from transformers import AutoTokenizer

    from hybridflow.rollout.base import SamplingParams
    from hybridflow.rollout.megatron_engine import MegatronRolloutEngine
    from hybridflow.rollout.turns import TurnSettings, engine_sampler, run_turns, start_episode
    from hybridflow.tools.observation_tokens import render_ids
    from megatron_adapters.hf_safetensors import load_hf_weights
    from megatron_adapters.model import build_gpt, model_shape
    from megatron_adapters.process_groups import build_role_groups

    pgs = build_role_groups(list(range(tp)), tp=tp, pp=1, dp=1)
    model = build_gpt(hf_dir, pgs, spec="decode")
    load_hf_weights(model, hf_dir)
    engine = MegatronRolloutEngine(model, pgs.tp, model_shape(hf_dir).vocab_size)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    settings = TurnSettings(environment=AlwaysAnswers(), tokenizer=tok, prompt_key="prompt", max_turns=3,
                            max_new_tokens=6, max_tool_tokens=16, budget=160)
    rows = [{"prompt_messages": [{"role": "user", "content": q}]} for q in QUESTIONS]
    episodes = [start_episode(render_ids(tok, r["prompt_messages"], add_generation_prompt=True), r, settings)
                for r in rows]
    sampling = SamplingParams(max_new_tokens=6, temperature=TEMPERATURE, stop_token_ids=(tok.eos_token_id,),
                              pad_token_id=tok.pad_token_id, seed=11)
    run_turns(episodes, engine_sampler(engine, sampling, tok.pad_token_id, torch.device("cpu")), settings)
    return [(e.tokens.ids, e.tokens.loss_mask, e.logprobs, e.counts["turns"]) for e in episodes]


@pytest.fixture(scope="module")
def model_and_tokenizer(tmp_path_factory):
    tok_dir = tmp_path_factory.mktemp("tok")
    tok = qwen_style_tokenizer(tok_dir)
    path = tmp_path_factory.mktemp("tiny_llama")
    hf = save_tiny_model("llama", path, seed=5, vocab_size=len(tok), max_position_embeddings=256)
    return str(path), hf, str(tok_dir)


@pytest.mark.parametrize("tp", [1, 2])
def test_every_turns_logprobs_match_hf_over_the_whole_trajectory(model_and_tokenizer, tp):
    hf_dir, hf, tok_dir = model_and_tokenizer
    results = run_distributed(_turns, world_size=tp, args=(hf_dir, tok_dir, tp))[0]
    for ids, mask, logprobs, turns in results:
        assert turns == 3 and sum(mask) > 0
        mask_t, logp_t = torch.tensor(mask, dtype=torch.bool), torch.tensor(logprobs)
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0].float() / TEMPERATURE
        want = torch.log_softmax(logits, -1)[:-1].gather(-1, torch.tensor(ids)[1:, None])[:, 0]
        torch.testing.assert_close(logp_t[1:][mask_t[1:]], want[mask_t[1:]], atol=1e-4, rtol=0)
        assert (logp_t[~mask_t] == 0).all()  # prompt and observation tokens: no engine log-prob
        # every turn after the first saw an observation before it
        starts = [i for i in range(1, len(mask)) if mask[i] and not mask[i - 1]]
        assert len(starts) == 3 and all(not any(mask[a - 3:a]) for a in starts[1:])
