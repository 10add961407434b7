"""Token coverage of ASSISTANT turns: which tokens a model is trained to emit / will generate.

The chat template is probed ONCE per tokenizer with a sentinel conversation to learn what it puts around
an assistant's content (the end-of-turn marker the model must emit, any text it adds after the generation
prompt) and whether it trims the content; then every assistant turn is ``head + content + marker``,
tokenized in batches with the fast tokenizer. Rendering the template per message would be an order of
magnitude slower, and on real ShareGPT the result equals the template's in-context assistant tokens.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from jinja2 import TemplateError
from safetensors.torch import save_file

from ._io import atomic_write, read_safetensors, tensors_checksum

__all__ = ["CHAT_ROLES", "AssistantTurnFormat", "TokenCounts", "assistant_texts", "assistant_turn_format",
           "count_assistant_tokens", "count_assistant_tokens_distributed", "normalized_messages"]

# Speaker names of chat formats -> the role they play (messages' "role", ShareGPT's "from"): the one table.
CHAT_ROLES = {"user": "user", "human": "user", "system": "system", "assistant": "assistant", "gpt": "assistant",
              "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "model": "assistant"}
_ASSISTANT_ROLES = frozenset(name for name, role in CHAT_ROLES.items() if role == "assistant")
_SENTINEL = "XQZSENTINELQZX"
_PAD = " \n"  # whitespace around the probe's content: survives only in templates that do not trim
_KNOWN_END_MARKERS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "</s>")
_FORMAT = "hf_vocabspec.TokenCounts/1"
_FORMATS_HELP = ("a 'messages' column (list of {'role', 'content'}, role 'assistant' for responses) or a ShareGPT "
                 "'conversations' column (list of {'from', 'value'}, from 'gpt' for responses)")
_warned: set[str] = set()


@dataclass(frozen=True)
class AssistantTurnFormat:
    """How a chat template renders an assistant turn's trainable part: ``head + content + suffix``."""

    suffix: str  # text after the content, up to and including the end-of-turn marker
    trims: bool  # the template strips the content's surrounding whitespace (both sides)
    lstrip: bool = False  # one-sided stripping (rare templates); ``trims`` implies both
    rstrip: bool = False
    head: str = ""  # text between the generation prompt and the content (the model generates it too)

    def render(self, content: str) -> str:
        if self.trims or (self.lstrip and self.rstrip):
            content = content.strip()
        elif self.lstrip:
            content = content.lstrip()
        elif self.rstrip:
            content = content.rstrip()
        return self.head + content + self.suffix


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def _fallback(tokenizer, why: str) -> AssistantTurnFormat:
    eos = getattr(tokenizer, "eos_token", None) or ""
    _warn_once(f"{getattr(tokenizer, 'name_or_path', '')}:{why}",
               f"Tokenizer {why}: counting assistant turns as content + eos_token ({eos!r}).")
    return AssistantTurnFormat(suffix=eos, trims=False)


def _special_token_strings(tokenizer) -> set[str]:
    names = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(tok, "special", False):
            names.add(str(tok))
    names.update(_KNOWN_END_MARKERS)
    if getattr(tokenizer, "eos_token", None):
        names.add(tokenizer.eos_token)
    return {n for n in names if n}


