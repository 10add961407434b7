"""Token coverage of ASSISTANT turns: which tokens a model is trained to emit / will generate.

The chat template is probed ONCE per tokenizer with a sentinel conversation to learn what it puts after
an assistant's content (the end-of-turn marker the model must emit) and whether it trims the content;
then every assistant turn is ``content + marker``, tokenized in batches with the fast tokenizer. Rendering
the template per message would be an order of magnitude slower.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from safetensors import safe_open
from safetensors.torch import save_file

_ASSISTANT_ROLES = {"assistant", "gpt", "chatgpt", "bing", "bard", "model"}
_SENTINEL = "XQZSENTINELQZX"
_FORMAT = "hf_vocabspec.TokenCounts/1"


@dataclass(frozen=True)
class AssistantTurnFormat:
    """How a chat template renders an assistant turn's trainable part."""

    suffix: str  # text after the content, up to and including the end-of-turn marker
    trims: bool  # whether the template strips surrounding whitespace of the content


def assistant_turn_format(tokenizer) -> AssistantTurnFormat:
    """Probe the chat template with a sentinel; fall back to ``content + eos`` without a template."""
    if not getattr(tokenizer, "chat_template", None):
        warnings.warn("Tokenizer has no chat template: counting assistant turns as content + eos_token.", stacklevel=2)
        return AssistantTurnFormat(suffix=tokenizer.eos_token or "", trims=False)
    convo = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": f"  {_SENTINEL}  "}]
    text = tokenizer.apply_chat_template(convo, tokenize=False)
    at = text.rindex(_SENTINEL)
    trims = text[at - 2 : at] != "  "
    after = text[at + len(_SENTINEL) :]
    if not trims:
        after = after[2:]
    # keep up to and including the end-of-turn marker; the newline after it is not generated
    markers = [m for m in (getattr(tokenizer, "eos_token", None), "<end_of_turn>", "<|im_end|>", "<|eot_id|>") if m]
    ends = [after.index(m) + len(m) for m in markers if m in after]
    suffix = after[: min(ends)] if ends else after.rstrip()
    return AssistantTurnFormat(suffix=suffix, trims=trims)


def _turns(example: dict) -> tuple[list[str], int]:
    """Assistant contents of one example (messages or ShareGPT conversations) and its turn count."""
    if "messages" in example and example["messages"] is not None:
        turns = example["messages"]
        role_key, content_key = "role", "content"
    elif "conversations" in example and example["conversations"] is not None:
        turns = example["conversations"]
        role_key, content_key = "from", "value"
    else:
        raise ValueError(
            "Unknown dataset format: expected a 'messages' column (list of {'role', 'content'}) or a ShareGPT "
            f"'conversations' column (list of {{'from', 'value'}}); found columns {sorted(example)}."
        )
    return [t.get(content_key) or "" for t in turns if t.get(role_key) in _ASSISTANT_ROLES], len(turns)


def assistant_texts(dataset: Iterable[dict], tokenizer, *, max_examples: int | None = None) -> Iterator[str]:
    """Each assistant turn's trainable text as the chat template renders it (content + end marker)."""
    fmt = assistant_turn_format(tokenizer)
    for i, example in enumerate(dataset):
        if max_examples is not None and i >= max_examples:
            return
        contents, _ = _turns(example)
        for c in contents:
            yield (c.strip() if fmt.trims else c) + fmt.suffix


