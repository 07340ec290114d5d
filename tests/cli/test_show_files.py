"""``dressage-worker show SESSION --files [--turn K]`` on both backends: every checkpoint's changed
paths, and one turn's unified diffs (file names and contents are the agent's: printed as text, no
rich markup read from them)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dressage.store import EventStore
from tests.cli.helpers import invoke
from tests.workspace_sessions import BIG_BYTES, HOSTILE_NAME, SECRET, build_checkpointed_session


def _runner(home: Path) -> CliRunner:
    return CliRunner(env={"COLUMNS": "250", "NO_COLOR": "1", "DRESSAGE_HOME": str(home)})


def test_show_files_lists_every_turn_and_diffs_one(
    db_url: str, store: EventStore, run_name: str, tmp_path: Path
) -> None:
    built = build_checkpointed_session(store, run_name, tmp_path / "trees")
    cli = _runner(tmp_path / "home")  # the store fixture's artifact directory

    listing = invoke(cli, db_url, "show", built.session_id, "--files")
    assert listing.exit_code == 0, listing.output + listing.stderr
    rows = [[c.strip() for c in x.split("│")[1:-1]] for x in listing.stdout.splitlines() if x.count("│") == 6]
    changed = {(r[0], r[1], r[2]) for r in rows if r[0].isdigit()}
    assert ("0", "added", "workspace/notes.md") in changed
    assert ("1", "modified", "workspace/src/app.py") in changed
    assert ("1", "removed", "workspace/notes.md") in changed
    assert ("1", "added", f"workspace/{HOSTILE_NAME}") in changed  # the markup-like name, verbatim
    assert ("2", "(no file changed)", "") in changed
    assert ("3", "modified", "workspace/data.bin") in changed

    one = invoke(cli, db_url, "show", built.session_id, "--files", "--turn", "1")
    assert one.exit_code == 0, one.output + one.stderr
    lines = one.stdout.splitlines()
    assert any(x.startswith("turn 1: 2 added, 1 modified, 1 removed") for x in lines)
    assert "--- a/workspace/src/app.py" in lines
    assert "-    print('version one')" in lines and "+    print('version two')" in lines
    assert "+<script>window.pwned = 1</script>" in lines
    assert "+api_key=[REDACTED]" in lines and SECRET not in one.stdout
    assert any(
        x.endswith(f"workspace/big.txt  ({BIG_BYTES} bytes, over the 64 KiB a diff shows)") for x in lines
    )
    binary = invoke(cli, db_url, "show", built.session_id, "--files", "--turn", "3")
    assert binary.exit_code == 0 and "(binary, 88 bytes)" in binary.stdout

    missing = invoke(cli, db_url, "show", built.session_id, "--files", "--turn", "9")
    assert missing.exit_code == 2
    assert "no checkpoint at turn 9 (turns with one: [0, 1, 2, 3])" in " ".join(missing.stderr.split())
    alone = invoke(cli, db_url, "show", built.session_id, "--turn", "1")
    assert alone.exit_code == 2 and "--turn needs --files" in " ".join(alone.stderr.split())
