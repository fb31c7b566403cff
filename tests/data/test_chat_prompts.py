import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from hybridflow.data import PromptLoader, build_char_tokenizer, load_prompt_dataset, load_tokenizer
from hybridflow.errors import UserError

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)
MESSAGES = [{"role": "system", "content": "add"}, {"role": "user", "content": "1 + 2"}]


def _word_tokenizer(out_dir):
    """A real WordLevel tokenizer (whitespace words) with a chat template, saved like a model's tokenizer."""
    words = ["<pad>", "<s>", "</s>", "<unk>", "<system>", "<user>", "<assistant>", "add", "1", "+", "2", "what"]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(out_dir))
    config = json.loads((out_dir / "tokenizer_config.json").read_text())
    (out_dir / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    return load_tokenizer(out_dir)


def _dataset(tmp_path, prompts):
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "answer": "3"}) + "\n" for p in prompts))
    return load_prompt_dataset(str(path))


def test_chat_column_rendered_with_template_and_plain_text_unchanged(tmp_path):
    tokenizer = _word_tokenizer(tmp_path / "tok")
    loader = PromptLoader(_dataset(tmp_path, [MESSAGES, "what"]), tokenizer, 2, 32, shuffle=False)
    chat, plain = loader.dataset.rows
    assert chat["prompt"] == "<system> add </s> <user> 1 + 2 </s> <assistant> "  # template's bos dropped
    assert chat["prompt_messages"] == MESSAGES and plain["prompt"] == "what"
    ids = loader.next_batch().input_ids[0].tolist()
    words = tokenizer.convert_ids_to_tokens(ids)
    assert words == ["<s>", "<system>", "add", "</s>", "<user>", "1", "+", "2", "</s>", "<assistant>"]  # one bos


def test_chat_column_without_template_is_one_clear_error(tmp_path):
    tokenizer = build_char_tokenizer(tmp_path / "chars")
    with pytest.raises(UserError, match=r"data\.prompt_key: .*no chat template; set data\.tokenizer"):
        PromptLoader(_dataset(tmp_path, [MESSAGES]), tokenizer, 1, 64)


def test_non_message_list_is_rejected(tmp_path):
    with pytest.raises(UserError, match="list of {role, content} messages"):
        _dataset(tmp_path, [[{"role": "user"}]])