def assistant_turn_format(tokenizer) -> AssistantTurnFormat:
    """Probe the chat template with a sentinel; fall back to ``content + eos`` without a usable template."""
    if not getattr(tokenizer, "chat_template", None):
        return _fallback(tokenizer, "has no chat template")
    user = [{"role": "user", "content": "Hi"}]
    try:
        prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        text = tokenizer.apply_chat_template(
            user + [{"role": "assistant", "content": _PAD + _SENTINEL + _PAD}], tokenize=False)
    except (TemplateError, ValueError, TypeError, KeyError, IndexError) as err:  # e.g. requires a system turn
        return _fallback(tokenizer, f"chat template failed on a user/assistant probe ({err})")
    if not isinstance(text, str) or _SENTINEL not in text:
        return _fallback(tokenizer, "chat template does not render assistant content")
    at = text.rindex(_SENTINEL)
    before, after = text[:at], text[at + len(_SENTINEL):]
    lstrip, rstrip = not before.endswith(_PAD), not after.startswith(_PAD)
    if not lstrip:
        before = before[: -len(_PAD)]
    if not rstrip:
        after = after[len(_PAD):]
    head = before[len(prompt):] if isinstance(prompt, str) and before.startswith(prompt) else ""
    # keep up to and including the first special token (the end-of-turn marker); what follows it (a newline,
    # the next turn's header) is not something the model generates
    best = None
    for marker in _special_token_strings(tokenizer):
        i = after.find(marker)
        if i >= 0 and (best is None or (i, -len(marker)) < (best[0], -best[1])):
            best = (i, len(marker))
    suffix = after[: best[0] + best[1]] if best else after.rstrip()
    if not suffix:
        _warn_once(f"{getattr(tokenizer, 'name_or_path', '')}:nosuffix",
                   "Chat template puts no end-of-turn marker after assistant content; counting content only.")
    both = lstrip and rstrip
    return AssistantTurnFormat(suffix=suffix, trims=both, lstrip=lstrip and not both, rstrip=rstrip and not both,
                               head=head)


def _text(content) -> str:
    """Content as text; multimodal-style lists of parts contribute their text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return str(content)


def _raw_turns(example: dict) -> tuple[list[dict], str, str]:
    """(turns, role key, content key) of one example in `messages` or ShareGPT `conversations` format."""
    for key, role, content in (("messages", "role", "content"), ("conversations", "from", "value")):
        turns = example.get(key)
        if turns is None:
            continue
        if isinstance(turns, str):  # a data error: ValueError, like every malformed row
            raise ValueError(f"'{key}' holds a string ({turns[:40]!r}...), not a list of turns: store it as a JSON "  # noqa: TRY004
                             f"list of {{{role!r}: ..., {content!r}: ...}} objects (json.loads the column first).")
        if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
            raise ValueError(f"'{key}' must be a list of {{{role!r}, {content!r}}} objects; got {type(turns).__name__} "
                             f"{str(turns)[:60]!r}.")
        return turns, role, content
    raise ValueError(f"Unknown dataset format: expected {_FORMATS_HELP}; found columns {sorted(example)}.")


def normalized_messages(example: dict) -> list[dict]:
    """A conversation as [{role, content}] with role user/assistant/system, from either chat format."""
    turns, role_key, content_key = _raw_turns(example)
    out = []
    for t in turns:
        role = t.get(role_key)
        role = "assistant" if role in _ASSISTANT_ROLES else ("system" if role == "system" else "user")
        out.append({"role": role, "content": _text(t.get(content_key))})
    return out


def _turns(example: dict, roles_seen: set | None = None) -> tuple[list[str], int, int]:
    """Assistant contents of one example (messages or ShareGPT conversations), its turn count and how many of its
    assistant turns were empty (so a refusal can say that their content is empty, not that none were found)."""
    turns, role_key, content_key = _raw_turns(example)
    if roles_seen is not None and len(roles_seen) < 50:
        roles_seen.update(str(t.get(role_key)) for t in turns)
    # an assistant turn with no content (null, "", whitespace) is not a turn: counting it would add only its
    # end-of-turn marker and inflate coverage (100% at k=50 on such data)
    contents = [_text(t.get(content_key)) for t in turns if t.get(role_key) in _ASSISTANT_ROLES]
    kept = [c for c in contents if c.strip()]
    return kept, len(turns), len(contents) - len(kept)


def _examples(dataset: Iterable[dict], max_examples: int | None) -> Iterable[dict]:
    return dataset if max_examples is None else itertools.islice(dataset, max(0, max_examples))


def assistant_texts(dataset: Iterable[dict], tokenizer, *, max_examples: int | None = None) -> Iterator[str]:
    """Each assistant turn's trainable text as the chat template renders it (content + end marker)."""
    fmt = assistant_turn_format(tokenizer)
    for example in _examples(dataset, max_examples):
        for content in _turns(example)[0]:
            yield fmt.render(content)


