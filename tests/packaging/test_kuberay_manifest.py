"""examples/kuberay/rayjob.yaml validates against KubeRay's RayJob CRD schema (vendored, pinned)."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "tests" / "packaging" / "kuberay" / "rayjob-v1.schema.json"
MANIFEST = REPO / "examples" / "kuberay" / "rayjob.yaml"


def check(manifest: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "check_jsonschema", "--schemafile", str(SCHEMA), str(manifest)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_the_vendored_schema_is_the_one_the_readme_pins() -> None:
    readme = (SCHEMA.parent / "README.md").read_text()
    pinned = re.search(r"sha256 of `rayjob-v1.schema.json` \| `([0-9a-f]{64})`", readme)
    assert pinned is not None
    assert hashlib.sha256(SCHEMA.read_bytes()).hexdigest() == pinned.group(1)


def test_the_rayjob_manifest_validates_against_kuberays_crd_schema() -> None:
    done = check(MANIFEST)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_misspelt_field_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "rayjob.yaml"
    bad.write_text(MANIFEST.read_text().replace("shutdownAfterJobFinishes", "shutdownAfterJobFinish"))
    done = check(bad)
    assert done.returncode != 0
    assert "shutdownAfterJobFinish" in done.stdout
