"""Serving-engine exports: SGLang hot-token map and EAGLE-3 offsets (the offset-vs-absolute trap)."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB, make_pair

from hf_vocabspec import trim_drafter
from hf_vocabspec.export import (
    from_eagle3_vocab_map,
    load_eagle3_vocab_map,
    save_eagle3_vocab_map,
    save_sglang_token_map,
    to_eagle3_vocab_map,
)


@pytest.fixture(scope="module")
def drafter():
    return trim_drafter(make_pair("llama", seed=2)[1], [5, 9, 17, 40, 63])


def test_sglang_token_map_is_the_hot_ids(tmp_path, drafter):
    path = save_sglang_token_map(drafter, tmp_path / "hot_token_ids.pt")
    hot = torch.load(path, weights_only=True)  # exactly how SGLang's load_token_map reads it
    assert hot.tolist() == drafter.d2t.tolist()


def test_eagle3_offsets_semantics_and_round_trip(tmp_path, drafter):
    m = to_eagle3_vocab_map(drafter)
    k = drafter.config.draft_vocab_size
    assert m["d2t"].shape == (k,) and m["d2t"].dtype == torch.int64
    assert m["t2d"].shape == (VOCAB,) and m["t2d"].dtype == torch.bool and int(m["t2d"].sum()) == k
    i = torch.arange(k)
    assert torch.equal(i + m["d2t"], drafter.d2t)  # target id = i + d2t[i]
    assert not torch.equal(m["d2t"], drafter.d2t)  # offsets, not absolute ids
    path = save_eagle3_vocab_map(drafter, tmp_path / "vocab_map.safetensors")
    assert torch.equal(load_eagle3_vocab_map(path), drafter.d2t)


def test_absolute_ids_passed_as_offsets_are_detected(drafter):
    # absolute ids read as offsets give i + id: still increasing, but inconsistent with t2d
    with pytest.raises(ValueError, match="disagree"):
        from_eagle3_vocab_map(drafter.d2t, to_eagle3_vocab_map(drafter)["t2d"])
    with pytest.raises(ValueError, match="strictly increasing"):
        from_eagle3_vocab_map(torch.tensor([5, 3, 0]))
