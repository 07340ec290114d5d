#!/usr/bin/env bash
# The optional Harbor side (docs/harbor.md), safe to run again:
# 1. .venv-harbor: Python 3.12 with harbor==0.26.0 (all its dependencies pinned by
#    scripts/harbor-constraints.txt) and Dressage without extras: no torch (harbor needs Python >= 3.12,
#    the CPU torch build exists only for 3.11 here; the dev engine runs from .venv as its own process).
# 2. mmdebstrap (Debian package), Ubuntu's archive keyring (Debian's ubuntu-keyring package: from the
#    host's release where it has one, else from Debian trixie through a private apt configuration) and
#    the cached Debian and Ubuntu root filesystems of the apt-only fixture tasks, so their tests run
#    offline.
# 3. buildah, skopeo and umoci (Debian packages: the builder of any other Dockerfile, and the image
#    sandbox's tools), the tbench fixture's local images (tests/harbor/tbench-images: a Debian base
#    with pip, and the prebuilt image of its docker_image task) and its task images, and the Ubuntu
#    fixture's image (tests/harbor/datasets/ubuntu: its ubuntu:24.04 base made from Ubuntu's archive),
#    each built once and cached (keyed by Dockerfile and context) under ~/.cache/dressage
#    (DRESSAGE_CACHE_DIR).
# Without Python 3.12 or a network, it says so and exits 0: the Harbor tests are then skipped with
# that reason (the rollout-side Harbor tests need neither).
set -euo pipefail
cd "$(dirname "$0")/.."

find_python312() {
  for candidate in "${PYTHON312:-}" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 12) else 1)' 2>/dev/null; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

if py=$(find_python312); then
  [ -x .venv-harbor/bin/python ] || "$py" -m venv .venv-harbor
  .venv-harbor/bin/python -m pip install -q --upgrade pip
  bash scripts/venv-install.sh .venv-harbor/bin/python -c scripts/harbor-constraints.txt -e '.[harbor]'
  if .venv-harbor/bin/python -c 'import torch' 2>/dev/null; then
    echo "error: torch got into .venv-harbor; the Harbor environment must not pull torch" >&2
    exit 1
  fi
  echo "Harbor $(.venv-harbor/bin/python -c 'import importlib.metadata as m; print(m.version("harbor"))') is installed in .venv-harbor"
else
  echo "warning: no Python 3.12 (set PYTHON312=...); the harbor-run tests will be skipped" >&2
fi

if ! command -v mmdebstrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q mmdebstrap >/dev/null ||
    echo "warning: could not install mmdebstrap" >&2
fi
install_ubuntu_keyring() { # Debian's ubuntu-keyring (bookworm has none: then trixie's, checked by apt)
  local d opts
  if DEBIAN_FRONTEND=noninteractive apt-get install -y -q ubuntu-keyring >/dev/null 2>&1; then return 0; fi
  d=$(mktemp -d)
  mkdir -p "$d/lists/partial" "$d/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-trixie-stable.gpg] http://deb.debian.org/debian trixie main" >"$d/sources.list"
  opts=(-o "Dir::Etc::SourceList=$d/sources.list" -o Dir::Etc::SourceParts=/nonexistent
    -o "Dir::State::Lists=$d/lists" -o "Dir::Cache=$d/cache" -o Dir::State::Status=/dev/null
    -o APT::Sandbox::User=root)
  if apt-get "${opts[@]}" update -q >/dev/null && (cd "$d" && apt-get "${opts[@]}" download ubuntu-keyring >/dev/null); then
    dpkg -i "$d"/ubuntu-keyring_*.deb >/dev/null
  fi
  rm -rf "$d"
  [ -f /usr/share/keyrings/ubuntu-archive-keyring.gpg ]
}
if [ ! -f /usr/share/keyrings/ubuntu-archive-keyring.gpg ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  install_ubuntu_keyring || echo "warning: could not install ubuntu-keyring; the Ubuntu fixture's tests will fail" >&2
fi
builder=.venv/bin/python
[ -x "$builder" ] || builder=.venv-harbor/bin/python
if command -v mmdebstrap >/dev/null 2>&1 && [ -x "$builder" ]; then
  "$builder" -m dressage.harbor.rootfs tests/harbor/datasets/apt ||
    echo "warning: the apt-only fixture's root filesystem was not built; its tests will be skipped" >&2
  "$builder" -m dressage.harbor.rootfs tests/harbor/datasets/ubuntu ||
    echo "warning: the Ubuntu fixture's root filesystem was not built (archive.ubuntu.com?)" >&2
fi

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  for tool in buildah skopeo umoci; do
    command -v "$tool" >/dev/null 2>&1 ||
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$tool" >/dev/null ||
      echo "warning: could not install $tool" >&2
  done
fi
if command -v buildah >/dev/null 2>&1 && command -v mmdebstrap >/dev/null 2>&1 && [ -x "$builder" ]; then
  { "$builder" -m dressage.harbor.build --tag localhost/dressage-tbench/base:1 tests/harbor/tbench-images/base &&
    "$builder" -m dressage.harbor.build --tag localhost/dressage-tbench/tool:1 tests/harbor/tbench-images/tool &&
    "$builder" -m dressage.harbor.prebuild tests/harbor/datasets/tbench; } ||
    echo "warning: the tbench fixture's images were not built; its tests will be skipped" >&2
  "$builder" -m dressage.harbor.prebuild tests/harbor/datasets/ubuntu ||
    echo "warning: the Ubuntu fixture's image was not built (archive.ubuntu.com?)" >&2
fi
