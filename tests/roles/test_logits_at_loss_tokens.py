"""The LM head at the loss tokens only (`ModelRole.logits_at_loss_tokens`, megatron_adapters.output_positions):
log-probs, entropies and the parameter gradient equal those of the head run at every position, on the tokens a loss
reads; the head sees exactly those tokens (CPU, gloo, fp32; TP 1 and 2, padded and packed micro-batches)."""

import pytest
import torch

from megatron_adapters.output_positions import logit_positions, scatter_positions
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model

ROWS, SEQ = 6, 20


def _batch() -> dict[str, torch.Tensor]:
    """Right-padded rows: a prompt of 4-9 tokens, a response of 3-9, then padding (as StepBatch lays them out)."""
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 200, (ROWS, SEQ), generator=gen)
    mask = torch.zeros(ROWS, SEQ, dtype=torch.long)
    seq_lens = torch.zeros(ROWS, dtype=torch.long)
    for r in range(ROWS):
        prompt, response = 4 + r, 3 + (r * 5) % 7
        mask[r, prompt:prompt + response] = 1
        ids[r, prompt + response:] = 0
        seq_lens[r] = prompt + response
    return {"input_ids": ids, "loss_mask": mask, "seq_lens": seq_lens}


def _run(hf_dir: str, tp: int, packed: bool) -> dict:
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import OptimizerSettings, build_model_role, per_token_logprobs
    from megatron_adapters.checkpoint import unwrap
    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.process_groups import build_role_groups

    groups = build_role_groups(list(range(tp)), tp=tp, pp=1, dp=1)
    mesh = RoleMesh("actor", tuple(range(tp)), ParallelDims(tp, 1, 1))
    actor = build_model_role("actor", mesh, groups, hf_dir, "lm", torch.float32, 4, OptimizerSettings(lr=1e-3),
                             seed=1, max_tokens_per_micro_batch=48 if packed else 0)
    head_rows: list[int] = []
    unwrap(actor.model).output_layer.register_forward_hook(
        lambda _m, args, _o: head_rows.append(args[0].shape[:2].numel()))  # positions the head ran on
    tensors = _batch()

    def loss(logits, mb):
        logp, ent = actor.logprobs(logits, mb["input_ids"], 0.7, with_entropy=True,
                                   positions=mb.get("logit_positions"))
        m = mb["loss_mask"].float()
        return -((logp + 0.1 * ent) * m).sum() / m.sum(), {"num_tokens": m.sum()}

    out = {"flag": actor.logits_at_loss_tokens}
    for selected in (True, False):
        actor.logits_at_loss_tokens = selected
        head_rows.clear()
        logp = actor.forward(dict(tensors), per_token_logprobs(actor, 0.7))
        actor.optimizer.zero_grad()
        run_forward_backward([actor.model], groups, actor.micro_batches(dict(tensors)), loss)
        grads = {n: p.main_grad.clone() for n, p in unwrap(actor.model).named_parameters()}
        out[selected] = {"logp": logp, "grads": grads, "head_rows": list(head_rows)}
    return out


@pytest.mark.parametrize(("tp", "packed"), [(1, False), (1, True), (2, False)])
def test_head_at_loss_tokens_matches_the_head_everywhere(tmp_path, tp, packed):
    save_tiny_model("llama", tmp_path)
    out = run_distributed(_run, world_size=tp, args=(str(tmp_path), tp, packed))[0]
    mask = _batch()["loss_mask"].bool()
    assert out["flag"]  # an LM-head role built without sequence parallelism selects
    sel, full = out[True], out[False]
    # the head ran on the loss tokens only (forward, then forward + backward), and on every position without
    assert sum(sel["head_rows"]) == 2 * int(mask.sum())
    assert sum(full["head_rows"]) > 1.5 * sum(sel["head_rows"])
    assert full["logp"][mask].abs().min() > 0
    torch.testing.assert_close(sel["logp"][mask], full["logp"][mask], rtol=1e-5, atol=1e-6)
    assert not sel["logp"][~mask].any()
    for name, grad in full["grads"].items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(sel["grads"][name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_positions_skip_column_zero_and_scatter_back():
    mask = torch.tensor([[1, 1, 0, 1], [0, 0, 1, 0]])
    positions = logit_positions(mask)
    assert positions.tolist() == [[0, 0, 1], [1, 3, 2]]  # column 0 has no predecessor: never listed
    values = torch.tensor([[1.0, 2.0, 3.0]])
    assert scatter_positions(values, positions, mask.shape).tolist() == [[0, 1, 0, 2], [0, 0, 3, 0]]
