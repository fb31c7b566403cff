import pytest
import torch

from hybridflow.data import build_char_tokenizer, collate_prompts, load_prompt_dataset
from hybridflow.errors import UserError
from hybridflow.rewards import (
    RewardInputs,
    answer_exact,
    answer_match,
    char_match,
    compute_scores,
    reward_inputs,
)


@pytest.mark.parametrize(
    ("response", "answer", "score"),
    [
        ("1234", "1234", 1.0),
        (" 1234\n", "1234", 1.0),  # surrounding whitespace is ignored
        ("1243", "1234", 0.5),
        ("12", "1234", 0.5),  # too short
        ("123499", "1234", 4 / 6),  # trailing junk costs like missing characters
        ("", "12", 0.0),
        ("", "", 1.0),
    ],
)
def test_char_match(response, answer, score):
    assert char_match(response, answer) == pytest.approx(score)


def _inputs(responses, rows):
    n = len(responses)
    return RewardInputs([""] * n, responses, [[]] * n, [[]] * n, rows)


def test_answer_rewards_and_missing_answer_field():
    batch = _inputs(["42", "41", "4"], [{"answer": "42"}, {"answer": 42}, {"answer": "42"}])
    assert answer_match(batch) == [1.0, 0.5, 0.5]
    assert answer_exact(batch) == [1.0, 0.0, 0.0]
    with pytest.raises(UserError, match="'answer' field"):
        answer_match(_inputs(["1"], [{"prompt": "x"}]))


def test_compute_scores_checks_count_and_finiteness():
    batch = _inputs(["a", "b"], [{}, {}])
    torch.testing.assert_close(compute_scores(lambda b: [0.5, 1], batch), torch.tensor([0.5, 1.0]))
    with pytest.raises(UserError, match="returned 1 scores for 2"):
        compute_scores(lambda b: [1.0], batch)
    with pytest.raises(UserError, match="NaN"):
        compute_scores(lambda b: torch.tensor([1.0, float("nan")]), batch)


def test_builtin_task_end_to_end_from_token_ids(tmp_path):
    # Prompts and responses right-padded (responses after eos): decode them and score against the answers.
    tok = build_char_tokenizer(tmp_path)
    rows = load_prompt_dataset("builtin:sort_digits", seed=0, num_builtin_examples=3).rows
    prompts = collate_prompts(tok, [r["prompt"] for r in rows], 16, rows)
    texts = [rows[0]["answer"], rows[1]["answer"][::-1], "x"]
    encoded = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]
    width = max(map(len, encoded)) + 2
    response_ids = torch.full((3, width), tok.pad_token_id)
    response_mask = torch.zeros(3, width, dtype=torch.long)
    for i, ids in enumerate(encoded):
        response_ids[i, : len(ids)], response_mask[i, : len(ids)] = torch.tensor(ids), 1
    batch = reward_inputs(
        tok, prompts.input_ids, prompts.attention_mask, response_ids, response_mask, prompts.rows
    )
    assert batch.prompts == [r["prompt"] for r in rows] and batch.responses == texts
    assert batch.response_ids[0][-1] == tok.eos_token_id
    scores = compute_scores(answer_match, batch)
    assert scores[0] == 1.0 and scores[2] == 0.0
    assert scores[1] == pytest.approx(char_match(texts[1], rows[1]["answer"]))


@pytest.mark.parametrize(("returned", "what"), [
    (["good", "bad"], "a list of str"),
    (None, "None"),
    ({"a": 1.0, "b": 0.0}, "a dict"),
    ("1.0", "a str"),
    (torch.tensor([[1.0], [0.0]]), r"a tensor of shape \(2, 1\)"),
    ([[1.0], [0.0]], r"a list of list"),
    (torch.tensor(1.0), r"a tensor of shape \(\)"),
])
def test_compute_scores_refuses_a_wrong_return_in_one_line_naming_reward_fn(returned, what):
    batch = _inputs(["a", "b"], [{}, {}])
    with pytest.raises(UserError, match=rf"^reward\.fn: returned {what}, not one number per sample; return a list "
                                        r"of 2 floats or a 1-D tensor") as err:
        compute_scores(lambda b: returned, batch)
    assert "\n" not in str(err.value)
