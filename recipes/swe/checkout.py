"""Where an instance's repository comes from, and its checkout at ``base_commit`` for a sandbox.

A record finds its repository, in this order:

1. its own ``repo_url`` field: any URL or path ``git fetch`` takes (a relative path is relative to
   the records file's folder);
2. ``repos/<owner>__<name>`` next to the records file (the ``repos_dir`` convention: SWE-bench's
   ``owner__name`` spelling of ``repo``), when that folder exists; the shipped sample's generator
   (:mod:`recipes.swe.sample`) writes its repositories there;
3. ``https://github.com/<owner>/<name>.git``, what the published records mean (needs the network).

The checkout is a depth-1 fetch of ``base_commit`` alone into the cache
(``<DRESSAGE_CACHE_DIR>/swe-checkouts``, default ``~/.cache/dressage``), so the sandbox holds the
repository at the issue's commit with its ``.git`` but none of its later history (the fix). Each
session's workspace is seeded from it (:func:`workspace_files`, bytes, ``.git`` included).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from dressage.config import load_settings
from dressage.errors import ConfigError
from recipes.swe.records import SweRecord

GIT_TIMEOUT_S = 600.0
"""A fetch of a large repository over the network can take minutes."""


def repo_source(record: SweRecord, records_dir: Path) -> str:
    """The URL or absolute path the repository of ``record`` is fetched from (module docstring)."""
    if record.repo_url:
        url = record.repo_url
        if "://" not in url and not url.startswith("git@") and not Path(url).is_absolute():
            return str((records_dir / url).resolve())
        return url
    local = records_dir / "repos" / record.repo.replace("/", "__")
    if local.is_dir():
        return str(local.resolve())
    return f"https://github.com/{record.repo}.git"


def checkouts_dir() -> Path:
    """``<cache_dir>/swe-checkouts``."""
    base = load_settings().cache_dir or Path.home() / ".cache" / "dressage"
    return Path(base) / "swe-checkouts"


def _git(args: list[str], cwd: Path) -> str:
    """Run git; a failure is a :class:`ConfigError` with its stderr."""
    try:
        r = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ConfigError(f"git {args[0]} failed: {e}") from None
    if r.returncode != 0:
        raise ConfigError(f"git {' '.join(args[:3])} failed: {r.stderr.strip()[-500:]}")
    return r.stdout


def prepare_checkout(record: SweRecord, source: str, cache: Path | None = None) -> Path:
    """The cached checkout of ``record`` at its ``base_commit`` (fetched from ``source`` once)."""
    safe = re.sub(r"[^\w.-]", "_", record.instance_id)
    dest = (cache or checkouts_dir()) / f"{safe}-{record.base_commit[:12]}"
    if (dest / ".git" / "dressage-ready").exists():
        return dest
    tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _git(["init", "-q"], tmp)
        _git(["fetch", "-q", "--depth", "1", "--no-tags", source, record.base_commit], tmp)
        # on a branch: refs/heads then holds a file, and a sandbox's files keep no empty folder
        _git(["checkout", "-q", "-b", "main", record.base_commit], tmp)
        for key, value in (
            ("core.fileMode", "false"),
            ("user.name", "agent"),
            ("user.email", "agent@sandbox"),
        ):
            _git(["config", key, value], tmp)
        (tmp / ".git" / "dressage-ready").write_text(record.base_commit + "\n")
        try:
            tmp.rename(dest)
        except OSError:  # another process made it first (same commit: same content), or a broken one
            if not (dest / ".git" / "dressage-ready").exists():
                raise
    except ConfigError as e:
        raise ConfigError(
            f"instance {record.instance_id}: the checkout of {source} at {record.base_commit} failed: {e}"
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def workspace_files(checkout: Path) -> dict[str, bytes]:
    """Every regular file of ``checkout``, ``.git`` included, by path relative to it (a sandbox's
    ``files``); symbolic links are kept as the files they point to inside the checkout, or dropped."""
    out: dict[str, bytes] = {}
    for path in sorted(checkout.rglob("*")):
        rel = path.relative_to(checkout).as_posix()
        if rel == ".git/dressage-ready" or not path.is_file():
            continue
        if path.is_symlink() and not path.resolve().is_relative_to(checkout.resolve()):
            continue
        out[rel] = path.read_bytes()
    return out
