#!/usr/bin/env bash
# The GPU checks, in one run on a GPU machine that has nvcc, PyTorch and Python 3.12 but no internet, no Java and no
# PyCUDA: everything else comes in .gpu/, made beforehand by scripts/gpu_prepare.sh. A borrowed GPU is lent for
# minutes, so the step that teaches the most comes first, and one overall deadline (8 minutes; --deadline SECONDS or
# GPU_CHECK_DEADLINE) bounds the whole run: a step that would start after it is not started (SKIPPED (deadline) in
# summary.txt), one still running at it is stopped, no step's own time limit reaches past it, and summary.txt is
# written whatever happens (scripts/gpu_steps.sh). In this order, into OUTDIR:
#   gpu_check.log     everything printed, with the seconds since the start of each step
#   env.txt           the GPU, its driver, Python, PyTorch
#   1. profile_resnet50_vendor.json   where ResNet-50's train step (batch 64, cuBLAS + cuDNN) goes, each launch timed
#                     alone: by op and by routine/algorithm, with FLOPs, bytes, TFLOP/s and GB/s; every vendor call's
#                     algorithm and workspace; the graph's status; the shared scratch (scripts/profile_gpu.py)
#   2. bench.json     train steps at batch 64 of ResNet-50 and LeNet, ours (PyCUDA runner by CUDA events, the Java
#                     CUDA device) against PyTorch eager in the same run (fp32 TF32 off, the same with
#                     cudnn.benchmark, PyTorch's TF32 default with and without it, AMP bf16 channels-last), ours /
#                     PyTorch's for each, a torch.profiler breakdown by kernel class, the goals judged, the profile's
#                     by-op table (scripts/bench_gpu.py --part headline)
#   3. pytest_gpu.txt the tests marked gpu: the PyCUDA runner against the NumPy runner over 5 iterations, and the GPU
#                     memory it took against the plan
#   4. java_*.json    the generated Java programs on their CUDA device: LeNet (own kernels, own without the CUDA
#                     graph, cuBLAS + cuDNN) and ResNet-50 (cuBLAS + cuDNN), with their references (numpy_lenet.json,
#                     pycuda_resnet50_vendor.json)
#   5. agreement.json their losses against the references, LeNet's with the graph against those without, their GPU
#                     memory against the plan (scripts/gpu_agreement.py)
#   6. optional, while time is left: bench.json's further rows (own kernels, the workspace A/B, --deterministic,
#                     --no-graph, ResNet-50's tf32 and bf16 kernels by name under torch.profiler with cuDNN's layout
#                     conversions' share, --precision on the Java device: those this build takes; LeNet compiled with
#                     --data-parallel on one rank, plain and with NCCL forced (-Ddeepdsl.collective=true, the
#                     libnccl.so.2 of PyTorch's wheels), graph and eager, its losses against the plain run's bit for
#                     bit), own_kernels.json (our convolutions against cuDNN's per ResNet-50 layer shape,
#                     scripts/bench_own_kernels.py), profile_resnet50_own.json and profile_lenet.json, ResNet-50
#                     with our kernels on the Java device (java_resnet50.json) against the PyCUDA runner
#                     (pycuda_resnet50_own.json); last, nccl_pycuda.json: the PyCUDA runner over NCCL on LeNet, one
#                     rank under `torchrun --nproc_per_node=1` with DEEPDSL_DP_FORCE=1 (a one-rank communicator of
#                     PyTorch's libnccl.so.2), graph and --no-graph, against the plain run bit for bit, and two ranks
#                     sharing the GPU (both LOCAL_RANK=0): equal to --micro-batches 2 bit for bit where they train, or
#                     NCCL's own refusal quoted (scripts/gpu_nccl_check.py)
#   summary.txt       one line per step: PASS, FAIL (why), SKIP (dry run: why) or SKIPPED (deadline); then the time
# Usage: bash scripts/gpu_check.sh [--dry-run] [--deadline SECONDS] OUTDIR   (about 5-6 minutes on an H200; the exit
#   status is 0 when every required step passed: an optional step the deadline cut is no failure)
#   --dry-run   on a machine without a GPU, after `scripts/gpu_prepare.sh --dry-run`: every step that does not need
#               PyCUDA on a real GPU runs as it would there (the carried wheels, JRE and jars, the Java programs on
#               their CUDA device, the NumPy references, the agreement check), the GPU being the stand-in driver of
#               the tests (tests/backends/fake_libcuda.c, kernels run on the CPU); the profile runs on the tests'
#               emulated driver with the stand-in cuBLAS and cuDNN (LeNet at batch 4); a self-test of the deadline
#               runs; the PyCUDA steps and the timings are left out and say so (SKIP lines). CI runs it, so that
#               what reaches a GPU has run once. Its deadline is 20 minutes (a CPU emulates the GPU).
set -uo pipefail
DRY=0
DEADLINE=${GPU_CHECK_DEADLINE:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --deadline) DEADLINE=${2:?--deadline takes seconds}; shift 2 ;;
    *) break ;;
  esac
