"""The step's scores: a rule-based function on decoded text, or a reward model on its own ranks."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hybridflow.config import ExperimentConfig
from hybridflow.placement import RoleMesh
from hybridflow.rewards import compute_scores, resolve_reward_fn, reward_inputs
from hybridflow.roles.exchange import share_from_role
from hybridflow.roles.model_role import ModelRole
from hybridflow.trainer.batch import StepBatch


def rule_inputs(tokenizer, batch: StepBatch):
    """Decode prompts and responses of a right-padded batch for a reward function."""
    cols = torch.arange(batch.tokens.shape[1])
    prompt_mask = (cols[None, :] < batch.prompt_lens[:, None]).long()
    return reward_inputs(tokenizer, batch.tokens, prompt_mask, batch.tokens, batch.response_mask, batch.rows)


def build_score_fn(
    cfg: ExperimentConfig, tokenizer, reward_role: ModelRole | None, reward_mesh: RoleMesh | None,
    device: torch.device,
) -> Callable[[StepBatch], torch.Tensor]:
    """Scores [B] for a batch, the same on every rank."""
    if not cfg.reward.use_model:
        fn = resolve_reward_fn(cfg.reward.fn, cfg.data.source)
        return lambda batch: compute_scores(fn, rule_inputs(tokenizer, batch))

    def model_scores(batch: StepBatch) -> torch.Tensor:
        # The reward head's output at each sequence's last response token is its score.
        local = None
        if reward_role is not None:
            rows = reward_role.local_rows(batch.size)
            out = reward_role.forward(batch.tensors(rows=rows), lambda logits, mb: logits[..., 0].float())
            local = _at_last_response_token(out, batch.response_mask[rows])[:, None]
        return share_from_role(local, reward_mesh, batch.size, (1,), torch.float32, device).cpu()[:, 0]

    return model_scores


def _at_last_response_token(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    cols = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), cols, 0).max(dim=1).values
    return per_token.cpu().gather(1, last[:, None].cpu())[:, 0]
