"""A throwaway Slurm cluster on localhost for end-to-end tests (Debian's slurm-wlm + munge).

Everything lives in one scratch directory: munge key/socket, slurm.conf, state, spool, logs. The daemons are
started here and stopped by pid in `stop()`; nothing under /etc or /run is touched, so a system Slurm (if any)
is not disturbed. `nodes > 1` starts one slurmd per emulated node (`slurmd -N <name>`, distinct ports), all on
this host: Slurm allows that when it was built with multiple-slurmd support, which `start()` finds out by
waiting for every node to come up.

Install on Debian: `apt-get install -y slurm-wlm munge`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from hybridflow.launch.ports import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "srun")
INSTALL_HINT = "apt-get install -y slurm-wlm munge"


def missing_binaries() -> list[str]:
    """Names of the Slurm/munge programs this fixture needs that are not on PATH (or in /usr/sbin)."""
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
    return [b for b in BINARIES if shutil.which(b, path=path) is None]


def _which(name: str) -> str:
    found = shutil.which(name, path=os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin")
    if found is None:
        raise FileNotFoundError(f"{name} not found; install with `{INSTALL_HINT}`")
    return found


@dataclass
class SlurmCluster:
    """A localhost Slurm cluster of `nodes` emulated nodes with `cpus_per_node` CPUs each."""

    root: Path
    nodes: int = 1
    cpus_per_node: int = 2
    partition: str = "debug"
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def conf_path(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def node_names(self) -> list[str]:
        return [f"hfnode{i}" for i in range(self.nodes)]

    def env(self) -> dict[str, str]:
        """Environment for client commands (sbatch, squeue, ...) to talk to this cluster."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf_path)
        env["PATH"] = env.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin"
        return env

    # ---------------------------------------------------------------- setup
    def _write_munge(self) -> Path:
        munge_dir = self.root / "munge"
        munge_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(munge_dir, 0o700)
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(128))
        os.chmod(key, 0o400)
        return munge_dir

    def _write_conf(self, munge_socket: Path) -> None:
        host = socket.gethostname()
        ctld_port, base_port = free_port("127.0.0.1"), free_port("127.0.0.1")
        for sub in ("state", "logs", *[f"spool/{n}" for n in self.node_names]):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        node_lines = [
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={base_port + i} "
            f"CPUs={self.cpus_per_node} RealMemory=1000 State=UNKNOWN"
            for i, name in enumerate(self.node_names)
        ]
        # proctrack/linuxproc + task/none: no cgroups needed (containers rarely allow them).
        conf = f"""
ClusterName=hftest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={self.root}/state
SlurmdSpoolDir={self.root}/spool/%n
SlurmctldPidFile={self.root}/slurmctld.pid
SlurmdPidFile={self.root}/slurmd.%n.pid
SlurmctldLogFile={self.root}/logs/slurmctld.log
SlurmdLogFile={self.root}/logs/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{chr(10).join(node_lines)}
PartitionName={self.partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
        self.conf_path.write_text(conf.lstrip())

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = open(self.root / "logs" / f"{name}.console", "wb")  # noqa: SIM115 - lives with the daemon
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.pids[name] = proc.pid
        self._procs = getattr(self, "_procs", {})
        self._procs[name] = proc

    def start(self, timeout_s: float = 60.0) -> None:
        """Start munged, slurmctld and one slurmd per node; wait until every node is idle."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        munge_dir = self._write_munge()
        munge_socket = munge_dir / "munge.socket"
        self._write_conf(munge_socket)
        env = self.env()
        # --force: munged refuses to run as root with a key not owned by a munge user otherwise.
        self._spawn("munged", [
            _which("munged"), "--foreground", "--force", f"--key-file={munge_dir / 'munge.key'}",
            f"--socket={munge_socket}", f"--pid-file={munge_dir / 'munged.pid'}",
            f"--log-file={munge_dir / 'munged.log'}", f"--seed-file={munge_dir / 'munged.seed'}",
            "--num-threads=2",
        ], env)
        self._wait(lambda: munge_socket.exists(), 10, "munged socket")
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf_path)], env)
        self._wait(lambda: self._run_ok(["scontrol", "ping"]), 20, "slurmctld ping")
        for name in self.node_names:
            argv = [_which("slurmd"), "-D", "-N", name, "-f", str(self.conf_path)]
            self._spawn(f"slurmd.{name}", argv, env)
        self._wait(self._all_idle, timeout_s, "all nodes idle")

    # ---------------------------------------------------------------- queries
    def _run_ok(self, argv: list[str]) -> bool:
        try:
            out = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=10)
        except subprocess.TimeoutExpired:
            return False
        return out.returncode == 0 and "DOWN" not in out.stdout

    def _all_idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env(), capture_output=True,
                             text=True, timeout=10)
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return len(states) == self.nodes and all(s == "idle" for s in states.values())

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, proc in getattr(self, "_procs", {}).items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode} while waiting for {what}; "
                                       f"logs: {self.root / 'logs'}\n{self.logs_tail()}")
            if ready():
                return
            time.sleep(0.5)
        raise TimeoutError(f"Slurm test cluster: {what} not reached in {timeout_s:.0f}s; logs: "
                           f"{self.root / 'logs'}\n{self.logs_tail()}")

    def logs_tail(self, lines: int = 15) -> str:
        parts = []
        for path in sorted((self.root / "logs").glob("*")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"== {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def sbatch(self, script: Path, args: list[str] | None = None, cwd: Path | None = None) -> int:
        """Submit `script`; returns the job id."""
        out = subprocess.run(["sbatch", "--parsable", str(script), *(args or [])], env=self.env(),
                             capture_output=True, text=True, timeout=30, cwd=cwd, check=True)
        return int(out.stdout.strip().split(";")[0])

    def job_state(self, job_id: int) -> str:
        out = subprocess.run(["scontrol", "show", "job", str(job_id)], env=self.env(), capture_output=True,
                             text=True, timeout=10)
        for token in out.stdout.split():
            if token.startswith("JobState="):
                return token.split("=", 1)[1]
        return "UNKNOWN"

    def wait_job(self, job_id: int, timeout_s: float) -> str:
        """Wait until the job leaves PENDING/RUNNING/COMPLETING; returns its final state."""
        deadline = time.monotonic() + timeout_s
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "UNKNOWN"):
                return state
            time.sleep(1.0)
        subprocess.run(["scancel", str(job_id)], env=self.env(), timeout=10)
        raise TimeoutError(f"job {job_id} still {state} after {timeout_s:.0f}s\n{self.logs_tail()}")

    # ---------------------------------------------------------------- teardown
    def stop(self) -> None:
        """Stop every daemon this fixture started (SIGTERM, then SIGKILL), by pid, slurmd first."""
        procs = getattr(self, "_procs", {})
        for name in sorted(procs, key=lambda n: (not n.startswith("slurmd"), n == "munged")):
            proc = procs[name]
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=10)
        procs.clear()
        self.pids.clear()
