#!/usr/bin/env bash
# Installs everything the build and the tests need on Debian 12 (idempotent, non-interactive):
# Debian packages for the C++ dependencies, and a Python virtual environment holding the pinned
# torch==2.11.0 wheel (its LibTorch is what CMake builds against) and the test-only peers.
#
# Environment: LIBREYOLO_VENV (default ~/.cache/libreyolo-server/venv-torch2.11) is where the
# virtual environment lives; it is shared by every checkout on the machine because the torch wheel
# and its CUDA libraries weigh several GiB.
# LIBREYOLO_SETUP=image: what the Dockerfile's builder needs and nothing else (the packages that
# build the server, the client and the tools; no test tools, no Python peers, no container
# tools), the apt lists removed afterwards, and a venv holding only the torch==2.11.0 wheel and
# the two CUDA runtime wheels its libtorch_cpu.so links (scripts/requirements-image.txt); no venv
# at all when Torch_DIR names a LibTorch already (the CUDA image's official distribution).
# LIBREYOLO_SETUP=image-packages: the packages of the image mode only (the Dockerfile's first
# layer, so that a failed download of the wheel does not redo apt).
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
venv=${LIBREYOLO_VENV:-$HOME/.cache/libreyolo-server/venv-torch2.11}
stamp_dir=$HOME/.cache/libreyolo-server
mkdir -p "$stamp_dir"

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

mode=${LIBREYOLO_SETUP:-full}
packages_only=0
if [ "$mode" = image-packages ]; then mode=image packages_only=1; fi
case $mode in full|image) ;; *) echo "setup: LIBREYOLO_SETUP=$mode: expected full, image or image-packages" >&2; exit 2 ;; esac

# What builds the server, the client and the tools (the image's builder needs exactly these).
build_debs=(
  build-essential cmake ninja-build ccache pkg-config curl ca-certificates
  python3 python3-venv
  libspdlog-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus-cpp-dev libcivetweb-dev
  libturbojpeg0-dev libpng-dev libcurl4-openssl-dev libssl-dev
  # The HTTP port (server/http/). Debian ships cpp-httplib as a compiled library with only a
  # pkg-config file, whose Requires.private (openssl, zlib, libbrotli*) pkg-config resolves even
  # for a shared build: their -dev packages must be there (apt pulls them as Depends too).
  libcpp-httplib-dev zlib1g-dev libbrotli-dev
  # tcmalloc_minimal, the daemon's malloc (CMakeLists.txt LIBREYOLO_TCMALLOC says why).
  libgoogle-perftools-dev
)
if [ "$mode" = image ]; then
  debs=("${build_debs[@]}")
else
  debs=(
    "${build_debs[@]}" git python3-dev
    clang libclang-rt-14-dev
    libgtest-dev libgmock-dev libbenchmark-dev
    clang-format prometheus
    libb64-0d
    # scripts/test.d/40-image.sh: builds and runs the image (scripts/podman-env.sh says why these).
    podman runc debootstrap
  )
fi

missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
  if [ "$mode" = image ]; then $SUDO apt-get clean; $SUDO rm -rf /var/lib/apt/lists/*; fi
else
  echo "setup: Debian packages present"
fi

if [ "$mode" = image ]; then
  [ "$packages_only" = 1 ] && exit 0
  if [ -n "${Torch_DIR:-}" ]; then
    echo "setup: LibTorch from Torch_DIR=$Torch_DIR: no virtual environment"
    exit 0
  fi
  # --no-deps: the wheel's other CUDA libraries (cuDNN, cuBLAS, NCCL, ... several GiB) serve only
  # libtorch_cuda.so, which a -DLIBREYOLO_TORCH_CUDA=OFF build does not link; nor does CMake
  # import torch (the builder sets Torch_DIR), so its Python dependencies are not needed either.
  req="$here/scripts/requirements-image.txt"
  want=$(sha256sum "$req" | cut -d' ' -f1)
  if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
    echo "setup: creating the image's virtual environment $venv (${PIP_INDEX_URL:-PyPI})"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install -q --no-deps -r "$req"
    echo "$want" > "$venv/.requirements.sha256"
  fi
  cfg=$(ls "$venv"/lib/python3*/site-packages/torch/share/cmake/Torch/TorchConfig.cmake)
  echo "setup: LibTorch at $(dirname "$cfg")"
  exit 0
fi

# Python: the pinned requirements file is the single source of truth for versions.
req="$here/scripts/requirements.txt"
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  echo "setup: creating/updating the virtual environment $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$req"
  echo "$want" > "$venv/.requirements.sha256"
else
  echo "setup: virtual environment $venv up to date"
