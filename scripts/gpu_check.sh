#!/usr/bin/env bash
# The GPU checks, in one run on a GPU machine that has nvcc, PyTorch and Python 3.12 but no internet, no Java and no
# PyCUDA: everything else comes in .gpu/, made beforehand by scripts/gpu_prepare.sh. Writes into OUTDIR:
#   gpu_check.log     everything printed, with the seconds since the start of each step
#   env.txt           the GPU, its driver, Python, PyTorch
#   pytest_gpu.txt    the tests marked gpu: the PyCUDA runner against the NumPy runner over 5 iterations (MLP,
#                     LeNet, a batch-norm/residual network, a network with concat, dropout and a tensor function)
#                     and the GPU memory it took against the plan
#   java_*.json       the generated Java programs on their CUDA device (LeNet and ResNet-50 at batch 64)
#   agreement.json    their losses against the NumPy runner (LeNet, ResNet-50) and the PyCUDA runner (ResNet-50),
#                     their measured GPU memory against the plan
#   bench.json        train-step times: ours (PyCUDA runner, CUDA events) and PyTorch eager, fp32 with TF32 off and
#                     PyTorch's default TF32, achieved FLOP/s against the fp32 peak (scripts/bench_gpu.py)
#   summary.txt       one line per check, PASS or FAIL
# Usage: bash scripts/gpu_check.sh OUTDIR      (about 3 minutes; the exit status is 0 when every check passed)
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUTDIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
G=${DEEPDSL_GPU_FILES:-$ROOT/.gpu}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
cd "$ROOT"
START=$SECONDS
FAILED=0
step() { echo "== [$((SECONDS - START)) s] $*"; }
result() { # NAME STATUS: one summary line; a nonzero status fails the run
  if [ "$2" -eq 0 ]; then echo "PASS $1" >>"$OUT/summary.txt"; else echo "FAIL $1 (status $2)" >>"$OUT/summary.txt"; FAILED=1; fi
}
: >"$OUT/summary.txt"

step "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv; "$PY" --version
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1; } | tee "$OUT/env.txt"

step "install: PyCUDA and friends from .gpu/wheels, a Java runtime from .gpu/jre.txz"
SITE=/tmp/deepdsl_site
rm -rf "$SITE" /tmp/deepdsl_jre && mkdir -p /tmp/deepdsl_jre
"$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$G"/wheels/*.whl
result "install wheels" $?
export PYTHONPATH=$SITE:$ROOT PYTHONUNBUFFERED=1
tar -C /tmp/deepdsl_jre --strip-components=1 -xJf "$G/jre.txz"
JAVA=/tmp/deepdsl_jre/bin/java
CP="$G/java/build:$G/java/res:$G/jars/*"
"$JAVA" -version 2>&1 | head -1

step "ResNet-50 on the NumPy runner, one iteration (in the background: the CPU reference)"
timeout 170 "$PY" -m deepdsl run networks/resnet50.ddsl --set N=64 --data synthetic --iters 1 --device cpu --json \
  >"$OUT/numpy_resnet50.json" 2>"$OUT/numpy_resnet50.err" &
NUMPY_PID=$!

step "PyCUDA sees the GPU"
"$PY" -c "import pycuda.driver as d; d.init(); print('PyCUDA', d.get_version(), d.Device(0).name())"
result "import pycuda.driver" $?

step "the PyCUDA runner: tests marked gpu"
timeout 90 "$PY" -m pytest -q -rs -p no:cacheprovider -m gpu tests/backends/test_gpu_runner.py 2>&1 | tee "$OUT/pytest_gpu.txt"
result "pytest -m gpu" "${PIPESTATUS[0]}"
! grep -qi "skipped" "$OUT/pytest_gpu.txt"  # a skip here means PyCUDA or the GPU was not usable: not a pass
result "pytest -m gpu ran every test" $?

step "the Java CUDA device: LeNet (5 iterations) and its NumPy reference"
timeout 60 "$JAVA" -cp "$CP" LeNet --device cuda --data synthetic --iters 5 --json >"$OUT/java_lenet.json"
result "java LeNet --device cuda" $?
timeout 60 "$PY" -m deepdsl run networks/lenet.ddsl --data synthetic --iters 5 --device cpu --json >"$OUT/numpy_lenet.json"

step "the Java CUDA device: ResNet-50 at batch 64 (3 iterations), and the PyCUDA runner on it"
timeout 90 "$JAVA" -cp "$CP" ResNet50 --device cuda --data synthetic --iters 3 --json >"$OUT/java_resnet50.json"
result "java ResNet50 --device cuda" $?
timeout 90 "$PY" -m deepdsl run networks/resnet50.ddsl --set N=64 --data synthetic --iters 3 --device cuda --json \
  >"$OUT/pycuda_resnet50.json"
result "deepdsl run resnet50 --device cuda" $?

step "benchmarks: LeNet and ResNet-50 at batch 64 against PyTorch eager"
timeout 120 "$PY" scripts/bench_gpu.py --steps 20 --java "$JAVA" --cp "$CP" --json "$OUT/bench.json"
result "bench_gpu" $?

step "agreement (waiting for the NumPy ResNet-50 run)"
wait "$NUMPY_PID"
"$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path

from deepdsl import api

out = Path(sys.argv[1])

def load(name):
    try:
        return json.loads((out / name).read_text().strip().splitlines()[-1])
    except Exception as err:  # a run that failed left nothing to read
        return {"error": f"{name}: {err}"}

def rel(a, b):
    n = min(len(a), len(b))
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a[:n], b[:n])) if n else None

report = {}
for net, java, refs in [("lenet", "java_lenet.json", ["numpy_lenet.json"]),
                        ("resnet50", "java_resnet50.json", ["numpy_resnet50.json", "pycuda_resnet50.json"])]:
    j = load(java)
    c = api.compile_file(f"networks/{net}.ddsl", {"N": 64}, stop_at="plan")
    params = sum(p.value.type.nbytes for p in c.plan.graph.params)
    row = {"java": j, "planned_arena_bytes": c.plan.arena_bytes, "planned_tensor_bytes": params}
    for ref in refs:
        r = load(ref)
        row[ref] = r
        if "losses" in j and "losses" in r:
            row[f"max_rel_diff_vs_{ref.split('_')[0]}"] = rel(j["losses"], r["losses"])
    if "gpu_memory_bytes" in j:
        row["measured_minus_planned_bytes"] = j["gpu_memory_bytes"] - c.plan.arena_bytes - params
    report[net] = row
(out / "agreement.json").write_text(json.dumps(report, indent=2))
bad = [f"{net} {k}={v:.2e}" for net, row in report.items() for k, v in row.items()
       if k.startswith("max_rel_diff") and v is not None and v > 1e-4]
for net, row in report.items():
    print(net, {k: v for k, v in row.items() if k.startswith(("max_rel", "measured", "planned"))})
sys.exit(1 if bad or any("error" in row["java"] for row in report.values()) else 0)
PYEOF
result "agreement (1e-4 relative)" $?

step "done"
cat "$OUT/summary.txt"
exit "$FAILED"
