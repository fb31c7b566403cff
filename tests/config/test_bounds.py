"""Every numeric and enum field declares its valid range, and every range is enforced when a config loads."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import types
import typing

import pytest

from hybridflow.config import ExperimentConfig, ModelConfig, load_experiment
from hybridflow.config.bounds import Bound, bounded, check_bounds, field_bound, walk_fields
from hybridflow.errors import UserError
from tests.trainer.run_helpers import REPO

# Fields that take any value of their type: names, paths, free-form maps and switches.
FREE_FIELDS = {"name", "path", "source", "prompt_key", "tokenizer", "fn", "resume", "output_dir", "master_addr",
               "imports", "import_dirs", "resources", "colocate", "engine_args", "critic_model", "reward_model",
               "val_source", "packaged"}  # packaged: a name model_cache checks against PACKAGED_MODELS


def _full_tree() -> ExperimentConfig:
    """The default tree with the optional model sections present, so their fields are walked too."""
    return ExperimentConfig(critic_model=ModelConfig(), reward_model=ModelConfig())


def _leaf_type(hint) -> type:
    """The type a bound applies to: an optional's own type, a list's element type."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if args and typing.get_origin(hint) in (list, typing.Union, types.UnionType):
        return _leaf_type(args[0])
    return typing.get_origin(hint) or hint


def _declared_fields() -> list[tuple[str, dataclasses.Field, type]]:
    out = []
    for name, f, value in walk_fields(_full_tree()):
        if dataclasses.is_dataclass(value) or f.name in FREE_FIELDS:
            continue
        owner = next(o for o in _owners() if f in dataclasses.fields(o))
        out.append((name, f, _leaf_type(typing.get_type_hints(owner)[f.name])))
    return out


def _owners() -> list[type]:
    seen, todo = [], [ExperimentConfig]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        for hint in typing.get_type_hints(cls).values():
            todo += [c for c in (*typing.get_args(hint), hint) if dataclasses.is_dataclass(c)]
    return seen


def _out_of_range(bound: Bound, kind: type):
    """A value of the field's type that the bound refuses."""
    if bound.choices is not None:
        return 987654 if kind is int else "no-such-choice"
    if bound.ge is not None:
        return bound.ge - 1 if kind is int else bound.ge - 0.5
    if bound.gt is not None:
        return bound.gt if kind is int else bound.gt - 0.5
    if bound.le is not None:
        return bound.le + 1
    return bound.lt


DECLARED = _declared_fields()


def test_every_numeric_and_enum_field_declares_a_range():
    undeclared = [name for name, f, kind in DECLARED if kind is not bool and field_bound(f) is None]
    assert not undeclared, f"declare a range with bounded(...) for {undeclared}"


# Model sections are checked under model.* (critic_model/reward_model share the same dataclass).
BOUNDED = [(n, f, k) for n, f, k in DECLARED if field_bound(f) is not None
           and not n.startswith(("critic_model.", "reward_model."))
           and not n.startswith(("roles.critic.", "roles.ref.", "roles.reward."))]


def test_the_algorithm_family_fields_are_among_the_checked_ones():
    checked = {n for n, _, _ in BOUNDED}
    assert {"algorithm.overlong_buffer", "algorithm.overlong_penalty", "algorithm.max_extra_draws",
            "algorithm.loss_agg_mode", "algorithm.clip_high"} <= checked


@pytest.mark.parametrize("name,f,kind", BOUNDED, ids=[n for n, _, _ in BOUNDED])
def test_every_range_is_enforced_with_one_line_naming_the_field(name, f, kind):
    bad = _out_of_range(field_bound(f), kind)
    value = f"[{bad}]" if kind is list else repr(bad) if isinstance(bad, str) else bad
    with pytest.raises(UserError) as err:
        load_experiment("tiny_cpu", [f"{name}={value}"])
    message = str(err.value)
    assert message.startswith(f"{name}: "), message
    assert "; use " in message and "\n" not in message, message


