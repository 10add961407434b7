"""Export the selected vocabulary to serving engines, from the one map in the drafter (``d2t``).

Two conventions exist and mixing them up silently collapses acceptance, so both directions are checked:

- **hf_vocabspec** (``TrimmedDrafter.d2t``): ABSOLUTE target ids, ascending; draft id ``i`` is target id ``d2t[i]``.
- **EAGLE-3 / SGLang / vLLM / vllm-project speculators**: ``d2t`` holds OFFSETS, ``target id = i + d2t[i]``
  (int64, length ``draft_vocab_size``), ``t2d`` is a bool mask over the target vocabulary (True where kept),
  ``draft_vocab_size`` goes into the drafter's config.
- **SGLang FR-Spec** ``--speculative-token-map``: a file that SGLang's ``load_token_map`` reads with
  ``torch.load(path, weights_only=True)`` and turns into ``torch.tensor(hot_token_id, dtype=torch.int64)``:
  the hot (kept) target ids. We write an int64 tensor of the absolute ids (as FR-Spec's released ``.pt``
  files do). SGLang also accepts a ``repo_id/filename`` path and fetches it with ``snapshot_download``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file

from ._io import atomic_write, first_line, read_safetensors, tensors_checksum
from .modeling import TrimmedDrafter

EAGLE3_CONVENTION = "eagle3-offsets"


def _int64_ids(values, type_error: str, empty_error: str) -> torch.Tensor:
    """A flat int64 CPU tensor of ids, refusing float/bool input and an empty one."""
    ids = torch.as_tensor(values)
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise TypeError(f"{type_error}, got a {ids.dtype} tensor.")
    ids = ids.detach().to("cpu", torch.int64).flatten()
    if ids.numel() == 0:
        raise ValueError(empty_error)
    return ids


def _absolute_ids(drafter_or_ids, vocab_size: int | None = None) -> torch.Tensor:
    """Absolute target ids from a TrimmedDrafter (validated) or a sequence/tensor of absolute ids."""
    if isinstance(drafter_or_ids, TrimmedDrafter):
        drafter_or_ids.validate_vocab_map()
        vocab_size = drafter_or_ids.config.vocab_size if vocab_size is None else vocab_size
        ids = drafter_or_ids.d2t
    else:
        ids = drafter_or_ids
    ids = _int64_ids(ids, "Expected integer target token ids", "The vocabulary map is empty.")
    if bool((ids < 0).any()):
        raise ValueError("Target ids must be >= 0 (got negative ids: is this an offsets map?).")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError("Expected ascending, unique absolute target ids (a TrimmedDrafter's d2t); "
                         "sort and de-duplicate them first.")
    if vocab_size is not None and int(ids[-1]) >= vocab_size:
        raise ValueError(f"Target id {int(ids[-1])} is outside the target vocabulary [0, {vocab_size}).")
    return ids


# --- SGLang FR-Spec ---------------------------------------------------------------------------------------
def to_sglang_token_map(drafter_or_d2t, path) -> Path:
    """Write SGLang's ``--speculative-token-map`` file: the hot target ids (int64 tensor, ``torch.save``).

    ``drafter_or_d2t`` is a :class:`TrimmedDrafter` or its absolute ids (NOT EAGLE-3 offsets).
    Serve with ``--speculative-algorithm EAGLE --speculative-token-map <path>``.
    """
    ids = _absolute_ids(drafter_or_d2t).clone()
    return atomic_write(path, lambda tmp: torch.save(ids, tmp))


save_sglang_token_map = to_sglang_token_map  # the name used in the README


def load_sglang_token_map(path) -> torch.Tensor:
    """Read a hot-token file the way SGLang does (``torch.load(weights_only=True)`` -> int64).

    The zip's CRCs are checked first (torch does not): a bit-flipped file is refused, never read as other ids."""
    import zipfile

    fix = "export it again with hf_vocabspec.export.to_sglang_token_map(drafter, path)"
    if not Path(path).is_file():
        raise FileNotFoundError(f"No such SGLang token map: {str(path)!r} ({fix}).")
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
        if bad is not None:
            raise ValueError(f"entry {bad} fails its CRC")
        hot = torch.load(path, weights_only=True)
    except Exception as err:  # zipfile.BadZipFile, UnpicklingError, RuntimeError of torch's reader, ...
        raise ValueError(f"{path} is not a readable SGLang token map ({first_line(err)}): {fix}.") from err
    if not isinstance(hot, (torch.Tensor, list, tuple)):
        raise ValueError(f"{path} holds a {type(hot).__name__}, not a list or tensor of token ids: {fix}.")
    if isinstance(hot, torch.Tensor) and (hot.dtype.is_floating_point or hot.dtype == torch.bool or hot.ndim != 1):
        raise ValueError(f"{path} holds a {hot.dtype} tensor of shape {tuple(hot.shape)}, not 1-D token ids: {fix}.")
    try:
        return _absolute_ids(torch.as_tensor(hot, dtype=torch.int64))
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{path}: not a token map ({first_line(err)}): {fix}.") from err


