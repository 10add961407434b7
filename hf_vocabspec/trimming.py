"""Trimming: build a :class:`~hf_vocabspec.modeling.TrimmedDrafter` from any causal LM and a kept vocabulary.

:func:`trim_drafter` keeps the chosen LM-head rows (plus the special tokens a turn needs, :func:`special_token_ids`),
reuses the body, writes the vocabulary map and its checksum, and gives the drafter its default drafting settings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn
from transformers import GenerationConfig, PreTrainedModel

from .compatibility import check_tokenizer_belongs, tokenizer_sha256
from .configuration import (DEFAULT_CONFIDENCE_THRESHOLD, DEFAULT_NUM_ASSISTANT_TOKENS, SelectionInfo,
                            TrimmedDrafterConfig, set_draft_length)
from .modeling import TrimmedDrafter, _head_transform, model_body, vocab_map_sha256

__all__ = ["chat_template_special_ids", "special_token_ids", "trim_drafter"]


def _as_id_list(keep_token_ids: Iterable[int] | torch.Tensor) -> list[int]:
    if isinstance(keep_token_ids, torch.Tensor):
        if keep_token_ids.dtype.is_floating_point or keep_token_ids.dtype == torch.bool:
            raise TypeError("keep_token_ids must hold integer token ids (got a floating/bool tensor).")
        return [int(i) for i in keep_token_ids.flatten().tolist()]
    ids = list(keep_token_ids)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) and not (hasattr(i, "__index__")):
            raise TypeError(f"keep_token_ids must hold integer token ids; got {i!r}.")
    return [int(i) for i in ids]


def chat_template_special_ids(tokenizer) -> list[int]:
    """Special tokens the chat template emits (e.g. <|im_start|>, <end_of_turn>).

    Not every "special" added token: Gemma's tokenizer marks 6,249 of them special (mostly unused
    placeholders); forcing all into the head would waste a third of a 20k-row head.
    """
    if not getattr(tokenizer, "chat_template", None):
        return []
    special = {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
    found: set[int] = set()
    convos = (
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
        [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
    )
    for convo in convos:
        for gen_prompt in (False, True):
            try:
                text = tokenizer.apply_chat_template(convo, tokenize=False, add_generation_prompt=gen_prompt)
            except Exception:  # noqa: BLE001 - some templates reject a system turn
                continue
            found.update(i for i in tokenizer(text, add_special_tokens=False)["input_ids"] if i in special)
    return sorted(found)


def special_token_ids(model: PreTrainedModel | None = None, tokenizer=None) -> list[int]:
    """Ids that must always stay draftable: EOS/BOS/PAD, the tokenizer's named special tokens, chat-template tokens."""
    ids: set[int] = set()

    def add(v):
        if v is None:
            return
        if isinstance(v, (list, tuple)):
            for x in v:
                add(x)
        elif isinstance(v, torch.Tensor):
            add(v.flatten().tolist())
        else:
            ids.add(int(v))

    if model is not None:
        for cfg in (model.config, getattr(model, "generation_config", None)):
            if cfg is None:
                continue
            for name in ("eos_token_id", "bos_token_id", "pad_token_id"):
                add(getattr(cfg, name, None))
    if tokenizer is not None:
        add(tokenizer.all_special_ids)
        add(chat_template_special_ids(tokenizer))
    return sorted(ids)


