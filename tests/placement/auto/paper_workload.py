"""HybridFlow's evaluation workloads (EuroSys'25 section 8.1) as the auto planner's records, for its tests:
Llama 2 7B/13B/70B and Code Llama 34B shapes (`LLAMA`: ModelConfig fields; `LLAMA_SHAPES`: the cost model's) and
the roles of PPO or GRPO over them."""

from __future__ import annotations

from hybridflow.placement.auto.workload import ModelCostShape, RoleWork
from hybridflow.role_records import Role, model_roles, role_record

LLAMA = {
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32),
    "13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                num_key_value_heads=40),
    "34b": dict(hidden_size=8192, intermediate_size=22016, num_hidden_layers=48, num_attention_heads=64,
                num_key_value_heads=8),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8),
}
VOCAB_SIZE = 32000
LLAMA_SHAPES: dict[str, ModelCostShape] = {
    size: ModelCostShape(f["hidden_size"], f["intermediate_size"], f["num_hidden_layers"], f["num_attention_heads"],
                         f["num_key_value_heads"], VOCAB_SIZE)
    for size, f in LLAMA.items()
}


def ppo_roles(actor: ModelCostShape, critic: ModelCostShape | None, reward: ModelCostShape | None,
              micro_batch_size: int = 1) -> tuple[RoleWork, ...]:
    """The roles of PPO (critic given) or GRPO (critic None); `reward` None = rule-based reward."""
    # The actor recomputes the old log-probs with its training layout in preparation (the rollout engine's
    # own log-probs are not bit-exact with the training forward), as verl and OpenRLHF do.
    shapes = {Role.ACTOR: actor, Role.CRITIC: critic, Role.REF: actor, Role.REWARD: reward}
    return tuple(RoleWork(role, shapes[role], role_record(role).stages, micro_batch_size)
                 for role in model_roles() if shapes[role] is not None)
