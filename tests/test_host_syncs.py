"""Device-to-host reads of the speculative loop (issue #36, a lean round): counted in ``SpeculationStats.host_syncs``
(generation/host.py), one per round (0 per drafted token) at batch 1 and 4, greedy and sampled; and every read
the generation modules make goes through the counter (an audit of ``Tensor.tolist / item / __bool__ / __int__ /
nonzero`` called directly from them)."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from tiny import VOCAB, left_padded, make_pair

import hf_vocabspec
from hf_vocabspec.generation import engine

GENERATION = os.path.dirname(engine.__file__)


@pytest.fixture(scope="module")
def pair():
    target, base = make_pair("llama", seed=0)
    target.generation_config.eos_token_id = None  # every call runs its 40 tokens (EOS is a row's own matter)
    return target, hf_vocabspec.trim_drafter(base, [t for t in range(VOCAB) if t < 48 or t % 3 == 0])


@pytest.fixture
def direct_reads(monkeypatch):
    """Reads of a tensor made directly by a module of hf_vocabspec/generation other than host.py (and hooks.py:
    the call's checks before the engine starts)."""
    seen = []

    def wrap(name, original):
        def read(self, *a, **k):
            code = sys._getframe(1).f_code.co_filename
            if code.startswith(GENERATION) and os.path.basename(code) not in ("host.py", "hooks.py"):
                seen.append((os.path.basename(code), sys._getframe(1).f_lineno, name))
            return original(self, *a, **k)
        return read

    for name in ("tolist", "item", "__bool__", "__int__", "__index__", "nonzero", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, wrap(name, getattr(torch.Tensor, name)))
    return seen


def _generate(target, drafter, batch, sample, padded=False, **kw):
    if padded:
        ids, mask = left_padded([7, 4, 9, 5][:batch], seed=1)
    else:
        ids = torch.randint(3, VOCAB, (batch, 8), generator=torch.Generator().manual_seed(batch))
        mask = torch.ones_like(ids)
    torch.manual_seed(0)
    drafter.generation_config.batched_speculation = "on"
    try:
        target.generate(ids, attention_mask=mask, assistant_model=drafter, do_sample=sample, max_new_tokens=40,
                        num_assistant_tokens=5, num_assistant_tokens_schedule="constant", **kw)
    finally:
        drafter.generation_config.batched_speculation = "auto"
    return drafter.last_speculation_stats


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("batch,padded", [(1, False), (4, False), (4, True)], ids=["b1", "b4", "b4-padded"])
def test_one_host_sync_per_round(pair, batch, padded, sample, direct_reads):
    stats = _generate(*pair, batch, sample, padded=padded)
    iterations = stats.rounds + stats.plain_steps
    assert stats.rounds > 3 and stats.accepted < stats.proposed  # real rounds, with rejections
    assert stats.host_syncs == iterations  # exactly one read per round: none per drafted token
    assert stats.setup_syncs <= 5  # pad id, EOS ids, prompt padding, the kept ids (context tokens), draw counters
    assert not direct_reads, direct_reads


@pytest.mark.parametrize("kw", [
    {"repetition_penalty": 1.3},  # a stateless processor reading ids: called per verified position
    {"stop_strings": None},  # a criterion other than EOS / length: the lazy commit
    {"prefix_allowed_tokens_fn": lambda b, ids: list(range(VOCAB))},  # a processor with state: stepwise
    {"assistant_confidence_threshold": 0.5},  # the confidence stop reads once per drafted position
], ids=["repetition_penalty", "criterion", "stepwise", "confidence"])
def test_every_read_goes_through_the_counter(pair, kw, direct_reads):
    target, drafter = pair
    if "stop_strings" in kw:
        from transformers import StoppingCriteria, StoppingCriteriaList

        class Never(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return torch.zeros(input_ids.shape[0], dtype=torch.bool)

        kw = {"stopping_criteria": StoppingCriteriaList([Never()])}
    for batch in (1, 4):
        stats = _generate(target, drafter, batch, sample=False, **kw)
        assert stats.host_syncs >= stats.rounds + stats.plain_steps > 0
    assert not direct_reads, direct_reads


@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("batch", [1, 4])
def test_a_lagged_confidence_stop_reads_once_per_round(pair, batch, sample, direct_reads, monkeypatch):
    """On a GPU the confidence stop's flag is read one draft late (host.LaggedRead, forced here on CPU): the loop's
    reads are then one per round with the stop on too (0 per drafted token); the lagged reads are counted apart."""
    monkeypatch.setattr(engine, "lags_reads", lambda device: True)
    stats = _generate(*pair, batch, sample, assistant_confidence_threshold=0.5)
    assert stats.rounds > 3 and stats.lagged_reads > 0
    assert stats.host_syncs == stats.rounds + stats.plain_steps
    assert not direct_reads, direct_reads


def test_power_a_direct_read_is_caught(pair, direct_reads, monkeypatch):
    """The audit sees a read that bypasses the counter (a test that cannot fail is a defect): a stray
    ``pad_cols.tolist()`` compiled as if it were a line of engine.py."""
    scope = {}
    exec(compile("def stray(self):\n    self.pad_cols.tolist()\n", os.path.join(GENERATION, "engine.py"), "exec"), scope)
    original = engine.SpeculativeEngine._remaining

    def remaining(self):
        scope["stray"](self)
        return original(self)

    monkeypatch.setattr(engine.SpeculativeEngine, "_remaining", remaining)
    stats = _generate(*pair, 1, False)
    assert len(direct_reads) == stats.rounds and direct_reads[0][0] == "engine.py"


def test_power_an_extra_read_per_drafted_token_is_counted(pair, monkeypatch):
    """One read per drafted position (the confidence stop's) shows in the count."""
    stats = _generate(*pair, 1, False, assistant_confidence_threshold=1e-9)
    assert stats.host_syncs > stats.rounds + stats.plain_steps
