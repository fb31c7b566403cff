"""Benchmark provenance names the commit a figure came from."""

from __future__ import annotations

import re

from benchmarks.provenance import commit


def test_commit_is_head_of_this_checkout(monkeypatch):
    monkeypatch.delenv("HYBRIDFLOW_COMMIT", raising=False)
    assert re.fullmatch(r"([0-9a-f]{7,40}|unknown)(-dirty)?", commit())


def test_sent_commit_overrides_stale_git_metadata(monkeypatch):
    monkeypatch.setenv("HYBRIDFLOW_COMMIT", "abc1234")
    assert commit() == "abc1234"
