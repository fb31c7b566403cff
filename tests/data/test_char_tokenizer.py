import pytest
from transformers import AutoTokenizer

from hybridflow.data import build_char_tokenizer, load_tokenizer
from hybridflow.errors import UserError


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    build_char_tokenizer(path)
    return path


def test_loads_through_auto_tokenizer_with_specials(tok_dir):
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    assert len(tok) == 100
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert tok.padding_side == "right"


@pytest.mark.parametrize("text", ["3142>1234", "17+25=42", "Hello, world!\nsecond line ~{}"])
def test_round_trip_one_id_per_character(tok_dir, text):
    tok = load_tokenizer(tok_dir)
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == len(text) + 1
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text


def test_unknown_character_and_custom_alphabet(tmp_path):
    tok = build_char_tokenizer(tmp_path, alphabet="0123456789>")
    assert len(tok) == 15
    assert tok("1é", add_special_tokens=False)["input_ids"] == [5, tok.unk_token_id]


def test_missing_dir_is_user_error(tmp_path):
    with pytest.raises(UserError, match="data.tokenizer"):
        load_tokenizer(tmp_path / "nope")