@dataclass
class TokenCounts:
    """Token frequencies over assistant turns, plus the coverage math selection needs."""

    counts: torch.Tensor  # int64, (vocab_size,)
    num_examples: int = 0
    num_assistant_turns: int = 0
    tokenizer_name: str = ""
    tokenizer_sha256: str = ""  # drafter.tokenizer_sha256 of the counting tokenizer ("" in files from before it)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self.counts = torch.as_tensor(self.counts).to(torch.int64).flatten()

    @property
    def num_tokens(self) -> int:
        if "total" not in self._cache:
            self._cache["total"] = int(self.counts.sum())
        return self._cache["total"]

    @property
    def vocab_size(self) -> int:
        return int(self.counts.numel())

    def ranked_token_ids(self) -> torch.Tensor:
        """Ids by descending count; ties broken by ascending id (stable), so rankings are reproducible."""
        if "ranked" not in self._cache:
            self._cache["ranked"] = torch.sort(self.counts, descending=True, stable=True).indices
        return self._cache["ranked"]

    def coverage_curve(self) -> torch.Tensor:
        """curve[k-1] = share of assistant-token occurrences covered by the top-k tokens (float64)."""
        if "curve" not in self._cache:
            cum = torch.cumsum(self.counts[self.ranked_token_ids()], 0)  # exact integers, then one division
            self._cache["curve"] = cum.double() / max(self.num_tokens, 1)
        return self._cache["curve"]

    def coverage(self, k: int) -> float:
        """Share covered by the top-k (0 for k <= 0, 1 for k >= vocab_size when anything was counted)."""
        k = int(k)
        if k <= 0:
            return 0.0
        return float(self.coverage_curve()[min(k, self.vocab_size) - 1])

    def coverage_of(self, token_ids) -> float:
        """Share of occurrences covered by an arbitrary id set (duplicates count once; ids >= V have none)."""
        ids = torch.as_tensor(token_ids, dtype=torch.long).flatten().unique()
        if ids.numel() and int(ids[0]) < 0:
            raise ValueError(f"coverage_of got a negative token id ({int(ids[0])}).")
        ids = ids[ids < self.vocab_size]
        return float(self.counts[ids].sum()) / max(self.num_tokens, 1)

    def top_k(self, k: int) -> torch.Tensor:
        """The k most frequent ids, most frequent first."""
        return self.ranked_token_ids()[: max(0, int(k))].clone()

    def smallest_k_for_coverage(self, c: float) -> int:
        """Smallest k with ``coverage(k) >= c`` (exactly the same float comparison as ``coverage``)."""
        if not 0 < c <= 1:
            raise ValueError(f"coverage must be in (0, 1]; got {c}.")
        if self.num_tokens == 0:
            raise ValueError("No tokens were counted: count a dataset with assistant turns first.")
        curve = self.coverage_curve()  # curve[-1] == 1.0 exactly, so a k always exists
        return int(torch.searchsorted(curve, torch.tensor([float(c)], dtype=torch.float64))[0]) + 1

    def save(self, path) -> None:
        """Safetensors (never pickle); scalar fields in the metadata with a checksum over them and the vector
        (an edited or bit-flipped file is refused, never read as other counts); atomic write (tmp + os.replace)."""
        counts = self.counts.to(torch.int64).contiguous()
        meta = {"format": _FORMAT, "num_examples": str(self.num_examples),
                "num_assistant_turns": str(self.num_assistant_turns), "tokenizer_name": self.tokenizer_name,
                "tokenizer_sha256": self.tokenizer_sha256}
        meta["counts_sha256"] = _counts_checksum(counts, meta)
        atomic_write(path, lambda tmp: save_file({"counts": counts}, str(tmp), metadata=meta))

    @classmethod
    def load(cls, path) -> TokenCounts:
        """Load a file written by :meth:`save`; anything else is refused with a clear message."""
        not_ours = (f"{os.fspath(path)} is not an hf_vocabspec counts file (made by `hf-vocabspec count` / "
                    "TokenCounts.save)")
        if os.path.isdir(path):
            raise ValueError(f"{os.fspath(path)} is a folder, not a counts file: pass the .safetensors file written by "
                             "`hf-vocabspec count --output FILE`.")

        def ours(meta: dict, names: list[str]) -> None:  # checked before any tensor is read
            if meta.get("format") != _FORMAT or "counts" not in names:
                shown = ", ".join(sorted(names)[:3]) + (f", ... ({len(names)} tensors)" if len(names) > 3 else "")
                looks = " It looks like model weights: pass those as --drafter." if len(names) > 3 else ""
                raise ValueError(f"{not_ours}: format tag {str(meta.get('format'))[:40]!r}, tensors "
                                 f"{shown[:200]}.{looks}")

        tensors, meta = read_safetensors(path, "counts file", "pass a file written by `hf-vocabspec count --output "
                                         "FILE`, or fix the path", check=ours)
        counts = tensors["counts"]
        name = meta.get("tokenizer_name") or "TOKENIZER"
        recount = (f"recount with `hf-vocabspec count --tokenizer {name[:100]} --dataset DATASET --output "
                   f"{os.fspath(path)}`")
        if counts.dtype != torch.int64 or counts.ndim != 1:
            raise ValueError(f"{not_ours}: counts must be a 1-D int64 tensor, got {counts.dtype} {tuple(counts.shape)}.")
        if not meta.get("tokenizer_sha256") or not meta.get("counts_sha256"):
            missing = "tokenizer fingerprint" if not meta.get("tokenizer_sha256") else "checksum"
            raise ValueError(f"The counts file {os.fspath(path)} has no {missing} (made by an older hf_vocabspec, or "
                             f"edited), so it cannot be checked against a tokenizer: {recount}.")
        if _counts_checksum(counts, meta) != meta["counts_sha256"]:
            raise ValueError(f"The counts file {os.fspath(path)} does not match its checksum (edited, cut short or "
                             f"corrupt): {recount}.")
        try:
            n_examples, n_turns = int(meta["num_examples"]), int(meta["num_assistant_turns"])
        except (KeyError, ValueError):  # unreachable past the checksum unless written by hand
            raise ValueError(f"{not_ours}: bad num_examples/num_assistant_turns: {recount}.") from None
        if bool((counts < 0).any()):
            raise ValueError(f"The counts file {os.fspath(path)} holds negative counts: {recount}.")
        return cls(counts, n_examples, n_turns, meta.get("tokenizer_name", ""), meta["tokenizer_sha256"])

    def check_tokenizer(self, tokenizer, *, what: str = "these counts") -> None:
        """Refuse a tokenizer other than the one counted with (fingerprint, not just size: two tokenizers of
        one size would silently map counts to the wrong tokens). Cheap: run it before any search or timing."""
        from .compatibility import tokenizer_sha256

        name = getattr(tokenizer, "name_or_path", "") or "the given tokenizer"
        how = f" (`hf-vocabspec count --tokenizer {name}`)" if getattr(tokenizer, "name_or_path", "") else ""
        fix = f"count again with it{how} or pass the tokenizer the counts were made with"
        if not self.tokenizer_sha256:
            raise ValueError(f"{what} carry no tokenizer fingerprint, so they cannot be checked against {name!r}: "
                             f"count again with it{how}.")
        if tokenizer_sha256(tokenizer) != self.tokenizer_sha256:
            raise ValueError(f"{what} were counted with another tokenizer ({self.tokenizer_name!r}) than "
                             f"{name!r} (tokenizer fingerprints differ): {fix}.")
        if len(tokenizer) > self.vocab_size:  # same tokenizer, vector cut short: an edited or broken file
            raise ValueError(f"{what} cover {self.vocab_size} ids but {name!r} has {len(tokenizer)} tokens (the "
                             f"vector is cut short): count again{how}.")

    def __add__(self, other: TokenCounts) -> TokenCounts:
        """Merge counts of shards of one dataset (counting is additive)."""
        if not isinstance(other, TokenCounts):
            return NotImplemented
        if (self.tokenizer_name != other.tokenizer_name or self.vocab_size != other.vocab_size
                or self.tokenizer_sha256 != other.tokenizer_sha256):
            raise ValueError(
                f"Cannot merge counts of different tokenizers ({self.tokenizer_name!r}, {self.vocab_size}) and "
                f"({other.tokenizer_name!r}, {other.vocab_size}): count both with the target's tokenizer."
            )
        return TokenCounts(self.counts + other.counts, self.num_examples + other.num_examples,
                           self.num_assistant_turns + other.num_assistant_turns, self.tokenizer_name,
                           self.tokenizer_sha256)

    def __radd__(self, other):
        """Lets ``sum(parts)`` work (it starts from 0)."""
        return self if isinstance(other, int) and other == 0 else NotImplemented


