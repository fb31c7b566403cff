import pytest

from hybridflow.errors import UserError
from hybridflow.rewards import answer_match, load_reward_fn, resolve_reward_fn


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def length(batch):\n    return [len(r) for r in batch.responses]\nX = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards"


def test_loads_user_function(user_module):
    fn = load_reward_fn(f"{user_module}:length")
    assert fn.__name__ == "length" and fn.__module__ == user_module


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("my_rewards.length", "package.module:function"),
        (":length", "package.module:function"),
        ("no_such_pkg.sub:fn", "cannot import module 'no_such_pkg.sub'"),
        ("my_rewards:missing", "has no 'missing'"),
        ("my_rewards:X", "not a function"),
    ],
)
def test_bad_specs_are_one_line_errors(user_module, spec, match):
    with pytest.raises(UserError, match=match) as err:
        load_reward_fn(spec)
    assert str(err.value).startswith("reward.fn:") and "\n" not in str(err.value)


def test_resolve_defaults_for_builtin_tasks_only():
    assert resolve_reward_fn(None, "builtin:add") is answer_match
    with pytest.raises(UserError, match="reward.fn: not set"):
        resolve_reward_fn(None, "/data/prompts.jsonl")
