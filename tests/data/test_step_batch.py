"""StepBatch.trim_columns: padding-only columns go, every real token stays."""

import copy
import pickle

import torch

from hybridflow.data.step_batch import StepBatch
from tests.single_turn import single_turn_kinds


def _batch(prompt_lens, response_lens, width):
    tokens = torch.zeros(len(prompt_lens), width, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for row, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        tokens[row, : p + r] = torch.arange(1, p + r + 1)
        mask[row, p : p + r] = 1
    return StepBatch(rows=[{}] * len(prompt_lens), tokens=tokens, prompt_lens=torch.tensor(prompt_lens),
                     token_kinds=single_turn_kinds(torch.tensor(prompt_lens), mask), rollout_logprobs=-mask.float())


def test_trim_keeps_the_longest_sample_rounded_up_to_the_multiple():
    batch = _batch([3, 10], [5, 60], width=200)  # the longest sample uses 70 columns
    before = batch.tokens.clone()
    batch.trim_columns(multiple=64, max_len=200)
    assert batch.tokens.shape == batch.token_kinds.shape == batch.rollout_logprobs.shape == (2, 128)
    assert torch.equal(batch.tokens, before[:, :128])
    assert int(batch.loss_mask.sum()) == 65 and batch.seq_lens.tolist() == [8, 70]


def test_trim_never_grows_past_the_configured_length():
    batch = _batch([3], [90], width=100)
    batch.trim_columns(multiple=64, max_len=100)
    assert batch.tokens.shape[1] == 100


def test_a_batch_pickled_with_a_response_mask_loads_with_its_token_kinds():
    new = _batch([3, 2], [4, 6], width=12)
    old = copy.copy(new)
    del old.__dict__["token_kinds"]
    old.__dict__["response_mask"] = new.loss_mask  # what a lag-1 checkpoint of c9eafa2 holds
    loaded = pickle.loads(pickle.dumps(old))
    assert torch.equal(loaded.token_kinds, new.token_kinds) and "response_mask" not in vars(loaded)
    assert loaded.seq_lens.tolist() == [7, 8]
