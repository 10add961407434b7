"""TrimmedDrafter: construction, the vocabulary map, save/load round trips and the errors users meet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny import EOS, VOCAB, llama_config, make_pair
from transformers import AutoModelForCausalLM, LlamaForCausalLM

import hf_vocabspec
from hf_vocabspec import TokenCounts, TrimmedDrafter, VocabularyMapError, trim_drafter
from hf_vocabspec.generation.hooks import compiles_draft_step


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
        assert loaded.generation_config.num_assistant_tokens == drafter.generation_config.num_assistant_tokens == 5


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


# --- one home per concept: the typed config, runtime switches as views, the old checkpoint layout ------------------
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
    for key in ("eval_results", "verify_head", "context_tokens", "max_context_tokens", "context_head_size",
                "compile_draft_step"):
        cfg.pop(key, None)
    path.write_text(json.dumps(cfg))
    old = TrimmedDrafter.from_pretrained(tmp_path / "d")
    assert old.config.eval_results is None and old.use_verify_head is True and old.use_context_tokens is False
    assert old.compile_draft_step is False


def test_runtime_switches_are_views_of_their_config_fields(tmp_path, pair):
    """One value per switch: what a call uses is what config.json saves (no second copy to drift)."""
    drafter = trim_drafter(pair[1], range(3, 30))
    assert drafter.use_context_tokens == drafter.config.context_tokens
    drafter.use_context_tokens = False
    drafter.use_verify_head = False
    assert drafter.config.context_tokens is False and drafter.config.verify_head is False
    drafter.config.verify_head = True
    assert drafter.use_verify_head is True
    assert drafter.compile_draft_step is False  # eager unless asked ("auto": generation/autocompile.py)
    drafter.compile_draft_step = "auto"
    assert drafter.config.compile_draft_step == "auto"
    drafter.compile_draft_step = True
    assert drafter.config.compile_draft_step is True
    with pytest.raises(ValueError, match='compile_draft_step must be True, False or "auto" .got .yes..: set drafter'):
        drafter.compile_draft_step = "yes"
    drafter.save_pretrained(tmp_path / "d")
    loaded = TrimmedDrafter.from_pretrained(tmp_path / "d")
    assert loaded.use_context_tokens is False and loaded.use_verify_head is True
    assert loaded.compile_draft_step is True  # saved on: generate runs its steps compiled (hooks.compiles_draft_step)
    assert compiles_draft_step(loaded)
    path = tmp_path / "d" / "config.json"  # an edited config.json: refused at load, in one line naming the fix
    path.write_text(json.dumps({**json.loads(path.read_text()), "compile_draft_step": "yes"}))
    with pytest.raises(ValueError, match='compile_draft_step must be True, False or "auto".*config.json'):
        TrimmedDrafter.from_pretrained(tmp_path / "d")
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


# --- bad input: tokenizers, checkpoints, dtypes; saves that keep what they did not write ----------------------------
def test_trim_drafter_refuses_a_tokenizer_of_another_model(tok, same_size_other_tok):
    small = LlamaForCausalLM(llama_config())
    with pytest.raises(ValueError, match="has 49152 tokens but the drafter's embedding has only 64 rows"):
        trim_drafter(small, torch.arange(3, 30), tokenizer=tok)
    big = LlamaForCausalLM(llama_config(vocab_size=len(tok) + 4096))
    with pytest.raises(ValueError, match="more than padding"):
        trim_drafter(big, torch.arange(3, 30), tokenizer=tok)
    wrong_eos = LlamaForCausalLM(llama_config(vocab_size=len(tok), eos_token_id=7, bos_token_id=tok.bos_token_id))
    with pytest.raises(ValueError, match="EOS id"):
        trim_drafter(wrong_eos, torch.arange(3, 30), tokenizer=tok)
    ok = LlamaForCausalLM(llama_config(vocab_size=len(tok), eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                                       pad_token_id=tok.pad_token_id))
    trim_drafter(ok, torch.arange(3, 30), tokenizer=tok)


def test_checkpoint_errors(saved, tmp_path):
    _, path = saved
    weights = path / "model.safetensors"
    state = load_file(str(weights))
    state["d2t"][4] = -5
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(VocabularyMapError, match="negative target id -5 at draft position 4"):
        TrimmedDrafter.from_pretrained(path)
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(OSError, match="truncated or corrupt"):
        TrimmedDrafter.from_pretrained(path)
    (path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        TrimmedDrafter.from_pretrained(path)


def test_checkpoint_check_accepts_architectures_with_other_field_names(tmp_path):
    """GPT-2 spells hidden_size/num_hidden_layers n_embd/n_layer: the config-vs-weights check must not refuse it."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=64, bos_token_id=1,
                                      eos_token_id=2)).eval()
    drafter = trim_drafter(base, torch.arange(3, 30))
    drafter.save_pretrained(tmp_path / "gpt2")
    loaded = TrimmedDrafter.from_pretrained(tmp_path / "gpt2", dtype=torch.float16)
    assert torch.equal(loaded.d2t, drafter.d2t) and {p.dtype for p in loaded.parameters()} == {torch.float16}


