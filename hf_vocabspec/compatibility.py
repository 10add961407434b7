"""Does this drafter fit this target and tokenizer? The one check, the one error class, the tokenizer fingerprint.

The rule (:func:`compatibility_error`): every id the drafter proposes must be a row of the target, and the
tokenizer, where one is known, must be the one the drafter was trimmed with (same token -> id table, compared by
:func:`tokenizer_sha256`). A target whose embedding is padded beyond its tokenizer fits: Qwen2.5-7B has 152,064
rows and its 0.5B drafter 151,936 ids, one tokenizer. Generate (generation/hooks.py), ``load_drafter``
(hub.py), the CLI, lm-eval's backend and SSD sessions all call :func:`check_compatibility`, which raises
:class:`DrafterMismatchError` (a :class:`~hf_vocabspec.configuration.VocabularyMapError`).

Before trimming, the same question is asked of an untrimmed model and a tokenizer (:func:`check_tokenizer_belongs`:
trim_drafter) or of two models known by their tokenizers or vocabulary sizes (:func:`check_same_tokenizer`: the
CLI, before any model is loaded); they raise the same error.
"""

from __future__ import annotations

import hashlib
import json
import os
import weakref

from .configuration import VocabularyMapError

__all__ = [
    "DrafterMismatchError",
    "check_compatibility",
    "check_same_tokenizer",
    "check_tokenizer_belongs",
    "compatibility_error",
    "target_rows",
    "target_tokenizer_fingerprint",
    "tokenizer_sha256",
]

DEFAULT_FIX = ("use a drafter trimmed with the target's tokenizer: hf_vocabspec.trim_drafter(base, ids, "
               "tokenizer=target_tokenizer)")


class DrafterMismatchError(VocabularyMapError):
    """The drafter does not fit the target or tokenizer it is used with (its ids fall outside the target's rows, or
    it was trimmed with another tokenizer), or a tokenizer does not belong to a model."""


def tokenizer_sha256(tokenizer) -> str:
    """Fingerprint of a tokenizer's token -> id table (drafter and target must share it)."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> (len, sha256), hashed once


def _fingerprint(tokenizer) -> str:
    """tokenizer_sha256, cached per tokenizer object (generate checks it on every call); rehashed when the
    tokenizer's length changed (add_tokens)."""
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else None
    try:
        cached = _FINGERPRINTS.get(tokenizer)
    except TypeError:  # not weak-referenceable: hash every call
        return tokenizer_sha256(tokenizer)
    if cached is None or cached[0] != size:
        cached = _FINGERPRINTS[tokenizer] = (size, tokenizer_sha256(tokenizer))
    return cached[1]


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
_TARGET_FINGERPRINTS: dict[tuple, str | None] = {}  # (folder, its tokenizer files' mtimes) -> fingerprint, read once


def target_tokenizer_fingerprint(target) -> tuple[str, str] | None:
    """(fingerprint, folder) of the tokenizer saved beside ``target``, where one is at hand: the local folder the
    target was loaded from (``config._name_or_path``) holding tokenizer files, read once per folder (local files
    only, never the network). None for a target built in memory, loaded from a Hub id, or whose folder holds no
    tokenizer that loads: then there is nothing to compare, and generate relies on the ``tokenizer=`` it is given."""
    path = getattr(getattr(target, "config", None), "_name_or_path", "") or ""
    if not path or not os.path.isdir(path):
        return None
    stamps = tuple(os.path.getmtime(os.path.join(path, f)) for f in _TOKENIZER_FILES
                   if os.path.isfile(os.path.join(path, f)))
    if not stamps:
        return None
    key = (os.path.realpath(path), stamps)
    if key not in _TARGET_FINGERPRINTS:
        from transformers import AutoTokenizer

        try:
            _TARGET_FINGERPRINTS[key] = tokenizer_sha256(AutoTokenizer.from_pretrained(path, local_files_only=True))
        except Exception:  # noqa: BLE001 - a folder whose tokenizer does not load has none at hand to compare
            _TARGET_FINGERPRINTS[key] = None
    fingerprint = _TARGET_FINGERPRINTS[key]
    return None if fingerprint is None else (fingerprint, path)


def target_rows(target) -> int:
    """The target's id space: its config's vocab_size or its head's rows, whichever is larger (padded heads)."""
    sizes = [int(getattr(target.config.get_text_config(), "vocab_size", 0) or 0)]
    head = target.get_output_embeddings() if hasattr(target, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        sizes.append(int(head.weight.shape[0]))
    return max(sizes)


def _name(model) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "_name_or_path", "") or type(model).__name__