def count_assistant_tokens(
    dataset: Iterable[dict],
    tokenizer,
    *,
    max_examples: int | None = None,
    batch_size: int = 512,
    progress: bool = True,
    vocab_size: int | None = None,
) -> TokenCounts:
    """Count target-tokenizer token frequencies over assistant turns of a chat dataset.

    ``vocab_size`` may exceed ``len(tokenizer)`` (e.g. a model's padded embedding) so counts line up with it.
    """
    from tqdm.auto import tqdm

    fmt = assistant_turn_format(tokenizer)
    size = max(vocab_size or 0, len(tokenizer))
    counts = np.zeros(size, dtype=np.int64)
    n_examples = n_turns = n_empty = 0
    columns: set[str] = set()
    roles: set[str] = set()
    batch: list[str] = []

    def flush():
        if batch:
            ids = tokenizer(batch, add_special_tokens=False)["input_ids"]
            flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64)
            binned = np.bincount(flat, minlength=size)
            if binned.size > size:
                raise ValueError(f"Token id {int(flat.max())} >= vocab size {size}: pass a larger vocab_size.")
            counts[:] += binned
            batch.clear()

    try:
        total = len(dataset) if max_examples is None else min(len(dataset), max_examples)
    except TypeError:
        total = max_examples
    with tqdm(total=total, desc="counting assistant tokens", unit="conv", disable=not progress) as bar:
        for example in _examples(dataset, max_examples):
            if not n_examples:
                columns.update(example)
            contents, _, empty = _turns(example, roles)
            n_examples += 1
            n_turns += len(contents)
            n_empty += empty
            batch.extend(fmt.render(c) for c in contents)
            if len(batch) >= batch_size:
                flush()
            bar.update(1)
        flush()
    if n_turns == 0 and n_empty:
        raise ValueError(
            f"No assistant turns with text in {n_examples} example(s): all {n_empty} assistant turn(s) have empty "
            "content (null, '' or whitespace only), so there is nothing to count: fill in the assistant answers, or "
            "count a dataset whose assistant turns hold text."
        )
    if n_turns == 0:
        raise ValueError(
            f"No assistant turns found in {n_examples} example(s): expected {_FORMATS_HELP} (also accepted as "
            f"responses: {sorted(_ASSISTANT_ROLES)}); found columns {sorted(columns)} and roles {sorted(roles)}."
        )
    return TokenCounts(torch.from_numpy(counts), n_examples, n_turns, str(getattr(tokenizer, "name_or_path", "")),
                       _fingerprint(tokenizer))


def _counts_checksum(counts: torch.Tensor, meta: dict) -> str:
    """SHA-256 over the count vector and the metadata fields (everything a reader uses): _io's checksum, in the
    layout counts files have always had (the bytes alone, no name/dtype/shape header)."""
    return tensors_checksum({"counts": counts.to(torch.int64)}, meta, skip="counts_sha256", described=False)


def _fingerprint(tokenizer) -> str:
    from .compatibility import tokenizer_sha256

    return tokenizer_sha256(tokenizer)


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
    return TokenCounts(counts, n_examples, n_turns, local.tokenizer_name, local.tokenizer_sha256)


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
        return TokenCounts(torch.zeros(size, dtype=torch.int64), 0, 0, str(getattr(tokenizer, "name_or_path", "")),
                           _fingerprint(tokenizer))
