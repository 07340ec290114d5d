"""Each recipe's libraries are a pyproject extra that `all` (what scripts/setup.sh installs) includes,
installed here at the pinned versions; without one, the run stops at config load with one line that
names the extra to install."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

from dressage.errors import ConfigError
from recipes.extras import require

REPO = Path(__file__).resolve().parents[2]
EXTRAS = {
    "hotpotqa": ("bm25s", "bm25s"),
    "textworld": ("textworld", "textworld"),
    "swe": ("swebench", "swebench"),
}
"""extra -> (distribution, module)."""


def test_each_recipe_has_its_extra_and_setup_installs_them_all() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    for extra, (dist, _) in EXTRAS.items():
        [pin] = extras[extra]
        assert pin.startswith(f"{dist}==") and version(dist) == pin.split("==")[1], (extra, pin)
    assert extras["recipes"] == [f"dressage[{','.join(EXTRAS)}]"]
    assert "recipes" in extras["all"][0]
    assert "-e '.[all]'" in (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_a_missing_extra_names_itself(extra: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = EXTRAS[extra][1]
    monkeypatch.setitem(sys.modules, module, None)  # what import sees when the package is absent
    with pytest.raises(ConfigError) as e:
        require(module, extra)
    assert (
        str(e.value) == f"this recipe needs {module!r}, from the '{extra}' extra: pip install -e '.[{extra}]'"
    )


def test_a_broken_dependency_inside_the_library_is_not_reported_as_a_missing_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "recipe_lib_broken_dep.py").write_text(
        "import recipe_lib_absent_dependency\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="recipe_lib_absent_dependency"):
        require("recipe_lib_broken_dep", "hotpotqa")


@pytest.mark.slow  # a CLI process per recipe (seconds each)
@pytest.mark.parametrize(
    ("recipe", "extra"), [("hotpotqa", "hotpotqa"), ("textworld", "textworld"), ("swe", "swe")]
)
def test_the_rollout_command_stops_at_config_load_naming_the_extra(
    recipe: str, extra: str, tmp_path: Path
) -> None:
    module = EXTRAS[extra][1]
    code = (
        f"import sys; sys.modules[{module!r}] = None; sys.argv = ['dressage-worker', 'rollout', '--config', "
        f"{str(REPO / 'recipes' / recipe / 'config.yaml')!r}]; from dressage.cli import main; main()"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRESSAGE_")}
    env |= {"DRESSAGE_HOME": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: this recipe needs {module!r}, from the '{extra}' extra: pip install -e '.[{extra}]'"
    )
    assert not (tmp_path / "dressage.db").exists()
