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


# --- one home per concept (issue #29): the typed config, runtime switches as views, the old checkpoint layout ------
def test_every_config_field_is_declared_with_a_type_and_a_docstring():
    import ast
    import inspect

    from hf_vocabspec import configuration

    tree = ast.parse(inspect.getsource(configuration.TrimmedDrafterConfig))
    body = tree.body[0].body
    fields = {}
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign):
            doc = body[i + 1] if i + 1 < len(body) else None
            fields[node.target.id] = isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
    saved = set(hf_vocabspec.TrimmedDrafterConfig().to_dict())
    ours = {"drafter_config", "vocab_size", "draft_vocab_size", "vocab_map_sha256", "target_model",
            "target_tokenizer_sha256", "base_drafter", "selection", "eval_results", "rdk", "context_tokens",
            "max_context_tokens", "context_head_size", "verify_head"}
    assert ours <= set(fields) and ours <= saved, (ours - set(fields), ours - saved)
    assert all(fields.values()), [name for name, documented in fields.items() if not documented]
    assert {"rdk", "selection", "eval_results"} <= {n for n, a in configuration.TrimmedDrafterConfig.__annotations__.items()
                                                    if any(t in str(a) for t in ("RDKInfo", "SelectionInfo",
                                                                                 "EvalResultRow"))}


def test_structured_entries_round_trip_and_old_configs_load(tmp_path, drafter):
    drafter.config.selection = {"method": "top-k by assistant-token count", "k": 5, "coverage": 0.5, "extra": [1, 2]}
    drafter.config.eval_results = [{"metric_type": "coverage", "metric_value": 0.5, "dataset_name": "d"}]
    drafter.save_pretrained(tmp_path / "d")
    loaded = TrimmedDrafter.from_pretrained(tmp_path / "d")
    assert loaded.config.selection == drafter.config.selection
    assert loaded.config.eval_results == drafter.config.eval_results
    # a config.json written before eval_results / verify_head / context fields were declared loads with defaults
    path = tmp_path / "d" / "config.json"
    cfg = json.loads(path.read_text())
    for key in ("eval_results", "verify_head", "context_tokens", "max_context_tokens", "context_head_size"):
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg))
    old = TrimmedDrafter.from_pretrained(tmp_path / "d")
    assert old.config.eval_results is None and old.use_verify_head is True and old.use_context_tokens is False


def test_runtime_switches_are_views_of_their_config_fields(tmp_path, pair):
    """One value per switch: what a call uses is what config.json saves (no second copy to drift)."""
    drafter = trim_drafter(pair[1], range(3, 30))
    assert drafter.use_context_tokens == drafter.config.context_tokens
    drafter.use_context_tokens = False
    drafter.use_verify_head = False
    assert drafter.config.context_tokens is False and drafter.config.verify_head is False
    drafter.config.verify_head = True
    assert drafter.use_verify_head is True
    drafter.save_pretrained(tmp_path / "d")
    loaded = TrimmedDrafter.from_pretrained(tmp_path / "d")
    assert loaded.use_context_tokens is False and loaded.use_verify_head is True
    assert loaded.use_rdk is False  # no kernel attached: nothing to switch on
    loaded.use_rdk = False
    with pytest.raises(ValueError, match="no RDK kernel"):
        loaded.use_rdk = True


def test_checkpoint_of_the_old_layout_loads(tmp_path, drafter):
    """A checkpoint saved before the split (auto_map naming drafter.py) loads with the package, and saving it again
    writes the new layout."""
    drafter.save_pretrained(tmp_path / "d")
    path = tmp_path / "d" / "config.json"
    cfg = json.loads(path.read_text())
    cfg["auto_map"] = {"AutoConfig": "drafter.TrimmedDrafterConfig", "AutoModelForCausalLM": "drafter.TrimmedDrafter"}
    path.write_text(json.dumps(cfg))
    for name in ("configuration.py", "modeling.py"):
        (tmp_path / "d" / name).unlink()
    (tmp_path / "d" / "drafter.py").write_text("raise ImportError('the shipped code is not used with the package')\n")
    for loaded in (AutoModelForCausalLM.from_pretrained(tmp_path / "d"), hf_vocabspec.load_drafter(tmp_path / "d"),
                   TrimmedDrafter.from_pretrained(tmp_path / "d")):
        assert isinstance(loaded, TrimmedDrafter) and torch.equal(loaded.d2t, drafter.d2t)
    loaded.save_pretrained(tmp_path / "e")
    assert json.loads((tmp_path / "e" / "config.json").read_text())["auto_map"] == {
        "AutoConfig": "configuration.TrimmedDrafterConfig", "AutoModelForCausalLM": "modeling.TrimmedDrafter"}
