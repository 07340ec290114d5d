"""Locate the official chat templates (used to verify the native renderers, and hashed).

The official jinja files ship inside the ``trl`` wheel as ``trl/chat_templates/*.jinja``
(``qwen3_5_think.jinja``, ``qwen3_5_nothink.jinja``, ``qwen3_6.jinja``, ``deepseekv3.jinja``, ...).
trl is not a dependency, so the text is found, in order:
``$DRESSAGE_QWEN_TEMPLATES_DIR``, the cache folder ``<cache root>/templates``, else the pinned wheel
(``trl==TRL_VERSION``, its sha256 checked by pip with ``--require-hashes``) is downloaded and the
``chat_templates/*.jinja`` members are extracted into the cache folder; the Qwen3.5 files are then
checked against their pinned hashes, and a failed or tampered download is a TemplateError.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from dressage.config import load_settings
from dressage.errors import TemplateError
from dressage.tito._cache import atomic_write_bytes, cache_subdir

QWEN35_TEMPLATE_FILES = {"think": "qwen3_5_think.jinja", "nothink": "qwen3_5_nothink.jinja"}
ENV_DIR = "DRESSAGE_QWEN_TEMPLATES_DIR"
TRL_VERSION = "1.16.0"
"""The trl release whose ``chat_templates`` are used; pinned with its wheel's sha256 (pip checks it)."""
TRL_WHEEL_SHA256 = "c4726e139dd40e1a41661511c639c8a68416782b2e3e8c0befebd77bb7ba0396"
VERSION_MARKER = ".trl-version"


def template_sha256(text: str) -> str:
    """sha256 hex digest of a template's text (UTF-8): the hash recorded in a run config."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _download_into(dest: Path) -> None:
    """Fetch the pinned trl wheel with pip and extract its ``chat_templates/*.jinja`` into ``dest``.

    The version is :data:`TRL_VERSION` and pip refuses a wheel whose sha256 is not
    :data:`TRL_WHEEL_SHA256` (``--require-hashes``); a failure (no network, wrong hash) is a
    :class:`TemplateError`, never a silent fallback. ``dest`` gets a marker naming the version.
    """
    with tempfile.TemporaryDirectory() as tmp:
        requirements = Path(tmp) / "trl-pin.txt"
        requirements.write_text(f"trl=={TRL_VERSION} --hash=sha256:{TRL_WHEEL_SHA256}\n")
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--require-hashes",
            "-r",
            str(requirements),
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            tmp,
            "-q",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        wheels = sorted(Path(tmp).glob(f"trl-{TRL_VERSION}-*.whl"))
        if proc.returncode != 0 and "DO NOT MATCH THE HASHES" in proc.stderr:
            raise TemplateError(
                f"could not download trl {TRL_VERSION}: the wheel pip found does not have the pinned "
                f"sha256 {TRL_WHEEL_SHA256}; set {ENV_DIR} to a folder with the official templates"
            )
        if proc.returncode != 0 or not wheels:
            raise TemplateError(
                f"could not download trl {TRL_VERSION} (sha256 {TRL_WHEEL_SHA256[:12]}...) to get the "
                f"official templates ({proc.stderr.strip()[-300:]}); "
                f"set {ENV_DIR} to a folder holding {', '.join(QWEN35_TEMPLATE_FILES.values())}"
            )
        if hashlib.sha256(wheels[0].read_bytes()).hexdigest() != TRL_WHEEL_SHA256:
            raise TemplateError(f"{wheels[0].name} does not have the pinned sha256 {TRL_WHEEL_SHA256}")
        with zipfile.ZipFile(wheels[0]) as zf:
            for member in zf.namelist():
                if member.startswith("trl/chat_templates/") and member.endswith(".jinja"):
                    atomic_write_bytes(dest / Path(member).name, zf.read(member))
        atomic_write_bytes(dest / VERSION_MARKER, TRL_VERSION.encode())


def _pinned_files_present(folder: Path) -> bool:
    """True when ``folder`` holds the Qwen3.5 templates with their pinned sha256 (and, for the cache,
    the pinned trl version's marker: a cache filled by an older, unpinned download is refreshed)."""
    from dressage.tito.chat_template import QWEN35_TEMPLATE_SHA256

    for variant, name in QWEN35_TEMPLATE_FILES.items():
        path = folder / name
        if (
            not path.is_file()
            or template_sha256(path.read_text(encoding="utf-8")) != QWEN35_TEMPLATE_SHA256[variant]
        ):
            return False
    return True


def official_template_dir(download: bool = True) -> Path:
    """Folder holding the official template files (env var, else cache, else downloaded to the cache).

    The cache counts only when it came from the pinned trl (marker) and its Qwen3.5 files have
    their pinned sha256; a folder named by the setting is used as given (its files are checked
    by hash where they are read).
    """
    configured = load_settings().qwen_templates_dir
    if configured:
        return configured.expanduser()
    dest = cache_subdir("templates")
    marker = dest / VERSION_MARKER
    if marker.is_file() and marker.read_text().strip() == TRL_VERSION and _pinned_files_present(dest):
        return dest
    if not download:
        raise TemplateError(
            f"official Qwen3.5 templates not cached in {dest}; set {ENV_DIR} or allow download"
        )
    _download_into(dest)
    return dest


def official_template(file_name: str, download: bool = True) -> str:
    """Text of the official template ``file_name`` from trl's ``chat_templates`` (e.g. ``qwen3_6.jinja``)."""
    path = official_template_dir(download) / file_name
    if not path.is_file():
        raise TemplateError(f"{path} is missing; set {ENV_DIR} to a folder with the official templates")
    return path.read_text(encoding="utf-8")


def official_qwen35_template(variant: str, download: bool = True) -> str:
    """Text of the official Qwen3.5 template ``variant`` (``"think"`` or ``"nothink"``)."""
    if variant not in QWEN35_TEMPLATE_FILES:
        raise TemplateError(
            f"unknown Qwen3.5 template variant {variant!r}; use one of {sorted(QWEN35_TEMPLATE_FILES)}"
        )
    from dressage.tito.chat_template import QWEN35_TEMPLATE_SHA256

    path = official_template_dir(download) / QWEN35_TEMPLATE_FILES[variant]
    if not path.is_file():
        raise TemplateError(f"{path} is missing; set {ENV_DIR} to a folder with the official templates")
    text = path.read_text(encoding="utf-8")
    if template_sha256(text) != QWEN35_TEMPLATE_SHA256[variant]:
        raise TemplateError(
            f"{path} is not the pinned official template (sha256 {template_sha256(text)[:12]}..., expected "
            f"{QWEN35_TEMPLATE_SHA256[variant][:12]}... from trl {TRL_VERSION})"
        )
    return text
