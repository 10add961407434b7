"""``python -m hf_vocabspec.lmeval <lm-eval arguments>``: the entry for ``accelerate launch -m hf_vocabspec.lmeval run
...`` (tooling, like ``hf_vocabspec.cli``): the same as ``hf-vocabspec lm-eval <arguments>``."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    return cli_main(["lm-eval", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
