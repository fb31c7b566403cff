"""`algorithm.shuffle_mini_batches`: which samples each optimizer step of an update sees, on two DP ranks (gloo,
CPU). Off, mini-batches are cut in batch order (whole prompt groups); on, from one permutation per step and PPO
epoch that every rank draws alike, so the replicas' shares still partition each mini-batch and every sample is
trained on once per epoch."""

from types import SimpleNamespace

from tests.distributed_harness import run_distributed

ROWS, MINI = 16, 8


def _rows_seen(shuffle: bool, steps_done: int, seed: int = 1234) -> list[list[list[int]]]:
    """Per PPO epoch and mini-batch, the sample ids this rank's replica trained on."""
    import torch
    import torch.distributed as dist

    from benchmarks.microbatch_overhead import step_batch
    from hybridflow.config import ExperimentConfig
    from hybridflow.roles.model_role import ModelRole
    from hybridflow.trainer.rl_step import RLStep

    cfg = ExperimentConfig()
    cfg.algorithm.mini_batch_size, cfg.algorithm.ppo_epochs = MINI, 2
    cfg.algorithm.shuffle_mini_batches, cfg.trainer.seed = shuffle, seed
    batch = step_batch(ROWS, 12, 4, 64)
    batch.tokens[:, 0] = torch.arange(ROWS)  # the first token names the sample
    seen: list[list[int]] = []
    role = SimpleNamespace(mesh=SimpleNamespace(dp=2), dp_rank=dist.get_rank(), groups=SimpleNamespace(dp=None),
                           micro_batches=lambda tensors: [tensors])
    role.local_rows = lambda n: ModelRole.local_rows(role, n)
    role.train = lambda micro, fn: seen.append(micro[0]["input_ids"][:, 0].tolist()) or {}
    step = RLStep()
    step.cfg, step.roles, step.steps_done = cfg, {"actor": role}, steps_done
    step._update("actor", batch, None, ())
    per_epoch = ROWS // MINI
    return [seen[e * per_epoch:(e + 1) * per_epoch] for e in range(cfg.algorithm.ppo_epochs)]


def _check(shuffle: bool) -> dict:
    return {"step3": _rows_seen(shuffle, 3), "again": _rows_seen(shuffle, 3), "step4": _rows_seen(shuffle, 4),
            "other_seed": _rows_seen(shuffle, 3, seed=7)}


def _mini_batches(ranks: list[dict], key: str) -> list[list[list[int]]]:
    """Per epoch, each mini-batch's samples over both replicas (rank 0's share, then rank 1's)."""
    return [[a + b for a, b in zip(e0, e1, strict=True)] for e0, e1 in zip(ranks[0][key], ranks[1][key],
                                                                          strict=True)]


def test_mini_batches_in_batch_order_by_default():
    ranks = run_distributed(_check, world_size=2, args=(False,))
    order = [list(range(0, MINI)), list(range(MINI, ROWS))]
    assert _mini_batches(ranks, "step3") == [order, order]  # both epochs
    assert _mini_batches(ranks, "step4") == [order, order]


def test_shuffled_mini_batches_partition_the_batch_alike_on_every_rank():
    ranks = run_distributed(_check, world_size=2, args=(True,))
    epochs = _mini_batches(ranks, "step3")
    for minis in epochs:
        assert sorted(sum(minis, [])) == list(range(ROWS))  # every sample once per epoch, no replica overlap
        assert all(len(m) == MINI for m in minis)
    assert epochs[0] != epochs[1]  # a new permutation each PPO epoch
    assert epochs[0][0] != list(range(MINI))  # not batch order
    assert _mini_batches(ranks, "again") == epochs  # drawn from the seed and step: a resumed run repeats it
    assert _mini_batches(ranks, "step4") != epochs
    assert _mini_batches(ranks, "other_seed") != epochs
