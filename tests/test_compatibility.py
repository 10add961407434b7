"""hf_vocabspec.compatibility: the one check that a drafter fits a target and tokenizer, and its one error.

Callers (generate, SSD sessions, load_drafter, the CLI, lm-eval) are tested where they live (test_generation.py,
test_cli.py, test_ssd.py, test_hub.py, test_lmeval.py); here the rule itself, and the first-line helper's one home."""

from __future__ import annotations

import types

import pytest
import torch
from tiny import VOCAB, llama_config
from transformers import LlamaForCausalLM

from hf_vocabspec import DrafterMismatchError, VocabularyMapError, check_compatibility, trim_drafter
from hf_vocabspec._io import first_line
from hf_vocabspec.compatibility import check_same_tokenizer, compatibility_error, target_rows, tokenizer_sha256


class Tok:
    """A duck-typed tokenizer: its token -> id table is all the fingerprint reads."""

    all_special_ids: list[int] = []

    def __init__(self, n: int = VOCAB, swap: bool = False):
        self.vocab = {f"t{i}": i for i in range(n)}
        if swap:
            self.vocab["t5"], self.vocab["t6"] = 6, 5
        self.name_or_path = "tok-swapped" if swap else "tok"

    def get_vocab(self):
        return dict(self.vocab)

    def __len__(self):
        return len(self.vocab)


@pytest.fixture(scope="module")
def drafter():
    torch.manual_seed(0)
    return trim_drafter(LlamaForCausalLM(llama_config()).eval(), range(3, 30), tokenizer=Tok())


def test_ids_inside_the_target_rows_fit_padded_targets_included(drafter):
    assert compatibility_error(drafter, target=LlamaForCausalLM(llama_config()).eval()) is None
    padded = LlamaForCausalLM(llama_config(vocab_size=VOCAB + 64)).eval()  # Qwen2.5-7B vs its 0.5B drafter, small
    assert target_rows(padded) == VOCAB + 64
    check_compatibility(drafter, target=padded, tokenizer=Tok())  # same tokenizer, more rows: compatible
    check_compatibility(drafter, target=VOCAB + 8)  # rows given as a number
    with pytest.raises(DrafterMismatchError, match=f"trimmed for a {VOCAB}-token vocabulary .* has {VOCAB - 8} rows"):
        check_compatibility(drafter, target=LlamaForCausalLM(llama_config(vocab_size=VOCAB - 8)).eval())


def test_the_tokenizer_must_be_the_one_recorded_at_trim_time(drafter):
    assert drafter.config.target_tokenizer_sha256 == tokenizer_sha256(Tok())
    check_compatibility(drafter, tokenizer=Tok())
    check_compatibility(drafter, tokenizer=tokenizer_sha256(Tok()))  # a fingerprint given as such
    with pytest.raises(DrafterMismatchError, match="'tok-swapped' is not the one .* fingerprints differ") as err:
        check_compatibility(drafter, tokenizer=Tok(swap=True), fix="pass the target's tokenizer")
    assert str(err.value).endswith(": pass the target's tokenizer.") and "\n" not in str(err.value)
    assert isinstance(err.value, VocabularyMapError) and isinstance(err.value, ValueError)  # one family
    unrecorded = types.SimpleNamespace(config=types.SimpleNamespace(vocab_size=VOCAB, target_model=None,
                                                                    target_tokenizer_sha256=None))
    check_compatibility(unrecorded, tokenizer=Tok(swap=True))  # nothing recorded: nothing to compare


def test_a_tokenizer_changed_in_place_is_fingerprinted_again(drafter):
    tok = Tok()
    check_compatibility(drafter, tokenizer=tok)  # cached for this object
    tok.vocab["extra"] = VOCAB  # add_tokens
    with pytest.raises(DrafterMismatchError, match="fingerprints differ"):
        check_compatibility(drafter, tokenizer=tok)


def test_two_models_share_a_tokenizer_or_an_embedding_size():
    check_same_tokenizer(Tok(), Tok(), what="--drafter d", other_name="the target t")
    with pytest.raises(DrafterMismatchError, match="--drafter d uses another tokenizer than the target t"):
        check_same_tokenizer(Tok(swap=True), Tok(), what="--drafter d", other_name="the target t")
    check_same_tokenizer(VOCAB + 64, Tok(), what="--target t", other_name="the drafter d")  # padded rows
    with pytest.raises(DrafterMismatchError, match="has a 49,152-token vocabulary but the drafter d has a 64-token"):
        check_same_tokenizer(49152, Tok(), what="--target t", other_name="the drafter d")


def test_first_line_is_one_helper():
    err = ValueError("\n  first line  \nsecond")
    assert first_line(err) == "first line"
    assert first_line(err, with_type=True) == "ValueError: first line"
    assert first_line(KeyError()) == "KeyError" and first_line(RuntimeError(""), with_type=True) == "RuntimeError: "
    assert first_line(ValueError("x" * 300), 50) == "x" * 47 + "..."


def _word_tokenizer(swap: bool = False):
    """A real (saveable) tokenizer over the tiny vocabulary; ``swap`` exchanges two ids (same size, other table)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(VOCAB)}
    if swap:
        vocab["t5"], vocab["t6"] = 6, 5
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")))


def test_generate_compares_the_tokenizer_saved_with_the_target(tmp_path):
    """No tokenizer= passed: generate compares the tokenizer saved beside the target (its folder) with the one the
    drafter was trimmed with, and refuses another in one line naming the folder (this ran silently, every draft
    wasted); the same tokenizer, or a target with no folder at hand, runs."""
    from hf_vocabspec.compatibility import target_tokenizer_fingerprint

    torch.manual_seed(0)
    target = LlamaForCausalLM(llama_config()).eval()
    drafter = trim_drafter(LlamaForCausalLM(llama_config()).eval(), range(3, 30), tokenizer=_word_tokenizer())
    for name, swap in (("same", False), ("other", True)):
        target.save_pretrained(tmp_path / name)
        _word_tokenizer(swap).save_pretrained(tmp_path / name)
    prompt = torch.tensor([[3, 4, 5, 6]])
    kw = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False, assistant_model=drafter)
    ref = target.generate(prompt, attention_mask=kw["attention_mask"], max_new_tokens=4, do_sample=False)
    assert torch.equal(target.generate(prompt, **kw), ref)  # built in memory: nothing at hand to compare
    same = LlamaForCausalLM.from_pretrained(tmp_path / "same").eval()
    assert target_tokenizer_fingerprint(same) == (tokenizer_sha256(_word_tokenizer()), str(tmp_path / "same"))
    assert torch.equal(same.generate(prompt, **kw), ref)
    other = LlamaForCausalLM.from_pretrained(tmp_path / "other").eval()
    with pytest.raises(DrafterMismatchError) as err:
        other.generate(prompt, **kw)
    line = str(err.value)
    assert "fingerprints differ" in line and f"saved with the target ({tmp_path / 'other'})" in line
    assert "trim_drafter" in line and "\n" not in line
    assert torch.equal(other.generate(prompt, tokenizer=_word_tokenizer(), **kw), ref)  # the tokenizer given decides
