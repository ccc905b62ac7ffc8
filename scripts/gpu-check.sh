#!/usr/bin/env bash
# The GPU proof in one command: installs the [gpu] extra into its own venv (.venv-gpu, never the
# CPU .venv: onnxruntime and onnxruntime-gpu must not meet) with the CUDA 12 libraries and the
# TensorRT 10 libraries onnxruntime-gpu's providers load, and torch's CUDA 12 build, then runs
# bench/gpu.py: the OCR sample and the guide's text_recognition on the CUDA and TensorRT (FP16)
# providers, and text_recognition as TorchScript on KIND_GPU (pytorch_libtorch), against the CPU.
#
#   scripts/gpu-check.sh [bench/gpu.py options]       # install from PyPI, run, write bench/results/
#   scripts/gpu-check.sh --check                       # without a GPU too: the CPU part, then the plan
#   scripts/gpu-check.sh --prepare DIR                 # download every wheel + the OCR weights into DIR
#   scripts/gpu-check.sh --offline DIR [options]       # install from DIR only (no network), then run
#   scripts/gpu-check.sh --print-requirements          # what the GPU venv gets, one requirement a line
#   scripts/gpu-check.sh --prepare-slim DIR [PARTS]    # only toolkit's own wheels (~22 MB) and the OCR
#                                                      # weights, for a machine that has its frameworks
#                                                      # (below); PARTS: onnxruntime-gpu in pieces
#   scripts/gpu-check.sh --stash PARTS                 # there: keep the pieces that came, say what is missing
#   scripts/gpu-check.sh --slim DIR [options]          # there: its python3 + DIR's wheels, then run
#
# A machine that already has its frameworks (a CUDA image with PyTorch's CUDA build, numpy, onnx,
# ONNX Runtime) but no package index needs only toolkit's own dependencies: `--prepare-slim DIR`
# downloads toolkit's requirements and its `tune` extra's (the client bench/gpu.py drives the
# servers with) as wheels for that machine's Python (PYTHON_VERSION, default this interpreter's;
# x86-64 manylinux) and leaves out numpy, onnx and the frameworks; `--slim DIR` there installs
# them into a folder of their own (TOOLKIT_GPU_SITE, default /tmp/toolkit-gpu-site; the machine's
# own packages are not touched) and runs bench/gpu.py with that machine's python3 (PYTHON). The
# TorchScript set then runs on its torch; the ONNX sets' GPU modes need its ONNX Runtime to be
# onnxruntime-gpu (bench/gpu.py says what is missing). DIR/ocr gets the OCR sample's weights (the
# rapidocr wheel, 27 MB), which --slim hands to bench/gpu.py.
#
# Where such a machine has the CPU build of ONNX Runtime and what may be copied to it at once is
# smaller than onnxruntime-gpu's wheel (255 MB), PARTS gets that wheel cut into pieces
# (TOOLKIT_GPU_PART_SIZE, default 50M, split's sizes) beside its sha256: the release line of the
# CUDA major TOOLKIT_GPU_CUDA_MAJOR (default 13: the lent machines' torch is +cu130, their
# driver 580; runtime_deps.py's CUDA_LINES), whose CUDA libraries are the ones the machine's torch
# already loads (nvidia-cublas, -cudnn-cu13, ...), or TOOLKIT_GPU_PARTS_REQUIREMENT. Bring the
# pieces over one or a few at a time, each time with `--stash PARTS`, which copies them into
# TOOLKIT_GPU_STASH (default /tmp/toolkit-gpu-stash, outside the copy) and lists what is still
# missing; `--slim` then joins them, checks the sha256 and installs the wheel with the others, so
# that its onnxruntime is the one imported (the machine's own is left as it is).
#
# A GPU machine without network access: run `--prepare DIR` on a machine with PyPI (same CPU
# architecture; the wheels are for this interpreter's Python, or PYTHON=python3.X), copy DIR
# there (about 3.5 GB: onnxruntime-gpu ~0.3, cuDNN + cuBLAS + cuFFT ~1.3, tensorrt-cu12-libs ~2;
# torch's CUDA build and the CUDA libraries only it needs come on top), then `--offline DIR`. The
# wheelhouse is too large to travel with a repository copy.
#
# Versions: onnxruntime-gpu and the CUDA 12 libraries are those of the GPU images (the CUDA 12
# line of toolkit/build/runtime_deps.py: onnxruntime-gpu 1.26.0, the last CUDA 12 release);
# its TensorRT provider links libnvinfer.so.10 and libnvonnxparser.so.10 (readelf on the wheel),
# so TensorRT comes from NVIDIA's tensorrt-cu12-libs 10.x. On PyPI that is a source stub whose
# build downloads the real wheel from NVIDIA's own package index: where that index cannot be
# reached the TensorRT libraries are left out (a warning) and bench/gpu.py reports the tensorrt
# modes as not runnable; --prepare builds the real wheel (`pip wheel`) so that --offline needs no
# network. bench/gpu.py puts the wheels' library folders on LD_LIBRARY_PATH for its servers.
# torch is the GPU images' own: the CUDA 12 line's build (torch_requirement in runtime_deps.py,
# torch==<version>+cu128 from PyTorch's index, or TOOLKIT_TORCH_INDEX_URL); installed after the
# rest, within the CUDA libraries' ranges, and where it cannot be the TorchScript set is reported
# as not runnable.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
venv=${TOOLKIT_GPU_VENV:-$root/.venv-gpu}
TENSORRT="tensorrt-cu12-libs>=10.14,<11"

