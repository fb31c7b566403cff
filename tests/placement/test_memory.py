"""The memory estimator against hand computations (Llama-3-8B written out here)."""

import dataclasses

import pytest

from hybridflow.config import load_experiment
from hybridflow.placement import GIB, MemoryEstimate, ParallelDims, estimate_role_memory
from hybridflow.placement.memory import stage_params

# Llama-3-8B: h=4096, f=14336, L=32, heads=32, kv heads=8 (head_dim 128 -> h_kv=1024), vocab 128256.
H, F, L, KV_DIM, V = 4096, 14336, 32, 1024, 128256


@pytest.fixture(scope="module")
def cfg8b():
    return load_experiment(
        "ppo_llama3_8b",
        [
            "rollout=vllm",
            "data.seq_length=2048",
            "roles.actor.micro_batch_size=1",
            "algorithm.mini_batch_size=64",
            "roles.actor.activation_recompute=selective",
            "roles.actor.offload_optimizer=false",
            # forward passes at micro_batch_size rows: the figures below are the update's
            "roles.actor.forward_max_tokens=0",
            "roles.reward.forward_max_tokens=0",
        ],
    )


def test_full_parameter_count_is_llama3_8b(cfg8b):
    # The published Llama-3-8B parameter count; vocab 128256 is already a multiple of 128 at TP1.
    assert stage_params(cfg8b.model, "actor", tp=1, pp=1, stage=0) == 8_030_261_248


