"""_versions: every close dependency has a tested range in pyproject, and the guard reads it from there."""

from __future__ import annotations

import importlib.metadata
import json
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from hf_vocabspec import _versions

ROOT = Path(__file__).resolve().parent.parent
CLOSE = ("transformers", "optuna", "datasets", "accelerate", "huggingface-hub", "safetensors")


def _pyproject_requirements() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {Requirement(d).name: Requirement(d) for d in deps}


def test_every_close_dependency_has_a_tested_range():
    reqs = _pyproject_requirements()
    for dist in CLOSE:
        ops = {s.operator for s in reqs[dist].specifier}
        assert ">=" in ops and "<" in ops, f"{dist} needs a tested range (floor and upper bound) in pyproject"
    assert reqs["transformers"].specifier.contains("5.24.0") and reqs["transformers"].specifier.contains("5.23.0")


@pytest.fixture
def fake_metadata(monkeypatch):
    def use(lines):
        monkeypatch.setattr(importlib.metadata, "requires", lambda dist: lines)
        _versions.supported_range.cache_clear()
    yield use
    _versions.supported_range.cache_clear()


def test_guard_reads_the_installed_metadata_and_names_the_pip_command(fake_metadata):
    fake_metadata(["torch<2.15,>=2.6", "transformers<5.25,>=5.18", 'pytest>=8; extra == "test"'])
    assert str(_versions.supported_range("transformers")) in ("<5.25,>=5.18", ">=5.18,<5.25")
    assert _versions.bounds("transformers") == ("5.18", "5.25")
    _versions.check("transformers", "5.24.0")
    _versions.check("transformers", "5.24.1.dev0")  # a dev build inside the range passes
    for bad in ("5.17.3", "5.25.0", "5.25.0.dev0", "6.0.0"):
        with pytest.raises(ImportError) as err:
            _versions.check("transformers", bad)
        line = str(err.value)
        assert "\n" not in line and f"found {bad}" in line and "pip install 'transformers>=5.18,<5.25'" in line
    fake_metadata(["transformers<5.30,>=5.20"])  # another installed range: the guard follows it, no copy of its own
    with pytest.raises(ImportError, match="transformers>=5.20,<5.30"):
        _versions.check("transformers", "5.19.0")
    with pytest.raises(KeyError, match="not a dependency"):
        _versions.supported_range("numpy")


def test_installed_versions_are_inside_the_declared_ranges():
    for dist in CLOSE:
        _versions.check(dist)


def test_installed_metadata_matches_this_checkout():
    """Holds after `make setup` (editable install of this tree); skipped where the metadata belongs to another
    checkout (a worktree sharing a virtualenv)."""
    try:
        url = json.loads(importlib.metadata.distribution("hf_vocabspec").read_text("direct_url.json") or "{}").get("url", "")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("hf_vocabspec is not installed")
    if url.removeprefix("file://").rstrip("/") != str(ROOT):
        pytest.skip(f"installed from {url}, not this checkout")
    installed = {Requirement(r).name: Requirement(r) for r in importlib.metadata.requires("hf_vocabspec") or []}
    for name, req in _pyproject_requirements().items():
        assert installed[name].specifier == req.specifier, f"{name}: reinstall (make setup) after editing pyproject"
