#!/usr/bin/env bash
# Build docker/Dockerfile without a Docker daemon and run its smoke commands inside the image.
#
#   bash scripts/ci-image.sh        (as root; .ci/run calls it)
#
# No registry image can be pulled here, so the base is a stand-in: a Debian bookworm root filesystem
# with python3, pip and the CA bundle, made by mmdebstrap and cached (keyed by its recipe) under
# $DRESSAGE_IMAGE_CACHE (default /var/cache/dressage-ci). These machines reach the package registries
# through the system CA bundle, so the stand-in carries this machine's bundle and points pip and
# Node.js at it. buildah builds with chroot isolation. Its storage, where the kernel mounts overlayfs:
# overlay (a layer is a diff) kept under $CACHE/buildah between runs, and the build uses buildah's
# layer cache (`--layers`), as `docker build` does: a Dockerfile step whose instruction, files and
# parent layer are unchanged is reused from an earlier run instead of run again (so an unchanged apt,
# Node.js or agent-CLI step is not re-downloaded; every step from the first changed one on, usually
# the COPY of the code and Dressage's pip install, runs), the stand-in base image is made once per
# recipe and CA bundle, and the smoke commands below always run in the image just built.
# DRESSAGE_IMAGE_NO_CACHE=1 runs every step (--no-cache). The kept storage is wiped when it passes
# $DRESSAGE_IMAGE_CACHE_MAX_GB (default 20). Without overlayfs: vfs storage (every layer a full copy:
# gigabytes) in a private directory removed on exit, whatever happened, every step run.
#
# Inside the built image: `dressage-worker --help`, `dressage-worker db upgrade` on SQLite,
# `bwrap --version`, and each agent CLI's `--version` compared with the Dockerfile's pin; on a base
# with torch and transformers >= 5 also one whitebox session through the proxy and the CPU dev engine.
# The stand-in has neither, so there that step says so and is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${DRESSAGE_IMAGE_CACHE:-/var/cache/dressage-ci}
SUITE=bookworm
MIRROR=http://deb.debian.org/debian
STANDIN_PACKAGES=python3,python3-pip,ca-certificates
T0=$SECONDS

step() { printf '[ci-image %4ds] %s\n' $((SECONDS - T0)) "$*"; }

if ! command -v buildah >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
  step "installing buildah and mmdebstrap (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah mmdebstrap >/dev/null
fi

# Build storage. vfs: a private directory per run under /var/tmp, removed on exit (a run peaks at about
# 6 GB). overlay: kept under $CACHE/buildah (its run state under /run, which a reboot clears); only
# this run's containers and image tag are removed on exit.
remove_build_dir() { # remove_build_dir DIR: its containers, then the directory, never across a mount
  buildah --root "$1/storage" --runroot "$1/run" --storage-driver vfs rm --all >/dev/null 2>&1 || true
  findmnt -rn -o TARGET | grep -F "$1/" | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf --one-file-system "$1"
}
overlay_works() { # the kernel mounts overlayfs here (not so inside some containers)
  local d rc=1
  d=$(mktemp -d)
  mkdir "$d/lower" "$d/upper" "$d/work" "$d/merged"
  if mount -t overlay overlay -o "lowerdir=$d/lower,upperdir=$d/upper,workdir=$d/work" "$d/merged" 2>/dev/null; then
    umount "$d/merged" && rc=0
  fi
  rm -rf "$d"
  return "$rc"
}
for stale in /var/tmp/dressage-ci-image.*; do # left by a run that was killed before its cleanup
  [ -d "$stale" ] || continue
  owner=$(cat "$stale/owner" 2>/dev/null || true)
  if { [ -n "$owner" ] && ! kill -0 "$owner" 2>/dev/null; } ||
    { [ -z "$owner" ] && [ -n "$(find "$stale" -maxdepth 0 -mmin +60)" ]; }; then
    step "removing $stale, left by an interrupted run"
    remove_build_dir "$stale"
  fi
