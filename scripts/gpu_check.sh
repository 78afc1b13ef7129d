#!/usr/bin/env bash
# The GPU checks, in one run on a GPU machine that has nvcc, PyTorch and Python 3.12 but no internet, no Java and no
# PyCUDA: everything else comes in .gpu/, made beforehand by scripts/gpu_prepare.sh. Writes into OUTDIR:
#   gpu_check.log     everything printed, with the seconds since the start of each step
#   env.txt           the GPU, its driver, Python, PyTorch
#   pytest_gpu.txt    the tests marked gpu: the PyCUDA runner against the NumPy runner over 5 iterations (MLP,
#                     LeNet, a batch-norm/residual network, a network with concat, dropout and a tensor function)
#                     and the GPU memory it took against the plan
#   java_*.json       the generated Java programs on their CUDA device (LeNet and ResNet-50 at batch 64; each also
#                     with its GEMMs through cuBLAS, convolutions and pooling through cuDNN, java_lenet_cublas.json and
#                     java_resnet50_vendor.json, and LeNet without the CUDA graph of its train step,
#                     java_lenet_nograph.json)
#   agreement.json    their losses against the NumPy runner (LeNet, each way) and the PyCUDA runner (ResNet-50, own and
#                     vendor: its first two losses judged, the later ones reported),
#                     LeNet's with the graph against those without,
#                     their measured GPU memory against the plan
#   bench.json        train-step times: ours (PyCUDA runner, CUDA events; own kernels and vendor; the Java
#                     program's steady step, own and vendor) and PyTorch eager, fp32 with TF32 off and
#                     PyTorch's default TF32, achieved FLOP/s against the fp32 peak (scripts/bench_gpu.py)
#   profile_*.json    where the train step's GPU time goes, by op and by kernel or vendor routine (scripts/profile_gpu.py:
#                     ResNet-50 with cuBLAS and cuDNN and with our kernels, LeNet with them)
#   summary.txt       one line per check, PASS or FAIL
# Usage: bash scripts/gpu_check.sh [--dry-run] OUTDIR   (about 3 minutes; the exit status is 0 when every check passed)
#   --dry-run   on a machine without a GPU, after `scripts/gpu_prepare.sh --dry-run`: every step that does not need
#               PyCUDA on a real GPU runs as it would there (the carried wheels, JRE and jars, the Java programs on
#               their CUDA device, the NumPy references, the agreement check), the GPU being the stand-in driver of
#               the tests (tests/backends/fake_libcuda.c, kernels run on the CPU); the PyCUDA steps and the
#               timings are left out and say so (SKIP lines in summary.txt). CI runs it, so that what reaches a GPU
#               has run once.
set -uo pipefail
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT=${1:?usage: scripts/gpu_check.sh [--dry-run] OUTDIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
G=${DEEPDSL_GPU_FILES:-$ROOT/.gpu}
PY=${PYTHON:-python3}
if [ ! -f "$G/sizes.env" ]; then
  echo "error: $G/sizes.env is missing: run scripts/gpu_prepare.sh (with --dry-run for a dry run) first" >&2
  exit 2
fi
# shellcheck source=/dev/null
. "$G/sizes.env"  # DRY_RUN, LENET_SETS, RESNET_SETS: what gpu_prepare.sh compiled
if [ "$DRY" != "$DRY_RUN" ]; then
  echo "error: $G was prepared with DRY_RUN=$DRY_RUN; run scripts/gpu_prepare.sh$([ "$DRY" = 1 ] && echo ' --dry-run') again" >&2
  exit 2
fi
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
skipped() { echo "SKIP $1 (dry run: $2)" >>"$OUT/summary.txt"; echo "skipped in a dry run: $2"; }
: >"$OUT/summary.txt"

step "machine"
if [ "$DRY" = 1 ]; then
  echo "dry run: no GPU; the stand-in driver $G/fake/libcuda.so.1 runs the kernels on the CPU" | tee "$OUT/env.txt"
else
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$OUT/env.txt"
fi
{ "$PY" --version
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1; } | tee -a "$OUT/env.txt"

step "install: PyCUDA and friends from .gpu/wheels, a Java runtime from .gpu/jre.txz"
SITE=/tmp/deepdsl_site
rm -rf "$SITE" /tmp/deepdsl_jre && mkdir -p /tmp/deepdsl_jre
# the wheels are built for the GPU machine's CPython 3.12: a dry run installs them with a 3.12 of its own
WHEEL_PY=$PY
[ "$DRY" = 1 ] && WHEEL_PY=${PYTHON312:-/root/.pyenv/versions/3.12.1/bin/python3.12}  # as build_pycuda_wheels.sh
"$WHEEL_PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$G"/wheels/*.whl
result "install wheels" $?
if [ "$DRY" = 1 ]; then
  export PYTHONPATH=$ROOT PYTHONUNBUFFERED=1  # this machine's Python runs deepdsl; the 3.12 wheels stay aside
  export LD_LIBRARY_PATH=$G/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  export PYTHONPATH=$SITE:$ROOT PYTHONUNBUFFERED=1
fi
tar -C /tmp/deepdsl_jre --strip-components=1 -xJf "$G/jre.txz"
JAVA=/tmp/deepdsl_jre/bin/java
CP="$G/java/build:$G/java/res:$G/jars/*"
"$JAVA" -version 2>&1 | head -1
# iterations of the Java programs. A dry run's emulated GPU takes a few seconds for a LeNet step at batch 8 but more
# than 10 minutes for one of ResNet-50 at batch 2 on 32x32 images (2 cores), so there ResNet-50 runs no step: its
# start (classes, kernels, the arena and every tensor on the device, the memory against the plan) is what is checked
LENET_ITERS=5 RESNET_ITERS=3
[ "$DRY" = 1 ] && LENET_ITERS=3 RESNET_ITERS=0
kernels() { # NAME: in a dry run, the stand-in driver runs this network's kernels
  [ "$DRY" = 1 ] && export DEEPDSL_FAKE_CUDA_KERNELS=$G/fake/$1/emulated.so
  return 0
}

if [ "$DRY" = 1 ]; then
  skipped "PyCUDA on the GPU and pytest -m gpu" "PyCUDA needs the real driver"
else
step "PyCUDA sees the GPU"
"$PY" -c "import pycuda.driver as d; d.init(); print('PyCUDA', d.get_version(), d.Device(0).name())"
result "import pycuda.driver" $?

step "the PyCUDA runner: tests marked gpu"
timeout 300 "$PY" -m pytest -q -rs -p no:cacheprovider -p no:benchmark -m gpu tests/backends/test_gpu_runner.py 2>&1 | tee "$OUT/pytest_gpu.txt"
result "pytest -m gpu" "${PIPESTATUS[0]}"
! grep -qi "skipped" "$OUT/pytest_gpu.txt"  # a skip here means PyCUDA or the GPU was not usable: not a pass
result "pytest -m gpu ran every test" $?
fi

step "the Java CUDA device: LeNet ($LENET_SETS, $LENET_ITERS iterations) and its NumPy reference"
kernels LeNet
timeout 120 "$JAVA" -cp "$CP" LeNet --device cuda --kernels own --data synthetic --iters $LENET_ITERS --json \
  >"$OUT/java_lenet.json"
result "java LeNet --device cuda --kernels own" $?
timeout 120 "$JAVA" -cp "$CP" LeNet --device cuda --kernels own --no-graph --data synthetic --iters $LENET_ITERS \
  --json >"$OUT/java_lenet_nograph.json"
result "java LeNet --device cuda --kernels own --no-graph" $?

step "the Java CUDA device with its GEMMs through cuBLAS and its convolutions and pooling through cuDNN: LeNet --kernels vendor"
# the CUDA 13 and cuDNN 9 libraries: in a dry run the stand-ins in $G/fake, on the GPU machine those of PyTorch's
# nvidia wheels
CUBLAS_LIBS=$G/fake
if [ "$DRY" = 0 ]; then
  CUBLAS_LIBS=$("$PY" -c "import glob, nvidia; print(':'.join(sorted({p.rsplit('/', 1)[0] for d in nvidia.__path__
    for p in glob.glob(d + '/*/lib/libcu*.so.13') + glob.glob(d + '/*/lib/libcudnn.so.9')})))")
fi
echo "cuBLAS, cudart and cuDNN from: $CUBLAS_LIBS"
# JavaCPP's cache may link to libraries found in an earlier run: one of this run's own, not ~/.javacpp
LD_LIBRARY_PATH=$CUBLAS_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 120 "$JAVA" \
  -Dorg.bytedeco.javacpp.cachedir=/tmp/deepdsl_javacpp -cp "$CP" LeNet --device cuda --kernels vendor \
  --data synthetic --iters $LENET_ITERS --json >"$OUT/java_lenet_cublas.json"
result "java LeNet --device cuda --kernels vendor" $?
# shellcheck disable=SC2086
timeout 60 "$PY" -m deepdsl run networks/lenet.ddsl $LENET_SETS --data synthetic --iters $LENET_ITERS --device cpu \
  --json >"$OUT/numpy_lenet.json"

step "the Java CUDA device: ResNet-50 ($RESNET_SETS, $RESNET_ITERS iterations), and the PyCUDA runner on it"
kernels ResNet50
timeout 90 "$JAVA" -cp "$CP" ResNet50 --device cuda --kernels own --data synthetic --iters $RESNET_ITERS --json \
  >"$OUT/java_resnet50.json"
result "java ResNet50 --device cuda --kernels own" $?
LD_LIBRARY_PATH=$CUBLAS_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 90 "$JAVA" \
  -Dorg.bytedeco.javacpp.cachedir=/tmp/deepdsl_javacpp -cp "$CP" ResNet50 --device cuda --kernels vendor \
  --data synthetic --iters $RESNET_ITERS --json >"$OUT/java_resnet50_vendor.json"
result "java ResNet50 --device cuda --kernels vendor" $?
if [ "$DRY" = 1 ]; then
  skipped "deepdsl run resnet50 --device cuda" "PyCUDA needs the real driver"
  skipped "bench_gpu" "no timings"
else
# the references of the Java runs: the PyCUDA runner with our kernels and with cuBLAS and cuDNN (the NumPy runner
# takes minutes for one step of ResNet-50 at batch 64; the tests marked gpu check the PyCUDA runner against it)
for k in own vendor; do
  timeout 90 "$PY" -m deepdsl run networks/resnet50.ddsl $RESNET_SETS --data synthetic --iters $RESNET_ITERS \
    --device cuda --kernels $k --json >"$OUT/pycuda_resnet50_$k.json"
  result "deepdsl run resnet50 --device cuda --kernels $k" $?
done

step "benchmarks: LeNet and ResNet-50 at batch 64 against PyTorch eager"
# the Java program's vendor runs find cuBLAS and cuDNN as above
LD_LIBRARY_PATH=$CUBLAS_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 240 "$PY" scripts/bench_gpu.py --steps 20 \
  --java "$JAVA" --cp "$CP" --json "$OUT/bench.json"
result "bench_gpu" $?

step "profiles: where ResNet-50's step goes (each launch timed alone), vendor and own; LeNet's, vendor"
for k in vendor own; do
  timeout 120 "$PY" scripts/profile_gpu.py --network resnet50 --set N=64 --kernels $k \
    --json "$OUT/profile_resnet50_$k.json"
  result "profile_gpu resnet50 --kernels $k" $?
done
timeout 60 "$PY" scripts/profile_gpu.py --network lenet --set N=64 --kernels vendor --json "$OUT/profile_lenet.json"
result "profile_gpu lenet --kernels vendor" $?
fi

step "agreement"
"$PY" - "$OUT" "$LENET_SETS" "$RESNET_SETS" "$DRY" <<'PYEOF'
import json, sys
from pathlib import Path

from deepdsl import api

out = Path(sys.argv[1])
sets = {net: dict(w.split("=") for w in words.split() if w != "--set") for net, words in
        zip(("lenet", "resnet50"), sys.argv[2:4])}
sets = {net: {k: int(v) for k, v in s.items()} for net, s in sets.items()}
pycuda = [] if sys.argv[4] == "1" else ["pycuda_resnet50_own.json", "pycuda_resnet50_vendor.json"]
# ResNet-50 on random data amplifies rounding from the third step on (NumPy's float32 and float64 losses part by 2% at
# the second step at batch 4, 64x64): its first two losses (the forward pass, and the forward pass after one whole
# update) measure the kernels; the later ones are reported, not judged
judged = {"lenet": None, "resnet50": 2}

def load(name):
    try:
        return json.loads((out / name).read_text().strip().splitlines()[-1])
    except Exception as err:  # a run that failed left nothing to read
        return {"error": f"{name}: {err}"}

def rel(a, b):
    n = min(len(a), len(b))
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a[:n], b[:n])) if n else None

report = {}
for key, net, java, refs in [("lenet", "lenet", "java_lenet.json", ["numpy_lenet.json"]),
                             ("lenet_cublas", "lenet", "java_lenet_cublas.json", ["numpy_lenet.json"]),
                             # the step call for call against its CUDA graph (java_lenet.json)
                             ("lenet_nograph", "lenet", "java_lenet_nograph.json",
                              ["numpy_lenet.json", "java_lenet.json"]),
                             ("resnet50", "resnet50", "java_resnet50.json", pycuda),
                             ("resnet50_vendor", "resnet50", "java_resnet50_vendor.json",
                              pycuda)]:
    j = load(java)
    c = api.compile_file(f"networks/{net}.ddsl", sets[net], stop_at="plan")
    params = sum(p.value.type.nbytes for p in c.plan.graph.params)
    row = {"java": j, "planned_arena_bytes": c.plan.arena_bytes, "planned_tensor_bytes": params}
    for ref in refs:
        r = load(ref)
        row[ref] = r
        if "losses" in j and "losses" in r:
            n = judged[net]
            row[f"max_rel_diff_vs_{ref.removesuffix('.json')}"] = rel(j["losses"][:n], r["losses"][:n])
            if n is not None:
                row[f"later_rel_diff_vs_{ref.removesuffix('.json')}"] = rel(j["losses"][n:], r["losses"][n:])
    if "gpu_memory_bytes" in j:
        row["measured_minus_planned_bytes"] = j["gpu_memory_bytes"] - c.plan.arena_bytes - params
    report[key] = row
(out / "agreement.json").write_text(json.dumps(report, indent=2))
bad = [f"{net} {k}={v:.2e}" for net, row in report.items() for k, v in row.items()
       if k.startswith("max_rel_diff") and v is not None and v > 1e-4]
for net, row in report.items():
    print(net, {k: v for k, v in row.items() if k.startswith(("max_rel", "later_rel", "measured", "planned"))})
sys.exit(1 if bad or any("error" in row["java"] for row in report.values()) else 0)
PYEOF
result "agreement (1e-4 relative)" $?

step "done"
cat "$OUT/summary.txt"
exit "$FAILED"
