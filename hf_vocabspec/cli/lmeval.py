"""``hf-vocabspec lm-eval <lm-eval arguments>``: lm-eval's own CLI with the ``hf-vocabspec`` backend registered."""

from __future__ import annotations

import argparse


def cmd_lmeval(args) -> int:
    try:
        from ..evaluation.lmeval import run_cli
    except ImportError as err:
        if "lm_eval" not in str(err):
            raise
        raise ImportError("lm-eval is not installed: pip install 'hf_vocabspec[lmeval]' (pins lm-eval 0.4.13).") \
            from err
    return run_cli(args.lmeval_args)


def register(sub) -> None:
    p = sub.add_parser(
        "lm-eval", help="run lm-evaluation-harness with the hf-vocabspec backend (arguments go to lm-eval unchanged)",
        description="Every argument after `lm-eval` goes unchanged to lm-eval's CLI, with the backend `hf-vocabspec` "
                    "registered: hf-vocabspec lm-eval run --model hf-vocabspec --model_args pretrained=<target>,"
                    "drafter=<trimmed drafter> --tasks ... . `hf-vocabspec lm-eval tasks-dir` prints the folder of "
                    "the offline tasks (vocabspec_humaneval, vocabspec_sharegpt, ...) to pass as --include_path. "
                    "Under accelerate: accelerate launch -m hf_vocabspec.lmeval run ...")
    p.add_argument("lmeval_args", nargs=argparse.REMAINDER,
                   help="lm-eval's arguments, e.g. run --model hf-vocabspec ...")
    p.set_defaults(func=cmd_lmeval)
