"""Dependencies whose internals the code uses stay inside the releases those internals were verified on.

``dressage/store/turn_io.py`` and ``pg_group_append.py`` drive libpq through ``psycopg.generators``
(psycopg's internal API), and ``dressage/proxy/keepalive.py`` subclasses uvicorn's HTTP protocol
classes and overrides their keep-alive timer. Neither is a public API, so pyproject.toml bounds both
to the releases checked here: an upgrade outside them fails at install, and an environment that
holds another release (or whose internals moved) fails this test instead of the proxy at runtime.
"""

from __future__ import annotations

import inspect
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
VERIFIED = {"psycopg": ("3.3", "3.4"), "uvicorn": ("0.54", "0.56")}
"""Per package: the releases its internals were verified on, ``[low, high)``."""


def _pin(name: str) -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    [req] = [Requirement(d) for d in deps if Requirement(d).name == name]
    return req


@pytest.mark.parametrize("name", sorted(VERIFIED))
def test_the_pin_is_the_verified_range_and_the_installed_release_is_inside(name: str) -> None:
    low, high = VERIFIED[name]
    req = _pin(name)
    assert {(s.operator, s.version) for s in req.specifier} == {(">=", low), ("<", high)}, str(req)
    installed = Version(version(name))
    assert installed in req.specifier, f"{name} {installed} is outside {req.specifier}: verify its internals"


@pytest.mark.parametrize("name", sorted(VERIFIED))
def test_the_harbor_constraints_stay_inside_the_pin(name: str) -> None:
    text = (ROOT / "scripts" / "harbor-constraints.txt").read_text(encoding="utf-8")
    m = re.search(rf"^{name}==(\S+)$", text, re.MULTILINE)
    assert m is not None and Version(m.group(1)) in _pin(name).specifier


def _params(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def test_the_psycopg_generators_used_have_the_verified_signatures() -> None:
    from psycopg import generators

    assert _params(generators.execute) == ["pgconn"]
    assert _params(generators.send) == ["pgconn"]
    assert _params(generators.fetch_many) == ["pgconn"]
    assert _params(generators.pipeline_communicate) == ["pgconn", "commands"]


def test_the_uvicorn_protocols_subclassed_have_the_verified_hooks() -> None:
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    for cls in (H11Protocol, HttpToolsProtocol):
        assert _params(cls.timeout_keep_alive_handler) == ["self"], cls
        assert _params(cls.connection_made) == ["self", "transport"], cls
        # keepalive.py clears the timer handle it is called from by this attribute's name
        assert "self.timeout_keep_alive_task" in inspect.getsource(cls), cls
