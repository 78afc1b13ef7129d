"""Memory of one training step for every reference network at its reference batch (issue 5 targets).

Prints, per network: the planned peak with --remat none, cheap and full, the extra FLOPs each costs, the naive
and eager baselines (DESIGN §5), and the ratios. Where PyTorch is importable it also measures, in the same run,
what PyTorch keeps for the backward pass of the same network (saved-tensor hooks on an eager interpreter of the
forward graph, at a small batch, scaled per sample) plus parameters, gradients and momentum, and prints the
planned peaks against that.

    python scripts/bench_memory.py [--nets resnet50,lenet] [--torch-batch 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from deepdsl import api  # noqa: E402
from deepdsl.memory.eager import eager_peak_bytes  # noqa: E402
from deepdsl.memory.report import flops, persistent_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_BATCH = {"lenet": 64, "alexnet": 128, "vgg16": 64, "googlenet": 128, "resnet50": 64}
GIB = 2**30


def torch_saved_bytes_per_sample(name: str, batch: int) -> float | None:
    """Bytes per sample of the tensors PyTorch keeps for the backward pass (parameters excluded), or None."""
    try:
        import torch
    except ImportError:
        return None
    from bench_runner import torch_training_step

    c = api.compile_file(ROOT / "networks" / f"{name}.ddsl", {"N": batch}, stop_at="graph")
    step = torch_training_step(c.program, 2)
    params = {p.untyped_storage().data_ptr() for p in step.parameters}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step.forward()
    return sum(kept.values()) / batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nets", default=",".join(REFERENCE_BATCH))
    ap.add_argument("--torch-batch", type=int, default=2, help="batch of the PyTorch measurement (scaled per sample)")
    args = ap.parse_args()
    for name in args.nets.split(","):
        n = REFERENCE_BATCH[name]
        t0 = time.perf_counter()
        c = api.compile_file(ROOT / "networks" / f"{name}.ddsl", {"N": n}, stop_at="plan")
        assert c.program is not None and c.opt is not None and c.train is not None
        base = flops(c.opt)
        eager = eager_peak_bytes(c.program.graph, c.train)
        naive = persistent_bytes(c.opt) + sum(s.out.type.nbytes for s in c.opt.stmts)
        print(f"{name} (batch {n}, planned in {time.perf_counter() - t0:.2f} s)")
        per_sample = torch_saved_bytes_per_sample(name, args.torch_batch)
        torch_total = None
        if per_sample is not None:
            g = c.train
            params = sum(q.value.type.nbytes for q in g.params if q.kind == "param")
            others = sum(q.value.type.nbytes for q in g.params if q.kind in ("state", "opt"))
            torch_total = per_sample * n + 2 * params + others
            print(f"  PyTorch keeps      {torch_total / GIB:8.3f} GiB  ({per_sample / 2**20:.2f} MiB per sample "
                  f"+ parameters, gradients, optimizer state)")  # fmt: skip
        else:
            print("  PyTorch keeps      (PyTorch is not importable here)")
        print(f"  eager (modelled)   {eager / GIB:8.3f} GiB")
        print(f"  naive              {naive / GIB:8.3f} GiB")
        for level in ("none", "cheap", "full"):
            assert c.build is not None
            b = api.with_remat(c.build, level)
            p = b.train_plan
            peak = persistent_bytes(p.graph) + p.arena_bytes
            extra = b.extra_flops / base
            vs_torch = f"  {peak / torch_total:.3f}x PyTorch" if torch_total else ""
            print(f"  remat {level:<6}       {peak / GIB:8.3f} GiB  {peak / eager:.3f}x eager{vs_torch}  "
                  f"{naive / peak:5.2f}x under naive  +{100 * extra:.1f}% FLOPs")  # fmt: skip


if __name__ == "__main__":
    main()
