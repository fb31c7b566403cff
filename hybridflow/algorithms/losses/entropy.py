"""Token entropy from full-vocabulary logits: the single-device reference for the model side's
vocab-parallel entropy (which the entropy bonus in actor_critic.py consumes)."""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) - sum(softmax(z) * z) over the last dim, computed stably in fp32."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
