"""The loss the role tests train with: mean negative log-likelihood of the micro-batch's tokens."""

import torch


def nll_loss(role):
    """`ModelRole.train`'s loss function for `role`: mean NLL, with the token count and NLL sum as metrics."""

    def fn(logits, mb):
        lp = role.logprobs(logits, mb["input_ids"])
        tokens = float(lp.numel())
        return -lp.sum() / tokens, {"num_tokens": torch.tensor(tokens), "nll": -lp.sum().detach()}

    return fn
