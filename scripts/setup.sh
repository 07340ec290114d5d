#!/usr/bin/env bash
# Set up Dressage in ./.venv: Python >= 3.11, torch 2.13.0 (see install_torch: the CPU build unless
# a GPU is visible), and the package with all extras. Safe to run again.
#
# The packages are installed by uv (pinned and hash-checked in scripts/uv-requirements.txt; the same
# resolution as pip, in a fraction of its time: docs/test-speed.md), with pip where uv cannot be
# installed. Both leave every package compiled to bytecode, and so does this script for Dressage's own
# packages (an editable install's sources stay in the checkout): processes then read bytecode instead
# of compiling from source, also where PYTHONDONTWRITEBYTECODE keeps them from writing any.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
  for candidate in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  echo "error: Dressage needs Python >= 3.11; set PYTHON=/path/to/python3.11" >&2
  return 1
}

# A registry download cut short (IncompleteRead, a reset connection) fails one pip run; try again.
retry() {
  local attempt
  for attempt in 1 2 3; do
    "$@" && return 0
    echo "warning: attempt $attempt of 3 failed: $*" >&2
    sleep 5
  done
  return 1
}

if [ ! -x .venv/bin/python ]; then
  "$(find_python)" -m venv .venv
fi
retry .venv/bin/python -m pip install -q --upgrade pip
if ! .venv/bin/python -m pip install -q --require-hashes -r scripts/uv-requirements.txt; then
  echo "warning: uv could not be installed (no pinned wheel for this machine?); installing with pip" >&2
fi
install() { bash scripts/venv-install.sh .venv/bin/python "$@"; }  # uv, or pip where uv is not there
TORCH_VERSION=2.13.0
CPU_INDEX=${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}

# torch==X from PyPI is the multi-GB CUDA build. In order: a wheel already in a local wheel folder
# (pip's find-links; works offline), the CUDA build from PyPI when nvidia-smi sees a GPU, else the
# CPU build from PyTorch's CPU index.
install_torch() {
  # pip for the indexes below: uv would rank --extra-index-url (PyPI: the CUDA build) above --index-url
  local pip=(retry .venv/bin/python -m pip install -q) local_wheels
  local_wheels=$(mktemp -d)
  if .venv/bin/python -m pip download -q --no-index --no-deps "torch==$TORCH_VERSION" -d "$local_wheels" 2>/dev/null; then
    echo "torch $TORCH_VERSION: from the local wheel folder ($(basename "$local_wheels"/torch-*.whl))"
    retry install "$local_wheels"/torch-*.whl
  elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "torch $TORCH_VERSION: GPU found (nvidia-smi), installing the CUDA build from PyPI"
    "${pip[@]}" "torch==$TORCH_VERSION"
  else
    echo "torch $TORCH_VERSION: no GPU found, installing the CPU build from $CPU_INDEX"
    "${pip[@]}" "torch==$TORCH_VERSION" --index-url "$CPU_INDEX" --extra-index-url https://pypi.org/simple
  fi
  rm -rf "$local_wheels"
}

if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
  install_torch
fi
retry install -e '.[all]'
.venv/bin/python -m compileall -q dressage workers recipes >/dev/null
echo "Dressage is installed in .venv (dressage-worker: .venv/bin/dressage-worker)"