done
OUT=${1:?usage: scripts/gpu_check.sh [--dry-run] [--deadline SECONDS] OUTDIR}
[ -n "$DEADLINE" ] || DEADLINE=$([ "$DRY" = 1 ] && echo 1200 || echo 480)
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
# shellcheck source=scripts/gpu_steps.sh
. "$ROOT/scripts/gpu_steps.sh"
steps_begin "$DEADLINE"
skipped() { echo "SKIP $1 (dry run: $2)" >>"$OUT/summary.txt"; echo "skipped in a dry run: $2"; }
: >"$OUT/summary.txt"
finish() {
  echo "done after $(elapsed) s (deadline $DEADLINE s)" >>"$OUT/summary.txt"
  step "done"
  cat "$OUT/summary.txt"
}
trap finish EXIT
trap 'exit 143' TERM INT  # stopped from outside: summary.txt still gets its last line
export OUT ROOT G PY DRY LENET_SETS RESNET_SETS

step "machine (deadline $DEADLINE s)"
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
# NVRTC's PTX kept between this run's processes (backends/cuda/nvrtc.py): ResNet-50's kernels compile once
export DEEPDSL_PTX_CACHE=1 DEEPDSL_CACHE=/tmp/deepdsl_cache_$$
mkdir -m 700 -p "$DEEPDSL_CACHE"
tar -C /tmp/deepdsl_jre --strip-components=1 -xJf "$G/jre.txz"
export JAVA=/tmp/deepdsl_jre/bin/java
export CP="$G/java/build:$G/java/res:$G/jars/*"
"$JAVA" -version 2>&1 | head -1
# iterations of the Java programs. A dry run's emulated GPU takes a few seconds for a LeNet step at batch 8 but more
# than 10 minutes for one of ResNet-50 at batch 2 on 32x32 images (2 cores), so there ResNet-50 runs no step: its
# start (classes, kernels, the arena and every tensor on the device, the memory against the plan) is what is checked
export LENET_ITERS=5 RESNET_ITERS=3
[ "$DRY" = 1 ] && LENET_ITERS=3 RESNET_ITERS=0
# the CUDA 13 and cuDNN 9 libraries for the Java device's vendor path: in a dry run the stand-ins in $G/fake, on the
# GPU machine those of PyTorch's nvidia wheels
CUBLAS_LIBS=$G/fake
if [ "$DRY" = 0 ]; then
  CUBLAS_LIBS=$("$PY" -c "import glob, nvidia; print(':'.join(sorted({p.rsplit('/', 1)[0] for d in nvidia.__path__
    for p in glob.glob(d + '/*/lib/libcu*.so.13') + glob.glob(d + '/*/lib/libcudnn.so.9')})))")
fi
echo "cuBLAS, cudart and cuDNN from: $CUBLAS_LIBS"
export CUBLAS_LIBS
if [ "$DRY" = 0 ]; then
  "$PY" -c "import pycuda.driver as d; d.init(); print('PyCUDA', d.get_version(), d.Device(0).name())"
  result "import pycuda.driver" $?
fi

