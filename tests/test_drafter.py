"""TrimmedDrafter: construction, the vocabulary map, save/load round trips and the errors users meet."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import EOS, VOCAB, make_pair
from transformers import AutoModelForCausalLM

import hf_vocabspec
from hf_vocabspec import TrimmedDrafter, VocabularyMapError, trim_drafter


@pytest.fixture(scope="module")
def pair():
    return make_pair("llama", seed=5)


@pytest.fixture()
def drafter(pair):
    return trim_drafter(pair[1], [40, 10, 11, 12, 30])


def test_keeps_exact_rows_in_d2t_order_and_forces_specials(pair, drafter):
    base = pair[1]
    assert drafter.d2t.tolist() == [0, 1, 2, 10, 11, 12, 30, 40]  # pad/bos/eos forced in, ascending
    assert drafter.config.draft_vocab_size == 8
    assert drafter.config.vocab_size == VOCAB
    x = torch.tensor([[1, 5, 9, 33]])
    with torch.no_grad():
        full = base(x).logits[0, -1]
        trimmed = drafter(x).logits[0, -1]
    assert torch.allclose(trimmed[drafter.d2t], full[drafter.d2t], atol=1e-5)
    pruned = torch.ones(VOCAB, dtype=torch.bool)
    pruned[drafter.d2t] = False
    assert torch.isinf(trimmed[pruned]).all()
    assert drafter.t2d[drafter.d2t].tolist() == list(range(8))
    assert drafter.t2d[5] == -1


def test_tied_embeddings_are_untied():
    target, base = make_pair("gemma3", seed=1)  # tied
    drafter = trim_drafter(base, range(3, 20))
    assert drafter.lm_head.weight.data_ptr() != drafter.get_input_embeddings().weight.data_ptr()
    assert drafter.get_input_embeddings().weight.shape[0] == VOCAB  # full input embeddings


def test_tokenizer_special_tokens_are_kept(pair):
    class Tok:
        all_special_ids = [7, 8]
        added_tokens_decoder = {9: type("T", (), {"special": True})(), 11: type("T", (), {"special": False})()}

        def get_vocab(self):
            return {f"t{i}": i for i in range(VOCAB)}

    drafter = trim_drafter(pair[1], [20, 21], tokenizer=Tok())
    kept = set(drafter.d2t.tolist())
    # named specials kept; a special-but-unused added token (no chat template emits it) is not forced in
    assert {7, 8, 20, 21, EOS}.issubset(kept) and 9 not in kept and 11 not in kept
    assert drafter.config.target_tokenizer_sha256


@pytest.mark.parametrize(
    "ids, match",
    [
        ([], "empty"),
        ([3, 4, VOCAB], "outside the drafter's vocabulary"),
        ([-1, 4], "outside the drafter's vocabulary"),
        ([3, 4, 4], "duplicate"),
    ],
)
def test_bad_keep_lists_are_refused(pair, ids, match):
    with pytest.raises(ValueError, match=match):
        trim_drafter(pair[1], ids)


def test_float_ids_refused(pair):
    with pytest.raises(TypeError, match="integer"):
        trim_drafter(pair[1], torch.tensor([1.0, 2.0]))


def test_trimming_twice_is_refused(drafter):
    with pytest.raises(ValueError, match="already trimmed"):
        trim_drafter(drafter, [1, 2])


def test_save_load_round_trip_safetensors_only(tmp_path, drafter):
    drafter.save_pretrained(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert "model.safetensors" in files and not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["draft_vocab_size"] == 8 and config["model_type"] == "hf_vocabspec_trimmed_drafter"
    assert "d2t" in load_file(tmp_path / "model.safetensors")
    x = torch.tensor([[1, 4, 8]])
    for loader in (TrimmedDrafter.from_pretrained, AutoModelForCausalLM.from_pretrained):
        loaded = loader(tmp_path)
        assert isinstance(loaded, TrimmedDrafter)
        assert torch.equal(loaded.d2t, drafter.d2t)
        with torch.no_grad():
            assert torch.allclose(loaded(x).logits, drafter(x).logits)
        assert loaded.generation_config.num_assistant_tokens == 5


def test_bf16_round_trip(tmp_path, pair):
    d = trim_drafter(pair[1].to(torch.bfloat16), range(10, 30))
    d.save_pretrained(tmp_path)
    loaded = TrimmedDrafter.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert loaded.lm_head.weight.dtype == torch.bfloat16
    assert torch.equal(loaded.lm_head.weight, d.lm_head.weight)
    pair[1].to(torch.float32)


def test_checkpoint_without_map_is_refused(tmp_path, drafter):
    drafter.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["d2t"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(VocabularyMapError, match="no draft->target vocabulary map"):
        TrimmedDrafter.from_pretrained(tmp_path)


def test_corrupt_map_is_refused(tmp_path, drafter):
    drafter.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights["d2t"] = weights["d2t"].clone()
    weights["d2t"][-1] = weights["d2t"][-1] + 1  # still increasing and in range: only the checksum catches it
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(VocabularyMapError, match="checksum"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_public_names_resolve():
    missing = [name for name in hf_vocabspec.__all__ if not hasattr(hf_vocabspec, name)]
    assert not missing, missing
    assert "draft_vocab_size" in hf_vocabspec.TrimmedDrafterConfig().to_dict()
