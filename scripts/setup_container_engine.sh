#!/usr/bin/env bash
# A container engine for sandbox provider docker's tests (tests/paddock/test_docker.py, tier external):
# Docker where its daemon answers, else Podman with runc from Debian's packages. Safe to run again;
# needs root (CI containers run as root) or sudo.
#
# Podman 4.3's defaults fail on some hosts, as on the CI machines (cgroup v1 with an empty cgroup2
# mount, no CAP_SYS_RESOURCE): crun 1.8 refuses the hybrid cgroup layout, and the default rlimits
# (nofile 1048576) are above what the engine may set. Only where a probe container fails this way,
# a drop-in (/etc/containers/containers.conf.d/50-dressage.conf) selects runc and rlimits within the
# host's own hard limits.
set -euo pipefail

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
if docker ps -q >/dev/null 2>&1; then
  docker --version
  exit 0
fi
if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: provider docker's tests need Docker or Podman; install one (Debian: apt-get install podman runc)" >&2
    exit 1
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends podman runc >/dev/null
fi

probe() {  # a container of a one-file image made from this host's /usr/bin/true and its libraries
  local root ref=localhost/dressage-engine-probe:1
  if ! podman image inspect "$ref" >/dev/null 2>&1; then
    root=$(mktemp -d)
    for f in /usr/bin/true $(ldd /usr/bin/true | grep -o '/[^ ]*'); do
      mkdir -p "$root$(dirname "$f")" && cp -L "$f" "$root$f"
    done
    tar -C "$root" -c . | podman import - "$ref" >/dev/null
    rm -rf "$root"
  fi
  podman run --rm --network none "$ref" /usr/bin/true
}

if ! probe 2>/tmp/dressage-engine-probe.err; then
  echo "podman's defaults fail here ($(tail -n 1 /tmp/dressage-engine-probe.err)); configuring runc and rlimits"
  nproc=$(ulimit -Hu)  # podman's conmon runs with at most 32768
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  $SUDO mkdir -p /etc/containers/containers.conf.d
  $SUDO tee /etc/containers/containers.conf.d/50-dressage.conf >/dev/null <<CONF
# Written by dressage's scripts/setup_container_engine.sh: crun refuses this host's hybrid cgroup
# layout, and podman's default rlimits exceed what it may set here without CAP_SYS_RESOURCE.
[containers]
default_ulimits = ["nofile=$(ulimit -Hn):$(ulimit -Hn)", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
CONF
  probe
fi
podman --version
