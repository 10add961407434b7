"""``hf-vocabspec``: count assistant-token coverage, choose and trim a drafter's vocabulary, evaluate it.

A user error prints ONE line (what is wrong and how to fix it) and exits non-zero: 2 for a bad command line (models
named on it that do not fit together included: hf_vocabspec.compatibility's DrafterMismatchError), 1 for anything
found later (a missing file, counts of another tokenizer, ...). ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys

from .._io import first_line
from . import evaluation, lmeval, pipeline, tune
from ._common import UsageError, explicit_options, resolve_auto_dtypes


class _Parser(argparse.ArgumentParser):
    """Every (sub)command shows defaults in --help and reports a bad command line in one line (exit 2)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _fill_help(parser: argparse.ArgumentParser) -> None:
    """An option registered without help still shows its default (ArgumentDefaultsHelpFormatter skips empty help)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _fill_help(sub)
        elif action.help is None and action.option_strings:
            action.help = "default: %(default)s" if action.default not in (None, False) else "optional"


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="hf-vocabspec", description=__doc__)
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    pipeline.register(sub)
    evaluation.register(sub)
    tune.register(sub)
    lmeval.register(sub)
    _fill_help(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv  # global: accepted before or after the subcommand
    argv = [a for a in argv if a != "--debug"]
    args = build_parser().parse_args(argv)
    args.explicit = explicit_options(build_parser(), argv)  # typed options: contradictions are checked on these
    try:
        # Started as the command, the package deferred torch, transformers and its hooks past argparse (--help and a
        # bad command line stay fast); a command runs with them, as after `import hf_vocabspec`.
        from .. import generation  # noqa: F401  (routes assistant_model=<TrimmedDrafter> to our generator)

        resolve_auto_dtypes(args)
        return args.func(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print("hf-vocabspec: interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except Exception as err:  # user-facing: one line; the traceback only on request
        if debug:
            raise
        text = ("missing key " if isinstance(err, KeyError) else "") + first_line(err, 400)
        print(f"hf-vocabspec {args.command}: error: {text} (--debug for the traceback)", file=sys.stderr)
        # a bad command line, or models that do not fit together (named on it): 2; anything found later: 1
        from ..compatibility import DrafterMismatchError

        return 2 if isinstance(err, (UsageError, DrafterMismatchError)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
