"""Resolve `reward.fn=package.module:function` to a callable; no registry, the config names the function."""

from __future__ import annotations

import importlib

from hybridflow.config.load import import_failure
from hybridflow.errors import UserError
from hybridflow.rewards.inputs import RewardFn

BUILTIN_TASK_REWARD = "hybridflow.rewards.answer_match:answer_match"


def load_reward_fn(spec: str, field: str = "reward.fn") -> RewardFn:
    """Import `package.module:function` (the module must be importable, e.g. on PYTHONPATH)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UserError(f"{field}: {spec!r} is not of the form package.module:function; write it that way")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UserError(
            f"{field}: cannot import module {module_name!r} ({err}); check the name or PYTHONPATH"
        ) from None
    except Exception as err:  # the module itself fails: a SyntaxError, or its top-level code raises
        raise UserError(f"{field}: module {module_name!r} fails to import ({import_failure(err)}); fix the module"
                        ) from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise UserError(f"{field}: module {module_name!r} has no {attr!r}; name a function defined there")
    if not callable(fn):
        raise UserError(f"{field}: {spec!r} is a {type(fn).__name__}, not a function; name a function")
    return fn


def resolve_reward_fn(spec: str | None, data_source: str) -> RewardFn:
    """`reward.fn` when set; for a built-in task without one, that task's answer-matching reward."""
    if spec:
        return load_reward_fn(spec)
    if data_source.startswith("builtin:"):
        return load_reward_fn(BUILTIN_TASK_REWARD)
    raise UserError(
        f"reward.fn: not set and data.source={data_source!r} is not a built-in task; "
        "set reward.fn=package.module:function or reward.use_model=true"
    )
