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


class _TurnRollout:
    """A multi-turn rollout stand-in: each generate leaves its rows' per-trajectory columns in `turn_stats`
    as RolloutRole.share does; row i of the run (over all chunks) made i % 3 tool calls in i % 3 + 1 turns."""

    def __init__(self, sampling):
        self.sampling, self.step, self.turns, self.turn_stats, self.done = sampling, 0, object(), None, 0

    def generate(self, batch):
        import torch

        from hybridflow.rollout.turns import TRAJECTORY_COLUMNS
        from hybridflow.token_kinds import TokenKind

        stats = torch.zeros(batch.size, len(TRAJECTORY_COLUMNS))
        calls = torch.arange(self.done, self.done + batch.size) % 3
        stats[:, TRAJECTORY_COLUMNS.index("tool_calls")] = calls
        stats[:, TRAJECTORY_COLUMNS.index("turns")] = calls + 1
        stats[:, TRAJECTORY_COLUMNS.index("env_reward")] = float("nan")
        self.turn_stats, self.done = stats, self.done + batch.size
        batch.token_kinds = torch.full_like(batch.tokens, int(TokenKind.ASSISTANT))

    def sync(self, actor):
        pass


def test_validation_reports_turn_and_tool_metrics_over_every_chunk(tmp_path):
    from types import SimpleNamespace

    import torch

    from hybridflow.rollout.base import SamplingParams
    from hybridflow.trainer.scorer import Scorer

    cfg = load_experiment("tiny_cpu", ["data.val_size=10", "trainer.val_every=1", "data.train_batch_size=4",
                                      "algorithm.mini_batch_size=4"])
    tok = build_char_tokenizer(tmp_path / "tok")
    validator = Validator.build(cfg, tok)
    rollout = _TurnRollout(SamplingParams(max_new_tokens=8))
    trainer = SimpleNamespace(rollout=rollout, roles={}, meshes={"rollout": SimpleNamespace(dp=1)},
                              scorer=Scorer(lambda b: torch.ones(b.size), lambda local, b: local))
    out = validator.run(trainer)
    assert rollout.done == 10  # three chunks of at most 4
    calls = [i % 3 for i in range(10)]
    assert out["val/tools/calls_per_trajectory"] == pytest.approx(sum(calls) / 10)
    assert out["val/tools/calling_share"] == pytest.approx(sum(c > 0 for c in calls) / 10)
    assert out["val/turns/max"] == 3 and out["val/accuracy"] == 1.0
    rollout.turns = None  # single turn: no turn metrics
    assert not any(k.startswith(("val/turns", "val/tools")) for k in validator.run(trainer))


def test_a_chunk_is_padded_to_every_roles_dp_and_the_copies_are_not_counted(tmp_path):
    """33 held-out prompts in chunks of 10 over a rollout of DP 2 and a reward model of DP 5: each generate gets
    a multiple of 10 rows (the replicas' results are assembled in equal blocks: share_from_role), so the last
    chunk's 3 rows go with 7 copies, and only the 33 count."""
    from types import SimpleNamespace

    import torch

    from hybridflow.rollout.base import SamplingParams
    from hybridflow.trainer.scorer import Scorer

    cfg = load_experiment("tiny_cpu", ["data.val_size=33", "trainer.val_every=1", "data.train_batch_size=10",
                                      "algorithm.mini_batch_size=10", "rollout.n_samples_per_prompt=1"])
    validator = Validator.build(cfg, build_char_tokenizer(tmp_path / "tok"))
    rollout = _TurnRollout(SamplingParams(max_new_tokens=8))
    sizes = []

    def score(batch):  # prompt 30 (the last chunk's first) scores 1, every other 0: its copies would lift the mean
        sizes.append(batch.size)
        return torch.tensor([float(r is validator.rows[30]) for r in batch.rows])

    trainer = SimpleNamespace(rollout=rollout, roles={}, scorer=Scorer(score, lambda local, b: local),
                              meshes={"rollout": SimpleNamespace(dp=2), "reward": SimpleNamespace(dp=5)})
    out = validator.run(trainer)
    assert sizes == [10, 10, 10, 10]
    assert out["val/num_prompts"] == 33 and out["val/accuracy"] == pytest.approx(1 / 33)
    # the stand-in numbers its rows on over the copies: row i of chunk c made (10 c + i) % 3 calls; 3 of chunk 3 count
    calls = sum((10 * c + i) % 3 for c, n in enumerate([10, 10, 10, 3]) for i in range(n))
    assert out["val/tools/calls_per_trajectory"] == pytest.approx(calls / 33)


def test_a_bad_val_source_is_blamed_on_data_val_source(tmp_path):
    tok = build_char_tokenizer(tmp_path / "tok")
    bad = tmp_path / "val.jsonl"
    bad.write_text("{bad json\n")
    cfg = load_experiment("tiny_cpu", [f"data.val_source={bad}", "trainer.val_every=1"])
    with pytest.raises(UserError, match=r"^data\.val_source: .*val\.jsonl:1 is not valid JSON"):
        Validator.build(cfg, tok)
