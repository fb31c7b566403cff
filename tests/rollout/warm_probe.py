"""An engine process's `warm` callable (tests/rollout/test_engine_host.py): records when it ran."""

import json
import time


def record_warm(path: str) -> None:
    with open(path, "w") as f:
        json.dump({"at": time.time()}, f)