def trim_drafter(
    model: PreTrainedModel,
    keep_token_ids: Sequence[int] | torch.Tensor,
    *,
    tokenizer=None,
    target_model: str | None = None,
    always_keep_special_tokens: bool = True,
    selection: SelectionInfo | None = None,
    keep_pruned_rows: bool = True,
) -> TrimmedDrafter:
    """Build a :class:`TrimmedDrafter` from any HF causal LM, keeping only ``keep_token_ids`` in its head.

    Special tokens (EOS/BOS/PAD, and the tokenizer's special and chat-template tokens when ``tokenizer``
    is given) are always kept so the drafter can end a turn. The body is reused (not copied); the kept
    head rows are copied, so tied embeddings become untied.

    Context tokens (pruned ids already in the context, drafted with their own head rows) are on by default.
    A tied base reads those rows from its input embedding (free); for an UNTIED head the pruned rows are
    copied into the ``context_head`` buffer (read only for context rows, never in the per-token GEMV), which
    costs (V - K) x hidden x dtype bytes of memory and disk: the drafter's head is stored whole again.
    ``keep_pruned_rows=False`` drops them (smaller checkpoint, context tokens off for untied heads).
    """
    if isinstance(model, TrimmedDrafter):
        raise ValueError("This model is already trimmed: trim the original (untrimmed) drafter instead.")
    if getattr(model, "_is_stateful", False):
        raise ValueError(f"{type(model).__name__} is a stateful (recurrent) model: transformers' assisted generation "
                         "does not support it, so it cannot draft. Trim a transformer drafter instead.")
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise ValueError(f"{type(model).__name__} has no LM head (get_output_embeddings() is None): pass a causal LM.")
    body = model_body(model)
    full_vocab = head.weight.shape[0]
    config_vocab = model.config.get_text_config().vocab_size
    vocab_size = max(full_vocab, config_vocab)

    ids = _as_id_list(keep_token_ids)
    if not ids:
        raise ValueError("keep_token_ids is empty: keep at least the tokens your workload uses.")
    if tokenizer is not None:
        check_tokenizer_belongs(model, tokenizer)
    bad = [i for i in ids if i < 0 or i >= full_vocab]
    if bad:
        raise ValueError(
            f"keep_token_ids has {len(bad)} id(s) outside the drafter's vocabulary [0, {full_vocab}), e.g. {bad[:5]}: "
            "were they counted with a different tokenizer? Count with the target's tokenizer."
        )
    if len(set(ids)) != len(ids):
        dup = len(ids) - len(set(ids))
        raise ValueError(f"keep_token_ids has {dup} duplicate id(s): pass unique ids, e.g. sorted(set(ids)).")
    forced = special_token_ids(model, tokenizer) if always_keep_special_tokens else []
    forced = [i for i in forced if 0 <= i < full_vocab]
    d2t = torch.tensor(sorted(set(ids) | set(forced)), dtype=torch.long)

    body_cfg = body.config.to_dict()
    body_cfg.pop("_name_or_path", None)
    pruned = torch.ones(full_vocab, dtype=torch.bool)
    pruned[d2t] = False
    pruned = pruned.nonzero().flatten()
    keep_untied = bool(keep_pruned_rows) and not body_cfg.get("tie_word_embeddings", False) and pruned.numel() > 0
    config = TrimmedDrafterConfig(
        drafter_config=body_cfg,
        vocab_size=vocab_size,
        draft_vocab_size=int(d2t.numel()),
        vocab_map_sha256=vocab_map_sha256(d2t),
        target_model=target_model,
        target_tokenizer_sha256=tokenizer_sha256(tokenizer) if tokenizer is not None else None,
        base_drafter=getattr(model.config, "_name_or_path", None) or None,
        selection=selection,
        bos_token_id=getattr(model.config.get_text_config(), "bos_token_id", None),
        eos_token_id=getattr(model.config.get_text_config(), "eos_token_id", None),
        pad_token_id=getattr(model.config.get_text_config(), "pad_token_id", None),
        # on wherever the pruned rows stay reachable (tied embeddings, or kept rows of an untied head):
        # lossless, and it recovers most of what pruning costs on chat text (README, docs/rdk.md section 8)
        context_tokens=bool(body_cfg.get("tie_word_embeddings", False)) or keep_untied,
        context_head_size=len(pruned) if keep_untied else 0,
    )
    dtype = head.weight.dtype
    with torch.device("meta"):
        drafter = TrimmedDrafter(config)
    drafter.model = body
    weight = head.weight.detach()[d2t.to(head.weight.device)].clone()
    drafter.lm_head = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device=weight.device, dtype=dtype)
    drafter.lm_head.weight.data.copy_(weight)
    drafter.d2t = d2t.to(weight.device)
    if keep_untied:
        drafter.context_ids = pruned.to(weight.device)
        drafter.context_head = head.weight.detach()[drafter.context_ids].clone()
    drafter.config.dtype = dtype
    drafter._head_transform = _head_transform(body.config)
    gen = GenerationConfig.from_model_config(model.config) if getattr(model, "generation_config", None) is None else (
        GenerationConfig.from_dict(model.generation_config.to_dict())
    )
    gen._from_model_config = False  # else transformers drops our own fields (batched_speculation) when loading it
    drafter.generation_config = set_draft_length(gen, DEFAULT_NUM_ASSISTANT_TOKENS, DEFAULT_CONFIDENCE_THRESHOLD)
    leftovers = [n for n, p in list(drafter.named_parameters()) + list(drafter.named_buffers()) if p.is_meta]
    if leftovers:
        raise RuntimeError(f"trim_drafter left uninitialised tensors: {leftovers[:5]}")
    drafter.validate_vocab_map()
    drafter.validate_context_head()
    drafter.eval()
    return drafter
