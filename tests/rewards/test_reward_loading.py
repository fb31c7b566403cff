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


@pytest.mark.parametrize(("source", "match"), [
    ("def f(:\n    pass\n", r"SyntaxError at .*broken_rewards\.py:1: "),
    ("raise RuntimeError('boom at import')\n", r"RuntimeError: boom at import"),
])
def test_a_module_that_fails_to_import_is_one_line_naming_reward_fn(tmp_path, monkeypatch, source, match):
    (tmp_path / "broken_rewards.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match=rf"^reward\.fn: module 'broken_rewards' fails to import \({match}") as err:
        load_reward_fn("broken_rewards:f")
    assert "\n" not in str(err.value) and "; fix " in str(err.value)
