import pytest

from hybridflow.config import load_experiment
from hybridflow.data import build_char_tokenizer
from hybridflow.data.tasks import BUILTIN_TASKS, task_rows
from hybridflow.errors import UserError
from hybridflow.trainer.validation import NUM_BUILTIN_TRAIN, Validator, validation_set


def test_builtin_held_out_split_is_disjoint_and_deterministic(tmp_path):
    cfg = load_experiment("tiny_cpu", ["data.val_size=50", "trainer.val_every=5"])
    tok = build_char_tokenizer(tmp_path / "tok")
    (first, dropped), (again, _) = validation_set(cfg, tok), validation_set(cfg, tok)
    train = {r["prompt"] for r in task_rows(BUILTIN_TASKS["max_digit"], NUM_BUILTIN_TRAIN, cfg.trainer.seed)}
    prompts = [r["prompt"] for r in first.rows]
    assert first.rows == again.rows and len(prompts) == 50 == len(set(prompts)) and dropped == 0
    assert not train & set(prompts)
    validator = Validator.build(cfg, tok)
    assert [s for s in range(1, 61) if validator.due(s)] == list(range(5, 61, 5))


def test_validation_off_by_default_and_file_source_needs_val_source(tmp_path):
    tok = build_char_tokenizer(tmp_path / "tok")
    assert Validator.build(load_experiment("tiny_cpu", []), tok) is None
    src = tmp_path / "d.jsonl"
    src.write_text('{"prompt": "1>", "answer": "1"}\n')
    cfg = load_experiment("tiny_cpu", [f"data.source={src}", "trainer.val_before_train=true"])
    with pytest.raises(UserError, match=r"data\.val_source: .*set data\.val_source"):
        Validator.build(cfg, tok)
    cfg = load_experiment("tiny_cpu", [f"data.source={src}", f"data.val_source={src}", "trainer.val_every=1"])
    assert Validator.build(cfg, tok).rows == [{"prompt": "1>", "answer": "1"}]