done
free_gb=$(($(df --output=avail -k /var/tmp | tail -n 1) / 1024 / 1024))
if [ "$free_gb" -lt 12 ]; then
  echo "error: the image build needs about 12 GB free under /var/tmp; $free_gb GB are" >&2
  exit 1
fi
WORK=$(mktemp -d /var/tmp/dressage-ci-image.XXXXXX)
echo $$ >"$WORK/owner"
CACHED_LAYERS=(--layers=false)
if overlay_works; then
  KEPT=$CACHE/buildah
  mkdir -p "$KEPT"
  kept_gb=$(($(du -sxk "$KEPT" | cut -f1) / 1024 / 1024))
  if [ "$kept_gb" -ge "${DRESSAGE_IMAGE_CACHE_MAX_GB:-20}" ]; then
    step "the kept build storage holds $kept_gb GB: wiping it (every step runs)"
    buildah --root "$KEPT/storage" --runroot /run/dressage-ci-buildah --storage-driver overlay rm --all >/dev/null 2>&1 || true
    buildah --root "$KEPT/storage" --runroot /run/dressage-ci-buildah --storage-driver overlay rmi --all --force >/dev/null 2>&1 || true
    rm -rf --one-file-system "$KEPT/storage"
  fi
  STORE=(--root "$KEPT/storage" --runroot /run/dressage-ci-buildah --storage-driver overlay)
  CACHED_LAYERS=(--layers)
  [ "${DRESSAGE_IMAGE_NO_CACHE:-}" = 1 ] && CACHED_LAYERS=(--layers --no-cache)
  step "build storage: overlay, kept in $KEPT (layer cache: ${CACHED_LAYERS[*]})"
else
  STORE=(--root "$WORK/storage" --runroot "$WORK/run" --storage-driver vfs)
  step "build storage: vfs in $WORK (no overlayfs here; removed on exit)"
fi
IMAGE=localhost/dressage-ci:run-$$ # this run's tag: concurrent runs on one kept storage keep apart
LAST=localhost/dressage-ci:last    # the newest build keeps a name; an older one stays, untagged, as cache
CONTAINERS=()
cleanup() {
  local c
  for c in "${CONTAINERS[@]}"; do buildah "${STORE[@]}" rm "$c" >/dev/null 2>&1 || true; done
  # Untag only: `rmi` of an image's last name would remove it and, with it, its untagged parents (the
  # layer cache). With a second name, `rmi` of this run's tag just drops the tag.
  if buildah "${STORE[@]}" tag "$IMAGE" "$LAST" >/dev/null 2>&1; then
    buildah "${STORE[@]}" rmi "$IMAGE" >/dev/null 2>&1 || true
  fi
  remove_build_dir "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
bud() { buildah "${STORE[@]}" "$@"; }

# --- the stand-in base -----------------------------------------------------------------------------
recipe="$SUITE $MIRROR variant=apt include=$STANDIN_PACKAGES"
key=$(printf '%s' "$recipe" | sha256sum | cut -c1-16)
rootfs="$CACHE/standin-$SUITE-$key.tar"
mkdir -p "$CACHE"
if [ ! -s "$rootfs" ]; then
  step "making the stand-in root filesystem ($recipe)"
  partial="$rootfs.$$.partial"
  mmdebstrap --quiet --variant=apt --include="$STANDIN_PACKAGES" --format=tar \
    "$SUITE" "$partial" "$MIRROR" || { rm -f "$partial"; exit 1; }
  mv "$partial" "$rootfs"
else
  step "stand-in root filesystem cached: $rootfs"
fi
# The base image is named by its inputs (the root filesystem's recipe and the CA bundle it carries), so
# a kept storage reuses it, and the layer cache on top of it, until one of them changes.
bundle=$(sha256sum /etc/ssl/certs/ca-certificates.crt | cut -c1-16)
STANDIN=localhost/dressage-ci-standin:$key-$bundle
if bud inspect --type image "$STANDIN" >/dev/null 2>&1; then
  step "stand-in base image kept from an earlier run: $STANDIN"
else
  ctr=$(bud from --pull=never scratch)
  CONTAINERS+=("$ctr")
  bud add --quiet "$ctr" "$rootfs" / >/dev/null
  bud copy --quiet "$ctr" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
  # Also where update-ca-certificates collects local CAs, so a rebuilt bundle keeps it.
  bud copy --quiet "$ctr" /etc/ssl/certs/ca-certificates.crt /usr/local/share/ca-certificates/host-bundle.crt
  bud config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    --env NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt "$ctr"
  bud commit --quiet --rm "$ctr" "$STANDIN" >/dev/null
  step "stand-in base image ready: $STANDIN"
fi

# --- the image -------------------------------------------------------------------------------------
step "building docker/Dockerfile (buildah, chroot isolation, ${STORE[*]: -1} storage, ${CACHED_LAYERS[*]})"
bud bud --quiet --isolation chroot "${CACHED_LAYERS[@]}" --pull=never \
  --build-arg BASE_IMAGE="$STANDIN" -f docker/Dockerfile -t "$IMAGE" . >/dev/null
step "image built"

# --- smoke commands inside it ----------------------------------------------------------------------
ctr=$(bud from --pull=never "$IMAGE")
CONTAINERS+=("$ctr")
in_image() { bud run --isolation chroot "$ctr" -- "$@"; }
pinned() { sed -n "s/^ARG $1=//p" docker/Dockerfile; }
expect_version() { # expect_version <command> <pinned version>
  local got
  got=$(in_image "$1" --version 2>&1 | head -n 1)
  case "$got" in
    *"$2"*) step "$1 --version: $got" ;;
    *) echo "error: $1 --version printed '$got', the Dockerfile pins $2" >&2; exit 1 ;;
  esac
}

