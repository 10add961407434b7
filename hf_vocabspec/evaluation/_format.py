"""Table cells shared by the evaluation reports and the scripts that render them."""

from __future__ import annotations


def cell(value, spec: str) -> str:
    """``value`` formatted with ``spec``, or "-" where it was not measured (None)."""
    return "-" if value is None else format(value, spec)


def plus_minus(standard_error: float | None) -> str:
    """" (+-0.12)" after a measured mean, or nothing where no standard error is known."""
    return "" if standard_error is None else f" (+-{standard_error:.2f})"
