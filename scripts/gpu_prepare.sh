#!/usr/bin/env bash
# Prepares .gpu/ (ignored by git) for scripts/gpu_check.sh, which runs on a GPU machine without internet access
# and without Java or PyCUDA. Run it here (with Maven Central and PyPI reachable), then carry .gpu along:
#   .gpu/jre.txz           a Java runtime made with jlink (java.base and java.logging: what the runtime and JCuda use)
#   .gpu/jars/             JCuda 12.6.0 and its natives, cut down to the driver API and NVRTC bindings
#   .gpu/java/build/       LeNet and ResNet50 (batch 64) compiled to Java and built with javac
#   .gpu/java/res/         their kernels: NAME.cu and NAME.sm_90.ptx (the CUDA device finds them on the class path)
#   .gpu/wheels/           PyCUDA built for CPython 3.12 and the pure-Python packages it and deepdsl need there
# Usage: bash scripts/gpu_prepare.sh   (PYTHON picks the interpreter that runs deepdsl here)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
G=$ROOT/.gpu
PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$G/java" "$G/jars"
mkdir -p "$G/java/res" "$G/jars"

echo "== JCuda jars"
JARS=${DEEPDSL_JCUDA_JARS:-$ROOT/.ci/jcuda/lib}
if [ ! -f "$JARS/jcuda-12.6.0.jar" ]; then
  mvn -B -q -f .ci/jcuda/pom.xml dependency:copy-dependencies -DoutputDirectory="$JARS"
fi
cp "$JARS/jcuda-12.6.0.jar" "$G/jars/"
mkdir "$tmp/natives"
(cd "$tmp/natives" && unzip -q "$JARS/jcuda-natives-12.6.0-linux-x86_64.jar" 'lib/libJCudaDriver-*' 'lib/libJNvrtc-*')
jar cf "$G/jars/jcuda-natives-12.6.0-linux-x86_64.jar" -C "$tmp/natives" lib

echo "== Java runtime (jlink)"
if [ ! -f "$G/jre.txz" ]; then
  jlink --add-modules java.base,java.logging --strip-debug --no-header-files --no-man-pages --compress=2 \
    --output "$tmp/jre"
  tar -C "$tmp" -cJf "$G/jre.txz" jre
fi

echo "== LeNet and ResNet-50 in Java, with PTX for sm_90"
for net in lenet resnet50; do
  "$PY" -m deepdsl compile "networks/$net.ddsl" --set N=64 -o "$tmp/src" --ptx --arch sm_90 >/dev/null
done
mv "$tmp"/src/*.cu "$tmp"/src/*.ptx "$G/java/res/"
javac -nowarn -encoding UTF-8 -cp "$G/jars/*" -d "$G/java/build" "$tmp"/src/*.java "$tmp"/src/deepdsl/runtime/*.java

echo "== PyCUDA and the packages the GPU machine lacks"
bash scripts/build_pycuda_wheels.sh "$G/wheels"

du -sh "$G"/*
total=$(du -sm "$G" | cut -f1)
if [ "$total" -gt 56 ]; then
  echo "error: .gpu is ${total} MiB; with the repository it must stay under the 64 MiB a device run carries" >&2
  exit 1
fi
