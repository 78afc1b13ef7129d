"""A Slurm cluster for the tests, so that `srun` starts the ranks as it does on a cluster: Debian's slurm-wlm
(22.05: slurmctld, slurmd, srun), started as root in a temporary folder with ports of its own, auth/none (no munge
daemon), no cgroups (proctrack/linuxproc, task/none), the node's CPUs as `slurmd -C` reads them and
`config_overrides`, so that more tasks than cores may share it. Every client command finds it through SLURM_CONF.

One node by default. `nodes=N` emulates N nodes on this one machine, as Slurm's "multiple slurmd" mode does: one
slurmd per node (`slurmd -N node1` ...), each NodeName with its own Port and NodeAddr 127.0.0.1, and `%n` in the
slurmd's pid file, spool folder and log, so that `srun -N 2` places tasks on two nodes with SLURM_NODEID and
SLURM_LOCALID as a two-node cluster sets them (Debian's 22.05 runs this mode; checked by test_slurm_nodes.py). The
nodes share the machine's CPUs, memory and file system: a launch across them, not across machines.

`hosts=True` (with `nodes` >= 2) makes each node a host of its own as far as the network goes: its slurmd, and so
every task it starts, runs in a network namespace and a UTS namespace of its own (`ip netns`, `nsenter`,
`unshare --uts --mount`), with the node's name as its host name, one address on a bridge that the test machine's
slurmctld and srun reach at .1, and an /etc/hosts of the cluster's (bound over the machine's in the node's mount
namespace) in which every node's name resolves to its address, and this machine's name to the bridge's, as a
cluster's DNS has them (so that MASTER_ADDR may be `node1`, and a launcher on this machine, a cluster's login node,
is reached by its name). MPI's ranks on two nodes then see two hosts and talk over TCP through the bridge
(`Cluster.traffic` counts its bytes), as on two machines; they still share the CPUs and the file system (as a
cluster's shared home), and /dev/shm. Where namespaces cannot be made (no root, no iproute2, a container without
CAP_NET_ADMIN) the tests skip, saying so. What a killed run's cluster left (its namespaces `ddsl*`, its bridge
`ddslbr*`) the next one removes (`remove_orphan_networks`).

.ci/run installs slurm-wlm where it runs as root with apt-get (`apt-get install --no-install-recommends slurm-wlm`);
elsewhere the tests that need the cluster skip, saying so. It is never the user's own cluster: nothing is read
from /etc/slurm."""

from __future__ import annotations

