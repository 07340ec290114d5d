"""The viewer's Jinja2 environment: autoescaping on for every template, and a few number filters."""

from __future__ import annotations

import math
import time
from pathlib import Path

import orjson
from jinja2 import Environment, FileSystemLoader, StrictUndefined

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"


def _num(value: object, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if math.isfinite(value) else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ts(value: float | None) -> str:
    return "-" if value is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _orjson_dumps(value: object, **_: object) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def environment() -> Environment:
    """The template environment (autoescape on: every ``{{ }}`` of untrusted text is escaped)."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(num=_num, pct=_pct, ts=_ts, ms=_ms)
    # tojson through orjson (a 30k-token view is ~1 MB of JSON); Jinja still escapes < > & ' after it.
    env.policies["json.dumps_function"] = _orjson_dumps
    env.policies["json.dumps_kwargs"] = {}
    return env


def render(env: Environment, name: str, context: dict[str, object]) -> str:
    """Render template ``name`` with ``context``."""
    return env.get_template(name).render(**context)
