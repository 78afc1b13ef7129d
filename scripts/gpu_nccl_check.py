"""The PyCUDA runner's NCCL step of scripts/gpu_check.sh (issue 32), on the one GPU of the machine:

1. one rank under `torchrun --standalone --nproc_per_node=1` with DEEPDSL_DP_FORCE=1 (the data-parallel pass and a
   one-rank NCCL communicator, the libnccl.so.2 of PyTorch's nvidia wheels), inside the CUDA graph and with
   --no-graph: its losses and saved parameters against the plain one-process run, bit for bit, and NCCL's own log
   (NCCL_DEBUG=INFO) saying the communicator was made ("Init COMPLETE");
2. two ranks sharing the GPU (`torchrun --nproc_per_node=2`, each told LOCAL_RANK=0, the runner's GPU choice):
   either they train and give the parameters of one process with --micro-batches 2 bit for bit, or NCCL refuses two
   ranks on one GPU ("Duplicate GPU detected", quoted from its warnings: NCCL_DEBUG=WARN). Anything else fails.

Writes nccl_pycuda.json into OUTDIR; exit status 1 where a comparison differs or a run failed otherwise.

    python scripts/gpu_nccl_check.py OUTDIR "LENET_SETS" ITERS

$DEEPDSL_NCCL_CHECK_RUNNER (tests only) replaces `python -m deepdsl` in every command by the command it holds
(shell words): tests/backends/test_torchrun.py runs this script end to end with the real torchrun and the runner
on the emulated GPU (tests/backends/emulated_rank.py) with the stand-in NCCL.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np

REFUSAL = "Duplicate GPU"  # NCCL's warning where two ranks of a communicator are on one GPU
RUNNER = "DEEPDSL_NCCL_CHECK_RUNNER"  # tests only: the command standing for `python -m deepdsl`


def deepdsl() -> list[str]:
    """The command of the deepdsl CLI: this Python's `-m deepdsl`, or what $DEEPDSL_NCCL_CHECK_RUNNER says."""
    stand_in = os.environ.get(RUNNER, "").strip()
    return shlex.split(stand_in) if stand_in else [sys.executable, "-m", "deepdsl"]


def run(out: Path, tag: str, sets: list[str], iters: int, *flags: str, ranks: int = 0, **env: str) -> dict:
    """`deepdsl run lenet --device cuda --kernels own` (under torchrun with `ranks` processes where ranks > 0):
    the --json object of rank 0 with the return code and the tail of stderr; parameters saved to TAG.npz."""
    cmd = [*deepdsl(), "run", "networks/lenet.ddsl", *sets, "--data", "synthetic", "--iters",
           str(iters), "--device", "cuda", "--kernels", "own", "--json", "--save", str(out / f"{tag}.npz"),
           *flags]  # fmt: skip
    if ranks:
        # --no-python: the command as given; `env LOCAL_RANK=0`: every rank on GPU 0 (the runner takes LOCAL_RANK's)
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                  "--no-python"]  # fmt: skip
        cmd = launch + (["env", "LOCAL_RANK=0"] if ranks > 1 else []) + cmd
    full = {**os.environ, "DEEPDSL_DP_TIMEOUT": "60", **env}
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=full, check=False)
        rc, stdout, stderr = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as err:
        rc, stdout, stderr = "timeout (120 s)", str(err.stdout or ""), str(err.stderr or "")
    (out / f"{tag}.log").write_text(f"$ {' '.join(cmd)}\n{stdout}\n--- stderr\n{stderr}")
    got: dict = {"rc": rc, "stderr_tail": stderr.strip().splitlines()[-6:]}
    # NCCL's own word that a communicator was made (NCCL_DEBUG=INFO: "... nranks 1 ... - Init COMPLETE")
    got["nccl_init"] = [line.strip() for line in (stdout + stderr).splitlines() if "Init COMPLETE" in line][:2]
    objects = [line for line in stdout.splitlines() if line.startswith("{")]
    if rc == 0 and len(objects) == 1:
        got.update({k: v for k, v in json.loads(objects[0]).items() if k in ("losses", "gpu_graph", "data_parallel")})
    return got


def has_torch() -> bool:
    """Whether this Python has PyTorch, whose torchrun (torch.distributed.run) launches the ranks."""
    return importlib.util.find_spec("torch") is not None


def params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def same(out: Path, tag: str, ref: str, got: dict, want: dict) -> dict:
    """Losses and parameters of TAG against REF, bit for bit."""
    if got.get("rc") != 0 or "losses" not in got or not (out / f"{tag}.npz").exists():
        return {"equal": False, "why": f"{tag} failed: rc {got.get('rc')}"}
    a, b = params(out / f"{tag}.npz"), params(out / f"{ref}.npz")
    differ = sorted(set(a) ^ set(b)) + [k for k in a if k in b and a[k].tobytes() != b[k].tobytes()]
    return {"equal": got["losses"] == want.get("losses") and not differ, "losses_equal": got["losses"] ==
            want.get("losses"), "parameters_differ": differ}  # fmt: skip


def main() -> None:
    out, sets, iters = Path(sys.argv[1]), sys.argv[2].split(), int(sys.argv[3])
    report: dict = {"network": "lenet", "sets": sets, "iters": iters}
    if not has_torch():
        report.update({"pass": False, "why": "no PyTorch in this Python: torchrun is missing"})
        (out / "nccl_pycuda.json").write_text(json.dumps(report, indent=1) + "\n")
        sys.exit(f"error: {report['why']}")
    ok = True
    plain = report["plain"] = run(out, "nccl_plain", sets, iters)
    for tag, flags in (("nccl_one_rank", ()), ("nccl_one_rank_nograph", ("--no-graph",))):
        got = report[tag] = run(out, tag, sets, iters, *flags, ranks=1, DEEPDSL_DP_FORCE="1", NCCL_DEBUG="INFO")
        got["against_plain"] = same(out, tag, "nccl_plain", got, plain)
        ok &= got["against_plain"]["equal"] and bool(got["nccl_init"])  # the same, and through NCCL
    micro = report["micro_batches_2"] = run(out, "nccl_micro2", sets, iters, "--micro-batches", "2")
    two = report["two_ranks_one_gpu"] = run(out, "nccl_two_ranks", sets, iters, ranks=2, NCCL_DEBUG="WARN")
    log = (out / "nccl_two_ranks.log").read_text()
    refusal = [line.strip() for line in log.splitlines() if REFUSAL in line]
    if two["rc"] == 0:
        two["outcome"] = "trained"
        two["against_micro_batches_2"] = same(out, "nccl_two_ranks", "nccl_micro2", two, micro)
        ok &= two["against_micro_batches_2"]["equal"]
    elif refusal:
        two["outcome"] = "NCCL refused two ranks on one GPU"
        two["nccl_said"] = refusal[:2]
    else:
        two["outcome"] = "failed otherwise (see nccl_two_ranks.log)"
        ok = False
    report["pass"] = ok
    (out / "nccl_pycuda.json").write_text(json.dumps(report, indent=1) + "\n")
    for tag in ("nccl_one_rank", "nccl_one_rank_nograph"):
        print(f"{tag}: against the plain run {report[tag]['against_plain']}")
    print(f"two ranks on one GPU: {two['outcome']} {two.get('nccl_said') or two.get('against_micro_batches_2') or ''}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
