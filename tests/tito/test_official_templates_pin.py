"""The official templates come from one pinned trl wheel (version + sha256), and nothing else is
used silently: a stale cache, a tampered folder, a failed or tampered download are clear errors."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from dressage.errors import TemplateError
from dressage.tito.official_templates import (
    QWEN35_TEMPLATE_FILES,
    TRL_VERSION,
    VERSION_MARKER,
    official_qwen35_template,
    official_template_dir,
)


@pytest.fixture
def offline_pip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip sees no index, only an empty local wheel folder (returned): a download fails fast."""
    links = tmp_path / "wheels"
    links.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("DRESSAGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DRESSAGE_QWEN_TEMPLATES_DIR", raising=False)
    return links


def test_a_stale_cache_is_not_used(offline_pip: Path, tmp_path: Path) -> None:
    stale = tmp_path / "cache" / "templates"
    stale.mkdir(parents=True)
    for name in QWEN35_TEMPLATE_FILES.values():
        (stale / name).write_text("{{ 'a template from another trl release' }}")
    with pytest.raises(TemplateError, match="not cached"):
        official_template_dir(download=False)
    (stale / VERSION_MARKER).write_text(TRL_VERSION)  # right marker, wrong files: still refused
    with pytest.raises(TemplateError, match="not cached"):
        official_template_dir(download=False)


def test_a_failed_download_is_an_error_not_a_fallback(offline_pip: Path, tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match=f"could not download trl {TRL_VERSION}"):
        official_qwen35_template("think")
    assert not (tmp_path / "cache" / "templates" / VERSION_MARKER).exists()


def test_a_wheel_without_the_pinned_hash_is_refused(offline_pip: Path, tmp_path: Path) -> None:
    fake = offline_pip / f"trl-{TRL_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(fake, "w") as zf:
        for name in QWEN35_TEMPLATE_FILES.values():
            zf.writestr(f"trl/chat_templates/{name}", "{{ 'tampered' }}")
    with pytest.raises(TemplateError, match="could not download trl") as e:
        official_qwen35_template("think")
    assert "does not have the pinned sha256" in str(e.value)
    assert not any((tmp_path / "cache" / "templates").glob("*.jinja"))


def test_a_configured_folder_with_other_files_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in QWEN35_TEMPLATE_FILES.values():
        (tmp_path / name).write_text("{{ 'not the official one' }}")
    monkeypatch.setenv("DRESSAGE_QWEN_TEMPLATES_DIR", str(tmp_path))
    with pytest.raises(TemplateError, match="is not the pinned official template"):
        official_qwen35_template("nothink")