def test_the_upper_sides_are_enforced_too():
    for override, match in [("rollout.top_p=1.5", "rollout.top_p: 1.5 is above 1; use a value in (0, 1]"),
                            ("algorithm.gamma=1.01", "algorithm.gamma: 1.01 is above 1"),
                            ("trainer.rollout_lag=2", "trainer.rollout_lag: 2 is above 1"),
                            ("distributed.master_port=70000", "distributed.master_port: 70000 is above 65535"),
                            ("rollout.gpu_memory_utilization=0", "rollout.gpu_memory_utilization: 0.0 is not above 0"),
                            ("roles.critic.parallel.tp=0", "roles.critic.parallel.tp: 0 is below 1"),
                            ("trainer.lr=nan", "trainer.lr: nan is not a number")]:
        with pytest.raises(UserError, match=f"^{re.escape(match)}"):
            load_experiment("tiny_cpu", [override])


def test_list_items_and_optional_sections_are_checked():
    with pytest.raises(UserError, match=r"^rollout\.stop_token_ids: -3 is below 0"):
        load_experiment("tiny_cpu", ["rollout.stop_token_ids=[2,-3]"])
    with pytest.raises(UserError, match=r"^critic_model\.hidden_size: 0 is below 1"):
        load_experiment("tiny_cpu", ["+model@critic_model=tiny_llama", "critic_model.hidden_size=0"])


def test_check_bounds_on_a_small_tree():
    @dataclasses.dataclass
    class Inner:
        p: float = bounded(0.5, gt=0, lt=1)

    @dataclasses.dataclass
    class Outer:
        mode: str = bounded("a", choices=("a", "b"))
        inner: Inner = dataclasses.field(default_factory=Inner)
        maybe: int | None = bounded(None, ge=1)

    check_bounds(Outer())
    with pytest.raises(UserError, match=r"^x\.inner\.p: 1\.0 is not below 1; use a value in \(0, 1\)$"):
        check_bounds(Outer(inner=Inner(p=1.0)), "x.")
    with pytest.raises(UserError, match=r"^mode: 'c' is unknown; use one of a, b$"):
        check_bounds(Outer(mode="c"))
    with pytest.raises(UserError, match=r"^maybe: True is a bool, not a number"):
        check_bounds(Outer(maybe=True))


def test_plan_cli_refuses_a_bad_value_with_exit_2_and_writes_nothing(tmp_path):
    out = tmp_path / "plan.json"
    result = subprocess.run([sys.executable, "-m", "hybridflow.plan", "algorithm.cliprange=-0.1", "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: algorithm.cliprange: -0.1 is not above 0; use a value in (0, 1]"
    assert "Traceback" not in result.stderr and not out.exists()


def test_a_token_budget_below_the_longest_sample_is_refused():
    # tiny_cpu: the longest sample is data.max_prompt_length 16 + rollout.max_new_tokens 8 = 24 tokens
    with pytest.raises(UserError, match=r"^roles\.critic\.max_tokens_per_micro_batch: 23 is below the longest "
                                        r"sample, .* = 24; set it to >= 24, or 0 \(off\)$"):
        load_experiment("tiny_cpu", ["roles.critic.max_tokens_per_micro_batch=23"])
    cfg = load_experiment("tiny_cpu", ["roles.actor.max_tokens_per_micro_batch=24"])
    assert cfg.roles.ref.max_tokens_per_micro_batch == 24  # ref follows the actor unless set
    assert cfg.roles.critic.max_tokens_per_micro_batch is None  # off
    assert load_experiment("tiny_cpu", ["roles.actor.max_tokens_per_micro_batch=0"]).roles.ref \
        .max_tokens_per_micro_batch == 0


@pytest.mark.parametrize("value", ["inf", "-inf"])
def test_infinite_floats_are_refused_for_every_bounded_float_field(value):
    floats = [n for n, f, kind in BOUNDED if kind is float and field_bound(f).choices is None]
    assert "rollout.temperature" in floats
    for name in floats:
        with pytest.raises(UserError, match=rf"^{re.escape(name)}: -?inf is not finite; use ") as err:
            load_experiment("tiny_cpu", [f"{name}={value}"])
        assert "\n" not in str(err.value)
    assert Bound(gt=0).problem(float("inf")) == Bound(le=1).problem(float("-inf")) == "is not finite"
