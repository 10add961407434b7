"""Serving-engine exports: SGLang hot-token map and EAGLE-3 offsets (the offset-vs-absolute trap)."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from tiny import VOCAB, make_pair

from hf_vocabspec import TrimmedDrafter, trim_drafter
from hf_vocabspec.export import (
    from_eagle3_vocab_map,
    load_eagle3_vocab_map,
    load_sglang_token_map,
    save_eagle3_vocab_map,
    to_eagle3_vocab_map,
    to_sglang_token_map,
)

KEEP = [5, 9, 17, 40, 63]


@pytest.fixture(scope="module")
def drafter():
    return trim_drafter(make_pair("llama", seed=2)[1], KEEP)  # + specials 0 (pad), 1 (bos), 2 (eos)


def test_sglang_token_map_is_the_hot_ids(tmp_path, drafter):
    path = to_sglang_token_map(drafter, tmp_path / "sub" / "hot_token_ids.pt")
    hot = torch.load(path, weights_only=True)  # exactly how SGLang's load_token_map reads it ...
    hot = torch.tensor(hot, dtype=torch.int64) if not isinstance(hot, torch.Tensor) else hot.to(torch.int64)  # ... then
    assert hot.tolist() == drafter.d2t.tolist() == [0, 1, 2, *KEEP]
    assert torch.equal(load_sglang_token_map(path), drafter.d2t)
    # raw absolute ids work too; offsets-looking (unsorted) input is refused
    assert load_sglang_token_map(to_sglang_token_map([3, 7, 8], tmp_path / "raw.pt")).tolist() == [3, 7, 8]
    with pytest.raises(ValueError, match="ascending"):
        to_sglang_token_map([7, 3], tmp_path / "bad.pt")
    with pytest.raises(TypeError):
        to_sglang_token_map(torch.tensor([0.5, 1.0]), tmp_path / "bad.pt")


def test_eagle3_offsets_semantics(drafter):
    m = to_eagle3_vocab_map(drafter)
    k = drafter.config.draft_vocab_size
    assert set(m) == {"d2t", "t2d"}
    assert m["d2t"].shape == (k,) and m["d2t"].dtype == torch.int64
    assert m["t2d"].shape == (VOCAB,) and m["t2d"].dtype == torch.bool and int(m["t2d"].sum()) == k
    i = torch.arange(k)
    assert torch.equal(i + m["d2t"], drafter.d2t)  # target id = i + d2t[i]
    assert not torch.equal(m["d2t"], drafter.d2t)  # offsets, not absolute ids
    assert m["t2d"].nonzero().flatten().tolist() == drafter.d2t.tolist()
    assert torch.equal(m["t2d"], drafter.t2d >= 0)  # agrees with the drafter's own derived lookup
    assert bool((m["d2t"][1:] >= m["d2t"][:-1]).all())  # offsets are non-decreasing
    # raw ids need the target vocabulary size
    assert to_eagle3_vocab_map([1, 4], vocab_size=8)["d2t"].tolist() == [1, 3]
    with pytest.raises(ValueError, match="vocab_size"):
        to_eagle3_vocab_map([1, 4])
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        to_eagle3_vocab_map([1, 9], vocab_size=8)


def test_eagle3_round_trip(tmp_path, drafter):
    m = to_eagle3_vocab_map(drafter)
    assert torch.equal(from_eagle3_vocab_map(m["d2t"], m["t2d"]), drafter.d2t)
    assert torch.equal(from_eagle3_vocab_map(m), drafter.d2t)  # the dict form
    assert torch.equal(from_eagle3_vocab_map(m["d2t"]), drafter.d2t)  # offsets alone suffice
    path = save_eagle3_vocab_map(drafter, tmp_path / "vocab_map.safetensors")
    with safe_open(str(path), framework="pt") as f:
        assert set(f.keys()) == {"d2t", "t2d"}
        meta = f.metadata()
    assert meta["draft_vocab_size"] == str(drafter.config.draft_vocab_size) and meta["vocab_size"] == str(VOCAB)
    assert torch.equal(load_eagle3_vocab_map(path), drafter.d2t)


def test_eagle3_map_drafts_the_same_tokens(drafter):
    """The exported map gives the same target ids for the drafter's argmax as the drafter itself."""
    m = to_eagle3_vocab_map(drafter)
    with torch.no_grad():
        hidden = drafter.model(input_ids=torch.tensor([[1, 6, 9, 14]])).last_hidden_state[:, -1]
        draft_id = drafter.draft_logits(hidden).argmax(-1)
        full = drafter(input_ids=torch.tensor([[1, 6, 9, 14]])).logits[:, -1]
    assert int(draft_id + m["d2t"][draft_id]) == int(full.argmax(-1))


def test_absolute_ids_passed_as_offsets_are_detected(drafter):
    m = to_eagle3_vocab_map(drafter)
    # absolute ids read as offsets give i + id: still increasing, but inconsistent with t2d ...
    with pytest.raises(ValueError, match="absolute target ids passed as offsets"):
        from_eagle3_vocab_map(drafter.d2t, m["t2d"])
    # ... and, when high ids are kept, past the vocabulary
    with pytest.raises(ValueError, match="past the target vocabulary"):
        from_eagle3_vocab_map(drafter.d2t, vocab_size=VOCAB)
    # not offsets at all
    with pytest.raises(ValueError, match="negative offsets"):
        from_eagle3_vocab_map(torch.tensor([0, -1, 3]))
    with pytest.raises(ValueError, match="strictly increasing"):
        from_eagle3_vocab_map(torch.tensor([5, 3, 0]))
    with pytest.raises(TypeError):
        from_eagle3_vocab_map(m["d2t"], m["t2d"].long())
    with pytest.raises(ValueError, match="t2d has"):
        from_eagle3_vocab_map(m["d2t"], m["t2d"], vocab_size=VOCAB + 1)


def test_corrupt_eagle3_file_is_refused(tmp_path, drafter):
    from safetensors.torch import save_file

    m = to_eagle3_vocab_map(drafter)
    path = tmp_path / "bad.safetensors"
    save_file({"d2t": m["d2t"], "t2d": m["t2d"]}, str(path), metadata={"draft_vocab_size": "3"})
    with pytest.raises(ValueError, match="draft_vocab_size=3"):
        load_eagle3_vocab_map(path)
    save_file({"t2d": m["t2d"]}, str(path))
    with pytest.raises(KeyError, match="no `d2t`"):
        load_eagle3_vocab_map(path)


def test_export_refuses_a_drafter_with_a_broken_map(drafter):
    broken = trim_drafter(make_pair("llama", seed=2)[1], KEEP)
    broken.d2t = torch.full_like(broken.d2t, -1)  # as a checkpoint loaded without its map
    assert isinstance(broken, TrimmedDrafter)
    with pytest.raises(ValueError):
        to_eagle3_vocab_map(broken)
