"""Imported by an engine process as its preload (tests/rollout/test_engine_host.py): records when, and what
the process's environment held, in the file $PRELOAD_PROBE names."""

import json
import os
import time

with open(os.environ["PRELOAD_PROBE"], "w") as f:
    json.dump({"at": time.time(), "default": os.environ.get("PRELOAD_DEFAULT"),
               "probe": os.environ["PRELOAD_PROBE"]}, f)