# ---- the steps, each a function run by run_step (scripts/gpu_steps.sh) ----
kernels() { # NAME: in a dry run, the stand-in driver runs this network's kernels
  if [ "$DRY" = 1 ]; then export DEEPDSL_FAKE_CUDA_KERNELS=$G/fake/$1/emulated.so; fi
  return 0
}
vendor_java() { # the Java program with cuBLAS and cuDNN found (JavaCPP's cache: this run's own, not ~/.javacpp)
  LD_LIBRARY_PATH=$CUBLAS_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$JAVA" \
    -Dorg.bytedeco.javacpp.cachedir=/tmp/deepdsl_javacpp "$@"
}
export -f kernels vendor_java
profile_resnet50_vendor() {
  "$PY" scripts/profile_gpu.py --network resnet50 --set N=64 --kernels vendor --json "$OUT/profile_resnet50_vendor.json"
}
profile_emulated() {
  "$PY" scripts/profile_gpu.py --network lenet --set N=4 --kernels vendor --emulate "$DEEPDSL_CACHE/emulated" \
    --json "$OUT/profile_lenet_emulated.json"
}
bench_headline() {
  LD_LIBRARY_PATH=$CUBLAS_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$PY" scripts/bench_gpu.py --part headline \
    --steps 20 --java "$JAVA" --cp "$CP" --json "$OUT/bench.json" --profile "$OUT/profile_resnet50_vendor.json" \
    --deadline-at $((STEP_DEADLINE_AT - 15))
}
bench_optional() { # the data-parallel LeNet's rows where gpu_prepare.sh built it (.gpu/java/dp)
  local dp=()
  [ -d "$G/java/dp" ] && dp=(--dp-cp "$G/java/dp:$G/jars/*")
  LD_LIBRARY_PATH=$CUBLAS_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$PY" scripts/bench_gpu.py --part optional \
    --steps 20 --java "$JAVA" --cp "$CP" --json "$OUT/bench.json" --append --deadline-at $((STEP_DEADLINE_AT - 15)) \
    "${dp[@]}"
}
own_kernels() {
  "$PY" scripts/bench_own_kernels.py --network resnet50 --set N=64 --json "$OUT/own_kernels.json"
}
pytest_gpu() {
  "$PY" -m pytest -q -rs -p no:cacheprovider -p no:benchmark -m gpu tests/backends/test_gpu_runner.py 2>&1 |
    tee "$OUT/pytest_gpu.txt" || return 1
  ! grep -qi "skipped" "$OUT/pytest_gpu.txt"  # a skip here means PyCUDA or the GPU was not usable: not a pass
}
java_lenet_own() {
  kernels LeNet
  "$JAVA" -cp "$CP" LeNet --device cuda --kernels own --data synthetic --iters "$LENET_ITERS" --json >"$OUT/java_lenet.json"
}
java_lenet_nograph() {
  kernels LeNet
  "$JAVA" -cp "$CP" LeNet --device cuda --kernels own --no-graph --data synthetic --iters "$LENET_ITERS" --json \
    >"$OUT/java_lenet_nograph.json"
}
java_lenet_vendor() {
  kernels LeNet
  vendor_java -cp "$CP" LeNet --device cuda --kernels vendor --data synthetic --iters "$LENET_ITERS" --json \
    >"$OUT/java_lenet_cublas.json"
}
numpy_lenet() {
  # shellcheck disable=SC2086  # the sets are words
  "$PY" -m deepdsl run networks/lenet.ddsl $LENET_SETS --data synthetic --iters "$LENET_ITERS" --device cpu --json \
    >"$OUT/numpy_lenet.json"
}
java_resnet50_vendor() {
  kernels ResNet50
  vendor_java -cp "$CP" ResNet50 --device cuda --kernels vendor --data synthetic --iters "$RESNET_ITERS" --json \
    >"$OUT/java_resnet50_vendor.json"
}
java_resnet50_own() {
  kernels ResNet50
  "$JAVA" -cp "$CP" ResNet50 --device cuda --kernels own --data synthetic --iters "$RESNET_ITERS" --json \
    >"$OUT/java_resnet50.json"
}
# the references of the Java ResNet-50 runs: the PyCUDA runner (the NumPy runner takes minutes for one step at batch
# 64; the tests marked gpu check the PyCUDA runner against it)
pycuda_resnet50_vendor() {
  # shellcheck disable=SC2086
  "$PY" -m deepdsl run networks/resnet50.ddsl $RESNET_SETS --data synthetic --iters "$RESNET_ITERS" --device cuda \
    --kernels vendor --json >"$OUT/pycuda_resnet50_vendor.json"
}
pycuda_resnet50_own() {
  # shellcheck disable=SC2086
  "$PY" -m deepdsl run networks/resnet50.ddsl $RESNET_SETS --data synthetic --iters "$RESNET_ITERS" --device cuda \
    --kernels own --json >"$OUT/pycuda_resnet50_own.json"
}
agreement() { "$PY" scripts/gpu_agreement.py "$OUT" "$LENET_SETS" "$RESNET_SETS" "$DRY"; }
profile_resnet50_own() {
  "$PY" scripts/profile_gpu.py --network resnet50 --set N=64 --kernels own --json "$OUT/profile_resnet50_own.json"
}
nccl_pycuda() { "$PY" scripts/gpu_nccl_check.py "$OUT" "$LENET_SETS" "$LENET_ITERS"; }
profile_lenet() {
  "$PY" scripts/profile_gpu.py --network lenet --set N=64 --kernels vendor --json "$OUT/profile_lenet.json"
}
deadline_selftest() { # a deadline of 3 s: a quick step passes, a long one is stopped at it, the next is skipped
  local dir
  dir=$(mktemp -d)
  (
    OUT=$dir
    . scripts/gpu_steps.sh
    steps_begin 3
    quick() { true; }
    slow() { sleep 30; }
    never() { touch "$OUT/ran"; }
    run_step quick 30 quick
    run_step slow 30 slow
    run_step never 30 never
    run_step --optional "never, optional" 30 never
    echo "FAILED=$FAILED" >>"$OUT/summary.txt"
  )
  cat "$dir/summary.txt"
  [ "$(sed -n 1p "$dir/summary.txt")" = "PASS quick" ] &&
    grep -qx "FAIL slow (stopped by the deadline after [23] s)" "$dir/summary.txt" &&
    [ "$(sed -n '3,5p' "$dir/summary.txt")" = "$(printf '%s\n' "SKIPPED (deadline) never" \
      "SKIPPED (deadline) never, optional" "FAILED=1")" ] && [ ! -e "$dir/ran" ]
}

