"""Adapter-only sync to the native engine (`roles.actor.lora.sync=adapters`; CPU, gloo, fp32, 2 ranks): the engine
is built with the actor's adapter spec, the first sync ships the frozen base and the adapters, every later sync
the adapters only. After several optimizer steps the engine's sampled tokens' log-probs equal the trainer's
(adapters on), and a later sync writes exactly the adapter bytes (counted by hand from the model shape, far
below the model) and receives no more than that. Three layouts: actor TP2 -> rollout TP1 x DP2 on the same ranks
(the adapters are resharded: B of q/k/v and gate/up gathered over rows, A of proj/fc2 over columns), actor
and rollout on different ranks (everything point to point), and both at TP2 on the same ranks, where the engine
takes the actor's frozen base tensors themselves (no copy: what the planner counts) and only adapters move."""

import pytest
import torch

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model, token_batch
from tests.roles.nll import nll_loss

RANK, STEPS, ROWS, SEQ, NEW = 4, 3, 4, 10, 6
PROMPTS = ([5, 9, 13, 2, 7], [3, 4], [11, 12, 6])


def _adapter_sync(hf_dir: str, layout: str, ids: torch.Tensor) -> dict:
    import torch.distributed as dist

    from hybridflow.config.parallel import LoraConfig
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import (
        OptimizerSettings,
        absent_from_role,
        build_model_role,
        lora_settings,
        per_token_logprobs,
    )
    from hybridflow.roles.rollout_role import build_rollout_role
    from hybridflow.rollout.base import EngineSetup, RolloutBatch, SamplingParams
    from hybridflow.token_kinds import TokenKind
    from megatron_adapters.bridge import build_reshard_plan
    from megatron_adapters.process_groups import build_role_groups

    rank = dist.get_rank()
    lora = lora_settings(LoraConfig(rank=RANK, alpha=8.0))
    if layout == "colocated":  # actor TP2, rollout TP1 x DP2 on the same two ranks
        actor_mesh = RoleMesh("actor", (0, 1), ParallelDims(2, 1, 1))
        gen_mesh = RoleMesh("rollout", (0, 1), ParallelDims(1, 1, 2))
        actor_groups = build_role_groups([0, 1], tp=2, pp=1, dp=1)
        gen_groups = build_role_groups([0, 1], tp=1, pp=1, dp=2)
    elif layout == "shared":  # both TP2 on the same two ranks: the engine takes the actor's base tensors
        actor_mesh = RoleMesh("actor", (0, 1), ParallelDims(2, 1, 1))
        gen_mesh = RoleMesh("rollout", (0, 1), ParallelDims(2, 1, 1))
        actor_groups = build_role_groups([0, 1], tp=2, pp=1, dp=1)
        gen_groups = build_role_groups([0, 1], tp=2, pp=1, dp=1)
    else:  # actor on rank 0, rollout on rank 1
        actor_mesh = RoleMesh("actor", (0,), ParallelDims(1, 1, 1))
        gen_mesh = RoleMesh("rollout", (1,), ParallelDims(1, 1, 1))
        actor_groups, gen_groups = build_role_groups([0], tp=1, pp=1, dp=1), build_role_groups([1], tp=1, pp=1, dp=1)
    actor = None
    if rank in actor_mesh.ranks:
        actor = build_model_role("actor", actor_mesh, actor_groups, hf_dir, "lm", torch.float32, 2,
                                 optimizer=OptimizerSettings(lr=1e-2), seed=1, lora=lora)
    else:
        absent_from_role(trained=True)  # the optimizer's build is collective over the world
    setup = EngineSetup(rollout=None, mesh=gen_mesh, groups=gen_groups if rank in gen_mesh.ranks else None,
                        hf_dir=hf_dir, dtype=torch.float32, device=torch.device("cpu"), seed=0, lora=lora)
    rollout = build_rollout_role("megatron", setup, build_reshard_plan(actor_mesh, gen_mesh),
                                 SamplingParams(max_new_tokens=NEW))
    rollout.sync(actor)
    syncs = [rollout.last_sync]
    for _ in range(STEPS):
        if actor is not None:
            actor.train(actor.micro_batches({"input_ids": ids}), nll_loss(actor))
        rollout.sync(actor)
        syncs.append(rollout.last_sync)

    width = max(map(len, PROMPTS)) + NEW
    tokens = torch.zeros(len(PROMPTS), width, dtype=torch.long)
    for row, p in enumerate(PROMPTS):
        tokens[row, : len(p)] = torch.tensor(p)
    kinds, logprobs = torch.zeros_like(tokens), torch.zeros(tokens.shape)
    if rollout.engine is not None:
        out = rollout.engine.generate(RolloutBatch(tokens, torch.tensor([len(p) for p in PROMPTS])),
                                      SamplingParams(max_new_tokens=NEW, temperature=1.0, seed=3, logprobs=True))
        tokens, kinds, logprobs = out.tokens, out.token_kinds, out.logprobs
    first = gen_mesh.ranks[0]  # every rollout replica sampled alike; the first one's samples go to the actor
    for t in (tokens, kinds, logprobs):
        dist.broadcast(t, src=first)
    result = {"syncs": syncs, "engine": None}
    if actor is not None:
        result["trainer"] = actor.forward({"input_ids": tokens}, per_token_logprobs(actor, 1.0))
        result["engine"], result["response"] = logprobs, kinds == int(TokenKind.ASSISTANT)
    if rollout.engine is not None:
        from megatron_adapters.lora import is_adapter_param

        params = list(rollout.engine.model.parameters())
        result["engine_adapter_bytes"] = sum(p.numel() * p.element_size() for p in params if is_adapter_param(p))
        result["engine_model_bytes"] = sum(p.numel() * p.element_size() for p in params)
        if actor is not None:  # which engine base tensors are the actor's own storage
            from megatron_adapters.checkpoint import unwrap

            mine = {p.data_ptr() for p in unwrap(actor.model).parameters()}
            base = [p for p in params if not is_adapter_param(p)]
            result["shared_base"] = sum(p.data_ptr() in mine for p in base) / len(base)
    return result


