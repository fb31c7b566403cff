"""The memory estimator under sequence packing (`roles.<role>.max_tokens_per_micro_batch`), by hand.

Llama-3-8B as in test_memory.py: h=4096, f=14336, L=32, heads=32, kv dim 1024; vocab padded to 128512 at tp=4.
ppo_llama3_8b: max_prompt_length 1024 + max_new_tokens 1024 = 2048 = seq_length, so the longest sample S = 2048.
"""

import random

import pytest

from hybridflow.config import load_experiment
from hybridflow.data.packing import pack_by_token_budget
from hybridflow.placement import ParallelDims, estimate_role_memory
from hybridflow.placement.memory import micro_batch_shape

V_TP4 = 128512
# Logit bytes per token at tp=4 (memory.logit_bytes) of the 128512 / 4 vocabulary shard: bf16 logits, in an update
# also their gradient and the slice's copy; CHUNK: one log-prob chunk's three fp32 [1024, shard], once per micro-batch.
UPDATE_LOGIT, FORWARD_LOGIT, CHUNK = V_TP4 // 4 * 6, V_TP4 // 4 * 2, 3 * 1024 * V_TP4
SELECTIVE = 41_984  # bytes per token-layer at tp=4 with SP, selective recompute (test_memory.py derives it)
S = 2048


def cfg8b(*overrides: str):
    return load_experiment("ppo_llama3_8b", ["rollout=vllm", "roles.actor.offload_optimizer=false", *overrides])


def actor(cfg, dims, stage=None):
    return estimate_role_memory(cfg.model, "actor", dims, cfg, stage=stage)


def test_packed_actor_hand_computation():
    cfg = cfg8b("roles.actor.max_tokens_per_micro_batch=6002")
    # One thd row of up to 6002 tokens, padded to a multiple of tp=4 for sequence parallelism: 6004.
    # pp=1: one micro-batch in flight, and its logits.
    est = actor(cfg, ParallelDims(4, 1, 2))
    assert est.activations == SELECTIVE * 6004 * 32 + 6004 * UPDATE_LOGIT + CHUNK
    # updates of 1 x 2048 tokens; forward passes of 8 x 2048 (16384 tokens)
    padded = actor(cfg8b(), ParallelDims(4, 1, 2))
    assert (est.weights, est.grads, est.optimizer) == (padded.weights, padded.grads, padded.optimizer)
    assert padded.activations == max(SELECTIVE * 2048 * 32 + 2048 * UPDATE_LOGIT, (SELECTIVE + FORWARD_LOGIT) * 16384) \
        + CHUNK


def test_attention_probabilities_span_one_sample_not_the_packed_row():
    # recompute=none keeps a*s per token-layer; packed attention is per sample, so s = S = 2048, not 6004.
    cfg = cfg8b("roles.actor.max_tokens_per_micro_batch=6002", "roles.actor.activation_recompute=none")
    per_token_layer = SELECTIVE + 2 * 32 * S // 4
    assert actor(cfg, ParallelDims(4, 1, 2)).activations == per_token_layer * 6004 * 32 + 6004 * UPDATE_LOGIT + CHUNK


def test_doubling_the_budget_doubles_activations_and_logits_but_not_the_log_prob_chunk():
    dims = ParallelDims(4, 1, 2)
    for recompute in ("selective", "none"):
        one = actor(cfg8b("roles.actor.max_tokens_per_micro_batch=4096",
                          f"roles.actor.activation_recompute={recompute}"), dims)
        two = actor(cfg8b("roles.actor.max_tokens_per_micro_batch=8192",
                          f"roles.actor.activation_recompute={recompute}"), dims)
        assert two.activations - CHUNK == 2 * (one.activations - CHUNK), recompute  # the chunk's work stays
        assert two.total - one.total == one.activations - CHUNK, recompute


def test_pipeline_in_flight_counts_packed_micro_batches():
    # 4 samples per replica, 2 fit in 4096 tokens -> at most 2 packed micro-batches (padded at mbs=1: 4),
    # so stage 0 of pp=4 holds min(4 - 0, 2) = 2 in flight, the last stage 1; 8 layers per stage.
    cfg = cfg8b("algorithm.mini_batch_size=4", "roles.actor.max_tokens_per_micro_batch=4096")
    assert actor(cfg, ParallelDims(4, 4, 1), stage=0).activations == SELECTIVE * 4096 * 8 * 2
    assert actor(cfg, ParallelDims(4, 4, 1), stage=3).activations == \
        SELECTIVE * 4096 * 8 * 1 + 4096 * UPDATE_LOGIT + CHUNK
    padded = cfg8b("algorithm.mini_batch_size=4")
    assert actor(padded, ParallelDims(4, 4, 1), stage=0).activations == SELECTIVE * 2048 * 8 * 4


