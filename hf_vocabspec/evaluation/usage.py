"""What the tools refuse in a user's arguments, before any work: ``UsageError`` (a bad argument or combination,
exit status 2 from the CLI) and the checks that a model or dataset name can exist. Both the CLI (``hf_vocabspec.cli``)
and the lm-eval backend (``lmeval.py``: its ``--model_args``) raise and run them, so they live here, below both.
Light on import: nothing heavy is imported at module level (``hf-vocabspec --help`` imports this module)."""

from __future__ import annotations

__all__ = ["UsageError", "check_dataset_name", "check_model_name"]


class UsageError(ValueError):
    """A bad argument or combination of arguments (a command line, lm-eval's ``--model_args``) found after parsing
    (exit status 2, like argparse's)."""


def check_dataset_name(name: str, option: str = "--dataset") -> None:
    """A dataset that cannot exist (a mistyped path, an unknown offline name) is refused before any work."""
    from .offline import _check_local, _DATASETS, _key, is_offline_name

    if is_offline_name(name):
        _key(name, _DATASETS, "dataset")
        return
    try:
        _check_local(name, "dataset")
    except FileNotFoundError as err:
        raise UsageError(f"{option}: {err}") from None


def check_model_name(name: str | None, option: str) -> None:
    """A model that cannot exist (a mistyped path, an unknown offline name, a counts file) is refused first."""
    from .offline import _MODELS, _check_local, _key, is_offline_name

    if name is None:
        return
    if is_offline_name(name):
        try:
            _key(name, _MODELS, "model")
        except ValueError as err:
            raise UsageError(f"{option}: {err}") from None
        return
    try:
        _check_local(name, "model")
    except (FileNotFoundError, ValueError) as err:
        raise UsageError(f"{option}: {err}") from None
