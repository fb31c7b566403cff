from hybridflow.trainer.resume import latest_complete, step_dir
from tests.trainer.checkpoint_dirs import checkpoint_of


def test_latest_complete_skips_partial_checkpoints(tmp_path):
    root = tmp_path / "checkpoints"
    assert latest_complete(root) is None
    checkpoint_of(tmp_path, "tiny_cpu", 2)
    ten = checkpoint_of(tmp_path, "tiny_cpu", 10)
    (root / (step_dir(root, 12).name + ".partial")).mkdir()  # killed mid-write
    assert latest_complete(root) == ten
