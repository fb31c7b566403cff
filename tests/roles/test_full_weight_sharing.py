"""Full fine-tuning with the native engine colocated at the actor's layout (CPU, gloo, fp32, 2 ranks): the engine
reads the actor's weight tensors themselves (no second copy: what placement.memory.rollout_shares_actor_weights
counts), so a sync moves nothing and the optimizer's in-place updates reach the engine. After several optimizer
steps the engine's log-probs of its samples equal the trainer's. At another layout (rollout TP1 x DP2 under an
actor at TP2) the engine keeps its own copy and every sync writes the whole model."""

import pytest
import torch

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model, token_batch
from tests.roles.nll import nll_loss

STEPS, ROWS, SEQ, NEW = 3, 4, 10, 6
PROMPTS = ([5, 9, 13, 2, 7], [3, 4], [11, 12, 6])


def _sync_and_sample(hf_dir: str, layout: str, ids: torch.Tensor) -> dict:
    import torch.distributed as dist

    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import OptimizerSettings, build_model_role, per_token_logprobs
    from hybridflow.roles.rollout_role import build_rollout_role
    from hybridflow.rollout.base import EngineSetup, RolloutBatch, SamplingParams
    from hybridflow.token_kinds import TokenKind
    from megatron_adapters.bridge import build_reshard_plan
    from megatron_adapters.checkpoint import unwrap
    from megatron_adapters.process_groups import build_role_groups

    gen_tp = 2 if layout == "shared" else 1
    actor_mesh = RoleMesh("actor", (0, 1), ParallelDims(2, 1, 1))
    gen_mesh = RoleMesh("rollout", (0, 1), ParallelDims(gen_tp, 1, 2 // gen_tp))
    actor_groups = build_role_groups([0, 1], tp=2, pp=1, dp=1)
    gen_groups = build_role_groups([0, 1], tp=gen_tp, pp=1, dp=2 // gen_tp)
    actor = build_model_role("actor", actor_mesh, actor_groups, hf_dir, "lm", torch.float32, 2,
                             optimizer=OptimizerSettings(lr=1e-2), seed=1)
    setup = EngineSetup(rollout=None, mesh=gen_mesh, groups=gen_groups, hf_dir=hf_dir, dtype=torch.float32,
                        device=torch.device("cpu"), seed=0)
    rollout = build_rollout_role("megatron", setup, build_reshard_plan(actor_mesh, gen_mesh),
                                 SamplingParams(max_new_tokens=NEW))
    rollout.sync(actor)
    written = [rollout.last_sync.bytes_written]
    for _ in range(STEPS):
        actor.train(actor.micro_batches({"input_ids": ids}), nll_loss(actor))
        rollout.sync(actor)
        written.append(rollout.last_sync.bytes_written)

    width = max(map(len, PROMPTS)) + NEW
    tokens = torch.zeros(len(PROMPTS), width, dtype=torch.long)
    for row, p in enumerate(PROMPTS):
        tokens[row, : len(p)] = torch.tensor(p)
    out = rollout.engine.generate(RolloutBatch(tokens, torch.tensor([len(p) for p in PROMPTS])),
                                  SamplingParams(max_new_tokens=NEW, temperature=1.0, seed=3, logprobs=True))
    tokens, kinds, logprobs = out.tokens, out.token_kinds, out.logprobs
    for t in (tokens, kinds, logprobs):  # every rank scores rank 0's samples
        dist.broadcast(t, src=0)
    mine = {p.data_ptr() for p in unwrap(actor.model).parameters()}
    params = list(rollout.engine.model.parameters())
    return {"written": written, "engine": logprobs, "response": kinds == int(TokenKind.ASSISTANT),
            "trainer": actor.forward({"input_ids": tokens}, per_token_logprobs(actor, 1.0)),
            "shared": sum(p.data_ptr() in mine for p in params) / len(params),
            "model_bytes": sum(p.numel() * p.element_size() for p in params)}


@pytest.mark.parametrize("layout", ["shared", "resharded"])
def test_colocated_engine_reads_the_actors_weights_in_place(tmp_path, layout):
    hf = save_tiny_model("llama", tmp_path, seed=3)
    ids = token_batch(hf.config.vocab_size, batch=ROWS, seq=SEQ, seed=5)
    for r in run_distributed(_sync_and_sample, world_size=2, args=(str(tmp_path), layout, ids)):
        if layout == "shared":
            assert r["shared"] == 1.0 and r["written"] == [0] * (STEPS + 1)
        else:
            assert r["shared"] == 0.0 and r["written"] == [r["model_bytes"]] * (STEPS + 1)
        response = r["response"]
        assert response.sum() >= len(response)
        torch.testing.assert_close(r["engine"][response], r["trainer"][response], rtol=1e-5, atol=1e-5)
