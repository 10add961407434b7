"""``hf-vocabspec``: count assistant-token coverage, choose and trim a drafter's vocabulary, evaluate it."""

from __future__ import annotations

import argparse

from . import evaluation, pipeline, tune


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hf-vocabspec", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    pipeline.register(sub)
    evaluation.register(sub)
    tune.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
