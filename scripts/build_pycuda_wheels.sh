#!/usr/bin/env bash
# Build (on a CPU-only, internet-connected x86-64 Linux box) every wheel needed to
#     pip install --no-index --no-deps --target SITE DEST/*.whl
# PyCUDA on an OFFLINE GPU machine: CPython 3.12, NVIDIA driver 580 (CUDA 13.0),
# numpy 2.x, typing-extensions and markupsafe already installed there.
#
# usage: scripts/build_pycuda_wheels.sh DEST
#   PYTHON312=/path/to/python3.12   interpreter to build with (must be CPython 3.12)
#   FORCE=1                         rebuild even if DEST already holds the wheels
#                                   (removes every *.whl in DEST first)
#   KEEP_TMP=1                      keep the temporary build directory
#
# PyCUDA is sdist-only.  Without a CUDA toolkit here we take cuda.h from the
# nvidia-cuda-runtime wheel and link against a generated stub libcuda.so
# (soname libcuda.so.1) that exports every cu* function declared in that cuda.h,
# so the extension gets "NEEDED libcuda.so.1" and resolves against the real
# driver library on the GPU machine.  Importing pycuda.driver here fails with
# "libcuda.so.1: cannot open shared object file" -- that is expected.
set -euo pipefail

# ---- pinned versions (sha256 from PyPI) ------------------------------------
PYCUDA_VERSION=2026.1
PYCUDA_SHA256=759516160628ba06f32ce7e563e3f5b9214691dc9528a03ea99ea1073f4e14ba
CUDA_RUNTIME_VERSION=13.0.96          # only for include/cuda.h (CUDA 13.0 == driver 580)
CUDA_RUNTIME_SHA256=7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548
CUDA_PROFILER_VERSION=13.0.85         # only for include/cudaProfiler.h (not in the runtime wheel)
CUDA_PROFILER_SHA256=73d2671deac833db6686d6fbde4753fa3a3a497d87540fc246f081f375243f66
# run-time dependencies that the GPU machine lacks (+ lark, our own dependency)
DEP_PINS=(
  "pytools==2026.1.1 --hash=sha256:1f6d9a39c871b6dc761893373792f10b67886c83e38f2aa09b66e11f8c021436"
  "platformdirs==4.14.9 --hash=sha256:d0d3a23e7ff282cfa94b77f5a22b81030dcb68ba0430f90c74f4bd8d090782ea"
  "siphash24==1.9 --hash=sha256:56c4c45c53cf0ce60585127ea15901bcb209fb24206c1bedbf69a4c2c60f72b7"
  "mako==1.4.3 --hash=sha256:723296007c870bfd6b3f0c3230dba7198096e5269297ebf5e4eff9e7ffa39d4f"
  "lark==1.3.1 --hash=sha256:c629b661023a014c37da873b4ff58a817398d12635d3bbb2c5a03be7fe5d1e12"
)
# build-only dependencies (throwaway venv)
BUILD_PINS=(setuptools==84.2.1 wheel==0.48.0 numpy==2.5.5)
# stand-ins for what the GPU machine already has, used only for the local import check
CHECK_PINS=(typing-extensions==4.16.0 markupsafe==3.0.4)
# expected wheel file name prefixes in DEST
EXPECTED=(pycuda-${PYCUDA_VERSION}-cp312-cp312- pytools-2026.1.1- platformdirs-4.14.9-
          siphash24-1.9-cp312-cp312-manylinux mako-1.4.3- lark-1.3.1-)

