"""The supported dependency ranges, read from the one place they are written: pyproject.toml.

pyproject's ``dependencies`` give every dependency we rely on closely a tested range (an upper bound, not
an open floor). An installed hf_vocabspec carries them in its metadata (``importlib.metadata.requires``),
so the runtime guard reads them there instead of keeping a second copy that drifts; a source tree that
is not installed (``PYTHONPATH=.``) falls back to its pyproject.toml.
"""

from __future__ import annotations

import importlib.metadata
from functools import cache
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

DISTRIBUTION = "hf_vocabspec"


def _requirements() -> list[str]:
    try:
        return list(importlib.metadata.requires(DISTRIBUTION) or [])
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if not pyproject.is_file():
        return []
    try:
        import tomllib
    except ImportError:  # Python 3.10 without an installed hf_vocabspec: no range to check against
        return []
    return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


@cache
def supported_range(dist: str) -> SpecifierSet:
    """The version range of ``dist`` that hf_vocabspec declares (and its CI tests), e.g. ``>=5.18,<5.25``."""
    name = canonicalize_name(dist)
    for line in _requirements():
        req = Requirement(line)
        if canonicalize_name(req.name) == name and (req.marker is None or req.marker.evaluate()):
            return req.specifier
    raise KeyError(f"{dist} is not a dependency of {DISTRIBUTION}.")


def _pretty(spec: SpecifierSet) -> str:
    """``>=5.18,<5.25`` (lower bound first), the way pyproject writes it."""
    return ",".join(sorted(map(str, spec), key=lambda s: (not s.startswith(">"), s)))


def check(dist: str, version: str | None = None) -> None:
    """Raise ImportError, in one line with the pip command, when the installed ``dist`` (or ``version``) is
    outside :func:`supported_range`. Pre-releases inside the range pass (5.24.0.dev0 for ``<5.25``)."""
    spec = supported_range(dist)
    if version is None:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = None
    if version is not None and spec.contains(version, prereleases=True):
        return
    wanted = _pretty(spec)
    found = "not installed" if version is None else f"found {version}"
    raise ImportError(f"hf_vocabspec supports {dist} {wanted} ({found}): pip install '{dist}{wanted}'")


def bounds(dist: str) -> tuple[str | None, str | None]:
    """(lower, upper) versions of the range, e.g. ("5.18", "5.25"), for messages and CI matrices."""
    lo = hi = None
    for s in supported_range(dist):
        if s.operator in (">=", ">"):
            lo = s.version
        elif s.operator in ("<", "<="):
            hi = s.version
    return lo, hi


__all__ = ["bounds", "check", "supported_range"]