def test_budget_beyond_the_replicas_samples_is_capped():
    # mini-batch 4 over dp=2: 2 samples of at most 2048 tokens, so a micro-batch never holds more than 4096.
    big = cfg8b("algorithm.mini_batch_size=4", "roles.actor.max_tokens_per_micro_batch=100000")
    exact = cfg8b("algorithm.mini_batch_size=4", "roles.actor.max_tokens_per_micro_batch=4096")
    assert actor(big, ParallelDims(4, 1, 2)) == actor(exact, ParallelDims(4, 1, 2))


def test_ref_takes_the_actors_budget_unless_set():
    cfg = cfg8b("roles.actor.max_tokens_per_micro_batch=6002")
    assert cfg.roles.ref.max_tokens_per_micro_batch == 6002  # load_experiment's rule
    ref = estimate_role_memory(cfg.model, "ref", ParallelDims(4, 1, 2), cfg)
    # Forward only: one layer's activations plus the logits, for the packed row.
    assert ref.activations == SELECTIVE * 6004 + 6004 * FORWARD_LOGIT + CHUNK
    off = cfg8b("roles.actor.max_tokens_per_micro_batch=6002", "roles.ref.max_tokens_per_micro_batch=0")
    # unpacked forward passes: forward_max_tokens (default 16384) / seq 2048 = 8 rows of 2048 tokens
    assert estimate_role_memory(off.model, "ref", ParallelDims(4, 1, 2), off).activations == \
        SELECTIVE * 16384 + 16384 * FORWARD_LOGIT + CHUNK


def test_budget_zero_is_the_padded_estimate():
    for role in ("actor", "critic", "ref", "reward"):
        on = cfg8b(f"roles.{role}.max_tokens_per_micro_batch=0")
        assert estimate_role_memory(on.model, role, ParallelDims(2, 1, 2), on) == \
            estimate_role_memory(on.model, role, ParallelDims(2, 1, 2), cfg8b()), role


def test_sft_warm_up_keeps_the_padded_shape_for_the_actor():
    # tiny_cpu: actor mbs 8 x seq 32 = 256 padded tokens; packing at 24 tokens (= the longest sample) is
    # smaller, but the warm-up (warmup_sft_steps 8) still trains on the padded rows.
    # (forward passes at micro_batch_size rows: the padded run's forward micro-batches would be larger)
    fwd = "roles.actor.forward_max_tokens=0"
    warm = load_experiment("tiny_cpu", ["roles.actor.max_tokens_per_micro_batch=24", fwd])
    cold = load_experiment("tiny_cpu", ["roles.actor.max_tokens_per_micro_batch=24", "trainer.warmup_sft_steps=0", fwd])
    padded = load_experiment("tiny_cpu", [fwd])
    dims = ParallelDims(2, 1, 2)
    assert actor(warm, dims) == actor(padded, dims)
    assert actor(cold, dims).activations < actor(padded, dims).activations
    # ref runs no warm-up: packed either way
    assert estimate_role_memory(warm.model, "ref", dims, warm) == estimate_role_memory(cold.model, "ref", dims, cold)


@pytest.mark.parametrize("budget", [2048, 3000, 4096, 10000])
def test_shape_bounds_what_the_runtime_packer_builds(budget):
    # The estimate's count and tokens bound pack_by_token_budget's micro-batches for any sample lengths
    # up to S, and the count is reached when every sample has the longest length.
    cfg = cfg8b(f"roles.actor.max_tokens_per_micro_batch={budget}")
    shape = micro_batch_shape(cfg, "actor", dp=2)
    per_replica = 32
    rng = random.Random(budget)
    for _ in range(50):
        lengths = [rng.randint(1, S) for _ in range(per_replica)]
        bins = pack_by_token_budget(lengths, budget)
        assert len(bins) <= shape.count
        assert max(sum(lengths[r] for r in b) for b in bins) <= shape.tokens
    assert len(pack_by_token_budget([S] * per_replica, budget)) == shape.count
