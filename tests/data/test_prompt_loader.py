import pytest

from hybridflow.data import PromptDataset, PromptLoader, build_char_tokenizer, load_prompt_dataset
from hybridflow.errors import UserError


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return build_char_tokenizer(tmp_path_factory.mktemp("tok"))


def _loader(tok, **kw):
    ds = load_prompt_dataset("builtin:sort_digits", seed=0, num_builtin_examples=10)
    return PromptLoader(ds, tok, batch_size=4, max_prompt_length=16, **kw)


def test_epochs_cover_distinct_rows_in_seeded_order(tok):
    a, b = _loader(tok, seed=1), _loader(tok, seed=1)
    first = [row["prompt"] for _ in range(2) for row in a.next_rows()]
    assert first == [row["prompt"] for _ in range(2) for row in b.next_rows()]
    assert a.epoch == 0
    a.next_rows()  # only 2 rows left in epoch 0: they are skipped, epoch 1 starts
    assert a.epoch == 1 and a.index == 4
    c = _loader(tok, seed=2)
    assert [r["prompt"] for r in c.next_rows()] != first[:4]


def test_the_warmup_loader_is_the_next_seeds_loader_without_fitting_the_prompts_again(tok):
    a = _loader(tok, seed=7)
    a.next_rows()  # where the training loader stands does not move the warm-up's start
    warm, fresh = a.warmup_loader(), _loader(tok, seed=8)
    assert warm.dataset is a.dataset and (warm.seed, warm.epoch, warm.index) == (8, 0, 0)
    for _ in range(4):  # into the second epoch
        assert warm.next_rows() == fresh.next_rows()
    assert (a.seed, a.index) == (7, 4)


def test_resume_from_state_dict_continues_identically(tok):
    a = _loader(tok, seed=7)
    for _ in range(3):
        a.next_rows()
    state = a.state_dict()
    b = _loader(tok, seed=0)
    b.load_state_dict(state)
    for _ in range(4):
        assert a.next_batch().input_ids.tolist() == b.next_batch().input_ids.tolist()


def test_an_epoch_is_a_permutation(tok):
    ds = PromptDataset([{"prompt": f"{i}>"} for i in range(10)])
    loader = PromptLoader(ds, tok, batch_size=5, max_prompt_length=8, seed=3)
    epoch = [r["prompt"] for _ in range(2) for r in loader.next_rows()]
    assert sorted(epoch) == sorted(r["prompt"] for r in ds.rows) and epoch != [r["prompt"] for r in ds.rows]
    unshuffled = PromptLoader(ds, tok, batch_size=5, max_prompt_length=8, shuffle=False)
    assert [r["prompt"] for r in unshuffled.next_rows()] == [f"{i}>" for i in range(5)]


def test_batch_carries_rows_for_the_reward(tok):
    batch = _loader(tok).next_batch()
    assert batch.input_ids.shape[0] == 4 and all("answer" in r for r in batch.rows)


def test_overlong_prompts_dropped_and_size_errors(tok):
    ds = PromptDataset([{"prompt": "1>"}, {"prompt": "123456789>"}, {"prompt": "3>"}])
    loader = PromptLoader(ds, tok, batch_size=2, max_prompt_length=5)
    assert loader.num_dropped == 1 and len(loader.dataset) == 2
    with pytest.raises(UserError, match="data.train_batch_size"):
        PromptLoader(ds, tok, batch_size=3, max_prompt_length=5)
    with pytest.raises(UserError, match="data.max_prompt_length"):
        PromptLoader(ds, tok, batch_size=1, max_prompt_length=2)
    other = PromptLoader(PromptDataset([{"prompt": "1>"}] * 5), tok, batch_size=1, max_prompt_length=5)
    with pytest.raises(UserError, match="trainer.resume"):
        other.load_state_dict(loader.state_dict())


def test_overlong_prompts_error_mode_names_count_longest_and_fix(tok):
    ds = PromptDataset([{"prompt": "1>"}, {"prompt": "123456789>"}, {"prompt": "1234>"}])
    with pytest.raises(UserError, match=r"^data\.max_prompt_length: 2 of 3 prompts of data\.source are longer than "
                                        r"4 tokens \(longest 11\) and data\.overlong_prompts=error; raise "
                                        r"data\.max_prompt_length to 11, or set data\.overlong_prompts=drop"):
        PromptLoader(ds, tok, batch_size=1, max_prompt_length=4, overlong_prompts="error")
    fits = PromptLoader(ds, tok, batch_size=1, max_prompt_length=11, overlong_prompts="error")
    assert fits.num_dropped == 0 and len(fits.dataset) == fits.num_rows == 3
    with pytest.raises(UserError, match=r"^data\.max_prompt_length: all 3 prompts .* at least 3$"):
        PromptLoader(ds, tok, batch_size=1, max_prompt_length=2, overlong_prompts="drop")
