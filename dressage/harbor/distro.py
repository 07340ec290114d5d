"""The distributions a task's ``FROM debian:<tag>`` / ``FROM ubuntu:<tag>`` is made from: tags, archives.

A Debian or Ubuntu base is never pulled from a registry: it is bootstrapped by ``mmdebstrap`` from the
distribution's own package archive (Debian's ``deb.debian.org``, Ubuntu's ``archive.ubuntu.com``),
which these machines reach. This module says which release a tag is (as Docker Hub's official images
mean it), which archive, components and keyring ``mmdebstrap`` uses for it, and whether that archive
answers (a base that cannot be made is refused before any agent runs, naming the task, the Dockerfile
line and the image).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from dressage.config import load_settings
from dressage.errors import ConfigError

DEBIAN_STABLE = "trixie"
"""Debian's current stable release, what ``debian:latest`` and ``debian:stable`` are (Debian 13 since
August 2025). Recorded by name, so a plan (and its cached root filesystem) does not change when
Debian releases the next one; move it then, on purpose."""
DEBIAN_TAGS: dict[str, str] = {
    **{tag: "bookworm" for tag in ("bookworm", "bookworm-slim", "12", "12-slim")},
    **{tag: "trixie" for tag in ("trixie", "trixie-slim", "13", "13-slim")},
    **{tag: "bullseye" for tag in ("bullseye", "bullseye-slim", "11", "11-slim")},
    **{tag: DEBIAN_STABLE for tag in ("latest", "stable", "stable-slim")},
}
"""The ``debian:<tag>`` images made here, and the Debian release each one is (``-slim`` images hold the
same release's packages with documentation left out)."""

UBUNTU_LATEST = "resolute"
"""What Docker Hub's ``ubuntu:latest`` is: the newest LTS release, 26.04 Resolute Raccoon (released
April 2026; the archive's ``dists/resolute/Release`` says ``Version: 26.04``). Recorded by name like
:data:`DEBIAN_STABLE`; move it with the next LTS, on purpose."""
UBUNTU_ROLLING = "stonking"
"""What Docker Hub's ``ubuntu:rolling`` is: the newest release, LTS or not, 26.10 Stonking Stingray
(released October 2026). Move it every six months, on purpose."""
UBUNTU_TAGS: dict[str, str] = {
    **{tag: "focal" for tag in ("focal", "20.04")},
    **{tag: "jammy" for tag in ("jammy", "22.04")},
    **{tag: "noble" for tag in ("noble", "24.04")},
    **{tag: "resolute" for tag in ("resolute", "26.04")},
    **{tag: "stonking" for tag in ("stonking", "26.10")},
    "latest": UBUNTU_LATEST,
    "rolling": UBUNTU_ROLLING,
}
"""The ``ubuntu:<tag>`` images made here (Docker Hub's supported releases, by number and by code
name), and the Ubuntu release each one is. Dated snapshots (``noble-20240530``) and ``devel`` are
refused: their packages cannot be had again from the archive."""

DISTRO_TAGS: dict[str, dict[str, str]] = {"debian": DEBIAN_TAGS, "ubuntu": UBUNTU_TAGS}
"""Tags per distribution (the image names ``debian`` and ``ubuntu``)."""
UBUNTU_KEYRING = Path("/usr/share/keyrings/ubuntu-archive-keyring.gpg")
"""Ubuntu's archive signing keys, from Debian's ``ubuntu-keyring`` package (scripts/setup-harbor.sh)."""
REACH_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Archive:
    """Where one distribution's packages come from, and what ``mmdebstrap`` needs to trust them."""

    distro: str
    mirror: str
    components: tuple[str, ...]
    pockets: tuple[str, ...]
    """Suffixes of the suites used besides the release itself (``-updates``, ``-security``)."""
    keyring: Path | None
    """None: the host's Debian keyring, which ``mmdebstrap`` uses by default."""


def archive(distro: str) -> Archive:
    """The archive of ``distro``: Debian as ``mmdebstrap`` makes it; Ubuntu with the components and
    pockets Docker Hub's ``ubuntu`` images list in their sources (so ``apt-get install`` finds there
    what it finds in those images). Mirrors: the ``harbor_debian_mirror`` / ``harbor_ubuntu_mirror``
    settings (default ``deb.debian.org`` and ``archive.ubuntu.com``)."""
    settings = load_settings()
    if distro == "debian":
        return Archive("debian", settings.harbor_debian_mirror.rstrip("/"), ("main",), (), None)
    return Archive(
        "ubuntu",
        settings.harbor_ubuntu_mirror.rstrip("/"),
        ("main", "restricted", "universe", "multiverse"),
        ("-updates", "-security"),
        UBUNTU_KEYRING,
    )


def distro_of(image: str) -> str | None:
    """``debian`` or ``ubuntu`` for such an image name (``docker.io/library/`` allowed), else None."""
    name = image.partition(":")[0].removeprefix("docker.io/").removeprefix("library/")
    return name if name in DISTRO_TAGS else None


def suite_of(where: str, image: str) -> tuple[str, str]:
    """``(distro, release)`` of a ``debian:<tag>`` / ``ubuntu:<tag>`` image (no tag: ``latest``), else
    :class:`ConfigError` naming ``where`` (the task and the line), the image and the tags made here."""
    distro = distro_of(image)
    if distro is None:
        raise ConfigError(f"{where}: base image {image!r} is neither debian:<tag> nor ubuntu:<tag>")
    tag = image.partition(":")[2] or "latest"
    suite = DISTRO_TAGS[distro].get(tag)
    if suite is None:
        raise ConfigError(
            f"{where}: base image {image!r} is refused: {distro} tag {tag!r} is not made here; "
            f"use one of {', '.join(DISTRO_TAGS[distro])}"
        )
    return distro, suite


def mmdebstrap_args(distro: str, suite: str, mirror: str | None = None) -> list[str]:
    """``mmdebstrap``'s arguments for ``suite`` of ``distro`` (``mirror``: another archive than the
    setting's): keyring and components options, the suite, the target placeholder ``{target}``, then
    the archive (Debian) or its ``deb`` lines, one per pocket (Ubuntu)."""
    found = archive(distro)
    if found.keyring is None:
        return [suite, "{target}", mirror or found.mirror]
    if not found.keyring.is_file():
        raise ConfigError(
            f"making an {distro} base needs {found.keyring} (Debian's ubuntu-keyring package; "
            "scripts/setup-harbor.sh installs it)"
        )
    parts = " ".join(found.components)
    lines = [f"deb {mirror or found.mirror} {suite}{p} {parts}" for p in ("", *found.pockets)]
    options = [f"--keyring={found.keyring}", f"--components={','.join(found.components)}"]
    return [*options, suite, "{target}", *lines]


def archive_reachable(distro: str, suite: str) -> bool:
    """Whether the archive serves ``dists/<suite>/InRelease`` (one short HTTP request)."""
    url = f"{archive(distro).mirror}/dists/{suite}/InRelease"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=REACH_TIMEOUT_S) as r:
            return bool(200 <= r.status < 300)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def require_archive(where: str, image: str, distro: str, suite: str) -> None:
    """:class:`ConfigError` naming ``where`` (the task and the line) and the image when the archive its
    base is made from does not answer."""
    if not archive_reachable(distro, suite):
        raise ConfigError(
            f"{where}: base image {image!r} is made from {distro}'s archive ({archive(distro).mirror}, release "
            f"{suite}), which cannot be reached from here: the task cannot be built"
        )
