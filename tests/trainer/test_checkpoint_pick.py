from hybridflow.trainer.resume import latest_complete, step_dir


def test_latest_complete_skips_partial_checkpoints(tmp_path):
    assert latest_complete(tmp_path) is None
    step_dir(tmp_path, 2).mkdir()
    step_dir(tmp_path, 10).mkdir()
    (tmp_path / (step_dir(tmp_path, 12).name + ".partial")).mkdir()  # killed mid-write
    assert latest_complete(tmp_path) == step_dir(tmp_path, 10)
