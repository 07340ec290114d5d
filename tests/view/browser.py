"""Small Selenium helpers for the viewer tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait


def url(base: str, path: str, **params: Any) -> str:
    """``base + path`` with a query string."""
    return f"{base}{path}" + (f"?{urlencode(params)}" if params else "")


def wait(driver: WebDriver, condition: Callable[[WebDriver], Any], timeout: float = 30) -> Any:
    """Wait until ``condition(driver)`` is truthy and return it (elements replaced meanwhile: retry)."""
    ignored = (StaleElementReferenceException, NoSuchElementException)
    return WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=ignored).until(condition)


def css(driver: WebDriver | WebElement, selector: str) -> list[WebElement]:
    """Elements matching ``selector``."""
    return driver.find_elements(By.CSS_SELECTOR, selector)


def one(driver: WebDriver | WebElement, selector: str) -> WebElement:
    """The element matching ``selector``."""
    return driver.find_element(By.CSS_SELECTOR, selector)


def text(el: WebElement) -> str:
    """The element's textContent (exact, not layout-normalised like ``.text``)."""
    return str(el.get_attribute("textContent"))


def severe_console_errors(driver: WebDriver) -> list[str]:
    """Browser console errors of the open page (script errors, CSP violations, failed requests,
    an event stream that broke: htmx logs its error event), favicon misses aside."""
    return [
        e["message"]
        for e in driver.get_log("browser")  # type: ignore[attr-defined]
        if e["level"] == "SEVERE" and "favicon" not in e["message"]
    ]


def draw_tokens(driver: WebDriver) -> list[WebElement]:
    """Draw the whole token view now (the page draws a turn's tokens as it is scrolled near) with
    its "draw all" button; the token spans."""
    driver.execute_script("document.getElementById('tokens-all').click()")
    wait(driver, lambda d: not css(d, "#tokens .turn-tokens.pending"))
    return css(driver, "#tokens .tok")
