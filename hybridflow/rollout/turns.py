"""The multi-turn loop both engines run (`rollout.environment`): per trajectory, sample an assistant turn, let
the environment answer it, append the observation's ids, and continue the unfinished trajectories; finished
ones leave the next turn's batch. Engine-independent: an engine enters only through a `Sampler` ("sample
these prefixes, up to n tokens each"); `engine_sampler` makes one from any `RolloutEngine.generate`.

Token-in-token-out (hybridflow.tools.observation_tokens): the sampled ids go into the trajectory verbatim;
the decoded text of a turn is only what the environment reads and what the template renders to measure the
observation's ids. A trajectory ends when the environment says so (a turn without a tool call), after
`max_turns` assistant turns, or when its budget (data.seq_length) has no room for the observation and one
more sampled token. The engine's log-probs of every assistant token are kept for the parity gate.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from hybridflow.errors import UserError
from hybridflow.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from hybridflow.token_kinds import TokenKind
from hybridflow.tools import EnvironmentRecord
from hybridflow.tools.invocation import EXCEPTION, MALFORMED, TIMEOUT, TOO_MANY_CALLS, UNKNOWN_TOOL
from hybridflow.tools.observation_tokens import observation_ids
from hybridflow.tools.trajectory import ASSISTANT, OBSERVATION, PROMPT, TrajectoryTokens
from hybridflow.tools.truncation import truncate_middle

# How a trajectory ended (the `turns/ended_<reason>` metrics).
ENDED_DONE, ENDED_MAX_TURNS, ENDED_BUDGET = "done", "max_turns", "budget"
# Per-trajectory counts, in this column order wherever they travel as a tensor (RolloutRole.share).
TURN_STATS = ("turns", "tool_calls", *(f"tool_errors/{kind}" for kind in
                                       (MALFORMED, UNKNOWN_TOOL, EXCEPTION, TIMEOUT, TOO_MANY_CALLS)),
              *(f"ended_{reason}" for reason in (ENDED_DONE, ENDED_MAX_TURNS, ENDED_BUDGET)))
# What travels per trajectory besides its tokens (RolloutRole.share), one column each: the counts, then the
# environment's reward (NaN where it gave none).
ENV_REWARD = "env_reward"
TRAJECTORY_COLUMNS = (*TURN_STATS, ENV_REWARD)
_KINDS = {PROMPT: TokenKind.PROMPT, ASSISTANT: TokenKind.ASSISTANT, OBSERVATION: TokenKind.OBSERVATION}
# Each turn's engine call draws from its own seed (the native engine seeds one generator per call).
TURN_SEED_STRIDE = 104729


@dataclass(frozen=True)
class SampledTurn:
    """One prefix's sampled ids (verbatim, ending with the stop id when it stopped) and their log-probs."""

    ids: list[int]
    logprobs: list[float]


# sample(prefixes, max_tokens, turn) -> one SampledTurn per prefix, at most max_tokens[i] ids for prefix i.
Sampler = Callable[[list[list[int]], list[int], int], list[SampledTurn]]


@dataclass(frozen=True)
class TurnSettings:
    """What the loop needs besides the engine: the environment, the tokenizer whose chat template renders the
    observations, the tool schemas the prompts were rendered with (`tools`, None: none), and the limits."""

    environment: EnvironmentRecord
    tokenizer: PreTrainedTokenizerBase
    prompt_key: str
    max_turns: int
    max_new_tokens: int  # per assistant turn
    max_tool_tokens: int  # per tool response
    budget: int  # tokens per trajectory, data.seq_length
    tools: list[dict] | None = None


@dataclass
class Episode:
    """One trajectory in progress: its conversation (assistant turns as decoded text), its tokens, the
    engine's log-prob of each of its tokens (0 off the assistant turns) and its counts (`TURN_STATS`)."""

    row: Mapping[str, Any]
    messages: list[dict[str, Any]]
    tokens: TrajectoryTokens
    logprobs: list[float]
    counts: Counter[str] = field(default_factory=Counter)
    reward: float | None = None  # the environment's, when it gives one

    def stats(self) -> list[float]:
        """The counts and the environment's reward (NaN: none), in `TRAJECTORY_COLUMNS` order."""
        reward = float("nan") if self.reward is None else float(self.reward)
        return [*(float(self.counts[name]) for name in TURN_STATS), reward]


