#!/usr/bin/env bash
# The image sandbox's tools (sandbox provider `image`, docs/rollout.md), Debian packages, safe to run again:
# skopeo (copies any image reference into the cache's OCI layout), umoci (unpacks it rootless),
# and, for the tests' offline test image and for images built locally, buildah (with podman,
# uidmap and fuse-overlayfs, what buildah/podman need rootless). The image tests are in the slow
# tier; without these tools they skip with that reason (DRESSAGE_REQUIRE_ALL=1: they fail).
set -euo pipefail

PACKAGES=(skopeo umoci buildah podman uidmap fuse-overlayfs)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "image tools installed: $(skopeo --version), $(umoci --version), $(buildah --version)"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || [ "$(id -u)" != 0 ]; then
  echo "warning: install ${missing[*]} (apt-get, as root) for the image sandbox" >&2
  exit 1
fi
apt-get update -qq || true
for attempt in 1 2 3; do  # the dpkg lock may be held by another install for a moment
  if DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; then
    echo "image tools installed: $(skopeo --version), $(umoci --version), $(buildah --version)"
    exit 0
  fi
  echo "warning: apt-get install ${missing[*]}: attempt $attempt of 3 failed" >&2
  sleep 5
done
exit 1
