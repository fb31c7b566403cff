"""Loss aggregation: hand-computed numerators, and gradients that depend neither on the micro-batch size
(where the old mean of micro-batch means does) nor on DP nor on sequence packing (replicas packing different
numbers of micro-batches), under megatron-core's real schedule and DDP (CPU, gloo)."""

import pytest
import torch

from hybridflow.algorithms import loss_agg
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model, token_batch

LOSS = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(("mode", "num", "count"), [
    ("token-mean", 1 + 2 + 3 + 4, 4),  # 10 / 4 tokens
    ("seq-mean-token-mean", 2.0 + 4.0, 2),  # (mean 2, mean 4) / 2 sequences
    ("seq-mean-token-sum", 6.0 + 4.0, 2),  # (sum 6, sum 4) / 2 sequences
])
def test_numerators_and_counts_by_hand(mode, num, count):
    assert loss_agg.numerator(LOSS, MASK, mode).item() == pytest.approx(num)
    assert loss_agg.local_count(MASK, mode).item() == count


def test_scale_undoes_megatrons_averaging():
    # 4 micro-batches (fixed-size or packed), 2 replicas, 40 tokens in the mini-batch
    assert loss_agg.micro_batch_scale(4, 2, 40.0) == pytest.approx(4 * 2 / 40)
    assert loss_agg.micro_batch_scale(1, 1, 0.0) == 1.0  # one micro-batch; an empty batch divides by 1


def _grads(hf_dir: str, ids: torch.Tensor, mask: torch.Tensor, mode: str) -> dict:
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import OptimizerSettings, build_model_role
    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.process_groups import build_role_groups

    groups = build_role_groups([0], tp=1, pp=1, dp=1)
    out = {}
    for micro in (1, 2, 4):
        mesh = RoleMesh("actor", (0,), ParallelDims(1, 1, 1))
        role = build_model_role("actor", mesh, groups, hf_dir, "lm", torch.float32,
                                micro, optimizer=OptimizerSettings(lr=1e-3), seed=1)
        micro_batches = role.micro_batches({"input_ids": ids, "mask": mask})
        scale = loss_agg.micro_batch_scale(len(micro_batches), 1, float(loss_agg.local_count(mask, mode)))
        for name, agg in (("agg", True), ("mean_of_means", False)):

            def loss_fn(logits, mb, agg=agg, role=role, scale=scale):
                token_loss = -role.logprobs(logits, mb["input_ids"])
                m = mb["mask"]  # logprobs come back [B, T], aligned with the tokens
                if agg:
                    return loss_agg.numerator(token_loss, m, mode) * scale, {}
                return (token_loss * m).sum() / m.sum(), {}

            role.model.train()
            role.optimizer.zero_grad()
            run_forward_backward([role.model], groups, micro_batches, loss_fn)
            out[(micro, name)] = torch.cat([p.main_grad.flatten().clone() for p in role.model.parameters()])
    return out


@pytest.mark.parametrize("mode", loss_agg.LOSS_AGG_MODES)
def test_gradients_do_not_depend_on_the_micro_batch_size(tmp_path, mode):
    hf = save_tiny_model("llama", tmp_path)
    ids = token_batch(hf.config.vocab_size, batch=4, seq=12, seed=2)
    mask = torch.zeros(4, 12)
    for row, length in enumerate((11, 3, 7, 1)):  # responses of very different lengths
        mask[row, 12 - length:] = 1.0
    (grads,) = run_distributed(_grads, world_size=1, args=(str(tmp_path), ids, mask, mode))
    reference = grads[(4, "agg")]  # one micro-batch: numerator / count, the definition
    assert reference.abs().max() > 0
    for micro in (1, 2):
        torch.testing.assert_close(grads[(micro, "agg")], reference, rtol=1e-4, atol=1e-7)
    if mode == "token-mean":  # the old aggregation moves with the micro-batch size: this test can fail
        assert not torch.allclose(grads[(1, "mean_of_means")], grads[(4, "mean_of_means")], rtol=1e-3)


def _dp_grads(hf_dir: str, ids: torch.Tensor, mask: torch.Tensor, lens: torch.Tensor, mode: str) -> dict:
    import torch.distributed as dist

    from hybridflow.data.packing import as_rows
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import OptimizerSettings, absent_from_role, build_model_role
    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.process_groups import build_role_groups

    # the plain DDP all-reduce leaves every replica the whole reduced gradient (the distributed optimizer
    # would reduce-scatter it into shards)
    settings = OptimizerSettings(lr=1e-3, use_distributed_optimizer=False)

    def grads(mesh, groups, micro, rows, budget=0):
        role = build_model_role("actor", mesh, groups, hf_dir, "lm", torch.float32, micro, optimizer=settings, seed=1,
                                max_tokens_per_micro_batch=budget)
        count = loss_agg.local_count(mask[rows], mode)
        dist.all_reduce(count, group=groups.dp)
        micro_batches = role.micro_batches({"input_ids": ids[rows], "mask": mask[rows], "seq_lens": lens[rows]})
        scale = loss_agg.micro_batch_scale(len(micro_batches), mesh.dp, float(count))

        def loss_fn(logits, mb):
            token_loss = -role.logprobs(logits, mb["input_ids"])
            return loss_agg.numerator(as_rows(token_loss, mb), as_rows(mb["mask"], mb), mode) * scale, {}

        role.model.train()
        role.optimizer.zero_grad()  # the schedule's finalize_model_grads all-reduces over DP at the end
        run_forward_backward([role.model], groups, micro_batches, loss_fn)
        return torch.cat([p.main_grad.flatten().clone() for p in role.model.parameters()]), len(micro_batches)

    both, alone = build_role_groups([0, 1], tp=1, pp=1, dp=2), build_role_groups([0], tp=1, pp=1, dp=1)
    rank = dist.get_rank()
    mine = slice(2 * rank, 2 * rank + 2)
    out = {"dp2": grads(RoleMesh("actor", (0, 1), ParallelDims(1, 1, 2)), both, 1, mine),
           # packed: replica 0's rows (12 + 10 tokens) need two micro-batches, replica 1's (3 + 2) one,
           # so replica 1 runs an empty one as well
           "dp2_packed": grads(RoleMesh("actor", (0, 1), ParallelDims(1, 1, 2)), both, 1, mine, budget=12)}
    if alone is not None:
        out["dp1"] = grads(RoleMesh("actor", (0,), ParallelDims(1, 1, 1)), alone, 4, slice(0, 4))
    else:
        absent_from_role(True)  # megatron's optimizer build gathers over the whole world
    return out


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_gradients_do_not_depend_on_data_parallelism(tmp_path, mode):
    hf = save_tiny_model("llama", tmp_path)
    ids = token_batch(hf.config.vocab_size, batch=4, seq=12, seed=2)
    mask = torch.zeros(4, 12)
    lens = torch.tensor([12, 10, 3, 2])  # true lengths: the rest of each row is padding
    for row, length in enumerate((11, 9, 2, 1)):  # the two replicas get very different token counts
        mask[row, lens[row] - length:lens[row]] = 1.0
        ids[row, lens[row]:] = 0
    first, second = run_distributed(_dp_grads, world_size=2, args=(str(tmp_path), ids, mask, lens, mode))
    reference = first["dp1"][0]
    assert reference.abs().max() > 0
    assert (first["dp2_packed"][1], second["dp2_packed"][1]) == (2, 2)  # replica 1 ran an empty micro-batch
    for result in (first, second):
        torch.testing.assert_close(result["dp2"][0], reference, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(result["dp2_packed"][0], reference, rtol=1e-4, atol=1e-7)