def check_chat_rows(rows: Sequence[Mapping[str, Any]], environment: str, prompt_key: str) -> None:
    """Every row (as the prompt loader leaves it) keeps the chat messages its prompt was rendered from, which an
    episode starts from; raises UserError naming the fix."""
    if any(f"{prompt_key}_messages" not in row for row in rows):
        raise UserError(f"rollout.environment: {environment!r} needs chat prompts, but data.prompt_key="
                        f"{prompt_key!r} holds text; store the prompt as a list of {{role, content}} messages, or "
                        "set rollout.environment=null")


def start_episode(prompt_ids: Sequence[int], row: Mapping[str, Any], settings: TurnSettings) -> Episode:
    """An episode from a prompt's ids (as the batch holds them) and its dataset row, whose
    `<prompt_key>_messages` are the chat messages the prompt was rendered from (hybridflow.data.chat)."""
    check_chat_rows([row], settings.environment.name, settings.prompt_key)
    messages = row[f"{settings.prompt_key}_messages"]
    tokens = TrajectoryTokens(list(prompt_ids), settings.budget)
    return Episode(row, [dict(m) for m in messages], tokens, [0.0] * len(tokens.ids))


def _step(episode: Episode, turn: SampledTurn, settings: TurnSettings) -> bool:
    """Append a sampled turn and the environment's answer; True when the episode continues."""
    tok = settings.tokenizer
    episode.tokens.add_assistant(turn.ids)
    episode.logprobs.extend(turn.logprobs)
    episode.counts["turns"] += 1
    episode.messages.append({"role": "assistant", "content": tok.decode(turn.ids, skip_special_tokens=True)})
    # The environment reads every turn, the last one too (it may end the episode with a reward then).
    step = settings.environment.step(episode.messages, episode.row)
    episode.counts.update(step.metrics)
    if step.reward is not None:
        episode.reward = step.reward
    if step.done:
        episode.counts[f"ended_{ENDED_DONE}"] += 1
        return False
    if episode.counts["turns"] >= settings.max_turns:  # its answer is not appended: no turn would read it
        episode.counts[f"ended_{ENDED_MAX_TURNS}"] += 1
        return False
    replies = [{**m, "content": truncate_middle(m["content"], settings.max_tool_tokens, tok)} for m in step.messages]
    ids = observation_ids(tok, episode.messages, turn.ids, replies, settings.tools)
    if not episode.tokens.add_observation(ids):
        episode.counts[f"ended_{ENDED_BUDGET}"] += 1
        return False
    episode.logprobs.extend([0.0] * len(ids))
    episode.messages.extend(replies)
    return True


def run_turns(episodes: list[Episode], sample: Sampler, settings: TurnSettings) -> list[Episode]:
    """Drive `episodes` to their ends: each round samples one turn for every unfinished episode at once."""
    active = list(range(len(episodes)))
    turn = 0
    while active:
        prefixes = [episodes[i].tokens.ids for i in active]
        limits = [min(settings.max_new_tokens, episodes[i].tokens.room) for i in active]
        if min(limits) < 1:  # an episode without room was ended before its observation was appended
            raise RuntimeError("run_turns: an unfinished trajectory has no room left to sample")
        sampled = sample(prefixes, limits, turn)
        active = [i for i, out in zip(active, sampled, strict=True) if _step(episodes[i], out, settings)]
        turn += 1
    return episodes


