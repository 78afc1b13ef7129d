#!/usr/bin/env bash
# Prepares .gpu/ (ignored by git) for scripts/gpu_check.sh, which runs on a GPU machine without internet access
# and without Java or PyCUDA. Run it here (with Maven Central and PyPI reachable), then carry .gpu along:
#   .gpu/jre.txz           a Java runtime made with jlink (java.base and java.logging: what the runtime and JCuda use)
#   .gpu/jars/             JCuda 12.6.0 and its natives, cut down to the driver API and NVRTC bindings; JavaCPP
#                          1.5.13 and its CUDA 13 presets, the natives cut down to the cudart, cuBLAS and cuDNN
#                          bindings
#                          (the CUDA device's --kernels vendor; the GPU machine's PyTorch wheels bring the libraries)
#   .gpu/java/build/       LeNet and ResNet50 (batch 64) compiled to Java and built with javac
#   .gpu/java/res/         their kernels: NAME.cu and NAME.sm_90.ptx (the CUDA device finds them on the class path)
#   .gpu/java/dp/          LeNet compiled with --data-parallel: its classes and kernels (bench_gpu.py's NCCL rows)
#   .gpu/wheels/           PyCUDA built for CPython 3.12 and the pure-Python packages it and deepdsl need there
#   .gpu/sizes.env         the --set flags the two networks were compiled with (gpu_check.sh reads them)
# Usage: bash scripts/gpu_prepare.sh [--dry-run]   (PYTHON picks the interpreter that runs deepdsl here)
#   --dry-run   for `gpu_check.sh --dry-run` on this machine: the networks at sizes the CPU emulates in seconds
#               (LeNet at batch 8, ResNet-50 at batch 2 on 32x32 images), and .gpu/fake/: the stand-in driver
#               (tests/backends/fake_libcuda.c) with each network's kernels compiled for the CPU by g++, and the
#               stand-ins of libcudart, libcublas and libcublasLt.so.13 and of cuDNN 9's libraries
#               (tests/backends/cuda13_stand_ins.py)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
G=${DEEPDSL_GPU_FILES:-$ROOT/.gpu}  # gpu_check.sh reads the same variable
PY=${PYTHON:-python3}
DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: bash scripts/gpu_prepare.sh [--dry-run]" >&2; exit 2 ;;
esac
if [ "$DRY" = 1 ]; then
  LENET_SETS="--set N=8"
  RESNET_SETS="--set N=2 --set H=32 --set W=32"
else
  LENET_SETS="--set N=64"
  RESNET_SETS="--set N=64"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$G/java" "$G/jars" "$G/fake"
mkdir -p "$G/java/res" "$G/jars"
printf 'DRY_RUN=%s\nLENET_SETS="%s"\nRESNET_SETS="%s"\n' "$DRY" "$LENET_SETS" "$RESNET_SETS" >"$G/sizes.env"

echo "== JCuda jars"
JARS=${DEEPDSL_JCUDA_JARS:-$ROOT/.ci/jcuda/lib}
if [ ! -f "$JARS/jcuda-12.6.0.jar" ]; then
  mvn -B -q -f .ci/jcuda/pom.xml dependency:copy-dependencies -DoutputDirectory="$JARS"
fi
cp "$JARS/jcuda-12.6.0.jar" "$G/jars/"
mkdir "$tmp/natives"
(cd "$tmp/natives" && unzip -q "$JARS/jcuda-natives-12.6.0-linux-x86_64.jar" 'lib/libJCudaDriver-*' 'lib/libJNvrtc-*')
jar cf "$G/jars/jcuda-natives-12.6.0-linux-x86_64.jar" -C "$tmp/natives" lib
CUDA_PRESETS=cuda-13.1-9.19-1.5.13
if [ ! -f "$JARS/$CUDA_PRESETS.jar" ]; then
  mvn -B -q -f .ci/jcuda/pom.xml dependency:copy-dependencies -DoutputDirectory="$JARS"
