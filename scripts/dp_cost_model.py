"""A cost model of data-parallel training on paper, checked by a small event simulation of the overlap.

From one rank's data-parallel plan (passes/data_parallel.py: the statements in the order the plan runs them, their
FLOPs and bytes, the gradient buckets and where each all-reduce starts and is waited for) it estimates the step time
and the scaling efficiency (weak scaling: the batch per GPU fixed) of a network on R GPUs:

- compute: each statement takes max(FLOPs / F, bytes / B) on the compute stream; F is calibrated so that one GPU's
  step takes the time that PyTorch-speed training gives (--images-per-s at the batch per GPU), B is HBM bandwidth;
- communication: NCCL's ring/hierarchical all-reduce: within a box 2(G-1)/G x bytes at the box's all-reduce bus
  bandwidth, between B boxes the 1/G shard of each GPU over its own NIC, 2(B-1)/B x bytes/G at the NIC's rate
  (--one-nic-per-box: every shard of the box through one NIC), plus a latency per all-reduce;
- paper estimate: exposed communication = the part of the buckets' total that does not fit behind the backward
  work after each start, found bucket by bucket in closed form (a single comm stream, buckets in order);
- simulation: an event simulation of the same schedule: the compute stream runs the statements, a start enqueues
  its bucket on one comm stream (FIFO), a wait blocks the compute stream until its bucket is done, and compute
  runs --contention slower while a reduction is in flight (NCCL's kernels take SMs);
- synchronised batch norm (--sync-batch-norm): each batch norm's statistics all-reduced where they are made, in
  the forward and the backward pass, on the same comm stream behind the gradient buckets; the compute stream waits
  for each at once, so their latencies add up;
- both: every step waits for the slowest rank: with a step time that varies by --jitter (a standard deviation, a
  fraction of the step) that costs about jitter x sqrt(2 ln R) of a step.

It prints its assumptions and both estimates. Nothing here ran on a GPU: the figures are a model, not a measure.

    python scripts/dp_cost_model.py                      # ResNet-50, batch 64 per GPU, 8 and 64 H200s
    python scripts/dp_cost_model.py --gpus 8 16 64 --one-nic-per-box --json
    python scripts/dp_cost_model.py --sync-batch-norm   # the same with batch norm's statistics synchronised
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deepdsl import api  # noqa: E402
from deepdsl.build import Options  # noqa: E402
from deepdsl.ir import REGISTRY, Graph  # noqa: E402
from deepdsl.ops.collective import STATS  # noqa: E402
from deepdsl.passes.data_parallel import MIB, Bucketing  # noqa: E402


@dataclass(frozen=True)
class Machine:
    gpus_per_box: int = 8
    nvlink_busbw: float = 450e9  # B/s: NCCL all-reduce bus bandwidth inside an 8-GPU H200 box (NVLink 4)
    nic_bps: float = 400e9 / 8  # B/s: 400 Gb/s between boxes
    nic_efficiency: float = 0.85  # of the NIC's line rate NCCL reaches over InfiniBand/RoCE
    one_nic_per_box: bool = False  # False: one NIC per GPU (DGX/HGX H200: 8 x 400 Gb/s)
    latency_box: float = 15e-6  # s per all-reduce inside a box
    latency_net: float = 30e-6  # s more per all-reduce across boxes
    hbm: float = 4.8e12 * 0.7  # B/s: H200 HBM3e, 70% reached by memory-bound kernels
    contention: float = 0.05  # compute runs this much slower while a reduction is in flight
    jitter: float = (
        0.01  # the standard deviation of one GPU's step time, a fraction of it: a step waits for the slowest
    )


def straggler(gpus: int, m: Machine) -> float:
    """The expected lateness of the slowest of `gpus` ranks, as a fraction of the step: the maximum of `gpus` normal
    samples is about sigma * sqrt(2 ln R) above the mean."""
    import math

    return m.jitter * math.sqrt(2 * math.log(gpus)) if gpus > 1 else 0.0


def allreduce_seconds(nbytes: int, gpus: int, m: Machine) -> float:
    if gpus == 1:
        return 0.0
    g = min(gpus, m.gpus_per_box)
    boxes = -(-gpus // m.gpus_per_box)
    t = m.latency_box + 2 * (g - 1) / g * nbytes / m.nvlink_busbw
    if boxes > 1:
        per_link = nbytes if m.one_nic_per_box else nbytes / g
        t += m.latency_net + 2 * (boxes - 1) / boxes * per_link / (m.nic_bps * m.nic_efficiency)
    return t


def statement_costs(g: Graph) -> tuple[list[float], list[int]]:
    """FLOPs and bytes moved (inputs read, output written) per statement; views and waits move nothing."""
    flops, moved = [], []
    for s in g.stmts:
        op = REGISTRY[s.op]
        primary = s.inputs[: op.arity] if "epilogue" in s.a else s.inputs
        f = op.flops(tuple(v.type for v in primary), s.out.type, s.a) if op.flops else 0
        f += s.out.type.numel if "epilogue" in s.a else 0
        flops.append(float(f))
        moved.append(0 if op.view else sum(v.type.nbytes for v in s.inputs) + s.out.type.nbytes)
    return flops, moved


@dataclass
class Schedule:
    seconds: list[float]  # per statement on one GPU, calibrated
    starts: dict[int, int]  # statement index -> bucket started there
    waits: dict[int, int]  # statement index -> bucket waited for there
    sizes: dict[int, int]  # bucket -> bytes
    flop_rate: float
    stats: frozenset[int] = frozenset()  # the buckets of synchronised batch norm's statistics (blocking)


def schedule(g: Graph, step_seconds: float, m: Machine) -> Schedule:
    flops, moved = statement_costs(g)
    memory = [b / m.hbm for b in moved]
    # F such that sum(max(flops / F, memory)) == step_seconds (bisection on 1/F)
    lo, hi = 0.0, step_seconds / max(sum(flops), 1.0)
    while sum(max(f * hi, t) for f, t in zip(flops, memory)) < step_seconds:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if sum(max(f * mid, t) for f, t in zip(flops, memory)) < step_seconds:
            lo = mid
        else:
            hi = mid
    seconds = [max(f * hi, t) for f, t in zip(flops, memory)]
    starts = {i: s.a["bucket"] for i, s in enumerate(g.stmts) if s.op == "allreduce_start"}
    waits = {i: s.a["bucket"] for i, s in enumerate(g.stmts) if s.op == "allreduce_wait"}
    sizes = {s.a["bucket"]: s.out.type.nbytes for s in g.stmts if s.op == "allreduce_start"}
    stats = frozenset(s.a["bucket"] for s in g.stmts if s.op == "allreduce_start" and s.a["kind"] == STATS)
    return Schedule(seconds, starts, waits, sizes, 1 / hi, stats)


def paper(sch: Schedule, gpus: int, m: Machine) -> float:
    """Closed form over the starts and waits in the plan's order: buckets in start order on one comm stream, each
    beginning at its start and after the previous one; a wait exposes what its bucket still needs, and what waits
    exposed so far delays every later start and wait (synchronised batch norm's all-reduces wait where they start,
    so theirs add up)."""
    t_at = []  # compute time at the start of each statement, without stalls
    t = 0.0
    for s in sch.seconds:
        t_at.append(t)
        t += s
    done: dict[int, float] = {}
    free = 0.0
    exposed = 0.0
    for i in sorted({*sch.starts, *sch.waits}):
        if i in sch.waits:  # a wait comes before its statement runs, a start after
            exposed += max(0.0, done[sch.waits[i]] - (t_at[i] + exposed))
        if i in sch.starts:
            b = sch.starts[i]
            free = max(free, t_at[i] + sch.seconds[i] + exposed) + allreduce_seconds(sch.sizes[b], gpus, m)
            done[b] = free
    return t * (1 + straggler(gpus, m)) + exposed


def simulate(sch: Schedule, gpus: int, m: Machine) -> tuple[float, float]:
    """Event simulation: returns (step seconds, seconds the compute stream stood waiting)."""
    clock = 0.0
    stalled = 0.0
    queue: list[tuple[int, float]] = []  # (bucket, ready time), FIFO on the comm stream
    comm_free = 0.0
    done: dict[int, float] = {}
    busy: list[tuple[float, float]] = []  # comm intervals

    def in_flight(a: float, b: float) -> float:
        return sum(max(0.0, min(b, e) - max(a, s)) for s, e in busy)

    for i, sec in enumerate(sch.seconds):
        if i in sch.waits:
            b = sch.waits[i]
            if clock < done[b]:
                stalled += done[b] - clock
                clock = done[b]
        # compute slows down while the comm stream runs beside it
        end = clock + sec
        if m.contention and gpus > 1:
            for _ in range(3):  # fixed point: the overlap depends on the end
                end = clock + sec + m.contention * in_flight(clock, end)
        clock = end
        if i in sch.starts:
            b = sch.starts[i]
            queue.append((b, clock))
            begin = max(comm_free, clock)
            comm_free = begin + allreduce_seconds(sch.sizes[b], gpus, m)
            done[b] = comm_free
            busy.append((begin, comm_free))
    late = straggler(gpus, m) * sum(sch.seconds)  # the wait for the slowest rank, at the first reduction's wait
    return clock + late, stalled + late


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--network", default=str(ROOT / "networks" / "resnet50.ddsl"))
    ap.add_argument("--batch", type=int, default=64, help="batch per GPU")
    ap.add_argument(
        "--images-per-s",
        type=float,
        default=2700.0,
        help="one H200's training speed at PyTorch speed (ResNet-50, ImageNet 90 epochs in ~12 h)",
    )
    ap.add_argument("--gpus", type=int, nargs="+", default=[8, 64])
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    ap.add_argument("--one-nic-per-box", action="store_true")
    ap.add_argument(
        "--sync-batch-norm",
        action="store_true",
        help="batch-norm statistics over the global batch: two blocking all-reduces per batch norm a step",
    )
    ap.add_argument("--contention", type=float, default=Machine.contention)
    ap.add_argument("--jitter", type=float, default=Machine.jitter)
    ap.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        help="every statement this many times faster than the calibrated speed (bf16 kernels: the "
        "gradients stay fp32, so the same bytes to reduce)",
    )
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    m = Machine(one_nic_per_box=a.one_nic_per_box, contention=a.contention, jitter=a.jitter)
    size = int(a.bucket_mb * MIB)
    c = api.compile_file(a.network, {"N": a.batch}, stop_at="plan",
                         options=Options(buckets=Bucketing(size, min(size, MIB), a.sync_batch_norm)))  # fmt: skip
    g = c.build.train_plan.graph
    step1 = a.batch / a.images_per_s
    sch = schedule(g, step1, m)
    if abs(sum(sch.seconds) - step1) > 1e-3 * step1:
        sys.exit(f"cannot calibrate: the statements' memory traffic alone takes {sum(sch.seconds) * 1e3:.2f} ms, more "
                 f"than the {step1 * 1e3:.2f} ms step asked for; use --speedup for faster kernels")  # fmt: skip
    sch.seconds = [t / a.speedup for t in sch.seconds]
    step1 = sum(sch.seconds)
    grads = sum(v for b, v in sch.sizes.items() if b not in sch.stats)
    rows = []
    for n in a.gpus:
        p = paper(sch, n, m)
        s, stalled = simulate(sch, n, m)
        comm = sum(allreduce_seconds(v, n, m) for v in sch.sizes.values())
        rows.append({"gpus": n, "step_ms_paper": p * 1e3, "step_ms_simulated": s * 1e3,
                     "efficiency_paper": step1 / p, "efficiency_simulated": step1 / s,
                     "allreduce_ms_total": comm * 1e3, "exposed_ms_simulated": stalled * 1e3,
                     "images_per_s_simulated": n * a.batch / s})  # fmt: skip
    assumptions = {
        "network": Path(a.network).name, "batch_per_gpu": a.batch, "one_gpu_images_per_s": a.images_per_s * a.speedup,
        "speedup": a.speedup,
        "one_gpu_step_ms": step1 * 1e3, "calibrated_tflops": sch.flop_rate / 1e12,
        "buckets": len(sch.sizes) - len(sch.stats),
        "bucket_mib": [round(sch.sizes[b] / MIB, 2) for b in sorted(sch.sizes) if b not in sch.stats],
        "reduced_mib_per_step": grads / MIB,
        "sync_batch_norm_allreduces": len(sch.stats),
        "sync_batch_norm_kib": sum(sch.sizes[b] for b in sch.stats) / 1024, "nvlink_busbw_GBps": m.nvlink_busbw / 1e9,
        "between_boxes": f"400 Gb/s x {m.nic_efficiency:.0%} per {'box' if m.one_nic_per_box else 'GPU'}",
        "latency_us": [m.latency_box * 1e6, m.latency_net * 1e6], "hbm_GBps": m.hbm / 1e9,
        "contention": m.contention, "step_jitter": m.jitter, "gpus_per_box": m.gpus_per_box,
    }  # fmt: skip
    if a.json:
        print(json.dumps({"assumptions": assumptions, "results": rows}, indent=1))
        return
    print("assumptions (a model: nothing here ran on a GPU)")
    for k, v in assumptions.items():
        print(f"  {k:<24} {v}")
    print(f"\n{'GPUs':>5} {'step ms (paper)':>16} {'(simulated)':>12} {'efficiency paper':>17} {'simulated':>10} "
          f"{'all-reduce ms':>14} {'exposed ms':>11} {'images/s':>10}")  # fmt: skip
    for r in rows:
        print(f"{r['gpus']:>5} {r['step_ms_paper']:>16.2f} {r['step_ms_simulated']:>12.2f} "
              f"{r['efficiency_paper']:>17.1%} {r['efficiency_simulated']:>10.1%} {r['allreduce_ms_total']:>14.2f} "
              f"{r['exposed_ms_simulated']:>11.2f} {r['images_per_s_simulated']:>10,.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