# --- EAGLE-3 / speculators --------------------------------------------------------------------------------
def to_eagle3_vocab_map(drafter_or_d2t, vocab_size: int | None = None) -> dict[str, torch.Tensor]:
    """``{"d2t": int64 offsets (K,), "t2d": bool (V,)}`` in the EAGLE-3 / speculators convention.

    ``target_id = i + d2t[i]``; ``t2d[target_id]`` is True exactly for the K kept ids. Pass a
    :class:`TrimmedDrafter`, or absolute ids plus ``vocab_size`` (the target vocabulary size).
    """
    if isinstance(drafter_or_d2t, TrimmedDrafter):
        vocab_size = drafter_or_d2t.config.vocab_size if vocab_size is None else vocab_size
    elif vocab_size is None:
        raise ValueError("Pass vocab_size (the target vocabulary size) when exporting raw ids.")
    ids = _absolute_ids(drafter_or_d2t, vocab_size)
    t2d = torch.zeros(int(vocab_size), dtype=torch.bool)
    t2d[ids] = True
    return {"d2t": ids - torch.arange(ids.numel(), dtype=torch.int64), "t2d": t2d}


def from_eagle3_vocab_map(d2t_offsets, t2d=None, *, vocab_size: int | None = None) -> torch.Tensor:
    """Absolute target ids (ascending) from an EAGLE-3 map: offsets ``d2t`` and optionally the ``t2d`` mask.

    Accepts the dict from :func:`to_eagle3_vocab_map` / a checkpoint as the first argument. Refuses what
    can be detected as absolute ids passed as offsets: ids running past the vocabulary (``vocab_size`` or
    ``len(t2d)``), or ids that disagree with ``t2d``. Negative or decreasing offsets are refused too (valid
    offsets are >= 0 and non-decreasing, since kept ids are strictly increasing).
    """
    if isinstance(d2t_offsets, Mapping):
        t2d = d2t_offsets.get("t2d", t2d)
        d2t_offsets = d2t_offsets["d2t"]
    offsets = _int64_ids(d2t_offsets, "d2t must hold integer offsets", "d2t is empty.")
    hint = "were absolute target ids passed as offsets (hf_vocabspec's d2t is absolute; EAGLE-3's is i + d2t[i])?"
    if bool((offsets < 0).any()):
        raise ValueError("d2t has negative offsets: not an EAGLE-3 offsets map (target id = i + d2t[i] >= i).")
    ids = offsets + torch.arange(offsets.numel(), dtype=torch.int64)
    if offsets.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError("d2t offsets do not give strictly increasing target ids: the map is corrupt or not in "
                         "the EAGLE-3 convention.")
    if t2d is not None:
        t2d = torch.as_tensor(t2d).detach().to("cpu").flatten()
        if t2d.dtype != torch.bool:
            raise TypeError(f"t2d must be a bool mask over the target vocabulary, got {t2d.dtype}.")
        if vocab_size is not None and t2d.numel() != vocab_size:
            raise ValueError(f"t2d has {t2d.numel()} entries, expected the target vocabulary size {vocab_size}.")
        vocab_size = t2d.numel()
    if vocab_size is not None and int(ids[-1]) >= vocab_size:
        raise ValueError(f"d2t offsets point past the target vocabulary (id {int(ids[-1])} >= {vocab_size}): {hint}")
    if t2d is not None and (int(t2d.sum()) != ids.numel() or not bool(t2d[ids].all())):
        raise ValueError(f"t2d mask and d2t offsets disagree: {hint} Or the map is corrupt.")
    return ids


def save_eagle3_vocab_map(drafter: TrimmedDrafter, path) -> Path:
    """Write ``d2t`` (offsets) and ``t2d`` to safetensors; ``draft_vocab_size``/``vocab_size`` in its metadata.

    The tensor names match EAGLE-3 checkpoints (SGLang / vLLM / speculators load ``d2t``/``t2d`` by name);
    put ``draft_vocab_size`` into the EAGLE-3 drafter's config.json too.
    """
    tensors = to_eagle3_vocab_map(drafter)
    metadata = {"draft_vocab_size": str(tensors["d2t"].numel()), "vocab_size": str(tensors["t2d"].numel()),
                "convention": EAGLE3_CONVENTION, "format": "pt"}
    metadata["hf_vocabspec_sha256"] = tensors_checksum(tensors, metadata, skip="hf_vocabspec_sha256")
    return atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata=metadata))


def load_eagle3_vocab_map(path) -> torch.Tensor:
    """Absolute target ids from a file written by :func:`save_eagle3_vocab_map` (or any EAGLE-3 d2t/t2d file).

    Files we wrote carry a checksum: an edited or bit-flipped one is refused, never read as another map."""
    fix = "export it again with hf_vocabspec.export.save_eagle3_vocab_map(drafter, path)"
    tensors, meta = read_safetensors(path, "EAGLE-3 vocabulary map", fix)
    if "d2t" not in tensors:
        raise KeyError(f"{path} has no `d2t` tensor (keys: {sorted(tensors)[:10]}).")
    expected = meta.get("hf_vocabspec_sha256")
    if expected is not None and tensors_checksum(tensors, meta, skip="hf_vocabspec_sha256") != expected:
        raise ValueError(f"{path} does not match its checksum (edited or corrupt): {fix}.")
    d2t, t2d = tensors["d2t"], tensors.get("t2d")
    if d2t.ndim != 1 or (t2d is not None and t2d.ndim != 1):
        raise ValueError(f"{path}: `d2t` and `t2d` must be 1-D, got {tuple(d2t.shape)} and "
                         f"{None if t2d is None else tuple(t2d.shape)}: {fix}.")
    ids = from_eagle3_vocab_map(d2t, t2d)
    try:
        size = int(meta["draft_vocab_size"]) if "draft_vocab_size" in meta else ids.numel()
    except ValueError:
        raise ValueError(f"{path}: metadata draft_vocab_size={meta['draft_vocab_size'][:20]!r} is not an integer: "
                         f"{fix}.") from None
    if size != ids.numel():
        raise ValueError(f"{path}: metadata draft_vocab_size={size} but d2t has {ids.numel()} entries.")
    return ids
