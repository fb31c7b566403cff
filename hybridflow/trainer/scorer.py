"""The step's scores: a rule-based function on decoded text, or a reward model on its own ranks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from hybridflow.algorithms import last_masked_index
from hybridflow.config import ExperimentConfig
from hybridflow.data.step_batch import StepBatch
from hybridflow.placement import RoleMesh
from hybridflow.rewards import compute_scores, resolve_reward_fn, reward_inputs
from hybridflow.roles.model_role import ModelRole
from hybridflow.roles.replica_results import share_from_role
from hybridflow.token_kinds import response_extent


def rule_inputs(tokenizer: PreTrainedTokenizerBase, batch: StepBatch):
    """Decode prompts and responses of a right-padded batch for a reward function; the response is every
    response-side token (a trajectory's assistant turns and observations alike)."""
    cols = torch.arange(batch.tokens.shape[1])
    prompt_mask = (cols[None, :] < batch.prompt_lens[:, None]).long()
    return reward_inputs(tokenizer, batch.tokens, prompt_mask, batch.tokens, response_extent(batch.token_kinds),
                         batch.rows)


@dataclass
class Scorer:
    """Scores [B] in two halves, so that a reward model on its own ranks overlaps the other roles' stages:
    `local` computes what this rank can (the whole batch for a rule; its replica's rows on reward-model
    ranks, None elsewhere) and `share` later makes the full [B] scores the same on every rank.

    Precedence: a trajectory whose environment gave a reward (`rollout.environment`, EnvironmentStep.reward;
    its last one counts) is scored with that reward; `reward.fn` or the reward model scores the others (it is
    still called on the whole batch, so it must accept every row)."""

    local: Callable[[StepBatch], torch.Tensor | None]
    share_scores: Callable[[torch.Tensor | None, StepBatch], torch.Tensor]

    def share(self, local: torch.Tensor | None, batch: StepBatch) -> torch.Tensor:
        """The full [B] scores on every rank (collective), the environment's rewards where it gave them."""
        return with_environment_rewards(self.share_scores(local, batch), batch)


def with_environment_rewards(scores: torch.Tensor, batch: StepBatch) -> torch.Tensor:
    """`scores` with each trajectory's environment reward in place of its score where there is one."""
    if batch.env_rewards is None:
        return scores
    given = ~batch.env_rewards.isnan()
    return torch.where(given, batch.env_rewards.to(scores.dtype), scores)


def build_scorer(
    cfg: ExperimentConfig, tokenizer: PreTrainedTokenizerBase, reward_role: ModelRole | None,
    reward_mesh: RoleMesh | None, device: torch.device,
) -> Scorer:
    """The rule-based function named by `reward.fn`, or the reward model's scalar head."""
    if not cfg.reward.use_model:
        fn = resolve_reward_fn(cfg.reward.fn, cfg.data.source)
        return Scorer(lambda batch: compute_scores(fn, rule_inputs(tokenizer, batch)), lambda local, batch: local)

    def model_scores(batch: StepBatch) -> torch.Tensor | None:
        # The reward head's output at each sequence's last response-side token (the whole trajectory read) is
        # its score.
        if reward_role is None:
            return None
        rows = reward_role.local_rows(batch.size)
        out = reward_role.forward(batch.tensors(rows=rows), lambda logits, mb: logits[..., 0].float())
        return _at_last_response_token(out, response_extent(batch.token_kinds[rows]))[:, None]

    def share(local: torch.Tensor | None, batch: StepBatch) -> torch.Tensor:
        return share_from_role(local, reward_mesh, batch.size, (1,), torch.float32, device).cpu()[:, 0]

    return Scorer(model_scores, share)


def _at_last_response_token(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    last = last_masked_index(mask).clamp(min=0)  # an empty response reads column 0
    return per_token.cpu().gather(1, last[:, None].cpu())[:, 0]