fi
"$venv/bin/python" -c 'import torch; print("setup: torch", torch.__version__, "at", torch.utils.cmake_prefix_path)'

# cudnn-frontend's C++ headers (header-only) for the CUDA build's `cudnn_graph` conv2d_bias_act
# (kernels/CMakeLists.txt looks for them here). PyPI's nvidia-cudnn-frontend wheel carries them
# beside its Python bindings, whose dependencies (CUTLASS DSL, TVM FFI) the build does not need:
# only the wheel's include/ folder is unpacked.
cfe_dir=$stamp_dir/cudnn-frontend-1.32.0
if [ ! -f "$cfe_dir/include/cudnn_frontend.h" ]; then
  echo "setup: unpacking cudnn-frontend 1.32.0's headers into $cfe_dir"
  cfe_tmp=$(mktemp -d)
  "$venv/bin/python" -m pip download -q --no-deps --only-binary=:all: -d "$cfe_tmp" nvidia-cudnn-frontend==1.32.0
  # Unpacked beside the final folder and moved into place whole: an interrupted unpack leaves
  # no partial headers behind that the check above would take for complete.
  rm -rf "$cfe_dir.partial"
  "$venv/bin/python" - "$cfe_tmp" "$cfe_dir.partial" <<'PY'
import glob, os, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheels = glob.glob(os.path.join(tmp, "nvidia_cudnn_frontend-*.whl"))
if not wheels:
    sys.exit("setup: cudnn-frontend: no wheel downloaded")
with zipfile.ZipFile(wheels[0]) as z:
    for name in z.namelist():
        if name.startswith("include/") and not name.endswith("/"):
            out = os.path.join(dest, name)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(z.read(name))
if not os.path.exists(os.path.join(dest, "include", "cudnn_frontend.h")):
    sys.exit("setup: cudnn-frontend: include/cudnn_frontend.h not in the wheel")
PY
  rm -rf "$cfe_dir" && mv "$cfe_dir.partial" "$cfe_dir"
  rm -rf "$cfe_tmp"
fi

# perf_analyzer (NVIDIA's load generator, a test-only peer: scripts/test.d/25-peers.sh). PyPI's
# `perf-analyzer` 0.1.0 is an empty placeholder; the binary ships inside tritonclient's manylinux
# wheels, and 2.51.0 is the last one built for glibc <= 2.36 (Debian 12; 2.52.0 and later need
# GLIBC_2.38, 2.61.0 and later no longer bundle it). tritonclient 2.51.0 itself pins numpy<2, so
# only its binary is taken, next to the two libraries it loads even without a GPU: libb64.so.0d
# (Debian libb64-0d, above) and libcudart.so.12 (nvidia-cuda-runtime-cu12).
pa_dir=$stamp_dir/perf-analyzer-2.51.0
if [ ! -x "$pa_dir/bin/perf_analyzer" ]; then
  echo "setup: installing perf_analyzer 2.51.0 into $pa_dir"
  pa_tmp=$(mktemp -d)
  "$venv/bin/python" -m pip download -q --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 -d "$pa_tmp" tritonclient==2.51.0 nvidia-cuda-runtime-cu12==12.9.79
  "$venv/bin/python" - "$pa_tmp" "$pa_dir" <<'PY'
import glob, os, sys, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(dest, "lib"), exist_ok=True)
want = {"tritonclient-2.51.0.data/data/bin/perf_analyzer": "lib/perf_analyzer",
        "nvidia/cuda_runtime/lib/libcudart.so.12": "lib/libcudart.so.12"}
for whl in glob.glob(os.path.join(tmp, "*.whl")):
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if name in want:
                out = os.path.join(dest, want[name])
                with open(out, "wb") as f:
                    f.write(z.read(name))
                os.chmod(out, 0o755)
missing = [v for v in want.values() if not os.path.exists(os.path.join(dest, v))]
if missing:
    sys.exit(f"setup: perf_analyzer: {missing} not found in the downloaded wheels")
PY
  mkdir -p "$pa_dir/bin"
  printf '#!/bin/sh\n# perf_analyzer from tritonclient 2.51.0 with its libcudart.so.12 (scripts/setup.sh)\nLD_LIBRARY_PATH="%s/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s/lib/perf_analyzer" "$@"\n' \
    "$pa_dir" "$pa_dir" > "$pa_dir/bin/perf_analyzer"
  chmod +x "$pa_dir/bin/perf_analyzer"
  rm -rf "$pa_tmp"
fi
"$pa_dir/bin/perf_analyzer" --version 2>&1 | sed 's/^/setup: perf_analyzer (a test peer): /'