def test_save_pretrained_is_atomic_and_keeps_other_files(saved, monkeypatch):
    drafter, path = saved
    (path / "tokenizer.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()}

    def broken(self, directory, *args, **kwargs):
        (Path(directory) / "config.json").write_text("{}")  # half written, then interrupted
        raise KeyboardInterrupt

    monkeypatch.setattr(TrimmedDrafter.__mro__[1], "save_pretrained", broken)
    with pytest.raises(KeyboardInterrupt):
        drafter.save_pretrained(path)
    assert {p.name: p.read_bytes() for p in path.iterdir() if p.is_file()} == before  # the old one, whole
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no temp left
    with pytest.raises(KeyboardInterrupt):
        drafter.save_pretrained(path.parent / "new")
    assert not (path.parent / "new").exists()  # nothing, never a config without weights
    monkeypatch.undo()
    drafter.save_pretrained(path)
    assert (path / "tokenizer.json").read_text() == "{}"
    assert torch.equal(TrimmedDrafter.from_pretrained(path).d2t, drafter.d2t)


def test_an_earlier_output_of_ours_is_accepted_and_anything_added_refused(saved, tok, tmp_path):
    from hf_vocabspec.cli._common import UsageError, prepare_output

    _, path = saved
    tok.save_pretrained(path)
    (path / "custom_generate").mkdir()
    (path / "custom_generate" / "generate.py").write_text("")
    assert prepare_output(str(path), "drafter") == path
    (tmp_path / "empty").mkdir()
    assert prepare_output(str(tmp_path / "empty"), "drafter") == tmp_path / "empty"
    (path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="it holds notes.txt"):
        prepare_output(str(path), "drafter")
    assert prepare_output(str(path), "drafter", overwrite=True) == path
    bench = tmp_path / "bench"
    bench.mkdir()
    for name in ("results.json", "results.md", "throughput_vs_vocab.png"):
        (bench / name).write_text("{}")
    assert prepare_output(str(bench), "bench") == bench
    with pytest.raises(UsageError, match="not an earlier hf-vocabspec tune output"):
        prepare_output(str(bench), "tune")


def test_save_pretrained_keeps_every_file_it_did_not_write(saved):
    drafter, path = saved
    mine = {"notes.txt": b"n", "helper.py": b"x = 1", "embeddings.safetensors": b"not ours", "src/main.py": b"m"}
    for name, data in mine.items():
        (path / name).parent.mkdir(exist_ok=True)
        (path / name).write_bytes(data)
    (path / "model-00001-of-00002.safetensors").write_bytes(b"stale shard of an earlier save")
    (path / "model.safetensors.index.json").write_text("{}")
    drafter.save_pretrained(path)
    for name, data in mine.items():
        assert (path / name).read_bytes() == data, name
    assert not (path / "model-00001-of-00002.safetensors").exists()  # only our own stale weights go
    assert not (path / "model.safetensors.index.json").exists()
    assert torch.equal(TrimmedDrafter.from_pretrained(path).d2t, drafter.d2t)


def test_a_folder_for_a_file_and_a_file_for_a_folder(tmp_path, saved):
    with pytest.raises(ValueError, match="is a folder, not a counts file"):
        TokenCounts.load(tmp_path)
    _, path = saved
    with pytest.raises(FileNotFoundError, match="is a file: pass the folder"):
        TrimmedDrafter.from_pretrained(path / "model.safetensors")
    LlamaForCausalLM(llama_config()).save_pretrained(tmp_path / "plain")
    with pytest.raises(OSError, match="is not a trimmed drafter .*model_type 'llama'"):
        TrimmedDrafter.from_pretrained(tmp_path / "plain")


@pytest.fixture
def bf16_saved(tmp_path):
    """A drafter trimmed from a bf16 base whose config says bfloat16 (as a real bf16 checkpoint's does)."""
    from tiny import make_pair

    target, base = make_pair()
    base = base.to(torch.bfloat16)
    base.config.dtype = base.model.config.dtype = torch.bfloat16
    trim_drafter(base, torch.arange(3, 40)).save_pretrained(tmp_path / "bf16")
    return target, tmp_path / "bf16"


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_from_pretrained_dtype_converts_the_whole_drafter(bf16_saved, dtype):
    target, path = bf16_saved
    drafter = TrimmedDrafter.from_pretrained(path, dtype=dtype)
    assert {p.dtype for p in drafter.parameters()} == {dtype}  # body AND head
    ids = torch.tensor([[1, 5, 6, 7]])
    out = target.generate(ids, assistant_model=drafter, max_new_tokens=8, do_sample=False)
    assert torch.equal(out, target.generate(ids, max_new_tokens=8, do_sample=False))


def test_batched_speculation_survives_save_and_load_and_one_home(tmp_path):
    from hf_vocabspec import configuration
    from hf_vocabspec.generation import engine

    assert engine.SPECULATION_MODES is configuration.SPECULATION_MODES  # one home of the valid values
    torch.manual_seed(0)
    drafter = trim_drafter(LlamaForCausalLM(llama_config()), torch.arange(3, 30))
    for value in ("off", "on", "auto"):
        drafter.generation_config.batched_speculation = value
        drafter.save_pretrained(tmp_path / value)
        assert TrimmedDrafter.from_pretrained(tmp_path / value).generation_config.batched_speculation == value
    # saved before the fix: transformers drops unknown fields of a file marked _from_model_config
    gen = tmp_path / "off" / "generation_config.json"
    gen.write_text(json.dumps(json.loads(gen.read_text()) | {"_from_model_config": True}))
    assert TrimmedDrafter.from_pretrained(tmp_path / "off").generation_config.batched_speculation == "off"


def test_invalid_batched_speculation_is_refused_at_load_save_and_batch_1(tmp_path):
    from hf_vocabspec.configuration import check_batched_speculation
    from tiny import make_pair

    assert check_batched_speculation("on") == "on"
    with pytest.raises(ValueError, match=r"batched_speculation must be one of \('auto', 'on', 'off'\) \(got 'maybe'\)"):
        check_batched_speculation("maybe")
    target, base = make_pair()
    drafter = trim_drafter(base, torch.arange(3, 40))
    drafter.save_pretrained(tmp_path / "d")
    gen = tmp_path / "d" / "generation_config.json"
    gen.write_text(json.dumps(json.loads(gen.read_text()) | {"batched_speculation": "maybe"}))
    with pytest.raises(ValueError, match="got 'maybe'.*edit generation_config.json") as err:
        TrimmedDrafter.from_pretrained(tmp_path / "d")
    assert "\n" not in str(err.value)
    drafter.generation_config.batched_speculation = "maybe"
    with pytest.raises(ValueError, match="got 'maybe'"):
        drafter.save_pretrained(tmp_path / "e")
    assert not (tmp_path / "e").exists()
    with pytest.raises(ValueError, match="got 'maybe'"):  # batch 1: never read there, refused all the same
        target.generate(torch.tensor([[1, 5, 6]]), assistant_model=drafter, max_new_tokens=3, do_sample=False)


def test_fresh_drafter_drafts_up_to_12_and_stops_below_confidence_0_4(pair, library_draft_defaults):
    """The library's draft policy (configuration.DEFAULT_*): written by trim_drafter, kept by a save, active in
    generate (rounds end early on an unsure draft, output unchanged), and turned off by generate(threshold=0)."""
    from hf_vocabspec.configuration import DEFAULT_CONFIDENCE_THRESHOLD, DEFAULT_NUM_ASSISTANT_TOKENS

    target, base = pair
    drafter = trim_drafter(base, range(VOCAB))
    drafter.adapt_confidence_threshold = False  # the configured stop (generation/confidence.py adapts it)
    gc = drafter.generation_config
    assert (DEFAULT_NUM_ASSISTANT_TOKENS, DEFAULT_CONFIDENCE_THRESHOLD) == (12, 0.4)
    assert (gc.num_assistant_tokens, gc.assistant_confidence_threshold, gc.num_assistant_tokens_schedule) == \
        (12, 0.4, "constant")
    ids = torch.tensor([[1, 6, 9, 14, 3]])
    ref = target.generate(ids, max_new_tokens=40, do_sample=False)
    kw = dict(max_new_tokens=40, do_sample=False, assistant_model=drafter)
    assert torch.equal(target.generate(ids, **kw), ref)
    stopped = drafter.last_speculation_stats.per_round_proposed
    assert max(stopped) <= 12 and any(0 < p < 12 for p in stopped[:-1]), stopped  # the stop ended rounds early
    assert torch.equal(target.generate(ids, assistant_confidence_threshold=0.0, **kw), ref)
    full = drafter.last_speculation_stats.per_round_proposed
    assert full[0] == 12 and sum(full) > sum(stopped), (full, stopped)  # no stop: every round drafts all it may