mode=online
wheelhouse=""
case "${1:-}" in
  --prepare|--offline|--prepare-slim|--slim|--stash)
    [ $# -ge 2 ] || { echo "usage: $0 $1 DIR" >&2; exit 2; }
    mode=${1#--}
    wheelhouse=$(mkdir -p "$2" && cd "$2" && pwd)
    shift 2
    ;;
esac
stash=${TOOLKIT_GPU_STASH:-/tmp/toolkit-gpu-stash}

# The pieces of each wheel in folder $1: "WHEEL COUNT PIECE..." lines, the pieces in order.
pieces() {
  local sum wheel count piece found
  for sum in "$1"/*.whl.sha256; do
    [ -e "$sum" ] || continue
    wheel=$(basename "${sum%.sha256}")
    count=0
    found=""
    for piece in "$1/$wheel".part-*-of-*; do
      [ -e "$piece" ] || continue
      count=$((10#${piece##*-of-}))
      found+=" $(basename "$piece")"
    done
    echo "$wheel $count$found"
  done
}
if [ "$mode" = stash ]; then
  mkdir -p "$stash"
  found=0
  for file in "$wheelhouse"/*.whl.sha256 "$wheelhouse"/*.whl.part-*-of-*; do
    [ -e "$file" ] || continue
    cp -f "$file" "$stash/"
    found=$((found + 1))
  done
  echo "==> $found file(s) from $wheelhouse kept in $stash"
  while read -r wheel count parts; do
    have=$(wc -w <<< "$parts")
    missing=()
    for ((i = 1; i <= count; i++)); do
      printf -v part '%s.part-%02d-of-%02d' "$wheel" "$i" "$count"
      [ -e "$stash/$part" ] || missing+=("$(printf '%02d' "$i")")
    done
    if [ "$count" -eq 0 ]; then
      echo "$wheel: no piece here yet"
    elif [ ${#missing[@]} -eq 0 ]; then
      echo "$wheel: all $count pieces are here"
    else
      echo "$wheel: $have of $count pieces here; still to bring: part-{$(IFS=,; echo "${missing[*]}")}-of-$(printf '%02d' "$count")"
    fi
  done < <(pieces "$stash")
  exit 0
fi

# What a machine with its own frameworks keeps of its own (wheel file names, normalised).
SLIM_LEFT_OUT='^(numpy|onnx|ml_dtypes|onnxruntime|onnxruntime_gpu|torch|triton|nvidia_[a-z0-9_]+)-'
if [ "$mode" = prepare-slim ]; then
  pyver=${PYTHON_VERSION:-$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')}
  mapfile -t wanted < <("$py" - "$root/pyproject.toml" <<'EOF'
import sys
import tomllib

with open(sys.argv[1], "rb") as handle:
    project = tomllib.load(handle)["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["tune"]))
EOF
)
  platforms=()
  for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
  done
  echo "==> toolkit's own wheels for CPython $pyver (x86-64) into $wheelhouse"
  "$py" -m pip download -q -d "$wheelhouse" --only-binary=:all: --python-version "$pyver" --implementation cp \
    "${platforms[@]}" "${wanted[@]}"
  for wheel in "$wheelhouse"/*.whl; do
    if [[ $(basename "$wheel") =~ $SLIM_LEFT_OUT ]]; then rm -f "$wheel"; fi
  done
  echo "==> the OCR sample's weights (rapidocr wheel) into $wheelhouse/ocr"
  "$py" samples/ocr/prepare.py --cache-dir "$wheelhouse/ocr" --fetch-only
  du -sh "$wheelhouse"
  if [ $# -ge 1 ]; then
    parts=$(mkdir -p "$1" && cd "$1" && pwd)
    requirement=${TOOLKIT_GPU_PARTS_REQUIREMENT:-$("$py" - "$root/toolkit/build/runtime_deps.py" \
      "${TOOLKIT_GPU_CUDA_MAJOR:-13}" <<'EOF'
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("runtime_deps", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["runtime_deps"] = module
spec.loader.exec_module(module)
print(module.CUDA_LINES[int(sys.argv[2])].onnxruntime.spec)
EOF
)}
    echo "==> $requirement for CPython $pyver into $parts, in pieces of ${TOOLKIT_GPU_PART_SIZE:-50M}"
    download=$(mktemp -d)
    "$py" -m pip download -q -d "$download" --no-deps --only-binary=:all: --python-version "$pyver" \
      --implementation cp "${platforms[@]}" "$requirement"
    for whl in "$download"/*.whl; do
      name=$(basename "$whl")
      rm -f "$parts/$name".part-* "$parts/$name.sha256"
      (cd "$download" && sha256sum "$name") > "$parts/$name.sha256"
      split -b "${TOOLKIT_GPU_PART_SIZE:-50M}" -d -a 3 "$whl" "$download/piece-"
      pieces_made=("$download"/piece-*)
      for ((i = 0; i < ${#pieces_made[@]}; i++)); do
        printf -v part '%s.part-%02d-of-%02d' "$name" $((i + 1)) ${#pieces_made[@]}
        mv "${pieces_made[$i]}" "$parts/$part"
      done
      echo "$name: ${#pieces_made[@]} pieces"
    done
    rm -rf "$download"
    ls -l "$parts"
    echo "bring each piece with $parts/*.sha256 to the GPU machine and run scripts/gpu-check.sh --stash PARTS there"
  fi
  echo "copy $wheelhouse to the GPU machine, then: scripts/gpu-check.sh --slim DIR [bench/gpu.py options]"
  exit 0
fi
if [ "$mode" = slim ]; then
  site=${TOOLKIT_GPU_SITE:-/tmp/toolkit-gpu-site}
  joined=()
  while read -r wheel count parts; do
    have=$(wc -w <<< "$parts")
    if [ "$have" -ne "$count" ] || [ "$count" -eq 0 ]; then
      echo "error: $wheel has $have of its ${count} pieces in $stash: bring the rest (scripts/gpu-check.sh --stash PARTS)" >&2
      exit 2
    fi
    if ! (cd "$stash" && sha256sum --status -c "$wheel.sha256" 2>/dev/null); then
      (cd "$stash" && cat $parts > "$wheel")
      (cd "$stash" && sha256sum --status -c "$wheel.sha256") || {
        echo "error: $wheel joined from $count pieces in $stash does not match its sha256" >&2; rm -f "$stash/$wheel"; exit 2; }
    fi
    echo "==> $wheel joined from $count pieces (sha256 checked)"
    joined+=("$stash/$wheel")
  done < <([ -d "$stash" ] && pieces "$stash")
  echo "==> $(( $(ls "$wheelhouse"/*.whl | wc -l) + ${#joined[@]} )) wheels from $wheelhouse${joined:+ and $stash} into $site" \
       "(with $py's own packages)"
  "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" "$wheelhouse"/*.whl "${joined[@]}"
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  ocr=(); [ ! -d "$wheelhouse/ocr" ] || ocr=(--ocr-cache "$wheelhouse/ocr")
  exec "$py" bench/gpu.py "${ocr[@]}" "$@"
fi

# The CUDA line's pins, read from the build's own table (runtime_deps.py needs only the stdlib).
mapfile -t cuda_line < <("$py" - "$root/toolkit/build/runtime_deps.py" <<'EOF'
import importlib.util
import sys

spec = importlib.util.spec_from_file_location("runtime_deps", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules["runtime_deps"] = module
spec.loader.exec_module(module)
line = module.CUDA_LINES[module.DEFAULT_CUDA_MAJOR]
torch = module.torch_requirement(line)
print(torch.spec)
print(torch.index_url or "")
print(line.onnxruntime.spec)
for library in line.libraries:
    print(library.spec)
EOF
)
TORCH=${cuda_line[0]}
torch_index=(); [ -z "${cuda_line[1]}" ] || torch_index=(--extra-index-url "${cuda_line[1]}")
requirements=("${cuda_line[@]:2}" "pillow>=10.1")
if [ "${1:-}" = "--print-requirements" ]; then
  printf '%s\n' "$root[gpu,tune]" "${requirements[@]}" "$TENSORRT" "$TORCH"
  [ ${#torch_index[@]} -eq 0 ] || echo "${torch_index[*]}"  # as a requirements file writes it
  exit 0
fi
no_tensorrt() {
  echo "warning: $TENSORRT could not be installed (its PyPI package is a stub that downloads from NVIDIA's" \
       "package index): the tensorrt modes will be reported as not runnable" >&2
}
no_torch() {
  echo "warning: $TORCH could not be installed (${cuda_line[1]:-pip's configured index}): the TorchScript set" \
       "(text_recognition_torch) will be reported as not runnable" >&2
}

if [ "$mode" = prepare ]; then
  echo "==> downloading the GPU venv's wheels into $wheelhouse"
  "$py" -m pip download -q -d "$wheelhouse" "setuptools>=77" wheel "$root[gpu,tune]" "${requirements[@]}"
  "$py" -m pip wheel -q --no-deps -w "$wheelhouse" "$TENSORRT" || no_tensorrt
  "$py" -m pip download -q -d "$wheelhouse" "$TORCH" "${torch_index[@]}" || no_torch
  echo "==> the OCR sample's weights (rapidocr wheel) into $wheelhouse/ocr"
  "$py" samples/ocr/prepare.py --cache-dir "$wheelhouse/ocr" --fetch-only
  du -sh "$wheelhouse"
  echo "copy $wheelhouse to the GPU machine, then: scripts/gpu-check.sh --offline DIR"
  exit 0
fi

if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv "$venv"
fi
stamp="$venv/.toolkit-gpu-installed"
want="$(printf '%s ' "${requirements[@]}" "$TORCH") $(sha256sum pyproject.toml | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "==> installing the [gpu] extra into $venv"
  if [ "$mode" = offline ]; then
    "$venv/bin/python" -m pip install -q --no-index --find-links "$wheelhouse" "setuptools>=77" wheel
    "$venv/bin/python" -m pip install -q --no-index --find-links "$wheelhouse" --no-build-isolation \
      -e "$root[gpu,tune]" "${requirements[@]}"
    "$venv/bin/python" -m pip install -q --no-index --find-links "$wheelhouse" "$TENSORRT" || no_tensorrt
    "$venv/bin/python" -m pip install -q --no-index --find-links "$wheelhouse" "$TORCH" || no_torch
  else
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -e "$root[gpu,tune]" "${requirements[@]}"
    "$venv/bin/python" -m pip install -q "$TENSORRT" || no_tensorrt
    "$venv/bin/python" -m pip install -q "$TORCH" "${torch_index[@]}" || no_torch
  fi
  echo "$want" > "$stamp"
fi
extra=()
if [ "$mode" = offline ] && [ -d "$wheelhouse/ocr" ]; then
  extra=(--ocr-cache "$wheelhouse/ocr")
fi
exec "$venv/bin/python" bench/gpu.py "${extra[@]}" "$@"
