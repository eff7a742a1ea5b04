#!/usr/bin/env bash
# Collects what the runtime image needs from a build tree into one prefix (used by the
# Dockerfile's builder stage, and by tests/deploy with --link to check it without Docker):
#   PREFIX/bin/  libreyolo-server, libreyolo-kernels-hub (and libreyolo-client,
#                libreyolo-kernels when built)
#   PREFIX/lib/  the project's shared libraries and the ldd closure of the programs except glibc
#                itself and the NVIDIA driver (the container runtime injects it). When that
#                closure holds libtorch_cuda.so, also every other library of LibTorch's lib folder
#                but the Python binding: the CUDA side dlopens some (libtorch_cuda_linalg.so,
#                cuDNN's sub-libraries, ...), which ldd cannot see. A build that links LibTorch's
#                CPU side only (-DLIBREYOLO_TORCH_CUDA=OFF, the CPU image) gets just its closure.
# The runtime image then sets LD_LIBRARY_PATH=PREFIX/lib.
#
# usage: collect-runtime.sh BUILD_DIR PREFIX [--link]
#   --link  symbolic links instead of copies (fast; for the test on a developer machine)
# Environment: TORCH_LIB (LibTorch's lib folder; default: from Torch_DIR, else the venv's torch).
# Exit status: 0, or 1 when a library cannot be resolved (printed as "missing: NAME").
set -euo pipefail

build=${1:?usage: collect-runtime.sh BUILD_DIR PREFIX [--link]}
prefix=${2:?usage: collect-runtime.sh BUILD_DIR PREFIX [--link]}
mode=copy
[ "${3:-}" = "--link" ] && mode=link

put() {  # put SRC DIR: copies (dereferencing) or links SRC into DIR under its own name
  if [ "$mode" = link ]; then ln -sf "$(readlink -f "$1")" "$2/$(basename "$1")"
  else cp -L "$1" "$2/$(basename "$1")"; fi
}

if [ -z "${TORCH_LIB:-}" ]; then
  if [ -n "${Torch_DIR:-}" ]; then
    TORCH_LIB=$(cd "$Torch_DIR/../../../lib" && pwd)
  else
    venv=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}
    # The wheel's layout, found without importing torch (that takes seconds).
    TORCH_LIB=$(ls -d "$venv"/lib/python3*/site-packages/torch/lib 2>/dev/null | head -1)
  fi
fi
[ -d "$TORCH_LIB" ] || { echo "collect-runtime: no LibTorch lib folder at $TORCH_LIB" >&2; exit 1; }

mkdir -p "$prefix/bin" "$prefix/lib"
for exe in libreyolo-server libreyolo-kernels-hub; do
  [ -x "$build/bin/$exe" ] || { echo "collect-runtime: $build/bin/$exe is not built" >&2; exit 1; }
  put "$build/bin/$exe" "$prefix/bin"
done
for exe in libreyolo-client libreyolo-kernels; do
  if [ -x "$build/bin/$exe" ]; then put "$build/bin/$exe" "$prefix/bin"; fi
done
for lib in "$build"/lib/*.so*; do
  [ -e "$lib" ] && put "$lib" "$prefix/lib"
done

# glibc and the driver stay out: the base image (and the NVIDIA container runtime) provide them.
skip='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libanl|libcuda|libnvidia-)[.-]'
missing=0
# ldd prints the whole transitive closure of each program (the project's libraries, LibTorch and
# what they need: gRPC, abseil, protobuf, yaml-cpp, ...), resolved as the image will resolve it.
# A CUDA torch wheel keeps the CUDA libraries in site-packages/nvidia/*/lib, found through
# RUNPATHs relative to torch/lib: search them explicitly, the copies will not be there.
search="$prefix/lib:$TORCH_LIB"
for d in "$TORCH_LIB"/../../nvidia/*/lib "$TORCH_LIB"/../../nvidia/*/*/lib; do
  [ -d "$d" ] && search="$search:$(cd "$d" && pwd)"
done
ldd_out=$(LD_LIBRARY_PATH="$search" ldd "$prefix"/bin/* 2>/dev/null || true)
while read -r name arrow path _; do
  [ "$arrow" = "=>" ] || continue
  if echo "$name" | grep -Eq "$skip"; then continue; fi
  if [ "$path" = "not" ]; then
    echo "missing: $name" >&2
    missing=1
    continue
  fi
  [ -e "$prefix/lib/$name" ] || put "$path" "$prefix/lib"
done <<<"$ldd_out"
if [ -e "$prefix/lib/libtorch_cuda.so" ]; then
  for lib in "$TORCH_LIB"/*.so*; do
    case $(basename "$lib") in libtorch_python*) continue ;; esac  # the Python binding: not used
    [ -e "$prefix/lib/$(basename "$lib")" ] || put "$lib" "$prefix/lib"
  done
fi
echo "collect-runtime: $(ls "$prefix/bin" | wc -l) programs, $(ls "$prefix/lib" | wc -l) libraries in $prefix ($mode)"
exit $missing