# ---- arguments / environment -------------------------------------------------
if [[ $# -ne 1 ]]; then
  echo "usage: $0 DEST" >&2
  exit 2
fi
PYTHON312=${PYTHON312:-/root/.pyenv/versions/3.12.1/bin/python3.12}
FORCE=${FORCE:-0}
mkdir -p "$1"
DEST=$(cd "$1" && pwd)

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'ERROR: %s\n' "$*" >&2; exit 1; }

list_dest() {
  echo "Wheels in $DEST:"
  local total=0 f sz
  for f in "$DEST"/*.whl; do
    [[ -e $f ]] || continue
    sz=$(stat -c %s "$f")
    total=$((total + sz))
    printf '  %10d  %s\n' "$sz" "$(basename "$f")"
  done
  printf '  %10d  total bytes (%s)\n' "$total" "$(du -sh "$DEST" | cut -f1) on disk for the folder"
}

have_all() {
  local p
  for p in "${EXPECTED[@]}"; do
    compgen -G "$DEST/${p}*.whl" >/dev/null || return 1
  done
}

if [[ $FORCE != 1 ]] && have_all; then
  log "DEST already has all wheels (FORCE=1 to rebuild); nothing to do"
  list_dest
  exit 0
fi

[[ -x $PYTHON312 ]] || die "PYTHON312=$PYTHON312 is not an executable"
"$PYTHON312" -c 'import sys; assert sys.version_info[:2] == (3, 12) and sys.implementation.name == "cpython", sys.version' \
  || die "PYTHON312 must be CPython 3.12"
[[ $(uname -m) == x86_64 && $(uname -s) == Linux ]] || die "must run on x86-64 Linux"
for tool in gcc g++ readelf nm unzip; do
  command -v "$tool" >/dev/null || die "missing tool: $tool"
done

if [[ $FORCE == 1 ]]; then
  log "FORCE=1: removing existing wheels in $DEST"
  rm -f "$DEST"/*.whl
fi

START=$SECONDS
TMP=$(mktemp -d "${TMPDIR:-/tmp}/pycuda-wheels.XXXXXX")
cleanup() {
  if [[ ${KEEP_TMP:-0} == 1 ]]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1

# ---- 1. throwaway build venv ---------------------------------------------------
log "creating build venv with $PYTHON312"
"$PYTHON312" -m venv "$TMP/venv"
VPY=$TMP/venv/bin/python
"$VPY" -m pip install -q "${BUILD_PINS[@]}"

# ---- 2. pure/binary dependency wheels (hash-pinned, no resolution) -----------------
log "downloading dependency wheels"
printf '%s\n' "${DEP_PINS[@]}" > "$TMP/deps.txt"
"$VPY" -m pip download -q --no-deps --require-hashes -r "$TMP/deps.txt" \
  --only-binary :all: --implementation cp --python-version 3.12 --abi cp312 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$DEST"

# ---- 3. pycuda ------------------------------------------------------------------
if [[ $FORCE != 1 ]] && compgen -G "$DEST/pycuda-${PYCUDA_VERSION}-*.whl" >/dev/null; then
  log "pycuda wheel already present; not rebuilding"
else
  BUILD_START=$SECONDS
  log "downloading pycuda ${PYCUDA_VERSION} sdist, nvidia-cuda-runtime ${CUDA_RUNTIME_VERSION}, nvidia-cuda-profiler-api ${CUDA_PROFILER_VERSION}"
  echo "pycuda==${PYCUDA_VERSION} --hash=sha256:${PYCUDA_SHA256}" > "$TMP/sdist.txt"
  # --no-build-isolation: otherwise --no-binary :all: would apply to the build deps too
  "$VPY" -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
    --require-hashes -r "$TMP/sdist.txt" -d "$TMP/dl"
  {
    echo "nvidia-cuda-runtime==${CUDA_RUNTIME_VERSION} --hash=sha256:${CUDA_RUNTIME_SHA256}"
    echo "nvidia-cuda-profiler-api==${CUDA_PROFILER_VERSION} --hash=sha256:${CUDA_PROFILER_SHA256}"
  } > "$TMP/cudart.txt"
  "$VPY" -m pip download -q --no-deps --require-hashes -r "$TMP/cudart.txt" \
    --only-binary :all: --platform manylinux2014_x86_64 --python-version 3.12 -d "$TMP/dl"

  mkdir -p "$TMP/cudart"
  # both unpack under nvidia/cu13/include/
  unzip -q -o "$TMP"/dl/nvidia_cuda_runtime-*.whl -d "$TMP/cudart"
  unzip -q -o "$TMP"/dl/nvidia_cuda_profiler_api-*.whl -d "$TMP/cudart"
  CUDA_H=$(find "$TMP/cudart" -path '*/include/cuda.h' | head -n 1)
  [[ -n $CUDA_H ]] || die "no include/cuda.h in the nvidia-cuda-runtime wheel"
  CUDA_INC=$(dirname "$CUDA_H")
  CUDA_ROOT=$(dirname "$CUDA_INC")
  log "cuda.h: $CUDA_H ($(grep -m1 -E '^#define CUDA_VERSION ' "$CUDA_H"))"
  [[ -f $CUDA_INC/cudaProfiler.h ]] || die "no cudaProfiler.h next to cuda.h"

  # stub libcuda.so exporting every cu* function declared by this cuda.h
  mkdir -p "$TMP/stub"
  printf '#include <cuda.h>\n#include <cudaProfiler.h>\n' | gcc -E -P -x c -I "$CUDA_INC" - > "$TMP/stub/cuda_pp.c"
  grep -oE '\bcu[A-Za-z0-9_]+[[:space:]]*\(' "$TMP/stub/cuda_pp.c" \
    | sed -E 's/[[:space:]]*\($//' | sort -u > "$TMP/stub/syms.txt"
  [[ $(wc -l < "$TMP/stub/syms.txt") -gt 100 ]] || die "too few cu* symbols found in cuda.h"
  sed -E 's/.*/void &(void) {}/' "$TMP/stub/syms.txt" > "$TMP/stub/stub.c"
  gcc -shared -fPIC -o "$TMP/stub/libcuda.so" -Wl,-soname,libcuda.so.1 "$TMP/stub/stub.c"
  log "stub libcuda.so: $(wc -l < "$TMP/stub/syms.txt") cu* symbols from cuda.h + cudaProfiler.h, soname libcuda.so.1"

  mkdir -p "$TMP/src"
  tar -xzf "$TMP/dl/pycuda-${PYCUDA_VERSION}.tar.gz" -C "$TMP/src"
  SRC=$TMP/src/pycuda-${PYCUDA_VERSION}
  (
    cd "$SRC"
    # writes siteconf.py (so setup.py does not sleep); curand off (no libcurand here)
    "$VPY" configure.py --cuda-root="$CUDA_ROOT" --cuda-inc-dir="$CUDA_INC" \
      --no-cuda-enable-curand --cudadrv-lib-dir="$TMP/stub" > "$TMP/configure.log"
    grep -q CUDA_ENABLE_CURAND.*False siteconf.py || die "curand is not disabled in siteconf.py"
    # The pyenv interpreter's LDSHARED carries -Wl,-rpath,<pyenv lib>; drop it.
    # CFLAGS/CXXFLAGS from the environment REPLACE sysconfig's (setuptools >= 7x), so
    # pass sysconfig's flags plus -g0 (no debug info: keeps the wheel small).
    SYS_CFLAGS=$("$VPY" -c 'import sysconfig; print(sysconfig.get_config_var("CFLAGS"))')
    export LDSHARED="gcc -shared" LDCXXSHARED="g++ -shared"
    export CFLAGS="$SYS_CFLAGS -g0" CXXFLAGS="$SYS_CFLAGS -g0"
    log "building pycuda wheel (log: $TMP/build.log)"
    if ! "$VPY" -m pip wheel -v --no-deps --no-build-isolation --no-index -w "$TMP/out" . > "$TMP/build.log" 2>&1; then
      tail -n 60 "$TMP/build.log" >&2
      die "pycuda build failed"
    fi
  )
  WHL=$(compgen -G "$TMP/out/pycuda-${PYCUDA_VERSION}-cp312-cp312-*.whl" | head -n 1)
  [[ -n $WHL ]] || die "no pycuda wheel produced"

  # ---- verify the extension's dynamic section --------------------------------------
  mkdir -p "$TMP/chk"
  unzip -q "$WHL" 'pycuda/*.so' -d "$TMP/chk"
  DRV=$(compgen -G "$TMP/chk/pycuda/_driver*.so" | head -n 1)
  readelf -d "$DRV" > "$TMP/driver.dyn"
  log "readelf -d $(basename "$DRV") (NEEDED / RPATH / RUNPATH):"
  grep -E 'NEEDED|RPATH|RUNPATH' "$TMP/driver.dyn" >&2
  grep -q 'NEEDED.*\[libcuda\.so\.1\]' "$TMP/driver.dyn" || die "_driver has no NEEDED libcuda.so.1"
  if grep -qE 'RPATH|RUNPATH' "$TMP/driver.dyn"; then die "_driver has an RPATH/RUNPATH"; fi
  grep -q "$TMP" "$DRV" && die "_driver mentions the temp dir $TMP"
  nm -D --undefined-only "$DRV" | awk '{print $NF}' | grep -E '^cu[A-Za-z]' | sed 's/@.*//' | sort -u > "$TMP/used.txt"
  MISSING=$(comm -23 "$TMP/used.txt" "$TMP/stub/syms.txt")
  [[ -z $MISSING ]] || die "_driver uses cu* symbols not declared in cuda.h: $MISSING"
  log "_driver imports $(wc -l < "$TMP/used.txt") cu* symbols from libcuda.so.1, all declared in CUDA ${CUDA_RUNTIME_VERSION} cuda.h"
  log "highest glibc / libstdc++ symbol versions required:"
  for so in "$TMP"/chk/pycuda/*.so; do
    echo "    $(basename "$so"):" >&2
    objdump -T "$so" 2>/dev/null | grep -oE '(GLIBC|GLIBCXX|CXXABI)_[0-9.]+' | sort -t_ -k1,1 -k2,2V -u \
      | awk -F_ '{v[$1]=$0} END {for (k in v) print "      " v[k]}' >&2 || true
  done
  cp "$WHL" "$DEST/"
  log "pycuda build took $((SECONDS - BUILD_START)) s"
fi

# ---- 4. check: offline, no-deps install of DEST/*.whl into a fresh target ----------
log "checking: pip install --no-index --no-deps --target <tmp> DEST/*.whl"
"$VPY" -m pip install -q "${CHECK_PINS[@]}"   # what the GPU machine already has
rm -rf "$TMP/site"
"$VPY" -m pip install -q --no-index --no-deps --target "$TMP/site" "$DEST"/*.whl
"$VPY" - "$TMP/site" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import pycuda, pytools, platformdirs, siphash24, mako.template, lark
assert pycuda.__file__.startswith(sys.argv[1]), pycuda.__file__
print("    import ok: pycuda", pycuda.VERSION_TEXT, "pytools", pytools.__version__ if hasattr(pytools, "__version__") else "?",
      "mako", mako.__version__, "lark", lark.__version__, file=sys.stderr)
try:
    import pycuda.driver
except ImportError as e:
    if "libcuda.so.1" not in str(e):
        raise
    print("    import pycuda.driver -> ImportError (expected without a driver):", e, file=sys.stderr)
else:
    print("    import pycuda.driver succeeded (a libcuda.so.1 is present here)", file=sys.stderr)
EOF

log "done in $((SECONDS - START)) s"
list_dest
shopt -s nullglob
for f in "$DEST"/*.whl; do
  b=$(basename "$f"); ok=0
  for p in "${EXPECTED[@]}"; do [[ $b == ${p}* ]] && ok=1; done
  [[ $ok == 1 ]] || log "WARNING: unexpected extra wheel in DEST: $b"
done