fi
cp "$JARS/javacpp-1.5.13.jar" "$JARS/javacpp-1.5.13-linux-x86_64.jar" "$JARS/$CUDA_PRESETS.jar" "$G/jars/"
mkdir "$tmp/presets"
(cd "$tmp/presets" && unzip -q "$JARS/$CUDA_PRESETS-linux-x86_64.jar" \
  'org/bytedeco/cuda/linux-x86_64/libjnicudart.so' 'org/bytedeco/cuda/linux-x86_64/libjnicublas.so' \
  'org/bytedeco/cuda/linux-x86_64/libjnicudnn.so' 'org/bytedeco/cuda/linux-x86_64/libjninccl.so')
jar cf "$G/jars/$CUDA_PRESETS-linux-x86_64.jar" -C "$tmp/presets" org
# JNA (the data-parallel program sets NCCL's rendezvous through it): .ci/jcuda/pom.xml's, else Maven's repository
JNA=jna-5.19.1.jar
for jna in "$JARS/$JNA" "$HOME/.m2/repository/net/java/dev/jna/jna/5.19.1/$JNA"; do
  if [ -f "$jna" ]; then cp "$jna" "$G/jars/"; break; fi
done

echo "== Java runtime (jlink)"
if [ ! -f "$G/jre.txz" ]; then
  jlink --add-modules java.base,java.logging --strip-debug --no-header-files --no-man-pages --compress=2 \
    --output "$tmp/jre"
  tar -C "$tmp" -cJf "$G/jre.txz" jre
fi

echo "== LeNet ($LENET_SETS) and ResNet-50 ($RESNET_SETS) in Java, with PTX for sm_90"
# shellcheck disable=SC2086  # the sets are words
"$PY" -m deepdsl compile networks/lenet.ddsl $LENET_SETS -o "$tmp/src" --ptx --arch sm_90 >/dev/null
# shellcheck disable=SC2086
"$PY" -m deepdsl compile networks/resnet50.ddsl $RESNET_SETS -o "$tmp/src" --ptx --arch sm_90 >/dev/null
if [ "$DRY" = 1 ]; then
  echo "== dry run: the stand-in driver and the kernels for the CPU"
  PYTHONPATH="$ROOT/tests/backends${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$tmp/src" "$G/fake" <<'PYEOF'
import sys
from pathlib import Path

from cuda13_stand_ins import fake_cuda13, fake_cudnn9
from cuda_emulator import TILED, emulate, fake_driver, kernel_names

src, fake = Path(sys.argv[1]), Path(sys.argv[2])
fake_driver(fake)
fake_cuda13(fake)
fake_cudnn9(fake)
for name in ("LeNet", "ResNet50"):
    unit = (src / f"{name}.cu").read_text()
    kernels = kernel_names(unit)
    (fake / name).mkdir()
    emulate(unit, kernels, fake / name, [k for k in kernels if k not in TILED])
PYEOF
fi
mv "$tmp"/src/*.cu "$tmp"/src/*.ptx "$G/java/res/"
javac -nowarn -encoding UTF-8 -cp "$G/jars/*" -d "$G/java/build" "$tmp"/src/*.java "$tmp"/src/deepdsl/runtime/*.java
# LeNet compiled with --data-parallel, its classes and kernels apart (the same class name): bench_gpu.py's one-rank
# NCCL rows (-Ddeepdsl.collective=true) against its plain run
echo "== LeNet ($LENET_SETS) --data-parallel in Java"
# shellcheck disable=SC2086
"$PY" -m deepdsl compile networks/lenet.ddsl $LENET_SETS --data-parallel -o "$tmp/dp" --ptx --arch sm_90 >/dev/null
mkdir -p "$G/java/dp"
javac -nowarn -encoding UTF-8 -cp "$G/jars/*" -d "$G/java/dp" "$tmp"/dp/*.java "$tmp"/dp/deepdsl/runtime/*.java
mv "$tmp"/dp/*.cu "$tmp"/dp/*.ptx "$G/java/dp/"

echo "== PyCUDA and the packages the GPU machine lacks"
bash scripts/build_pycuda_wheels.sh "$G/wheels"

du -sh "$G"/*
total=$(du -sm --exclude=fake "$G" | cut -f1)  # the dry run's stand-ins are not carried
if [ "$total" -gt 56 ]; then
  echo "error: .gpu is ${total} MiB; with the repository it must stay under the 64 MiB a device run carries" >&2
  exit 1
fi
