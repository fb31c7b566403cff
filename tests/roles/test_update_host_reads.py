"""Host reads of one actor update (GRPO loss, one mini-batch), the actor built as a run builds it by default: a
small constant, independent of the micro-batch count and of the number of layers and parameter tensors (CPU,
gloo, fp32, one rank; megatron's core-attention recompute, the old default, read the device once per layer and
pass). Counted as benchmarks/microbatch_overhead.py counts them (profiler `aten::_local_scalar_dense`)."""

import torch

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model

ROWS, SEQ, PROMPT = 8, 24, 8
# Per mini-batch: megatron's total grad norm (it clips with a float) and the loss-agg count.
MAX_READS_PER_UPDATE = 2


def _update_reads(hf_dirs: dict[int, str]) -> dict:
    from benchmarks.microbatch_overhead import grpo_trainer, host_syncs, step_batch
    from hybridflow.config.parallel import RoleConfig
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import OptimizerSettings, build_model_role, role_config_overrides
    from megatron_adapters.process_groups import build_role_groups

    groups = build_role_groups([0], tp=1, pp=1, dp=1)
    mesh = RoleMesh("actor", (0,), ParallelDims(1, 1, 1))
    batch = step_batch(ROWS, SEQ, PROMPT, 256)
    out = {}
    for layers, hf_dir in hf_dirs.items():
        # as a run builds the actor by default (its activation_recompute)
        overrides = role_config_overrides(True, 1, RoleConfig().activation_recompute)
        actor = build_model_role("actor", mesh, groups, hf_dir, "lm", torch.float32, 1,
                                 optimizer=OptimizerSettings(lr=1e-3), seed=0, **overrides)
        trainer = grpo_trainer(actor, mesh, ROWS)
        tensors = sum(1 for _ in actor.model.parameters())
        for mbs in (1, ROWS):
            actor.micro_batch_size = mbs

            def update(trainer=trainer):
                return trainer._update("actor", batch, trainer._actor_loss(1.0), trainer._actor_fields())

            update()  # the first step makes Adam's state
            out[(layers, mbs)] = {"reads": host_syncs(update)["item_calls"], "tensors": tensors}
    return out


def test_update_host_reads_do_not_grow_with_micro_batches_or_parameters(tmp_path):
    dirs = {}
    for layers in (1, 3):
        dirs[layers] = str(tmp_path / f"l{layers}")
        save_tiny_model("llama", dirs[layers], num_hidden_layers=layers, vocab_size=256)
    (out,) = run_distributed(_update_reads, world_size=1, args=(dirs,))
    assert out[(3, 1)]["tensors"] > out[(1, 1)]["tensors"]  # more parameter tensors to step and clip
    reads = {key: r["reads"] for key, r in out.items()}
    assert len(set(reads.values())) == 1, reads  # 8 micro-batches read as often as 1; 3 layers as 1
    assert 1 <= reads[(1, 1)] <= MAX_READS_PER_UPDATE, reads


def test_sync_free_grad_norm_equals_the_norm_of_all_tensors():
    from megatron_adapters.optimizer_sync import sync_free_grad_norm

    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(5, 3, generator=gen), torch.randn(7, generator=gen), torch.randn(2, 2, generator=gen)]
    norm, per_tensor = sync_free_grad_norm(2048, torch.zeros(1, dtype=torch.int), [tensors], False)
    reference = torch.cat([t.flatten() for t in tensors]).pow(2).sum().sqrt()
    assert per_tensor is None and norm.shape == (1,)
    torch.testing.assert_close(norm[0], reference)
    empty, _ = sync_free_grad_norm(2048, torch.zeros(1, dtype=torch.int), [[]], False)
    assert empty.tolist() == [0.0]
