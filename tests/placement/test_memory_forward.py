"""The memory estimate counts the forward micro-batch the run uses (`roles.<role>.forward_max_tokens`), by hand.

Llama-3-8B as in test_memory.py at tp=4 with SP, selective recompute: 41,984 bytes per token-layer; vocab
padded to 128512; data.seq_length 2048; micro_batch_size 1.
"""

from hybridflow.config import load_experiment
from hybridflow.placement import ParallelDims, estimate_role_memory

SELECTIVE, V_TP4, L, S = 41_984, 128512, 32, 2048
# Logit bytes per token at tp=4 (memory.logit_bytes) of the vocabulary shard: bf16 logits, in an update also their
# gradient and the slice's copy; CHUNK: one log-prob chunk's three fp32 [1024, shard], once per micro-batch.
UPDATE_LOGIT, FORWARD_LOGIT, CHUNK = V_TP4 // 4 * 6, V_TP4 // 4 * 2, 3 * 1024 * V_TP4


def cfg8b(*overrides: str):
    return load_experiment("ppo_llama3_8b", ["rollout=vllm", "data.seq_length=2048", "roles.actor.micro_batch_size=1",
                                             "roles.actor.activation_recompute=selective",
                                             "roles.actor.offload_optimizer=false", *overrides])


def test_ref_forward_micro_batch_follows_the_budget():
    for budget, rows in ((0, 1), (4096, 2), (16384, 8), (5000, 2)):  # rows = max(mbs, budget // seq)
        cfg = cfg8b(f"roles.actor.forward_max_tokens={budget}")  # ref inherits it
        assert cfg.roles.ref.forward_max_tokens == budget
        tokens = rows * S
        assert estimate_role_memory(cfg.model, "ref", ParallelDims(4, 1, 2), cfg).activations == \
            SELECTIVE * tokens + tokens * FORWARD_LOGIT + CHUNK, budget


def test_actor_takes_the_larger_of_its_update_and_its_forward_pass():
    update = SELECTIVE * S * L + S * UPDATE_LOGIT + CHUNK  # one micro-batch of 2048 tokens in flight, its logits
    small = cfg8b("roles.actor.forward_max_tokens=2048")  # 1 row: one layer + logits of 2048 tokens < update
    assert estimate_role_memory(small.model, "actor", ParallelDims(4, 1, 2), small).activations == update
    large = cfg8b("roles.actor.forward_max_tokens=65536")  # 32 rows: the old log-probs' logits dominate
    forward = SELECTIVE * 32 * S + 32 * S * FORWARD_LOGIT + CHUNK
    assert forward > update
    assert estimate_role_memory(large.model, "actor", ParallelDims(4, 1, 2), large).activations == forward
