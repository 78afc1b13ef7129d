"""A one-node Slurm cluster for the tests, so that `srun` starts the ranks as it does on a cluster: Debian's
slurm-wlm (22.05: slurmctld, slurmd, srun), started as root in a temporary folder with ports of its own, auth/none
(no munge daemon), no cgroups (proctrack/linuxproc, task/none), the node's CPUs as `slurmd -C` reads them and
`config_overrides`, so that more tasks than cores may share it. Every client command finds it through SLURM_CONF.

.ci/run installs slurm-wlm where it runs as root with apt-get (`apt-get install --no-install-recommends slurm-wlm`);
elsewhere the tests that need the cluster skip, saying so. It is never the user's own cluster: nothing is read
from /etc/slurm."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

NEEDS = ("srun", "slurmctld", "slurmd", "scontrol", "scancel", "sinfo")
INSTALL = "apt-get install --no-install-recommends slurm-wlm (as root; .ci/run does)"


@dataclass(frozen=True)
class Cluster:
    """A running cluster: its slurm.conf and folder."""

    conf: Path
    folder: Path

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` (a launch's environment, no launcher's variables in it) with this cluster's SLURM_CONF."""
        return {**base, "SLURM_CONF": str(self.conf)}


def missing() -> str | None:
    """Why this machine cannot start the cluster, or None."""
    absent = [tool for tool in NEEDS if shutil.which(tool) is None]
    if absent:
        return f"no Slurm ({', '.join(absent)} missing): {INSTALL}"
    if os.geteuid() != 0:
        return "the test cluster's slurmd runs as root (it starts every task), and these tests do not"
    return None


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _node() -> tuple[str, int]:
    """This machine's node name and CPUs, as slurmd reads them."""
    line = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30, check=True).stdout
    fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
    return fields["NodeName"], int(fields["CPUs"])


def _conf(folder: Path) -> str:
    node, cpus = _node()
    ctld, slurmd = _free_ports(2)
    return "\n".join(
        [
            "ClusterName=deepdsl-tests",
            # job ids of its own: with ids from 1, as every earlier test cluster had, the first jobs' MPI_Init
            # failed or hung under srun --mpi=pmi2 about half the time ('failed to unpack address', 'Message
            # truncated': what another job of that id left); with these, 10 runs of 10 passed
            f"FirstJobId={random.randint(1_000_000, 60_000_000)}",
            f"TmpFS={folder / 'tmp'}",
            f"SlurmctldHost={node}(127.0.0.1)",
            "AuthType=auth/none",
            "CredType=cred/none",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={ctld}",
            f"SlurmdPort={slurmd}",
            f"StateSaveLocation={folder / 'state'}",
            f"SlurmdSpoolDir={folder / 'spool'}",
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
            f"SlurmdPidFile={folder / 'slurmd.pid'}",
            f"SlurmctldLogFile={folder / 'slurmctld.log'}",
            f"SlurmdLogFile={folder / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "ReturnToService=2",
            f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
            "PartitionName=tests Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8",
            "",
        ]
    )


def _steps(cluster: Cluster) -> list[int]:
    """The slurmstepd processes of this cluster (their environment names its slurm.conf)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() == "slurmstepd":
                if f"SLURM_CONF={cluster.conf}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                    pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _stop(cluster: Cluster, env: dict[str, str]) -> None:
    """Cancels every job (a test that timed out leaves its step running), shuts the daemons down, and kills what
    is left of them."""
    daemons = []
    for daemon in ("slurmd", "slurmctld"):
        try:
            daemons.append(int((cluster.folder / f"{daemon}.pid").read_text().strip()))
        except (OSError, ValueError):
            continue
    subprocess.run(["scancel", "--partition=tests"], env=env, capture_output=True, timeout=30, check=False)
    deadline = time.monotonic() + 10
    while _steps(cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    subprocess.run(["scontrol", "shutdown"], env=env, capture_output=True, timeout=30, check=False)
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in daemons) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in [*daemons, *_steps(cluster)]:
        if _alive(pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"  # a zombie has ended
    except (ProcessLookupError, OSError):
        return False


@contextmanager
def slurm_cluster(folder: Path) -> Iterator[Cluster]:
    """Starts the cluster in `folder` (skipping the test where this machine cannot), yields it once its node is
    idle, and shuts it down."""
    why = missing()
    if why:
        pytest.skip(why)
    for sub in ("state", "spool", "tmp"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    cluster = Cluster(folder / "slurm.conf", folder)
    cluster.conf.write_text(_conf(folder))
    env = cluster.env(dict(os.environ))
    try:
        for daemon in (["slurmctld", "-i"], ["slurmd"]):
            r = subprocess.run(daemon, env=env, capture_output=True, text=True, timeout=60, check=False)
            assert r.returncode == 0, f"{daemon[0]} did not start: {r.stderr}"
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            r = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=30,
                               check=False)  # fmt: skip
            state = r.stdout.strip()
            if state == "idle":
                break
            time.sleep(0.2)
        log = (folder / "slurmctld.log").read_text() if (folder / "slurmctld.log").exists() else ""
        assert state == "idle", f"the test cluster's node is {state!r}, not idle:\n{log[-2000:]}"
        yield cluster
    finally:
        _stop(cluster, env)
