"""generate() integration: the usual knobs, num_assistant_tokens, errors, and the hot-path rule."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB, make_pair
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.generation.streamers import BaseStreamer

from hf_vocabspec import trim_drafter
from hf_vocabspec.generation import DraftVocabulary

PROMPT = torch.tensor([[1, 6, 9, 14]])


@pytest.fixture(scope="module")
def pair():
    target, base = make_pair("llama", seed=7, head_scale=8.0)
    return target, trim_drafter(base, range(0, VOCAB - 10))


def test_num_assistant_tokens_from_drafter_config_and_from_generate(pair):
    target, drafter = pair
    drafter.generation_config.num_assistant_tokens = 3
    target.generate(PROMPT, max_new_tokens=30, assistant_model=drafter)
    stats = drafter.last_speculation_stats
    assert stats.proposed <= 3 * stats.rounds and max(stats.per_round_accepted) <= 3
    assert stats.draft_steps > stats.rounds  # really drafted several tokens per round
    target.generate(PROMPT, max_new_tokens=30, assistant_model=drafter, num_assistant_tokens=1)
    stats = drafter.last_speculation_stats
    assert stats.draft_steps == stats.rounds  # one draft per round: the generate() argument won
    drafter.generation_config.num_assistant_tokens = 5


def test_streamer_and_stopping_criteria(pair):
    target, drafter = pair

    class Collect(BaseStreamer):
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value.flatten().tolist())

        def end(self):
            self.ended = True

    class StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= PROMPT.shape[1] + 7, dtype=torch.bool)

    streamer = Collect()
    out = target.generate(
        PROMPT, max_new_tokens=40, assistant_model=drafter, streamer=streamer,
        stopping_criteria=StoppingCriteriaList([StopAfter()]),
    )
    ref = target.generate(PROMPT, max_new_tokens=40, stopping_criteria=StoppingCriteriaList([StopAfter()]))
    streamed = [t for chunk in streamer.chunks[1:] for t in chunk]  # first chunk is the prompt
    assert streamer.ended and streamed == out[0, PROMPT.shape[1]:].tolist()
    assert out.shape[1] >= PROMPT.shape[1] + 7
    assert torch.equal(out[:, : ref.shape[1]], ref)


def test_eos_stops_and_return_dict(pair):
    target, drafter = pair
    eos = int(target.generate(PROMPT, max_new_tokens=6)[0, -3])  # a token the target will produce
    kwargs = dict(max_new_tokens=30, eos_token_id=eos, return_dict_in_generate=True, output_scores=True)
    ref = target.generate(PROMPT, **kwargs)
    out = target.generate(PROMPT, assistant_model=drafter, **kwargs)
    assert torch.equal(ref.sequences, out.sequences) and out.sequences[0, -1] == eos
    assert len(out.scores) == out.sequences.shape[1] - PROMPT.shape[1]


def test_target_with_other_vocabulary_is_refused(pair):
    """A target with fewer rows than the drafter's ids (a padded target with MORE rows is accepted:
    tests/test_contract.py::test_padded_target_embedding_is_compatible_and_exact)."""
    _, drafter = pair
    other = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB - 8, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(ValueError, match="tokenizer"):
        other.generate(PROMPT, max_new_tokens=5, assistant_model=drafter)


def test_lossy_ensemble_weight_is_refused(pair):
    target, drafter = pair
    with pytest.raises(ValueError, match="lossy"):
        target.generate(PROMPT, max_new_tokens=5, assistant_model=drafter, assistant_ensemble_weight=0.5)


def test_other_assistants_still_use_hf_path(pair):
    target, _ = pair
    _, plain = make_pair("llama", seed=7, head_scale=8.0)
    ref = target.generate(PROMPT, max_new_tokens=12)
    assert torch.equal(target.generate(PROMPT, max_new_tokens=12, assistant_model=plain), ref)


def test_full_vocab_work_at_most_once_per_round(pair, monkeypatch):
    """Hot-path rule: the (1, L, V) q is built once per verification round under sampling, never under greedy."""
    target, drafter = pair
    calls = []
    original = DraftVocabulary.scatter

    def counting(self, logits, fill=float("-inf"), size=None):
        calls.append(tuple(logits.shape))
        return original(self, logits, fill, size)

    monkeypatch.setattr(DraftVocabulary, "scatter", counting)
    target.generate(PROMPT, max_new_tokens=20, assistant_model=drafter)
    assert calls == []
    torch.manual_seed(0)
    target.generate(PROMPT, max_new_tokens=20, do_sample=True, assistant_model=drafter)
    assert len(calls) == sum(n > 0 for n in drafter.last_speculation_stats.per_round_proposed)
    assert all(len(shape) == 3 for shape in calls)


def test_standalone_drafter_generates_in_target_ids(pair):
    _, drafter = pair
    out = drafter.generate(PROMPT, max_new_tokens=8, do_sample=False)
    assert set(out[0, PROMPT.shape[1]:].tolist()).issubset(set(drafter.d2t.tolist()))