def _hand_adapter_bytes(hf) -> int:
    """rank x (in + out) per HF projection of every layer, fp32: q, k, v, o, gate, up, down."""
    c = hf.config
    h, ffn, d = c.hidden_size, c.intermediate_size, c.hidden_size // c.num_attention_heads
    q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
    per_layer = RANK * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + ffn) + (ffn + h))
    return 4 * per_layer * c.num_hidden_layers


@pytest.mark.parametrize("layout", ["colocated", "split", "shared"])
def test_adapter_sync_matches_the_trainer_and_moves_only_adapters(tmp_path, layout):
    hf = save_tiny_model("llama", tmp_path, seed=3)
    ids = token_batch(hf.config.vocab_size, batch=ROWS, seq=SEQ, seed=5)
    results = run_distributed(_adapter_sync, world_size=2, args=(str(tmp_path), layout, ids))
    engines = [r for r in results if "engine_adapter_bytes" in r]
    # a TP1 engine holds every adapter; a TP2 one its shard of them
    adapter_bytes = _hand_adapter_bytes(hf) if layout != "shared" else engines[0]["engine_adapter_bytes"]
    assert engines and all(r["engine_adapter_bytes"] == adapter_bytes for r in engines)
    model_bytes = engines[0]["engine_model_bytes"]
    assert adapter_bytes * 5 < model_bytes  # megabytes vs the model, at this tiny size already
    for r, rank_result in zip(range(len(results)), results, strict=True):
        first, *later = rank_result["syncs"]
        if "engine_adapter_bytes" not in rank_result:
            continue  # an actor-only rank writes nothing
        if layout == "shared":  # the engine's base is the actor's frozen base itself: nothing to ship, ever
            assert rank_result["shared_base"] == 1.0 and first.bytes_written == adapter_bytes, r
        else:
            assert rank_result.get("shared_base", 0.0) == 0.0
            assert first.bytes_written == model_bytes, r  # the base once, with the adapters
        for stats in later:
            assert stats.bytes_written == adapter_bytes  # the adapters only, every later sync
            assert stats.bytes_received <= adapter_bytes
            if layout == "split":
                assert stats.bytes_received == adapter_bytes  # all of it comes from the actor's rank
    for out in results:
        if out["engine"] is None:
            continue
        response = out["response"]
        assert response.sum() >= len(response)  # every prompt sampled something
        torch.testing.assert_close(out["engine"][response], out["trainer"][response], rtol=1e-5, atol=1e-5)
