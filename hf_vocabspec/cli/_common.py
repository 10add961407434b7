"""What every CLI command shares: dtype names, logging to stderr, counting under accelerate, selection options."""

from __future__ import annotations

import sys

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


def selection_args(p) -> None:
    p.add_argument("--min-coverage", type=float, default=0.95)
    p.add_argument("--objective", choices=["throughput", "utility"], default="throughput")
    p.add_argument("--cost", choices=["measured", "flops"], default="measured",
                   help="draft cost model: measured step latency on this device, or architecture-aware FLOPs")
    p.add_argument("--n-trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-k", type=int, default=65536)
    p.add_argument("--storage", default=None, help="journal file (or sqlite:///...) to resume/share the study")


