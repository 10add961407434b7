"""Context tokens: pruned ids already in the context are draftable, and output stays exactly the target's.

Same statistical method as test_lossless.py (chi-square on the first two generated tokens against the
exact target marginals, p >= 1e-3, 2,000 draws), on a Gemma-3-shaped model (tied embeddings, sliding
window, softcapping) trimmed so that the target's likely next tokens are PRUNED but occur in the prompt,
and on a Llama-shaped model with an UNTIED head (its pruned rows kept in ``context_head``).
"""

from __future__ import annotations

import pytest
import torch
from marginals import N_DRAWS, check_detected, check_lossless
from tiny import VOCAB, context_pair, make_pair  # noqa: F401

import hf_vocabspec
from hf_vocabspec.generation import DraftVocabulary


@pytest.fixture(scope="module")
def pair():
    return context_pair()


@pytest.fixture(scope="module")
def untied_pair():
    return context_pair(kind="llama")


def test_context_rows_score_like_the_untrimmed_model():
    target, base = make_pair("gemma3", seed=1)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)))
    vocab = DraftVocabulary(drafter, use_context=True, max_context=8)
    vocab.update(torch.tensor([[1, 3, 5, 3, 4, 7, 9, 11, 13, 15, 17, 19, 21]]))
    assert vocab.ids[vocab.k:].tolist() == [3, 5, 7, 9, 11, 13, 15, 17]  # odd ids are pruned; capped at 8
    hidden = torch.randn(1, base.config.hidden_size)
    full = base.lm_head(hidden)
    full = torch.tanh(full / base.config.final_logit_softcapping) * base.config.final_logit_softcapping
    torch.testing.assert_close(vocab.logits(hidden), full[:, vocab.ids])
    vocab.update(torch.tensor([[1, 3, 5, 3, 4, 7, 9, 11, 13, 15, 17, 19, 21, 23]]))
    assert vocab.num_context == 8  # full: nothing more is added


def test_sampling_with_context_tokens_is_lossless(pair):
    target, drafter, prompt, probe = pair
    check_lossless(target, drafter, {"temperature": 0.9}, pruned_probe=probe, prompt=prompt)
    proposed = 0
    for seed in range(20):  # the drafter really proposes pruned tokens from the prompt
        torch.manual_seed(seed)
        target.generate(prompt, do_sample=True, temperature=0.9, max_new_tokens=3, assistant_model=drafter)
        proposed += drafter.last_speculation_stats.context_proposed
    assert proposed > 0


def test_sampling_with_context_tokens_and_repetition_penalty_is_lossless(pair):
    target, drafter, prompt, _ = pair
    check_lossless(target, drafter, {"repetition_penalty": 1.5, "top_p": 0.95}, prompt=prompt)


def test_wrong_q_for_context_tokens_is_detected(pair, monkeypatch):
    """Power check: scatter the context tokens' q onto the wrong ids (kept part intact) -> must fail."""
    target, drafter, prompt, probe = pair

    def wrong_scatter(self, values, fill=float("-inf"), size=None):
        out = values.new_full((*values.shape[:-1], size or drafter.config.vocab_size), fill)
        ids = torch.cat([self.ids[: self.k], self.ids[self.k :].roll(1)])
        out[..., ids] = values
        return out

    monkeypatch.setattr(DraftVocabulary, "scatter", wrong_scatter)
    check_detected(target, drafter, {"temperature": 0.9}, pruned_probe=probe, prompt=prompt)


def test_greedy_identical_and_context_tokens_are_drafted():
    target, base = make_pair("gemma3", seed=3, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [3, 5])
    g = torch.Generator().manual_seed(0)
    stats = {False: [0, 0], True: [0, 0]}
    for _ in range(12):
        prompt = torch.randint(3, VOCAB, (1, int(torch.randint(4, 16, (1,), generator=g))), generator=g)
        ref = target.generate(prompt, do_sample=False, max_new_tokens=40)
        for on in (False, True):
            drafter.use_context_tokens = on
            out = target.generate(prompt, do_sample=False, max_new_tokens=40, assistant_model=drafter)
            assert torch.equal(ref, out), (on, prompt, ref, out)
            s = drafter.last_speculation_stats
            stats[on][0] += s.accepted
            stats[on][1] += s.context_proposed
    assert stats[False][1] == 0 and stats[True][1] > 0
    assert stats[True][0] > stats[False][0]  # repeats of pruned tokens get accepted now


