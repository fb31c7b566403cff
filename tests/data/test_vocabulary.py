"""Stop ids (tokenizer eos + the checkpoint's generation_config eos, or an explicit list) and the vocabulary
check, as the planner, the preflight and both engines see them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.config import load_experiment
from hybridflow.data.vocabulary import check_run_tokens, stop_token_ids
from hybridflow.errors import UserError
from hybridflow.rollout.vllm_engine import sampling_kwargs
from hybridflow.trainer.build import rollout_sampling
from tests.megatron_adapters.tiny_hf_models import CHAT_WORDS, save_tiny_checkpoint_with_tokenizer

REPO = Path(__file__).resolve().parents[2]
EOT, END = CHAT_WORDS.index("<|eot|>"), CHAT_WORDS.index("<|end|>")  # 3 (the tokenizer's eos), 2


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    save_tiny_checkpoint_with_tokenizer(path, generation_eos=(END, EOT))
    return path


def test_default_is_tokenizer_eos_plus_every_generation_config_eos(ckpt):
    cfg = load_experiment("tiny_cpu", [f"model.path={ckpt}"])
    assert cfg.rollout.stop_token_ids is None
    assert check_run_tokens(cfg).stop_token_ids == (EOT, END)


def test_both_engines_get_the_same_ids(ckpt):
    # The native engine reads SamplingParams.stop_token_ids; vLLM gets them as its own stop_token_ids with
    # ignore_eos, so it stops on exactly these ids too.
    cfg = load_experiment("tiny_cpu", [f"model.path={ckpt}"])
    sampling = rollout_sampling(cfg, check_run_tokens(cfg).tokenizer)
    assert sampling.stop_token_ids == (EOT, END)
    kwargs = sampling_kwargs(sampling, 8, seed=0)
    assert kwargs["stop_token_ids"] == [EOT, END] and kwargs["ignore_eos"]


def test_an_int_eos_in_generation_config(tmp_path):
    save_tiny_checkpoint_with_tokenizer(tmp_path, generation_eos=(7,))
    cfg = load_experiment("tiny_cpu", [f"model.path={tmp_path}"])
    assert stop_token_ids(cfg, check_run_tokens(cfg).tokenizer) == (EOT, 7)


def test_explicit_list_wins_and_empty_list_never_stops(ckpt):
    cfg = load_experiment("tiny_cpu", [f"model.path={ckpt}", "rollout.stop_token_ids=[9]"])
    assert check_run_tokens(cfg).stop_token_ids == (9,)
    cfg = load_experiment("tiny_cpu", [f"model.path={ckpt}", "rollout.stop_token_ids=[]"])
    assert check_run_tokens(cfg).stop_token_ids == ()


def test_no_checkpoint_uses_the_character_tokenizers_eos():
    # tiny_cpu sets no stop ids: the random model's config says nothing, the char tokenizer's <eos> is id 2.
    assert check_run_tokens(load_experiment("tiny_cpu", [])).stop_token_ids == (2,)


def test_embedding_smaller_than_tokenizer_is_refused(tmp_path):
    save_tiny_checkpoint_with_tokenizer(tmp_path, vocab_size=len(CHAT_WORDS) - 2)
    cfg = load_experiment("tiny_cpu", [f"model.path={tmp_path}"])
    with pytest.raises(UserError, match=rf"^model\.vocab_size: {len(CHAT_WORDS) - 2} is smaller than the "
                                        rf"tokenizer's {len(CHAT_WORDS)} ids \(model\.path="):
        check_run_tokens(cfg)
    with pytest.raises(UserError, match=r"^model\.vocab_size: 10 .* set model\.vocab_size=17$"):
        check_run_tokens(load_experiment("tiny_cpu", ["model.vocab_size=10"]))


def test_stop_id_outside_the_vocabulary_is_refused():
    with pytest.raises(UserError, match=r"^rollout\.stop_token_ids: \[40\] .* model\.vocab_size=17"):
        check_run_tokens(load_experiment("tiny_cpu", ["rollout.stop_token_ids=[2,40]"]))


def _plan(tmp_path, *overrides):
    return subprocess.run([sys.executable, "-m", "hybridflow.plan", *overrides], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_plan_prints_the_stop_ids_and_refuses_a_small_embedding(tmp_path, ckpt):
    proc = _plan(tmp_path, f"model.path={ckpt}")
    assert proc.returncode == 0, proc.stderr
    assert f"rollout stops at token ids [{EOT}, {END}] (tokenizer eos + checkpoint eos_token_id)" in proc.stdout
    assert json.loads((tmp_path / "plan.json").read_text())["stop_token_ids"] == [EOT, END]
    (tmp_path / "plan.json").unlink()
    proc = _plan(tmp_path, "model.vocab_size=10")
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "error: model.vocab_size: 10 is smaller than the tokenizer's 17 ids (the built-in character tokenizer); "
        "set model.vocab_size=17"]
    assert not (tmp_path / "plan.json").exists()
