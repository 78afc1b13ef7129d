"""Where a train step's GPU time goes: each launch of the PyCUDA runner timed on its own with CUDA events, summed by
op and by what ran (our kernel, or the cuBLAS / cuDNN routine and its algorithm), beside the whole step's time.

    python scripts/profile_gpu.py [--network resnet50] [--set N=64] [--kernels own|vendor] [--top 20] [--json OUT]

Timing each launch alone serialises the step (no launch overlaps the next), so the launches' sum is at least the
step's time; the difference is the GPU's idle time between launches that a whole-step measurement hides. Needs
PyCUDA and a GPU (scripts/gpu_check.sh runs it on ResNet-50 at batch 64).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_gpu  # noqa: E402

from deepdsl import api  # noqa: E402

WARMUP, REPEATS = 2, 3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--network", default="resnet50", help="a network of networks/ (its file name without .ddsl)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--kernels", default="vendor", choices=("own", "vendor"))
    ap.add_argument("--top", type=int, default=20, help="how many rows of each table")
    ap.add_argument("--json", dest="out", default=None, help="write the tables here too")
    args = ap.parse_args()
    sets = {k: int(v) for k, v in (s.split("=", 1) for s in args.sets)}
    c = api.compile_file(bench_gpu.ROOT / "networks" / f"{args.network}.ddsl", sets, stop_at="plan")
    runner, feeds = bench_gpu.runner_for(c, args.kernels)
    steps = [runner.run("train", feeds(k))[1] for k in range(WARMUP + REPEATS)][WARMUP:]
    runs = [runner.profile("train", feeds(WARMUP + REPEATS + k)) for k in range(REPEATS)]
    runner.close()
    # each launch's median over the repeats
    launches = [(launch, what, statistics.median(r[i][2] for r in runs)) for i, (launch, what, _) in enumerate(runs[0])]
    step_ms, sum_ms = 1e3 * statistics.median(steps), 1e3 * sum(t for _, _, t in launches)
    print(f"{args.network} {sets} --kernels {args.kernels}: step {step_ms:.2f} ms (whole, CUDA events); "
          f"{len(launches)} launches, each timed alone: {sum_ms:.2f} ms")  # fmt: skip
    tables = {}
    for title, key in (("by op", lambda launch, what: launch.op),
                       ("by what ran", lambda launch, what: what)):  # fmt: skip
        total: dict[str, float] = defaultdict(float)
        count: dict[str, int] = defaultdict(int)
        for launch, what, t in launches:
            total[key(launch, what)] += t
            count[key(launch, what)] += 1
        rows = sorted(total, key=total.get, reverse=True)
        tables[title] = [{"name": r, "launches": count[r], "ms": 1e3 * total[r]} for r in rows]
        print(f"\n{title:<60} {'launches':>8} {'ms':>9} {'share':>6}")
        for r in rows[: args.top]:
            print(f"{r[:60]:<60} {count[r]:>8} {1e3 * total[r]:>9.3f} {100 * total[r] / (sum_ms / 1e3):>5.1f}%")
    slowest = sorted(launches, key=lambda x: x[2], reverse=True)[: args.top]
    print(f"\n{'slowest launches':<60} {'ms':>9}")
    for launch, what, t in slowest:
        print(f"{(launch.stmt + ' ' + what)[:60]:<60} {1e3 * t:>9.3f}")
    if args.out:
        Path(args.out).write_text(json.dumps({"network": args.network, "sets": sets, "kernels": args.kernels,
                                              "step_ms": step_ms, "launches_ms": sum_ms, "tables": tables,
                                              "slowest": [{"stmt": launch.stmt, "op": launch.op, "what": what,
                                                           "ms": 1e3 * t} for launch, what, t in slowest]},
                                             indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