def test_untied_drafter_refuses_context_tokens_with_the_fix():
    target, base = make_pair("llama")  # untied head, pruned rows dropped on request
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)), keep_pruned_rows=False)
    assert not drafter.supports_context_tokens and not drafter.config.context_tokens
    assert "context_head" not in drafter.state_dict()
    drafter.use_context_tokens = True
    with pytest.raises(ValueError, match="use_context_tokens = False"):
        target.generate(torch.tensor([[1, 5, 7]]), max_new_tokens=4, assistant_model=drafter)


def test_context_tokens_round_trip_in_config(tmp_path):
    _, base = make_pair("gemma3")
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)))
    drafter.config.context_tokens = True
    drafter.save_pretrained(tmp_path)
    loaded = hf_vocabspec.TrimmedDrafter.from_pretrained(tmp_path)
    assert loaded.use_context_tokens and loaded.supports_context_tokens


# --- untied heads: the pruned rows are kept in `context_head`, read only for context rows ----------------------
def test_untied_context_rows_score_like_the_untrimmed_model():
    _, base = make_pair("llama", seed=1)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)))
    assert drafter.supports_context_tokens and drafter.config.context_tokens
    assert drafter.config.context_head_size == VOCAB // 2 - 1  # the odd ids but BOS=1 (special: always kept)
    assert drafter.context_ids.tolist() == [t for t in range(VOCAB) if t not in set(drafter.d2t.tolist())]
    vocab = DraftVocabulary(drafter, use_context=True, max_context=8)
    vocab.update(torch.tensor([[1, 3, 5, 3, 4, 7, 9, 11, 13, 15, 17, 19, 21]]))
    assert vocab.ids[vocab.k:].tolist() == [3, 5, 7, 9, 11, 13, 15, 17]
    hidden = torch.randn(1, base.config.hidden_size)
    torch.testing.assert_close(vocab.logits(hidden), base.lm_head(hidden)[:, vocab.ids])
    # the head's own rows, not the (different, untied) input embedding
    assert not torch.allclose(drafter.context_head_rows(torch.tensor([3])), base.get_input_embeddings().weight[3:4])


def test_untied_greedy_identical_and_context_tokens_are_drafted():
    target, base = make_pair("llama", seed=3, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [3, 5])
    g = torch.Generator().manual_seed(0)
    stats = {False: [0, 0], True: [0, 0]}
    for _ in range(12):
        prompt = torch.randint(3, VOCAB, (1, int(torch.randint(4, 16, (1,), generator=g))), generator=g)
        ref = target.generate(prompt, do_sample=False, max_new_tokens=40)
        for on in (False, True):
            drafter.use_context_tokens = on
            out = target.generate(prompt, do_sample=False, max_new_tokens=40, assistant_model=drafter)
            assert torch.equal(ref, out), (on, prompt, ref, out)
            s = drafter.last_speculation_stats
            stats[on][0] += s.accepted
            stats[on][1] += s.context_proposed
    assert stats[False][1] == 0 and stats[True][1] > 0
    assert stats[True][0] > stats[False][0]


def test_untied_sampling_with_context_tokens_is_lossless(untied_pair):
    target, drafter, prompt, probe = untied_pair
    assert drafter.has_context_head and drafter.use_context_tokens
    check_lossless(target, drafter, {"temperature": 0.9}, pruned_probe=probe, prompt=prompt)
    proposed = 0
    for seed in range(20):
        torch.manual_seed(seed)
        target.generate(prompt, do_sample=True, temperature=0.9, max_new_tokens=3, assistant_model=drafter)
        proposed += drafter.last_speculation_stats.context_proposed
    assert proposed > 0


