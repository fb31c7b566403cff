"""A character-level tokenizer built locally and saved as a HF tokenizer directory.

Saved with `PreTrainedTokenizerFast.save_pretrained`, so it loads through the same
`AutoTokenizer.from_pretrained(local_dir)` path as a real model's tokenizer.
"""

from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from hybridflow.errors import UserError

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0..3 in this order
# Printable ASCII without the vertical whitespace other than "\n": 96 characters + 4 specials = 100 ids.
DEFAULT_ALPHABET = "".join(c for c in string.printable if c not in "\r\x0b\x0c\t")


def char_tokenizer(alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """A one-id-per-character tokenizer over `alphabet` (+ pad/bos/eos/unk), in memory.

    Encoding prepends <bos>, like Llama's tokenizer; unknown characters map to <unk>.
    """
    chars = list(dict.fromkeys(alphabet))
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK, padding_side="right"
    )


def build_char_tokenizer(out_dir: str | Path, alphabet: str = DEFAULT_ALPHABET) -> PreTrainedTokenizerFast:
    """`char_tokenizer(alphabet)`, saved to `out_dir` as a HF tokenizer directory."""
    fast = char_tokenizer(alphabet)
    fast.save_pretrained(str(out_dir))
    return fast


def load_tokenizer(path: str | Path, field: str = "data.tokenizer") -> PreTrainedTokenizerBase:
    """A HF tokenizer from a local directory; it must define a pad token or an eos token to pad with."""
    if not (Path(path) / "tokenizer_config.json").is_file() and not (Path(path) / "tokenizer.json").is_file():
        raise UserError(f"{field}: {str(path)!r} has no tokenizer (tokenizer.json / tokenizer_config.json); "
                        "set data.tokenizer to a local HF tokenizer dir")
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise UserError(f"{field}: tokenizer at {str(path)!r} has no pad or eos token; add a pad token")
        tokenizer.pad_token = tokenizer.eos_token  # padding is masked out; any id will do
    return tokenizer