def episodes_to_batch(episodes: Sequence[Episode], width: int, pad_token_id: int, device: torch.device,
                      with_logprobs: bool) -> RolloutBatch:
    """The rollout batch of finished episodes: each row its trajectory's ids right-padded to `width`, the
    token kinds of its segments, and the engine's log-probs on its assistant tokens."""
    tokens = torch.full((len(episodes), width), pad_token_id, dtype=torch.long)
    kinds = torch.zeros((len(episodes), width), dtype=torch.long)
    logprobs = torch.zeros((len(episodes), width), dtype=torch.float32)
    for row, episode in enumerate(episodes):
        ids = episode.tokens.ids
        tokens[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        logprobs[row, : len(ids)] = torch.tensor(episode.logprobs, dtype=torch.float32)
        for segment in episode.tokens.segments:
            kinds[row, segment.start : segment.end] = int(_KINDS[segment.source])
    prompt_lens = torch.tensor([len(e.tokens.prompt_ids) for e in episodes], dtype=torch.long)
    return RolloutBatch(tokens.to(device), prompt_lens.to(device), kinds.to(device),
                        logprobs.to(device) if with_logprobs else None)


def environment_rewards(stats: torch.Tensor) -> torch.Tensor:
    """[B] the environment's reward of each trajectory (NaN where it gave none) from its columns
    ([B, len(TRAJECTORY_COLUMNS)])."""
    return stats[:, TRAJECTORY_COLUMNS.index(ENV_REWARD)]


def turn_metrics(stats: torch.Tensor) -> dict[str, float]:
    """Step metrics of a batch's per-trajectory columns ([B, len(TRAJECTORY_COLUMNS)]): turns and tool calls
    per trajectory, the share of trajectories that called a tool, tool errors per call and by kind, the share
    of trajectories each ending took, and the share the environment rewarded itself."""
    column = {name: stats[:, i] for i, name in enumerate(TRAJECTORY_COLUMNS)}
    calls = float(column["tool_calls"].sum())
    errors = {name: float(c.sum()) for name, c in column.items() if name.startswith("tool_errors/")}
    out = {"turns/per_trajectory": float(column["turns"].mean()), "turns/max": float(column["turns"].max()),
           "tools/calls_per_trajectory": float(column["tool_calls"].mean()),
           "tools/calling_share": float((column["tool_calls"] > 0).float().mean()),
           "tools/errors_per_call": sum(errors.values()) / calls if calls else 0.0,
           "turns/env_rewarded": float((~column[ENV_REWARD].isnan()).float().mean())}
    out |= {f"tools/errors/{name.removeprefix('tool_errors/')}": n for name, n in errors.items()}
    out |= {f"turns/{name}": float(c.mean()) for name, c in column.items() if name.startswith("ended_")}
    return out


def engine_sampler(engine: RolloutEngine, sampling: SamplingParams, pad_token_id: int,
                   device: torch.device) -> Sampler:
    """A `Sampler` over an engine's `generate`: the prefixes become a right-padded prompt batch as wide as the
    longest prefix plus its limit, sampled with max_new_tokens = the largest limit. The engine stops a row at
    min(prefix + max_new_tokens, width): with the loop's limits, min(max_new_tokens, room left in one shared
    budget), that is each row's own limit (a row limited by its room reaches the budget, which is the width).
    A row given a smaller limit otherwise keeps its first `limit` ids. Each turn draws from its own seed."""

    def sample(prefixes: list[list[int]], max_tokens: list[int], turn: int) -> list[SampledTurn]:
        width = max(len(p) + n for p, n in zip(prefixes, max_tokens, strict=True))
        tokens = torch.full((len(prefixes), width), pad_token_id, dtype=torch.long)
        for row, prefix in enumerate(prefixes):
            tokens[row, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
        lens = torch.tensor([len(p) for p in prefixes], dtype=torch.long)
        turn_sampling = replace(sampling, max_new_tokens=max(max_tokens),
                                seed=sampling.seed + TURN_SEED_STRIDE * turn)
        out = engine.generate(RolloutBatch(tokens.to(device), lens.to(device)), turn_sampling)
        sampled = (out.token_kinds == TokenKind.ASSISTANT).cpu()
        ids, logps = out.tokens.cpu(), out.logprobs.cpu() if out.logprobs is not None else None
        turns = []
        for row, limit in enumerate(max_tokens):
            row_ids = ids[row][sampled[row]].tolist()[:limit]
            row_logps = logps[row][sampled[row]].tolist()[:limit] if logps is not None else [0.0] * len(row_ids)
            turns.append(SampledTurn(row_ids, row_logps))
        return turns

    return sample
