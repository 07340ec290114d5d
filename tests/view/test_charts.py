"""The viewer's charts read right (issue 34, point 6), live and in a static bundle: a near-constant
series (``is_ratio_mean`` within 1e-7 of 1 on an on-policy run, a constant count) draws without a
script error; tiny values (a loss of 1e-9, a KL of 1e-13) get tick labels that tell the ticks apart
and read as the numbers they mark; the reward-by-version axis starts at version 0, not -1."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dressage.cli import app
from dressage.config import Settings
from dressage.store import EventStore
from dressage.view.app import create_app
from dressage.view.readonly import open_readonly_store
from tests.view.browser import css, one, severe_console_errors, url, wait
from tests.view.builders import METRIC_VALUES, build_metric_run
from tests.view.conftest import serve

RUN = "charts"


@dataclass
class ChartLog:
    url: str
    home: Path
    base: str


@pytest.fixture(scope="module")
def charted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartLog]:
    home = tmp_path_factory.mktemp("charts")
    settings = Settings(database_url=f"sqlite:///{home / 'log.db'}", home=home)
    store = EventStore.open(settings=settings)
    build_metric_run(store, RUN)
    store.close()
    reader = open_readonly_store(settings)
    server = serve(create_app(reader))
    server.start()
    yield ChartLog(settings.resolved_database_url(), home, server.base)
    server.stop()
    reader.close()


def _ticks(chart, axis: str) -> list[str]:
    return json.loads(chart.get_attribute(f"data-{axis}-ticks") or "[]")


def assert_readable(labels: list[str], values: list[float] | None = None) -> None:
    """At least two ticks, all different, short, each a number, increasing; with ``values``, the
    ticks span the data's neighbourhood (a tick within the data's range or one step of it)."""
    assert len(labels) >= 2, labels
    assert len(set(labels)) == len(labels), labels
    assert all(len(x) <= 10 for x in labels), labels
    numbers = [float(x) for x in labels]
    assert numbers == sorted(numbers), labels
    if values is not None:
        lo, hi, step = min(values), max(values), numbers[1] - numbers[0]
        assert numbers[0] <= lo + step and numbers[-1] >= hi - step, (labels, values)
        assert any(not math.isclose(n, 0.0, abs_tol=0.0) for n in numbers), labels


def check_charts(browser, training_page: str, run_page: str) -> None:
    browser.get(training_page)
    names = wait(browser, lambda d: [x.get_attribute("data-metric") for x in css(d, "[data-metric]")])
    assert set(METRIC_VALUES) <= set(names)
    wait(browser, lambda d: all(css(x, "canvas") for x in css(d, "[data-metric]")))
    for name, values in METRIC_VALUES.items():
        chart = one(browser, f"[data-metric={name}] .chart")
        assert_readable(_ticks(chart, "y"), values)
        assert _ticks(chart, "x")[0] == "1"  # training steps start at 1
    assert "e-9" in "".join(_ticks(one(browser, "[data-metric=loss] .chart"), "y"))
    assert "e-13" in "".join(_ticks(one(browser, "[data-metric=kl_behaviour] .chart"), "y"))
    ratio = [float(x) for x in _ticks(one(browser, "[data-metric=is_ratio_mean] .chart"), "y")]
    assert min(ratio) < 1 < max(ratio) and max(ratio) - min(ratio) < 0.01  # a band around 1
    rewards = wait(browser, lambda d: _ticks(one(d, "#chart-rewards"), "x"))
    assert rewards[0] == "0" and [float(x) for x in rewards] == [0, 1, 2], rewards
    assert_readable(_ticks(one(browser, "#chart-rewards"), "y"), [0.0, 0.25, 0.5])
    assert not severe_console_errors(browser)
    browser.get(run_page)
    versions = wait(browser, lambda d: _ticks(one(d, "#chart-version"), "x"))
    assert versions[0] == "0" and all(float(x) >= 0 for x in versions), versions
    assert not severe_console_errors(browser)


def test_live_charts_draw_and_read_right(charted: ChartLog, browser) -> None:
    check_charts(browser, url(charted.base, "/training", run=RUN), url(charted.base, "/run", name=RUN))


def test_bundle_charts_draw_and_read_right(charted: ChartLog, browser, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    result = CliRunner().invoke(
        app,
        ["view", "bundle", RUN, "--out", str(out), "--database-url", charted.url],
        env={"DRESSAGE_HOME": str(charted.home), "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    check_charts(browser, (out / "training.html").as_uri(), (out / "index.html").as_uri())
