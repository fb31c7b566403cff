"""One trajectory's tokens as an engine's turn loop builds them: the prompt, then sampled assistant turns and
observations, kept as ids with a loss mask (1 on sampled assistant ids only) and per-turn segments, under one
token budget (`data.seq_length`). Ids are only ever appended: nothing here decodes or re-encodes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

PROMPT, ASSISTANT, OBSERVATION = "prompt", "assistant", "observation"


@dataclass(frozen=True)
class Segment:
    """ids[start:end] came from `source` (prompt, assistant or observation)."""

    source: str
    start: int
    end: int


@dataclass
class TrajectoryTokens:
    """Built by `TrajectoryTokens(prompt_ids, budget)`, then `add_assistant` / `add_observation` in turn order."""

    prompt_ids: Sequence[int]
    budget: int
    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.prompt_ids) > self.budget:
            raise ValueError(f"the prompt has {len(self.prompt_ids)} tokens, over the budget of {self.budget}")
        self._append(PROMPT, self.prompt_ids, 0)

    def _append(self, source: str, ids: Sequence[int], mask: int) -> None:
        start = len(self.ids)
        self.ids.extend(int(i) for i in ids)
        self.loss_mask.extend([mask] * len(ids))
        self.segments.append(Segment(source, start, len(self.ids)))

    @property
    def room(self) -> int:
        """Tokens left in the budget: the most the next turn may sample."""
        return self.budget - len(self.ids)

    @property
    def turns(self) -> int:
        """Assistant turns so far."""
        return sum(s.source == ASSISTANT for s in self.segments)

    def add_assistant(self, sampled_ids: Sequence[int]) -> None:
        """Append a turn's sampled ids verbatim (they carry the loss)."""
        if len(sampled_ids) > self.room:
            raise ValueError(f"{len(sampled_ids)} sampled tokens exceed the {self.room} left in the budget")
        self._append(ASSISTANT, sampled_ids, 1)

    def add_observation(self, ids: Sequence[int]) -> bool:
        """Append an observation's ids (hybridflow.tools.observation_tokens) if the next turn still has room
        to sample at least one token after it; False (nothing appended: the episode ends) otherwise."""
        if len(ids) >= self.room:
            return False
        self._append(OBSERVATION, ids, 0)
        return True

    def response_ids(self) -> list[int]:
        """Everything after the prompt (what the batch stores as the response)."""
        return self.ids[len(self.prompt_ids):]

    def observation_share(self) -> float:
        """The share of response tokens that are observations (a metric of the issue)."""
        response = len(self.ids) - len(self.prompt_ids)
        return sum(s.end - s.start for s in self.segments if s.source == OBSERVATION) / response if response else 0.0