import contextlib
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
    network: Network | None = None  # hosts=True: the nodes' namespaces and the bridge between them

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` (a launch's environment, no launcher's variables in it) with this cluster's SLURM_CONF."""
        return {**base, "SLURM_CONF": str(self.conf)}

    def traffic(self) -> int:
        """The bytes the nodes have sent into the bridge so far (hosts=True: their links' counters)."""
        assert self.network is not None
        return sum(int(Path(f"/sys/class/net/{link}/statistics/rx_bytes").read_text()) for link in self.network.links)


@dataclass(frozen=True)
class Network:
    """The nodes' network: a bridge (address `subnet`.1, this machine's side), and per node k (from 0) a network
    namespace with one end of a veth pair at `subnet`.(11 + k); the other end, `links[k]`, is a port of the bridge."""

    bridge: str
    subnet: str
    namespaces: tuple[str, ...]
    links: tuple[str, ...]

    def address(self, k: int) -> str:
        """Node k's address (k from 0); -1: this machine's, the bridge's."""
        return f"{self.subnet}.{11 + k if k >= 0 else 1}"


NETNS = Path("/run/netns")


def remove_orphan_networks(min_age: float = 600.0, tag: str = "") -> list[str]:
    """What clusters of killed test runs left (a run killed before its cluster stopped keeps its namespaces and
    bridge, whose subnet a later cluster may draw): each namespace `ddsl<tag>*` that no process is in, made at least
    `min_age` seconds ago, and each bridge `ddslbr<tag>*` without ports whose tag no namespace has. Returns their
    names."""
    removed = []
    for ns in sorted(NETNS.glob(f"ddsl{tag}*")) if NETNS.is_dir() else []:
        try:
            idle = subprocess.run(["ip", "netns", "pids", ns.name], capture_output=True, text=True, timeout=30,
                                  check=True).stdout.strip() == ""  # fmt: skip
            if idle and time.time() - ns.stat().st_mtime >= min_age:
                _ip("netns", "del", ns.name)
                removed.append(ns.name)
        except (OSError, subprocess.SubprocessError):
            continue
    for bridge in sorted(Path("/sys/class/net").glob(f"ddslbr{tag}*")):
        own = bridge.name[len("ddslbr") :]
        ports = list((bridge / "brif").iterdir()) if (bridge / "brif").is_dir() else []
        if not ports and not (NETNS.is_dir() and any(NETNS.glob(f"ddsl{own}*"))):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _ip("link", "del", bridge.name)
                removed.append(bridge.name)
    return removed


def _ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if r.returncode != 0:
        raise OSError(f"ip {' '.join(args)}: {r.stderr.strip()}")


@contextmanager
def _network(names: tuple[str, ...]) -> Iterator[Network]:
    """A bridge and a network namespace per node, linked to it; removed afterwards (a namespace's removal takes its
    link's ends with it). The names and the subnet are drawn at random (pytest-xdist's workers each start clusters);
    a test skips where they cannot be made."""
    tag = f"{random.randrange(16**5):05x}"
    net = Network(f"ddslbr{tag}", f"10.{random.randint(200, 249)}.{random.randint(1, 254)}",
                  tuple(f"ddsl{tag}{name}" for name in names),
                  tuple(f"ddsl{tag}h{k}" for k in range(len(names))))  # fmt: skip
    remove_orphan_networks()
    made: list[tuple[str, ...]] = []
    try:
        try:  # the namespaces before the bridge: a bridge without namespaces of its tag is an orphan
            for ns in net.namespaces:
                _ip("netns", "add", ns)
                made.append(("netns", "del", ns))
            _ip("link", "add", net.bridge, "type", "bridge")
            made.append(("link", "del", net.bridge))
            _ip("addr", "add", f"{net.address(-1)}/24", "dev", net.bridge)
            _ip("link", "set", net.bridge, "up")
            for k, (ns, link) in enumerate(zip(net.namespaces, net.links, strict=True)):
                inner = f"{link[:-2]}n{k}"
                _ip("link", "add", link, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", link, "master", net.bridge)
                _ip("link", "set", link, "up")
                for args in (("addr", "add", f"{net.address(k)}/24", "dev", inner), ("link", "set", inner, "up"),
                             ("link", "set", "lo", "up")):  # fmt: skip
                    _ip("-n", ns, *args)
        except (OSError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"the nodes' network namespaces cannot be made here ({exc})")
        yield net
    finally:
        for undo in reversed(made):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                _ip(*undo)


def missing(hosts: bool = False) -> str | None:
    """Why this machine cannot start the cluster (with `hosts`: its nodes in namespaces of their own), or None."""
    absent = [tool for tool in NEEDS if shutil.which(tool) is None]
    if absent:
        return f"no Slurm ({', '.join(absent)} missing): {INSTALL}"
    absent = [tool for tool in ("ip", "nsenter", "unshare") if hosts and shutil.which(tool) is None]
    if absent:
        return f"no {', '.join(absent)} for the nodes' namespaces: apt-get install iproute2 util-linux (.ci/run does)"
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


def _conf(folder: Path, names: tuple[str, ...], network: Network | None = None) -> str:
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
        node_lines = [
            f"NodeName={name} NodeHostname={host if network is None else name} "
            f"NodeAddr={'127.0.0.1' if network is None else network.address(k)} Port={port} CPUs={cpus} State=UNKNOWN"
            for k, (name, port) in enumerate(zip(names, slurmds, strict=True))
        ]  # fmt: skip
    return "\n".join(
        [
            "ClusterName=deepdsl-tests",
            # job ids of its own: with ids from 1, as every earlier test cluster had, the first jobs' MPI_Init
            # failed or hung under srun --mpi=pmi2 about half the time ('failed to unpack address', 'Message
            # truncated': what another job of that id left); with these, 10 runs of 10 passed
            f"FirstJobId={random.randint(1_000_000, 60_000_000)}",
            *([f"TmpFS={folder / 'tmp'}"] if len(names) == 1 else []),
            f"SlurmctldHost={host}({'127.0.0.1' if network is None else network.address(-1)})",
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
def slurm_cluster(folder: Path, nodes: int = 1, hosts: bool = False) -> Iterator[Cluster]:
    """Starts the cluster of `nodes` nodes in `folder` (skipping the test where this machine cannot), each node a
    host of its own where `hosts` (the module's docstring), yields it once every node is idle, and shuts it down."""
    why = missing(hosts)
    if why:
        pytest.skip(why)
    assert nodes >= 1 and (nodes > 1 or not hosts), (nodes, hosts)
    names = _names(nodes)
    for sub in ("state", "spool", "tmp", *(f"{d}/{name}" for name in names for d in ("spool", "tmp") if nodes > 1)):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    with _network(names) if hosts else contextlib.nullcontext() as network:
        cluster = Cluster(folder / "slurm.conf", folder, names, network)
        cluster.conf.write_text(_conf(folder, names, network))
        env = cluster.env(dict(os.environ))
        try:
            for daemon in (["slurmctld", "-i"], *_slurmds(folder, names, network)):
                r = subprocess.run(daemon, env=env, capture_output=True, text=True, timeout=60, check=False)
                assert r.returncode == 0, f"{' '.join(daemon)} did not start: {r.stderr}"
            _wait_idle(cluster, env)
            yield cluster
        finally:
            _stop(cluster, env)


def _slurmds(folder: Path, names: tuple[str, ...], network: Network | None) -> list[list[str]]:
    """The commands that start the nodes' slurmd: this machine's one; one per emulated node (-N); where nodes are
    hosts, in the node's network namespace, under its own host name, with the cluster's /etc/hosts (nsenter keeps
    this machine's /sys, where slurmd finds the cgroup file system: `ip netns exec` mounts a /sys of the
    namespace's own)."""
    if len(names) == 1:
        return [["slurmd"]]
    if network is None:
        return [["slurmd", "-N", name] for name in names]
    hosts = folder / "hosts"
    lines = ["127.0.0.1 localhost", f"{network.address(-1)} {_node()[0]}",  # this machine: a cluster's login node
             *(f"{network.address(k)} {name}" for k, name in enumerate(names))]  # fmt: skip
    hosts.write_text("\n".join(lines) + "\n")
    return [["nsenter", f"--net={NETNS / ns}", "unshare", "--uts", "--mount", "sh", "-c",
             f"mount --bind {hosts} /etc/hosts && hostname {name} && exec slurmd -N {name}"]
            for name, ns in zip(names, network.namespaces, strict=True)]  # fmt: skip


def _wait_idle(cluster: Cluster, env: dict[str, str]) -> None:
    deadline = time.monotonic() + 60
    states: list[str] = []
    while time.monotonic() < deadline:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True, text=True,
                           timeout=30, check=False)  # fmt: skip
        states = sorted(r.stdout.split("\n")[:-1])
        if states == sorted(f"{name} idle" for name in cluster.nodes):
            return
        time.sleep(0.2)
    log = (cluster.folder / "slurmctld.log").read_text() if (cluster.folder / "slurmctld.log").exists() else ""
    raise AssertionError(f"the test cluster's nodes are {states!r}, not all idle:\n{log[-2000:]}")