# ---- in order: the profile, the benchmark, the tests, the Java runs, the agreement, then what is optional ----
if [ "$DRY" = 1 ]; then
  run_step "profile_gpu lenet --kernels vendor on the emulated driver (stand-in cuBLAS and cuDNN)" 300 profile_emulated
  skipped "bench_gpu" "no timings"
  skipped "pytest -m gpu" "PyCUDA needs the real driver"
else
  run_step "profile_gpu resnet50 --kernels vendor" 150 profile_resnet50_vendor
  run_step "bench_gpu (headline rows)" 270 bench_headline
  run_step "pytest -m gpu (every test ran)" 240 pytest_gpu
fi
run_step "java LeNet --device cuda --kernels own" 120 java_lenet_own
run_step "java LeNet --device cuda --kernels own --no-graph" 120 java_lenet_nograph
run_step "java LeNet --device cuda --kernels vendor" 120 java_lenet_vendor
run_step "deepdsl run lenet --device cpu (the reference)" 60 numpy_lenet
run_step "java ResNet50 --device cuda --kernels vendor" 120 java_resnet50_vendor
if [ "$DRY" = 1 ]; then
  skipped "deepdsl run resnet50 --device cuda --kernels vendor" "PyCUDA needs the real driver"
else
  run_step "deepdsl run resnet50 --device cuda --kernels vendor (the reference)" 90 pycuda_resnet50_vendor
fi
# a dry run's ResNet-50 runs no step (the start alone): it is quick there, and its memory goes into the agreement
[ "$DRY" = 1 ] && run_step --optional "java ResNet50 --device cuda --kernels own" 120 java_resnet50_own
run_step "agreement (1e-4 relative)" 60 agreement
if [ "$DRY" = 1 ]; then
  run_step "the deadline stops and skips steps, and summary.txt is written (self-test)" 60 deadline_selftest
  skipped "bench_gpu (optional rows), profile_gpu resnet50 --kernels own, profile_gpu lenet" "no timings"
  skipped "bench_gpu's one-rank NCCL rows (LeNet --data-parallel, -Ddeepdsl.collective=true)" \
    "the stand-in NCCL is built over MPI (mpich), which the bundle does not carry; tests/backends/test_java_nccl.py runs it"
  skipped "bench_own_kernels resnet50 (own against cuDNN per layer shape)" \
    "PyCUDA needs the real driver (the script has no emulator mode)"
  skipped "PyCUDA LeNet over NCCL: one rank under torchrun (DEEPDSL_DP_FORCE=1) = the plain run, two ranks on one GPU" \
    "PyCUDA and NCCL need the real GPU, torchrun PyTorch; tests/backends/test_gpu_data_parallel.py runs the one \
forced rank on the emulated GPU with the stand-in NCCL"
else
  run_step --optional "bench_gpu (optional rows)" 200 bench_optional
  run_step --optional "bench_own_kernels resnet50 (own against cuDNN per layer shape)" 120 own_kernels
  run_step --optional "profile_gpu resnet50 --kernels own" 120 profile_resnet50_own
  run_step --optional "java ResNet50 --device cuda --kernels own" 120 java_resnet50_own
  run_step --optional "deepdsl run resnet50 --device cuda --kernels own (the reference)" 90 pycuda_resnet50_own
  run_step --optional "agreement, ResNet-50's own kernels too" 60 agreement
  run_step --optional "profile_gpu lenet --kernels vendor" 60 profile_lenet
  run_step --optional "PyCUDA LeNet over NCCL: one rank under torchrun (DEEPDSL_DP_FORCE=1) = the plain run, \
two ranks on one GPU" 240 nccl_pycuda
fi
exit "$FAILED"
