"""A Slurm cluster for the tests, so that `srun` starts the ranks as it does on a cluster: Debian's slurm-wlm
(22.05: slurmctld, slurmd, srun), started as root in a temporary folder with ports of its own, auth/none (no munge
daemon), no cgroups (proctrack/linuxproc, task/none), the node's CPUs as `slurmd -C` reads them and
`config_overrides`, so that more tasks than cores may share it. Every client command finds it through SLURM_CONF.

One node by default. `nodes=N` emulates N nodes on this one machine, as Slurm's "multiple slurmd" mode does: one
slurmd per node (`slurmd -N node1` ...), each NodeName with its own Port and NodeAddr 127.0.0.1, and `%n` in the
slurmd's pid file, spool folder and log, so that `srun -N 2` places tasks on two nodes with SLURM_NODEID and
SLURM_LOCALID as a two-node cluster sets them (Debian's 22.05 runs this mode; checked by test_slurm_nodes.py). The
nodes share the machine's CPUs, memory and file system: a launch across them, not across machines.

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
    """A running cluster: its slurm.conf, folder and node names (as SLURMD_NODENAME says them)."""

    conf: Path
    folder: Path
    nodes: tuple[str, ...] = ()

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


def _names(nodes: int) -> tuple[str, ...]:
    """The node names: this machine's own for one node (its slurmd finds itself by its host name); node1 ...
    nodeN for emulated nodes, each slurmd told its own with -N."""
    return (_node()[0],) if nodes == 1 else tuple(f"node{i}" for i in range(1, nodes + 1))


def _conf(folder: Path, names: tuple[str, ...]) -> str:
    host, cpus = _node()
    ctld, *slurmds = _free_ports(1 + len(names))
    if len(names) == 1:
        daemons = [
            f"SlurmdPort={slurmds[0]}",
            f"SlurmdSpoolDir={folder / 'spool'}",
            f"SlurmdPidFile={folder / 'slurmd.pid'}",
            f"SlurmdLogFile={folder / 'slurmd.log'}",
        ]
        node_lines = [f"NodeName={names[0]} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN"]
    else:  # one slurmd per node: each its own port, and %n (the node's name) in what would otherwise collide
        daemons = [
            f"SlurmdSpoolDir={folder / 'spool' / '%n'}",
            f"SlurmdPidFile={folder / 'slurmd.%n.pid'}",
            f"SlurmdLogFile={folder / 'slurmd.%n.log'}",
            # the pmix plugin makes its clients' folder in TmpFS under the job's name alone, so two nodes in one
            # TmpFS collide ('Cannot create client cli tmpdir ... File exists'): one each
            f"TmpFS={folder / 'tmp' / '%n'}",
        ]
        node_lines = [f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} State=UNKNOWN"
                      for name, port in zip(names, slurmds, strict=True)]  # fmt: skip
    return "\n".join(
        [
            "ClusterName=deepdsl-tests",
            # job ids of its own: with ids from 1, as every earlier test cluster had, the first jobs' MPI_Init
            # failed or hung under srun --mpi=pmi2 about half the time ('failed to unpack address', 'Message
            # truncated': what another job of that id left); with these, 10 runs of 10 passed
            f"FirstJobId={random.randint(1_000_000, 60_000_000)}",
            *([f"TmpFS={folder / 'tmp'}"] if len(names) == 1 else []),
            f"SlurmctldHost={host}(127.0.0.1)",
            "AuthType=auth/none",
            "CredType=cred/none",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={ctld}",
            *daemons,
            f"StateSaveLocation={folder / 'state'}",
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
            f"SlurmctldLogFile={folder / 'slurmctld.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "MpiDefault=none",
            "ReturnToService=2",
            *node_lines,
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
    """Cancels every job (a test that timed out leaves its step running), shuts the daemons down (slurmctld tells
    every slurmd), and kills what is left of them: the pid files of this cluster's folder alone, every slurmd's."""
    daemons = []
    for pid_file in [*sorted(cluster.folder.glob("slurmd*.pid")), cluster.folder / "slurmctld.pid"]:
        try:
            daemons.append(int(pid_file.read_text().strip()))
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
def slurm_cluster(folder: Path, nodes: int = 1) -> Iterator[Cluster]:
    """Starts the cluster of `nodes` nodes in `folder` (skipping the test where this machine cannot), yields it once
    every node is idle, and shuts it down."""
    why = missing()
    if why:
        pytest.skip(why)
    assert nodes >= 1, nodes
    names = _names(nodes)
    for sub in ("state", "spool", "tmp", *(f"{d}/{name}" for name in names for d in ("spool", "tmp") if nodes > 1)):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    cluster = Cluster(folder / "slurm.conf", folder, names)
    cluster.conf.write_text(_conf(folder, names))
    env = cluster.env(dict(os.environ))
    try:
        slurmds = [["slurmd"]] if nodes == 1 else [["slurmd", "-N", name] for name in names]
        for daemon in (["slurmctld", "-i"], *slurmds):
            r = subprocess.run(daemon, env=env, capture_output=True, text=True, timeout=60, check=False)
            assert r.returncode == 0, f"{' '.join(daemon)} did not start: {r.stderr}"
        deadline = time.monotonic() + 60
        states: list[str] = []
        while time.monotonic() < deadline:
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True,
                               timeout=30, check=False)  # fmt: skip
            states = sorted(r.stdout.split("\n")[:-1])
            if states == sorted(f"{name} idle" for name in names):
                break
            time.sleep(0.2)
        log = (folder / "slurmctld.log").read_text() if (folder / "slurmctld.log").exists() else ""
        assert states == sorted(f"{name} idle" for name in names), (
            f"the test cluster's nodes are {states!r}, not all idle:\n{log[-2000:]}"
        )
        yield cluster
    finally:
        _stop(cluster, env)