in_image dressage-worker --help >/dev/null
step "dressage-worker --help: ok"
in_image dressage-worker db upgrade --database-url sqlite:////tmp/smoke/dressage.db
in_image dressage-worker db current --database-url sqlite:////tmp/smoke/dressage.db
step "bwrap --version: $(in_image bwrap --version)"
step "node --version: $(in_image node --version)"
expect_version opencode "$(pinned OPENCODE_VERSION)"
expect_version openclaw "$(pinned OPENCLAW_VERSION)"
expect_version claude "$(pinned CLAUDE_CODE_VERSION)"
expect_version codex "$(pinned CODEX_VERSION)"
# The dev engine's tiny model is a Qwen3.5-MoE: torch and transformers >= 5.
if in_image python3 -c 'import torch; from transformers import Qwen3_5MoeTextConfig' >/dev/null 2>&1; then
  # One whitebox session through the in-process TITO proxy and the CPU dev engine, into SQLite.
  cat >"$WORK/smoke.yaml" <<'YAML'
run: image-smoke
dataset: {path: /opt/dressage/examples/data/letters.jsonl, limit: 1}
n_samples_per_prompt: 1
engine: {kind: dev, model: tiny, seed: 0}
sampling: {max_tokens: 4, seed: 0, enable_thinking: false}
agent: {kind: answer, system_prompt: You answer in as few words as possible.}
sandbox: {provider: local}
reward: {kind: contains}
worker: {concurrency: 1}
YAML
  bud copy --quiet "$ctr" "$WORK/smoke.yaml" /tmp/smoke/run.yaml
  in_image dressage-worker rollout --config /tmp/smoke/run.yaml --no-progress \
    --database-url sqlite:////tmp/smoke/session.db >/dev/null
  runs=$(in_image dressage-worker runs --json --database-url sqlite:////tmp/smoke/session.db)
  grep -q '"finished": 1' <<<"$runs" || { echo "error: the whitebox session did not finish: $runs" >&2; exit 1; }
  step "whitebox session through the proxy and the dev engine: finished"
else
  step "no torch and transformers >= 5 in this base (the stand-in has neither): whitebox session not run"
fi
step "done in $((SECONDS - T0))s; removing this run's containers (and the storage, if vfs)"
