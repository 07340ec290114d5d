"""The shipped sample: small local repositories with a real bug, its fix and tests, as SWE records.

``python -m recipes.swe.make_sample [--out DIR]`` builds, for each folder of ``recipes/swe/sample/``
(``repo.json``: ``repo``, ``number``, ``created_at``, ``version``; ``issue.md``: the problem
statement; ``base/``: the repository before the fix; ``fixed/``: the files the fix and its tests
change, as they are after it), a git repository ``DIR/repos/<owner>__<name>`` with two commits (the
base, then the upstream fix with its tests), and writes ``DIR/swe_sample.jsonl``: one SWE-bench
record per repository. ``patch`` and ``test_patch`` are the fix commit's diff split as SWE-bench
splits it (test files vs the rest); ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` are found by running the
tests, as SWE-bench's validation does: the tests that fail with ``test_patch`` alone and pass with
both patches, and the tests that pass both times. Commits carry fixed authors and dates, so the
commit ids, and the records, are the same on every machine: the default ``DIR`` is
``recipes/swe/data``, whose ``swe_sample.jsonl`` is committed (``--check`` says whether a fresh
build still matches it), while ``data/repos/`` is built here and git-ignored.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from recipes.extras import require
from recipes.swe.grading import test_spec
from recipes.swe.records import SweRecord

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "sample"
DATA = HERE / "data"
RECORDS = "swe_sample.jsonl"
GITIGNORE = "__pycache__/\n*.pyc\n.pytest_cache/\n"


def _git(repo: Path, *args: str, date: str | None = None) -> str:
    env = {
        "PATH": "/usr/bin:/bin:/usr/local/bin",
        "HOME": str(repo),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "Acme Maintainer",
        "GIT_AUTHOR_EMAIL": "maintainer@acme.example",
        "GIT_COMMITTER_NAME": "Acme Maintainer",
        "GIT_COMMITTER_EMAIL": "maintainer@acme.example",
    }
    if date:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = date
    r = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} in {repo}: {r.stderr.strip()}")
    return r.stdout


def _commit_all(repo: Path, message: str, date: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message, date=date)
    return _git(repo, "rev-parse", "HEAD").strip()


def _is_test(path: str) -> bool:
    """SWE-bench's split of a fix commit: files under a test folder or named like tests go to test_patch."""
    parts = path.split("/")
    return any(p in ("tests", "test", "testing") for p in parts[:-1]) or parts[-1].startswith("test_")


def _statuses(repo: Path, record: SweRecord, with_fix: bool) -> dict[str, str]:
    """pytest's status of every test of ``test_patch`` at the base with it (and the fix) applied."""
    spec = test_spec(
        record.model_copy(update={"test_cmd": f"{sys.executable} -m pytest -rA --tb=no -p no:cacheprovider"})
    )
    with tempfile.TemporaryDirectory() as d:
        work = Path(d) / "w"
        subprocess.run(["git", "clone", "-q", str(repo), str(work)], check=True)
        _git(work, "checkout", "-q", record.base_commit)
        if with_fix:
            subprocess.run(["git", "apply"], cwd=work, input=record.patch, text=True, check=True)
        r = subprocess.run(
            ["bash", "-c", spec.eval_script], cwd=work, capture_output=True, text=True, check=False
        )
    sliced = r.stdout + r.stderr
    parser = require("swebench.harness.log_parsers", "swe").PARSER_REGISTRY[spec.log_parser]
    return dict(parser(sliced, spec))


def build_repo(src: Path, repos: Path) -> tuple[Path, str]:
    """Build the git repository of sample folder ``src`` under ``repos``: its folder and base commit."""
    meta = json.loads((src / "repo.json").read_text())
    repo = repos / meta["repo"].replace("/", "__")
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    shutil.copytree(src / "base", repo, dirs_exist_ok=True)
    (repo / ".gitignore").write_text(GITIGNORE)
    created = datetime.fromisoformat(meta["created_at"].replace("Z", "+00:00"))
    base = _commit_all(repo, "Initial version", (created - timedelta(days=30)).isoformat())
    shutil.copytree(src / "fixed", repo, dirs_exist_ok=True)
    issue = (src / "issue.md").read_text()
    _commit_all(
        repo, f"Fix #{meta['number']}: {issue.splitlines()[0]}", (created + timedelta(days=1)).isoformat()
    )
    return repo, base


def make_record(src: Path, repos: Path) -> dict[str, Any]:
    """The record of sample folder ``src``, its repository built under ``repos`` (module docstring)."""
    meta = json.loads((src / "repo.json").read_text())
    issue = (src / "issue.md").read_text()
    repo, base = build_repo(src, repos)
    changed = _git(repo, "diff", "--name-only", base, "HEAD").split()
    tests = [p for p in changed if _is_test(p)]
    code = [p for p in changed if not _is_test(p)]
    record = SweRecord(
        instance_id=f"{meta['repo'].replace('/', '__')}-{meta['number']}",
        repo=meta["repo"],
        base_commit=base,
        problem_statement=issue,
        patch=_git(repo, "diff", base, "HEAD", "--", *code),
        test_patch=_git(repo, "diff", base, "HEAD", "--", *tests),
        FAIL_TO_PASS=["placeholder"],
        hints_text="",
        created_at=meta["created_at"],
        version=meta["version"],
        environment_setup_commit=base,
    )
    before, after = _statuses(repo, record, False), _statuses(repo, record, True)
    f2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) != "PASSED")
    p2p = sorted(t for t, s in after.items() if s == "PASSED" and before.get(t) == "PASSED")
    if not f2p or len(f2p) + len(p2p) != len(after):
        raise RuntimeError(
            f"{src.name}: the fix does not make the tests pass: before {before}, after {after}"
        )
    out = record.model_dump(mode="json", exclude_none=True)
    out.update(FAIL_TO_PASS=json.dumps(f2p), PASS_TO_PASS=json.dumps(p2p))  # JSON strings, as on the Hub
    return out


def sample_folders() -> list[Path]:
    """The folders of ``recipes/swe/sample``, in order."""
    return sorted(p for p in SAMPLE.iterdir() if p.is_dir())


def build_repos(repos: Path) -> list[Path]:
    """Only the repositories (no test runs): what the committed records need, under ``repos``."""
    return [build_repo(src, repos)[0] for src in sample_folders()]


def make_sample(out: Path = DATA) -> Path:
    """Build every sample repository under ``out/repos`` and write ``out/swe_sample.jsonl``."""
    records = [make_record(src, out / "repos") for src in sample_folders()]
    path = out / RECORDS
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    return path


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring)."""
    ap = argparse.ArgumentParser(
        prog="python -m recipes.swe.make_sample", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--out", type=Path, default=DATA, help="folder for repos/ and swe_sample.jsonl")
    ap.add_argument(
        "--check", action="store_true", help="build into a temporary folder and compare with --out"
    )
    ap.add_argument("--repos-only", action="store_true", help="build only the repositories under --out/repos")
    args = ap.parse_args(argv)
    if args.repos_only:
        for repo in build_repos(args.out / "repos"):
            print(repo)
        return 0
    if not args.check:
        print(make_sample(args.out))
        return 0
    with tempfile.TemporaryDirectory() as d:
        fresh = make_sample(Path(d)).read_text()
    same = fresh == (args.out / RECORDS).read_text()
    print("the sample matches" if same else f"error: a fresh build differs from {args.out / RECORDS}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
