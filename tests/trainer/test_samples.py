"""Sample generations: decoded records of the first samples, written to samples.jsonl and TensorBoard text."""

import json

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hybridflow.data.step_batch import StepBatch
from hybridflow.data.tasks import BUILTIN_ALPHABET
from hybridflow.data.tokenizer import char_tokenizer
from hybridflow.token_kinds import TokenKind
from hybridflow.trainer.metrics import MetricsLog
from hybridflow.trainer.samples import sample_records
from hybridflow.trainer.scorer import rule_inputs
from tests.single_turn import single_turn_kinds


def _batch(tok):
    """Row 0 stops at <eos> after "2"; row 1 runs to the length limit; row 2 is not logged (n=2)."""
    eos, pad = tok.eos_token_id, tok.pad_token_id
    rows = [(tok("12>")["input_ids"], tok("2", add_special_tokens=False)["input_ids"] + [eos]),
            (tok("3>")["input_ids"], tok("333", add_special_tokens=False)["input_ids"]),
            (tok("4>")["input_ids"], [eos])]
    width = max(len(p) + len(r) for p, r in rows) + 2
    tokens = torch.full((3, width), pad)
    mask = torch.zeros(3, width, dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        tokens[i, : len(p) + len(r)] = torch.tensor(p + r)
        mask[i, len(p) : len(p) + len(r)] = 1
    prompt_lens = torch.tensor([len(p) for p, _ in rows])
    return StepBatch(rows=[{}] * 3, tokens=tokens, prompt_lens=prompt_lens,
                     token_kinds=single_turn_kinds(prompt_lens, mask), scores=torch.tensor([1.0, 0.25, 0.0]))


def test_records_decode_prompt_response_reward_and_why_it_ended():
    tok = char_tokenizer(BUILTIN_ALPHABET)
    records = sample_records(tok, _batch(tok), step=7, split="val", n=2, stop_token_ids=(tok.eos_token_id,))
    assert records == [
        {"step": 7, "split": "val", "prompt": "<bos>12>", "response": "2<eos>", "reward": 1.0,
         "response_tokens": 2, "finish_reason": "stop"},
        {"step": 7, "split": "val", "prompt": "<bos>3>", "response": "333", "reward": 0.25,
         "response_tokens": 3, "finish_reason": "length"},
    ]


def test_metrics_log_writes_samples_jsonl_and_tensorboard_text(tmp_path):
    tok = char_tokenizer(BUILTIN_ALPHABET)
    log = MetricsLog(tmp_path, total_steps=2, start_step=0, active=True)
    log.log_samples(sample_records(tok, _batch(tok), 1, "train", 2, (tok.eos_token_id,)))
    log.log_samples(sample_records(tok, _batch(tok), 2, "val", 1, (tok.eos_token_id,)))
    log.bar.close()
    log.writer.close()
    lines = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["split"]) for r in lines] == [(1, "train"), (1, "train"), (2, "val")]
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    assert {"samples/train/text_summary", "samples/val/text_summary"} <= set(events.Tags()["tensors"])
    text = events.Tensors("samples/train/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "2<eos>" in text and "(stop)" in text and "(length)" in text


def test_inactive_rank_writes_nothing(tmp_path):
    tok = char_tokenizer(BUILTIN_ALPHABET)
    MetricsLog(tmp_path, 2, 0, active=False).log_samples(sample_records(tok, _batch(tok), 1, "train", 2, ()))
    assert not (tmp_path / "samples.jsonl").exists()


def test_a_multi_turn_record_shows_each_turn_and_counts_sampled_tokens():
    tok = char_tokenizer(BUILTIN_ALPHABET)
    def text(s: str) -> list[int]:
        return tok(s, add_special_tokens=False)["input_ids"]

    parts = [(TokenKind.PROMPT, tok("12>")["input_ids"]), (TokenKind.ASSISTANT, text("3+")),
             (TokenKind.OBSERVATION, text("45")), (TokenKind.ASSISTANT, text("6") + [tok.eos_token_id])]
    ids = [i for _, p in parts for i in p]
    kinds = torch.zeros(1, len(ids) + 3, dtype=torch.long)
    kinds[0, : len(ids)] = torch.tensor([int(k) for k, p in parts for _ in p])
    tokens = torch.full(kinds.shape, tok.pad_token_id)
    tokens[0, : len(ids)] = torch.tensor(ids)
    batch = StepBatch(rows=[{}], tokens=tokens, prompt_lens=torch.tensor([len(parts[0][1])]), token_kinds=kinds,
                      scores=torch.tensor([1.0]))
    (record,) = sample_records(tok, batch, step=1, split="train", n=1, stop_token_ids=(tok.eos_token_id,))
    assert record["response"] == "3+456<eos>" and record["response_tokens"] == 4  # 2 + 2 sampled, 2 observed
    assert record["finish_reason"] == "stop"
    assert record["turns"] == [{"kind": "assistant", "text": "3+", "ids": text("3+")},
                               {"kind": "observation", "text": "45", "ids": text("45")},
                               {"kind": "assistant", "text": "6<eos>", "ids": text("6") + [tok.eos_token_id]}]
    assert rule_inputs(tok, batch).responses == ["3+456"]  # a rule reads the whole trajectory
