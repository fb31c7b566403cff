"""`python -m hybridflow.run` refuses bad input with one line, exit code 2, and writes nothing."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    return subprocess.run(
        [sys.executable, "-m", "hybridflow.run", f"trainer.output_dir={out}", *overrides],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


def _bad_jsonl(tmp_path: Path) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"question": "1+1="}) + "\n")
    return str(path)


def _prompts_jsonl(tmp_path: Path) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"{i}>", "answer": str(i)}) + "\n" for i in range(40)))
    return str(path)


@pytest.mark.parametrize(
    ("make_overrides", "field"),
    [
        (lambda tmp: ["model.path=/nonexistent/model"], "model.path"),
        (lambda tmp: [f"data.source={_bad_jsonl(tmp)}", "trainer.warmup_sft_steps=0"], "data.prompt_key"),
        (lambda tmp: ["reward.fn=no_such_module.rewards:score"], "reward.fn"),
        (lambda tmp: ["+experiment=ppo_llama_1b_h200"], "cluster.gpus_per_node"),
        (lambda tmp: ["roles.actor.max_tokens_per_micro_batch=10"], "roles.actor.max_tokens_per_micro_batch"),
        (lambda tmp: ["model.vocab_size=10"], "model.vocab_size"),
        (lambda tmp: ["data.max_prompt_length=4"], "data.max_prompt_length"),
        (lambda tmp: ["data.max_prompt_length=6", "data.overlong_prompts=error"], "data.max_prompt_length"),
        (lambda tmp: ["data.max_prompt_length=6", "data.train_batch_size=8000"], "data.train_batch_size"),
        (lambda tmp: [f"data.source={_prompts_jsonl(tmp)}", "model.vocab_size=100", "trainer.val_every=5"],
         "data.val_source"),
    ],
    ids=["missing-model-path", "no-prompt-field", "reward-fn-import", "more-gpus-than-present",
         "token-budget-below-longest-sample", "embedding-smaller-than-tokenizer", "every-prompt-overlong",
         "overlong-prompts-error", "too-few-prompts-after-drop", "file-source-validation-without-val-source"],
)
def test_bad_input_is_one_line_exit_2_nothing_written(tmp_path, make_overrides, field):
    result = _run(tmp_path, *make_overrides(tmp_path))
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_overlong_prompts_error_says_how_many_the_longest_and_the_fix(tmp_path):
    # builtin:max_digit prompts are 5-8 tokens (bos, 3-6 digits, ">"): 6 leaves the 7s and 8s out.
    result = _run(tmp_path, "data.max_prompt_length=6", "data.overlong_prompts=error")
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "error: data.max_prompt_length: 4118 of 8192 prompts of data.source are longer than 6 tokens (longest 8) "
        "and data.overlong_prompts=error; raise data.max_prompt_length to 8, or set data.overlong_prompts=drop "
        "to train without them"]
