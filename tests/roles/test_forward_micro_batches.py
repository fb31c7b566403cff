"""Forward-only passes sized by tokens (`roles.<role>.forward_max_tokens`): the micro-batch count follows the
budget, and the log-probs and values equal those of one-row micro-batches (CPU, gloo, fp32, one rank)."""

import torch

from hybridflow.config.parallel import RoleConfig
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model

ROWS, SEQ = 10, 16


def test_rows_per_forward_micro_batch_follow_the_budget():
    assert RoleConfig(micro_batch_size=2, forward_max_tokens=64).forward_micro_batch_size(16) == 4
    assert RoleConfig(micro_batch_size=8, forward_max_tokens=64).forward_micro_batch_size(16) == 8  # at least mbs
    assert RoleConfig(micro_batch_size=2, forward_max_tokens=0).forward_micro_batch_size(16) == 2  # off
    assert RoleConfig(micro_batch_size=1, forward_max_tokens=16384).forward_micro_batch_size(192) == 85


def _forward(hf_dir: str, budgets: tuple[int, ...]) -> dict:
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles import model_role
    from hybridflow.roles.model_role import build_model_role, per_token_logprobs, per_token_values
    from megatron_adapters.process_groups import build_role_groups

    groups = build_role_groups([0], tp=1, pp=1, dp=1)
    mesh = RoleMesh("actor", (0,), ParallelDims(1, 1, 1))
    ids = torch.randint(3, 200, (ROWS, SEQ), generator=torch.Generator().manual_seed(3))
    counts: list[int] = []
    run = model_role.run_forward_backward

    def counting(chunks, pgs, micro, *args, **kwargs):
        counts.append(len(micro))
        return run(chunks, pgs, micro, *args, **kwargs)

    model_role.run_forward_backward = counting
    out = {}
    for budget in budgets:
        rows = RoleConfig(micro_batch_size=1, forward_max_tokens=budget).forward_micro_batch_size(SEQ)
        actor = build_model_role("actor", mesh, groups, hf_dir, "lm", torch.float32, 1, seed=1,
                                 forward_micro_batch_size=rows)
        critic = build_model_role("critic", mesh, groups, hf_dir, "value", torch.float32, 1, seed=1,
                                  forward_micro_batch_size=rows)
        out[budget] = {"logprobs": actor.forward({"input_ids": ids}, per_token_logprobs(actor, 0.7)),
                       "values": critic.forward({"input_ids": ids}, per_token_values)}
    out["counts"] = counts
    return out


def test_forward_micro_batches_by_tokens_equal_one_row_micro_batches(tmp_path):
    save_tiny_model("llama", tmp_path)
    # 0: one row each (10 micro-batches); 64 tokens / 16 = 4 rows -> 3 micro-batches of 4, 4, 2 rows; 10k: one
    (out,) = run_distributed(_forward, world_size=1, args=(str(tmp_path), (0, 64, 10_000)))
    assert out["counts"] == [10, 10, 3, 3, 1, 1]
    for budget in (64, 10_000):
        for key in ("logprobs", "values"):
            assert out[0][key].abs().max() > 0
            torch.testing.assert_close(out[budget][key], out[0][key], rtol=1e-5, atol=1e-6)