def compatibility_error(drafter, *, target=None, tokenizer=None) -> str | None:
    """Why ``drafter`` cannot serve ``target`` / ``tokenizer`` (None: it can). THE rule, both halves optional:

    - every id the drafter maps into (``config.vocab_size``) is a row of the target (:func:`target_rows`; a target
      padded beyond its tokenizer has more rows and fits; fewer rows does not);
    - a tokenizer given (an object, or its fingerprint as a string) has the fingerprint the drafter recorded when it
      was trimmed (a drafter trimmed without one records none: nothing to compare).

    ``drafter``: a TrimmedDrafter, or anything with its ``config`` (lm-eval checks a config before loading weights);
    ``target``: a model, or its number of rows.
    """
    cfg = drafter.config
    trimmed_for = cfg.target_model or "an unrecorded target"
    if target is not None:
        rows = target if isinstance(target, int) else target_rows(target)
        if cfg.vocab_size > rows:
            what = "the target" if isinstance(target, int) else f"the target {_name(target)}"
            return (f"This drafter was trimmed for a {cfg.vocab_size:,}-token vocabulary ({trimmed_for}) but {what} "
                    f"has {rows:,} rows: draft ids would fall outside it (drafter and target must share a tokenizer)")
    recorded = getattr(cfg, "target_tokenizer_sha256", None)
    if tokenizer is not None and recorded:
        fingerprint = tokenizer if isinstance(tokenizer, str) else _fingerprint(tokenizer)
        if fingerprint != recorded:
            name = "" if isinstance(tokenizer, str) else f" {getattr(tokenizer, 'name_or_path', '')!r}"
            return (f"The tokenizer{name} is not the one this drafter was trimmed with ({trimmed_for}): their token->id "
                    "tables differ (tokenizer fingerprints differ), so draft ids would map to the wrong tokens")
    return None


def check_compatibility(drafter, *, target=None, tokenizer=None, fix: str = DEFAULT_FIX) -> None:
    """Raise :class:`DrafterMismatchError` (one line: the reason, then ``fix``) when ``drafter`` does not fit
    ``target`` / ``tokenizer`` by :func:`compatibility_error`."""
    why = compatibility_error(drafter, target=target, tokenizer=tokenizer)
    if why:
        raise DrafterMismatchError(f"{why}: {fix}.")


def _fits_rows(n: int, rows: int) -> bool:
    """Whether a tokenizer of ``n`` tokens can be the tokenizer of an embedding of ``rows`` rows: no id beyond the
    rows, and no more spare rows than padding (to a multiple of 64 or 128 is common; more than max(1024, rows/64)
    spare rows is another tokenizer)."""
    return n <= rows and rows - n <= max(1024, rows // 64)


def check_tokenizer_belongs(model, tokenizer) -> None:
    """Refuse a tokenizer that cannot be ``model``'s (an untrimmed drafter about to be trimmed): ids beyond its
    embedding, far fewer tokens than its rows (padding to a multiple is common, a different tokenizer family is
    not), or BOS/EOS ids the model does not use. Kept ids and special tokens come from the tokenizer, so a wrong
    one silently trims the wrong rows."""
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    rows = model.get_input_embeddings().weight.shape[0]
    n = len(tokenizer) if hasattr(tokenizer, "__len__") else rows  # duck-typed tokenizers: special ids only
    fix = "pass the tokenizer that belongs to this drafter (the target's, which the drafter shares)."
    if n > rows:
        raise DrafterMismatchError(f"Tokenizer {name!r} has {n} tokens but the drafter's embedding has only {rows} rows: "
                                   f"{fix}")
    if not _fits_rows(n, rows):
        raise DrafterMismatchError(f"Tokenizer {name!r} has {n} tokens but the drafter's embedding has {rows} rows (more "
                                   f"than padding): {fix}")
    config = model.config.get_text_config()
    gen = getattr(model, "generation_config", None)
    for kind in ("bos", "eos"):
        tok_id = getattr(tokenizer, f"{kind}_token_id", None)
        ids = set()
        for source in (config, gen):
            value = getattr(source, f"{kind}_token_id", None) if source is not None else None
            ids.update(value if isinstance(value, (list, tuple)) else [] if value is None else [value])
        if tok_id is not None and ids and tok_id not in ids:
            raise DrafterMismatchError(f"Tokenizer {name!r} has {kind.upper()} id {tok_id} but the drafter's config "
                                       f"uses {sorted(ids)}: {fix}")


def check_same_tokenizer(tokenizer, other, *, what: str, other_name: str,
                         fix: str = "drafter and target must share a tokenizer; pass matching models") -> None:
    """Refuse two models that do not share a tokenizer, before either is loaded: ``what`` (a model named by the
    user) has ``tokenizer``, or, saved without one, an embedding of ``tokenizer`` rows (an int); ``other`` is the
    other side's tokenizer (``other_name`` names it)."""
    if isinstance(tokenizer, int):
        n = len(other)
        if not _fits_rows(n, tokenizer):
            raise DrafterMismatchError(f"{what} has a {tokenizer:,}-token vocabulary but {other_name} has a {n:,}-token "
                                       f"tokenizer: {fix}.")
        return
    if _fingerprint(tokenizer) != _fingerprint(other):
        raise DrafterMismatchError(f"{what} uses another tokenizer than {other_name} (tokenizer fingerprints differ): "
                                   f"{fix}.")
