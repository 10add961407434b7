"""Export the selected vocabulary to serving engines, from the one map in the drafter (``d2t``).

- SGLang FR-Spec ``--speculative-token-map``: a file SGLang reads with
  ``torch.load(path, weights_only=True)`` holding the hot (kept) target token ids.
- EAGLE-3 / vLLM / vllm-project speculators: ``d2t`` holds OFFSETS (target id = i + d2t[i]) and ``t2d`` is
  a bool mask over the target vocabulary. Our checkpoint stores ABSOLUTE ids; passing one convention where
  the other is expected is a known, silent acceptance-killer, so both directions are checked here.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .drafter import TrimmedDrafter


def _absolute_ids(drafter_or_ids) -> torch.Tensor:
    ids = drafter_or_ids.d2t if isinstance(drafter_or_ids, TrimmedDrafter) else torch.as_tensor(drafter_or_ids)
    ids = ids.detach().to("cpu", torch.int64).flatten()
    if ids.numel() == 0 or bool((ids < 0).any()) or (ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all())):
        raise ValueError("Expected ascending, unique, non-negative absolute target ids (a TrimmedDrafter's d2t).")
    return ids


def save_sglang_token_map(drafter_or_ids, path) -> Path:
    """Write SGLang's ``--speculative-token-map`` file (hot target ids, int64 tensor, torch.save)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(_absolute_ids(drafter_or_ids).clone(), tmp)
    os.replace(tmp, path)
    return path


def to_eagle3_vocab_map(drafter: TrimmedDrafter) -> dict[str, torch.Tensor]:
    """``{"d2t": offsets int64 (K,), "t2d": bool (V,)}`` in the EAGLE-3 / speculators convention."""
    ids = _absolute_ids(drafter)
    t2d = torch.zeros(drafter.config.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return {"d2t": ids - torch.arange(ids.numel()), "t2d": t2d}


def from_eagle3_vocab_map(d2t_offsets: torch.Tensor, t2d: torch.Tensor | None = None) -> torch.Tensor:
    """Absolute target ids from EAGLE-3 offsets; checks consistency with ``t2d`` when given."""
    offsets = torch.as_tensor(d2t_offsets, dtype=torch.int64).flatten()
    ids = offsets + torch.arange(offsets.numel())
    if offsets.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError("d2t offsets do not give strictly increasing target ids: were absolute ids passed as offsets?")
    if t2d is not None:
        t2d = torch.as_tensor(t2d, dtype=torch.bool)
        in_range = int(ids.max()) < t2d.numel()
        if not in_range or int(t2d.sum()) != ids.numel() or not bool(t2d[ids].all()):
            raise ValueError("t2d mask and d2t offsets disagree: were absolute ids passed as offsets, "
                             "or is the map corrupt?")
    return ids


def save_eagle3_vocab_map(drafter: TrimmedDrafter, path) -> Path:
    """Safetensors with ``d2t`` (offsets) and ``t2d``; ``draft_vocab_size`` in the metadata."""
    path = Path(path)
    tensors = to_eagle3_vocab_map(drafter)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, tmp, metadata={"draft_vocab_size": str(tensors["d2t"].numel()), "convention": "eagle3-offsets"})
    os.replace(tmp, path)
    return path


def load_eagle3_vocab_map(path) -> torch.Tensor:
    tensors = load_file(path)
    return from_eagle3_vocab_map(tensors["d2t"], tensors.get("t2d"))
