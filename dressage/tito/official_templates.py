"""Locate the official chat templates (used to verify the native renderers, and hashed).

The official jinja files ship inside the ``trl`` wheel as ``trl/chat_templates/*.jinja``
(``qwen3_5_think.jinja``, ``qwen3_5_nothink.jinja``, ``qwen3_6.jinja``, ``deepseekv3.jinja``, ...).
trl is not a dependency, so the text is found, in order:
``$DRESSAGE_QWEN_TEMPLATES_DIR``, the cache folder ``<cache root>/templates``, else the wheel is
fetched with ``pip download trl --no-deps --only-binary=:all:`` and the ``chat_templates/*.jinja``
members are extracted into the cache folder.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from dressage.errors import TemplateError
from dressage.tito._cache import atomic_write_bytes, cache_subdir

QWEN35_TEMPLATE_FILES = {"think": "qwen3_5_think.jinja", "nothink": "qwen3_5_nothink.jinja"}
ENV_DIR = "DRESSAGE_QWEN_TEMPLATES_DIR"


def template_sha256(text: str) -> str:
    """sha256 hex digest of a template's text (UTF-8): the hash recorded in a run config."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _download_into(dest: Path) -> None:
    """Fetch the trl wheel with pip and extract its ``chat_templates/*.jinja`` into ``dest``."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "trl",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            tmp,
            "-q",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        wheels = sorted(Path(tmp).glob("trl-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise TemplateError(
                f"could not download the trl wheel to get the Qwen3.5 templates ({proc.stderr.strip()[-300:]}); "
                f"set {ENV_DIR} to a folder holding {', '.join(QWEN35_TEMPLATE_FILES.values())}"
            )
        with zipfile.ZipFile(wheels[-1]) as zf:
            for member in zf.namelist():
                if member.startswith("trl/chat_templates/") and member.endswith(".jinja"):
                    atomic_write_bytes(dest / Path(member).name, zf.read(member))


def official_template_dir(download: bool = True) -> Path:
    """Folder holding the official template files (env var, else cache, else downloaded to the cache)."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    dest = cache_subdir("templates")
    if all((dest / f).is_file() for f in QWEN35_TEMPLATE_FILES.values()):
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
    path = official_template_dir(download) / QWEN35_TEMPLATE_FILES[variant]
    if not path.is_file():
        raise TemplateError(f"{path} is missing; set {ENV_DIR} to a folder with the official templates")
    return path.read_text(encoding="utf-8")
