"""How memcheck's time grows with depth: plan residual MLPs of 200, 500 and 1000 blocks (the network of
tests/security/deep_networks.py) and print the CPU seconds of each and the ratio against 200 blocks, beside the
ratio a linear algorithm would give.

    python scripts/bench_deep.py [--layers 200,500,1000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "security"))

from deep_networks import residual_mlp  # noqa: E402

from deepdsl import api  # noqa: E402
from deepdsl.memory.report import report  # noqa: E402


def seconds(layers: int, folder: Path) -> float:
    f = folder / f"deep{layers}.ddsl"
    f.write_text(residual_mlp(layers))
    t0 = time.process_time()
    c = api.compile_file(f, stop_at="plan")
    report(c.plan)
    return time.process_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="200,500,1000")
    sizes = [int(n) for n in ap.parse_args().layers.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        times = {n: seconds(n, Path(tmp)) for n in sizes}
    base = sizes[0]
    print(f"{'blocks':>7} {'CPU s':>8} {'ratio':>7} {'linear':>7}")
    for n in sizes:
        print(f"{n:>7} {times[n]:>8.2f} {times[n] / times[base]:>7.2f} {n / base:>7.2f}")


if __name__ == "__main__":
    main()