@dataclass
class TokenCounts:
    """Token frequencies over assistant turns, plus the coverage math selection needs."""

    counts: torch.Tensor
    num_examples: int = 0
    num_assistant_turns: int = 0
    tokenizer_name: str = ""
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        return int(self.counts.sum())

    @property
    def vocab_size(self) -> int:
        return int(self.counts.numel())

    def ranked_token_ids(self) -> torch.Tensor:
        """Ids by descending count; ties broken by ascending id (stable)."""
        if "ranked" not in self._cache:
            self._cache["ranked"] = torch.sort(self.counts, descending=True, stable=True).indices
        return self._cache["ranked"]

    def coverage_curve(self) -> torch.Tensor:
        """curve[k-1] = share of assistant-token occurrences covered by the top-k tokens."""
        if "curve" not in self._cache:
            total = max(self.num_tokens, 1)
            self._cache["curve"] = torch.cumsum(self.counts[self.ranked_token_ids()].double(), 0) / total
        return self._cache["curve"]

    def coverage(self, k: int) -> float:
        if k <= 0:
            return 0.0
        return float(self.coverage_curve()[min(k, self.vocab_size) - 1])

    def coverage_of(self, token_ids) -> float:
        ids = torch.as_tensor(token_ids, dtype=torch.long).unique()
        ids = ids[(ids >= 0) & (ids < self.vocab_size)]
        return float(self.counts[ids].sum()) / max(self.num_tokens, 1)

    def top_k(self, k: int) -> torch.Tensor:
        return self.ranked_token_ids()[:k].clone()

    def smallest_k_for_coverage(self, c: float) -> int:
        if not 0 < c <= 1:
            raise ValueError(f"coverage must be in (0, 1]; got {c}.")
        if self.num_tokens == 0:
            raise ValueError("No tokens were counted: count a dataset with assistant turns first.")
        curve = self.coverage_curve()
        k = int(torch.searchsorted(curve, torch.tensor(c - 1e-12, dtype=torch.float64))) + 1
        return min(k, self.vocab_size)

    def save(self, path) -> None:
        """Safetensors (never pickle); scalar fields in the metadata; atomic write."""
        path = os.fspath(path)
        tmp = f"{path}.tmp-{os.getpid()}"
        save_file({"counts": self.counts.to(torch.int64).contiguous()}, tmp, metadata={
            "format": _FORMAT, "num_examples": str(self.num_examples),
            "num_assistant_turns": str(self.num_assistant_turns), "tokenizer_name": self.tokenizer_name,
        })
        os.replace(tmp, path)

    @classmethod
    def load(cls, path) -> TokenCounts:
        with safe_open(os.fspath(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != _FORMAT or "counts" not in f.keys():
                raise ValueError(
                    f"{path} is not an hf_vocabspec counts file (made by `hf-vocabspec count` / TokenCounts.save)."
                )
            counts = f.get_tensor("counts")
        return cls(counts, int(meta["num_examples"]), int(meta["num_assistant_turns"]), meta["tokenizer_name"])

    def __add__(self, other: TokenCounts) -> TokenCounts:
        if self.tokenizer_name != other.tokenizer_name or self.vocab_size != other.vocab_size:
            raise ValueError(
                f"Cannot merge counts of different tokenizers ({self.tokenizer_name!r}, {self.vocab_size}) and "
                f"({other.tokenizer_name!r}, {other.vocab_size}): count both with the target's tokenizer."
            )
        return TokenCounts(self.counts + other.counts, self.num_examples + other.num_examples,
                           self.num_assistant_turns + other.num_assistant_turns, self.tokenizer_name)


def count_assistant_tokens(
    dataset: Iterable[dict],
    tokenizer,
    *,
    max_examples: int | None = None,
    batch_size: int = 512,
    progress: bool = True,
    vocab_size: int | None = None,
) -> TokenCounts:
    """Count target-tokenizer token frequencies over assistant turns of a chat dataset."""
    from tqdm.auto import tqdm

    fmt = assistant_turn_format(tokenizer)
    size = max(vocab_size or 0, len(tokenizer))
    counts = torch.zeros(size, dtype=torch.int64)
    n_examples = n_turns = 0
    seen_columns: set[str] = set()
    batch: list[str] = []

    def flush():
        if batch:
            ids = tokenizer(batch, add_special_tokens=False)["input_ids"]
            flat = torch.tensor([t for seq in ids for t in seq], dtype=torch.int64)
            counts.add_(torch.bincount(flat, minlength=size)[:size])
            batch.clear()

    total = None
    try:
        total = len(dataset) if max_examples is None else min(len(dataset), max_examples)
    except TypeError:
        total = max_examples
    bar = tqdm(total=total, desc="counting assistant tokens", unit="conv", disable=not progress)
    for i, example in enumerate(dataset):
        if max_examples is not None and i >= max_examples:
            break
        seen_columns.update(example)
        contents, _ = _turns(example)
        n_examples += 1
        n_turns += len(contents)
        batch.extend((c.strip() if fmt.trims else c) + fmt.suffix for c in contents)
        if len(batch) >= batch_size:
            flush()
        bar.update(1)
    flush()
    bar.close()
    if n_turns == 0:
        raise ValueError(
            f"No assistant turns found in {n_examples} example(s) (columns: {sorted(seen_columns)}). Expected "
            "'messages' with role 'assistant' or ShareGPT 'conversations' with from 'gpt'."
        )
    return TokenCounts(counts, n_examples, n_turns, str(getattr(tokenizer, "name_or_path", "")))


def count_assistant_tokens_distributed(
    dataset, tokenizer, *, max_examples: int | None = None, progress: bool = True, **kwargs
) -> TokenCounts:
    """Like :func:`count_assistant_tokens`, sharded over the processes of ``accelerate launch``/torchrun.

    Every process counts its shard and the counts are summed, so the result is IDENTICAL to a single
    process (counting is additive). ``PartialState(cpu=True)`` makes CPU-only launches form a real gloo
    group (a plain PartialState() there thinks it is alone and silently duplicates work). Run alone, it is
    the single-process function.
    """
    from accelerate import PartialState
    from accelerate.utils import reduce

    state = PartialState(cpu=True)
    if max_examples is not None:
        dataset = _take(dataset, max_examples)
    if state.num_processes == 1:
        return count_assistant_tokens(dataset, tokenizer, progress=progress, **kwargs)
    shard = _shard(dataset, state.process_index, state.num_processes)
    local = _count_or_empty(shard, tokenizer, progress=progress and state.is_main_process, **kwargs)
    packed = torch.cat([local.counts, torch.tensor([local.num_examples, local.num_assistant_turns])])
    total = reduce(packed, "sum")
    counts, n_examples, n_turns = total[:-2], int(total[-2]), int(total[-1])
    if n_turns == 0:
        raise ValueError("No assistant turns found in any shard: expected 'messages' with role 'assistant' or "
                         "ShareGPT 'conversations' with from 'gpt'.")
    return TokenCounts(counts, n_examples, n_turns, local.tokenizer_name)


def _take(dataset, n: int):
    if hasattr(dataset, "select") and hasattr(dataset, "__len__"):
        return dataset.select(range(min(n, len(dataset))))
    if hasattr(dataset, "take"):
        return dataset.take(n)
    import itertools

    return list(itertools.islice(dataset, n))


def _shard(dataset, rank: int, world: int):
    import datasets

    if isinstance(dataset, (datasets.Dataset, datasets.IterableDataset)):
        from datasets.distributed import split_dataset_by_node

        return split_dataset_by_node(dataset, rank=rank, world_size=world)
    return list(dataset)[rank::world]


def _count_or_empty(shard, tokenizer, **kwargs) -> TokenCounts:
    """A shard may legitimately hold no assistant turns; only the global total must have some."""
    try:
        return count_assistant_tokens(shard, tokenizer, **kwargs)
    except ValueError as err:
        if "No assistant turns" not in str(err):
            raise
        size = max(kwargs.get("vocab_size") or 0, len(tokenizer))
        return TokenCounts(torch.zeros(size, dtype=torch.int64), 0, 0, str(getattr(tokenizer, "name_or_path", "")))
