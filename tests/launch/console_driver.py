"""`python tests/launch/console_driver.py LOG_DIR PORT`: launch 2 ranks of noisy_workers.prints_progress as
`hybridflow.run` launches its ranks (known warnings quieted in this process first), for test_console.py.
Everything runs under the main guard: each rank imports this file again as `__mp_main__`."""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: hybridflow and tests
    from hybridflow.launch.known_warnings import quiet_known_noise

    quiet_known_noise()  # as hybridflow.run does before it imports the rank's modules
    from hybridflow.launch import launch_local
    from tests.launch.launch_fakes import fake_plan
    from tests.launch.launch_workers import DistCfg
    from tests.launch.noisy_workers import prints_progress

    log_dir, port = sys.argv[1], int(sys.argv[2])
    launch_local(fake_plan(1, 2), prints_progress, [port], DistCfg(master_port=port), log_dir)