def test_actor_tp4_dp2_hand_computation(cfg8b):
    # Per TP rank (tp=4). Vocab padded to a multiple of 128*4=512: ceil(128256/512)*512 = 128512.
    vocab = 128512
    attn = 2 * H * H + 2 * H * KV_DIM  # q, o + k, v           = 41_943_040
    mlp = 3 * H * F  # gate, up, down                         = 176_160_768
    layer = (attn + mlp) // 4 + 2 * H  # + two RMSNorm weights = 54_534_144
    params = L * layer + 2 * (vocab * H // 4) + H  # + embedding, untied head, final norm
    assert params == 2_008_289_280
    weights = 2 * params  # bf16
    grads = 4 * params  # fp32 main grads
    optimizer = 12 * params // 2  # fp32 master + 2 Adam moments, sharded over dp=2
    # Activations, selective recompute, sequence parallel: 2 bytes x (6h + 2h_kv + 4f) / tp per token-layer,
    # x 2048 tokens x 1 micro-batch x 32 layers x 1 in flight (pp=1); + the logits' 2048 x 128512 / 4 x 6 B (bf16
    # logits, their gradient, the slice's copy in backward) + one log-prob chunk's three fp32 [1024, 128512 / 4].
    per_token_layer = 2 * (6 * H + 2 * KV_DIM + 4 * F) // 4
    assert per_token_layer == 41_984
    activations = per_token_layer * 2048 * 1 * L + 2048 * vocab // 4 * 6 + 3 * 1024 * vocab // 4 * 4
    est = estimate_role_memory(cfg8b.model, "actor", ParallelDims(tp=4, pp=1, dp=2), cfg8b)
    assert est == MemoryEstimate(weights=weights, grads=grads, optimizer=optimizer, activations=activations)
    assert est.total == 27_640_512_512  # ~25.7 GiB


def test_recompute_and_sequence_parallel_variants(cfg8b):
    dims = ParallelDims(tp=4, pp=1, dp=2)
    logits = 2048 * 128512 // 4 * 6 + 3 * 1024 * 128512  # an update's logits at tp=4 (the hand computation)
    full = dataclasses.replace(cfg8b.roles.actor, activation_recompute="full")
    none = dataclasses.replace(cfg8b.roles.actor, activation_recompute="none")
    no_sp = dataclasses.replace(
        cfg8b.roles.actor, parallel=dataclasses.replace(cfg8b.roles.actor.parallel, sequence_parallel=False)
    )
    expected = {
        # only the layer input (h / tp) per layer, plus one whole layer while it is recomputed
        "full": (full, 2 * H // 4 * 2048 * L + 41_984 * 2048 + logits),
        # attention probabilities a*s kept: + 2 bytes x 32 heads x 2048 / 4 per token-layer
        "none": (none, (41_984 + 2 * 32 * 2048 // 4) * 2048 * L + logits),
        # without SP the 4h of norm/block inputs are whole on every TP rank
        "no_sp": (no_sp, (2 * (2 * H + 2 * KV_DIM + 4 * F) // 4 + 2 * 4 * H) * 2048 * L + logits),
    }
    for name, (role_cfg, activations) in expected.items():
        cfg = dataclasses.replace(cfg8b, roles=dataclasses.replace(cfg8b.roles, actor=role_cfg))
        assert estimate_role_memory(cfg.model, "actor", dims, cfg).activations == activations, name


def test_offload_and_pipeline_stages(cfg8b):
    roles = dataclasses.replace(cfg8b.roles, actor=dataclasses.replace(cfg8b.roles.actor, offload_optimizer=True))
    cfg = dataclasses.replace(cfg8b, roles=roles)
    assert estimate_role_memory(cfg.model, "actor", ParallelDims(4, 1, 2), cfg).optimizer == 0
    # PP2: stage 0 holds 16 layers + embedding and 2 micro-batches in flight; stage 1 16 layers + head, 1.
    first = estimate_role_memory(cfg8b.model, "actor", ParallelDims(4, 2, 1), cfg8b, stage=0)
    last = estimate_role_memory(cfg8b.model, "actor", ParallelDims(4, 2, 1), cfg8b, stage=1)
    assert first.activations == 41_984 * 2048 * 16 * 2
    assert last.activations == 41_984 * 2048 * 16 * 1 + 2048 * 128512 // 4 * 6 + 3 * 1024 * 128512
    assert first.weights == last.weights - 2 * 4096  # the head shard equals the embedding shard; + final norm
    worst = estimate_role_memory(cfg8b.model, "actor", ParallelDims(4, 2, 1), cfg8b)
    assert worst.total == max(first.total, last.total)


def test_critic_and_reward_have_a_scalar_head(cfg8b):
    actor = stage_params(cfg8b.model, "actor", 1, 1, 0)
    critic = stage_params(cfg8b.model, "critic", 1, 1, 0)
    assert actor - critic == V * H - H  # LM head replaced by a (hidden -> 1) head
    reward = estimate_role_memory(cfg8b.model, "reward", ParallelDims(2, 1, 1), cfg8b)
    assert reward.grads == reward.optimizer == reward.kv_cache == 0


def test_vllm_rollout_takes_its_gpu_memory_utilization(cfg8b):
    # vLLM pre-allocates utilization x capacity for weights + KV cache.
    est = estimate_role_memory(cfg8b.model, "rollout", ParallelDims(2, 1, 2), cfg8b)
    assert est.weights + est.kv_cache == int(cfg8b.rollout.gpu_memory_utilization * 80 * GIB)
    assert est.weights == stage_params(cfg8b.model, "rollout", 2, 1, 0) * 2


def test_native_rollout_kv_cache_for_the_batch():
    cfg = load_experiment("tiny_cpu", [])
    # tiny: L=4, kv heads 2, head_dim 32, fp32; rollout tp2 -> 1 kv head per rank; dp2 -> half the sequences.
    est = estimate_role_memory(cfg.model, "rollout", ParallelDims(2, 1, 2), cfg)
    per_token = 2 * 4 * 1 * 32 * 4  # K and V x layers x kv heads x head_dim x fp32
    sequences = cfg.data.train_batch_size * cfg.rollout.n_samples_per_prompt // 2
    assert est.kv_cache == sequences * cfg.data.seq_length * per_token
    shared = estimate_role_memory(cfg.model, "rollout", ParallelDims(2, 1, 2), cfg, shares_actor_weights=True)
    assert shared.weights == 0 and shared.kv_cache == est.kv_cache


def test_logits_count_what_the_chunked_log_probs_keep():
    """megatron_adapters.logprobs.ChunkedLogprobs: an update keeps the bf16 logits, writes their bf16 gradient and
    the slice's backward copies it (3 x 2 bytes per logit of the vocabulary shard); a forward pass keeps the
    logits (2); either adds three fp32 [CHUNK_TOKENS, shard] work tensors once. The chunk size is the adapters'."""
    from hybridflow.placement.memory import LOGPROB_CHUNK_TOKENS, logit_bytes, logit_chunk_bytes
    from megatron_adapters.logprobs import CHUNK_TOKENS

    assert LOGPROB_CHUNK_TOKENS == CHUNK_TOKENS
    cfg = load_experiment("ppo_llama_1b_h200", [])  # vocab 128256, a multiple of 128 (tp 1) and 256 (tp 2)
    assert logit_bytes(cfg.model, 1, trained=True) == 128256 * 6
    assert logit_bytes(cfg.model, 1, trained=False) == 128256 * 2
    assert logit_bytes(cfg.model, 2, trained=True) == 128256 // 2 * 6
    assert logit_chunk_bytes(cfg.model, 1) == 3 * CHUNK_TOKENS * 128256 * 4
    assert logit_chunk_bytes(cfg.model, 2) == 3 * CHUNK_TOKENS * 128256 // 2 * 4
