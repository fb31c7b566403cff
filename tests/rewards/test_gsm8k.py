import pytest

from hybridflow.rewards import RewardInputs, extract_final_answer, gsm8k, gsm8k_score, load_reward_fn


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so she has 5 + 7 = 12 apples.\n#### 12", "12"),
        ("#### 1,234", "1234"),  # thousands commas
        ("The loss is #### -7", "-7"),
        ("#### 3.50", "3.5"),  # trailing zeros do not make a different answer
        ("#### $18", "18"),
        ("first \\boxed{4} then \\boxed{ 2,000 }", "2000"),  # the last match wins
        ("#### 5 ... actually \\boxed{6}", "6"),
        ("#### 0.0", "0"),
        ("#### 100", "100"),  # not 1E+2
        ("the answer is 12", None),
        ("\\boxed{x+1}", None),
    ],
)
def test_extract_final_answer(text, answer):
    assert extract_final_answer(text) == answer


@pytest.mark.parametrize(
    ("response", "answer", "score"),
    [
        ("... #### 72", "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72", 1.0),  # full GSM8K solution
        ("\\boxed{72}", "72", 1.0),  # bare-number reference
        ("#### 72.0", "72", 1.0),
        ("#### 1,000", "1000", 1.0),
        ("#### 71", "72", 0.0),
        ("72", "72", 0.0),  # no final-answer marker, no credit
        ("#### 72", "seventy-two", 0.0),  # reference without a number never matches
    ],
)
def test_gsm8k_score(response, answer, score):
    assert gsm8k_score(response, answer) == score


def test_gsm8k_batch_and_config_name():
    batch = RewardInputs(["", ""], ["#### 3", "#### 4"], [[], []], [[], []], [{"answer": "#### 3"}, {"answer": 3}])
    assert gsm8k(batch) == [1.0, 0.0]
    assert load_reward_fn("hybridflow.rewards.gsm8k:gsm8k") is gsm8k
