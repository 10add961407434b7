"""What every CLI command shares: dtype names, logging to stderr, counting under accelerate, selection options."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def log(msg: str) -> None:
    print(f"[hf-vocabspec] {msg}", file=sys.stderr, flush=True)


def count_for_args(args):
    """Count on this process, or sharded over all processes under `accelerate launch` (identical result)."""
    from ..coverage import count_assistant_tokens_distributed
    from ..evaluation.offline import load_chat_dataset, load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    dataset = load_chat_dataset(args.dataset)
    return count_assistant_tokens_distributed(dataset, tokenizer, max_examples=args.max_examples, progress=True)


def is_main_process() -> bool:
    from accelerate import PartialState

    return PartialState(cpu=True).is_main_process


class UsageError(ValueError):
    """A bad combination of command-line arguments found after parsing (exit status 2, like argparse's)."""


def coverage_fraction(text: str) -> float:
    """argparse type: a coverage share in (0, 1] (checked on the command line, before any work)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], e.g. 0.95; got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1] (a share, e.g. 0.95 for 95%); got {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text}")
    return value


def check_output_parent(path: str, option: str = "--output") -> None:
    """Refuse an output whose parent directory does not exist before any expensive work (a typo, usually)."""
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise UsageError(f"{option} {path}: the directory {str(parent)!r} does not exist (create it first or fix "
                         f"the path).")


def selection_args(p) -> None:
    p.add_argument("--min-coverage", type=coverage_fraction, default=0.95,
                   help="smallest share of counted assistant tokens the kept vocabulary must cover, in (0, 1]")
    p.add_argument("--objective", choices=["throughput", "utility"], default="throughput",
                   help="what the search maximises: predicted speculative-decoding throughput, or a*C+(1-a)*R utility")
    p.add_argument("--cost", choices=["measured", "flops"], default="measured",
                   help="draft cost model: measured step latency on this device, or architecture-aware FLOPs")
    p.add_argument("--n-trials", type=positive_int, default=100, help="Optuna TPE trials")
    p.add_argument("--seed", type=int, default=42, help="Optuna sampler seed")
    p.add_argument("--max-k", type=positive_int, default=65536, help="largest kept vocabulary size searched")
    p.add_argument("--storage", default=None, help="journal file (or sqlite:///...) to resume/share the study")