def test_untied_wrong_q_for_context_tokens_is_detected(untied_pair, monkeypatch):
    """Power check for the untied case: the context tokens' q scattered onto the wrong ids must fail."""
    target, drafter, prompt, probe = untied_pair

    def wrong_scatter(self, values, fill=float("-inf"), size=None):
        out = values.new_full((*values.shape[:-1], size or drafter.config.vocab_size), fill)
        ids = torch.cat([self.ids[: self.k], self.ids[self.k :].roll(1)])
        out[..., ids] = values
        return out

    monkeypatch.setattr(DraftVocabulary, "scatter", wrong_scatter)
    check_detected(target, drafter, {"temperature": 0.9}, pruned_probe=probe, prompt=prompt, n=N_DRAWS)


def test_untied_context_head_round_trips_and_keeps_output(tmp_path):
    from safetensors.torch import load_file

    target, base = make_pair("llama", seed=3, head_scale=8.0)
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [3, 5])
    drafter.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert saved["context_head"].shape == (drafter.config.context_head_size, base.config.hidden_size)
    prompt = torch.tensor([[1, 7, 9, 11, 7, 9, 13]])
    ref = target.generate(prompt, do_sample=False, max_new_tokens=30)
    for dtype in (torch.float32, torch.bfloat16):
        loaded = hf_vocabspec.TrimmedDrafter.from_pretrained(tmp_path, dtype=dtype)
        assert loaded.use_context_tokens and loaded.supports_context_tokens and loaded.has_context_head
        assert torch.equal(loaded.context_ids, drafter.context_ids)
        assert loaded.context_head.dtype == dtype
        torch.testing.assert_close(loaded.context_head.float(), drafter.context_head.to(dtype).float())
        out = target.generate(prompt, do_sample=False, max_new_tokens=30, assistant_model=loaded)
        assert torch.equal(out, ref)
        assert loaded.last_speculation_stats.context_proposed > 0


def test_untied_checkpoint_without_its_kept_rows_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    _, base = make_pair("llama")
    drafter = hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)))
    drafter.save_pretrained(tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    for drop, match in (("context_head", "context_head"), ("context_ids", "context_ids")):
        part = {k: v for k, v in weights.items() if k != drop}
        save_file(part, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
        with pytest.raises(hf_vocabspec.VocabularyMapError, match=match):
            hf_vocabspec.TrimmedDrafter.from_pretrained(tmp_path)
    overlap = dict(weights)
    overlap["context_ids"] = weights["context_ids"].clone()
    overlap["context_ids"][0] = int(drafter.d2t[1])  # a kept id: weights from two different drafters
    overlap["context_ids"] = overlap["context_ids"].sort().values
    save_file(overlap, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(hf_vocabspec.VocabularyMapError, match="overlaps|increasing"):
        hf_vocabspec.TrimmedDrafter.from_pretrained(tmp_path)


def test_untied_context_head_costs_what_the_docs_say(tmp_path):
    """Disk cost of the kept rows: (V - K) x hidden x dtype bytes more (plus the ids), measured on files."""
    _, base = make_pair("llama")
    keep = list(range(0, VOCAB, 2))
    with_rows = hf_vocabspec.trim_drafter(base, keep)
    without = hf_vocabspec.trim_drafter(base, keep, keep_pruned_rows=False)
    with_rows.save_pretrained(tmp_path / "a")
    without.save_pretrained(tmp_path / "b")
    extra = (tmp_path / "a" / "model.safetensors").stat().st_size - (tmp_path / "b" / "model.safetensors").stat().st_size
    c, h = with_rows.config.context_head_size, base.config.hidden_size
    expected = c * h * 4 + c * 8  # fp32 rows + int64 ids
    assert expected <= extra <= expected + 512  # + the two tensors' header entries
