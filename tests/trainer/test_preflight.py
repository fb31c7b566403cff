"""The run's preflight on the launching process: what it refuses is tested through the CLI
(test_run_bad_input.py); here, what it tells the user when it drops over-long prompts."""

from hybridflow.config import load_experiment
from hybridflow.placement import plan_placement
from hybridflow.trainer.preflight import preflight


def _notes(*overrides):
    cfg = load_experiment("tiny_cpu", list(overrides))
    return preflight(cfg, plan_placement(cfg))


def test_dropped_prompts_are_counted_out_of_the_total():
    # builtin:max_digit: 8192 prompts of 5-8 tokens, 2024 of them 8 (seed 1234); validation draws its own 64.
    assert _notes("data.max_prompt_length=7") == [
        "data: dropped 2024 of 8192 prompts longer than data.max_prompt_length=7 tokens (data.overlong_prompts=drop)"]
    notes = _notes("data.max_prompt_length=7", "trainer.val_every=5")
    assert len(notes) == 2 and notes[1].startswith("data: dropped ") and " of 64 validation prompts " in notes[1]


def test_nothing_to_say_when_every_prompt_fits():
    assert _notes() == []
