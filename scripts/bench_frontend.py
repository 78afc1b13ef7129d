"""Parse + elaborate time per network (median of several runs), and the ratio to a 200 ms budget.

python scripts/bench_frontend.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from deepdsl import api
from deepdsl.frontend.parser import _lark

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    t0 = time.perf_counter()
    _lark()  # the grammar is loaded once per process; report it separately
    print(f"grammar load (once per process): {1000 * (time.perf_counter() - t0):.1f} ms")
    print(f"{'network':<12} {'statements':>10} {'parse ms':>9} {'total ms':>9}  (median of {args.runs})")
    for path in sorted((ROOT / "networks").glob("*.ddsl")):
        text = path.read_text()
        parse, total = [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            c = api.compile_source(text, str(path), stop_at="ast")
            t1 = time.perf_counter()
            c = api.compile_source(text, str(path))
            t2 = time.perf_counter()
            parse.append(t1 - t0)
            total.append(t2 - t1)
        n = len(c.program.graph.stmts)
        print(
            f"{path.stem:<12} {n:>10} {1000 * statistics.median(parse):>9.1f} {1000 * statistics.median(total):>9.1f}"
        )


if __name__ == "__main__":
    main()
