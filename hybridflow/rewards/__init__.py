"""Rule-based rewards: the function named by `reward.fn`, the built-in tasks' answer matching, GSM8K's rule."""

from hybridflow.rewards.answer_match import answer_exact, answer_match, char_match
from hybridflow.rewards.gsm8k import extract_final_answer, gsm8k, gsm8k_score
from hybridflow.rewards.inputs import RewardFn, RewardInputs, compute_scores, reads_row_fields, reward_inputs
from hybridflow.rewards.loading import load_reward_fn, resolve_reward_fn

__all__ = [
    "RewardFn",
    "RewardInputs",
    "answer_exact",
    "answer_match",
    "char_match",
    "compute_scores",
    "extract_final_answer",
    "gsm8k",
    "gsm8k_score",
    "load_reward_fn",
    "reads_row_fields",
    "resolve_reward_fn",
    "reward_inputs",
]
