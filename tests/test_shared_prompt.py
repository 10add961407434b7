"""A drafter whose body is the target's (pair G: the target trimmed to a smaller head) takes the target's prompt
cache instead of reading the prompt again (``SpeculativeEngine._take_prompt``): the target's own first step, then
the drafter's cache a copy of the target's.

What must hold: the output stays target-only's (greedy identity, sampled marginals with their power check), the
pair is recognised only where the bodies are the same (a nudged weight, another model: not), the copied cache is
the one the drafter would have computed itself, row for row and layer for layer, and the drafter never reads the
prompt where it took it (a forward hook sees every width it is fed; the same hook sees the prompt read where the
bodies differ)."""

from __future__ import annotations

import pytest
import torch
from marginals import PROMPT, check_detected, check_lossless, permuted_scatter
from tiny import VOCAB, left_padded, make_pair
from transformers import DynamicCache

import hf_vocabspec
from hf_vocabspec.generation import DraftVocabulary
from hf_vocabspec.generation.draft_step import DraftStep, engine_cache
from hf_vocabspec.generation.engine import _AlignedCache
from hf_vocabspec.modeling import cache_kwarg


def _own_body(kind: str = "llama", keep=None, seed: int = 3):
    """(target, drafter): the drafter is the target itself, trimmed to ``keep`` (default: every other id + a few)."""
    target, base = make_pair(kind, seed=seed, head_scale=8.0, noise=0.0)
    keep = keep if keep is not None else list(range(0, VOCAB, 2)) + [3, 5]
    return target, hf_vocabspec.trim_drafter(base, keep)


def _widths(drafter) -> tuple[list[int], object]:
    """Every width the drafter's body is fed (a forward hook), and the hook's handle."""
    seen: list[int] = []
    handle = drafter.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(int(kwargs["input_ids"].shape[1])), with_kwargs=True)
    return seen, handle


def test_the_same_body_is_recognised_and_only_it():
    target, drafter = _own_body()
    assert DraftStep(drafter, [], do_sample=False).same_body(target)
    plain = make_pair("llama", seed=3, head_scale=8.0, noise=0.0)[1]  # an untrimmed copy (a plain assistant)
    assert DraftStep(plain, [], do_sample=False).same_body(target)
    half = hf_vocabspec.trim_drafter(make_pair("llama", seed=3, head_scale=8.0, noise=0.0)[1].to(torch.bfloat16),
                                     list(range(VOCAB)))
    assert DraftStep(half, [], do_sample=False).same_body(target)  # the target's values in the drafter's dtype
    # power: one value nudged, another model, another architecture
    nudged = _own_body()[1]
    with torch.no_grad():
        w = nudged.model.layers[1].mlp.down_proj.weight
        w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(float("inf")))
    assert not DraftStep(nudged, [], do_sample=False).same_body(target)
    assert not DraftStep(_own_body(seed=4)[1], [], do_sample=False).same_body(target)
    assert not DraftStep(_own_body("gemma3")[1], [], do_sample=False).same_body(target)


def test_models_made_in_inference_mode_share_too():
    """Parameters made under torch.inference_mode keep no version counters (``modeling.version_of``): the pair is
    still recognised (once), and the fast linears' copies of the weights are still made and kept."""
    with torch.inference_mode():
        target, drafter = _own_body()
    prompt = torch.tensor([[4, 9, 11, 6, 20, 7]])
    out = target.generate(prompt, do_sample=False, max_new_tokens=12, assistant_model=drafter)
    assert torch.equal(out, target.generate(prompt, do_sample=False, max_new_tokens=12))
    assert drafter.last_speculation_stats.shared_prompt_cache


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_the_taken_cache_is_the_drafters_own(kind):
    """Left-padded rows of different prompts: every layer's keys and values taken from the target's cache are the
    ones the drafter's body computes over the same prompts (not another row's: the rows differ)."""
    target, drafter = _own_body(kind)
    ids, mask = left_padded([7, 4, 6])
    theirs = _AlignedCache(DynamicCache(config=target.config))
    own = _AlignedCache(DynamicCache(config=target.config))
    with torch.no_grad():
        target(input_ids=ids, attention_mask=mask, use_cache=True, **{cache_kwarg(target): theirs.cache})
        drafter.model(input_ids=ids, attention_mask=mask, use_cache=True, **{cache_kwarg(drafter.model): own.cache})
    theirs.grew(ids.shape[1])
    taken = _AlignedCache(DynamicCache(config=target.config))
    assert taken.take(theirs, torch.float32) and taken.length == ids.shape[1]
    assert len(own.cache.layers) == len(taken.cache.layers) >= 2
    for mine, copied in zip(own.cache.layers, taken.cache.layers):
        for name in ("keys", "values"):
            a, b = getattr(mine, name), getattr(copied, name)
            assert torch.allclose(a, b, atol=1e-5), (kind, name)
            assert not torch.allclose(a, b.flip(0), atol=1e-3)  # power: the rows differ
    assert not taken.take(theirs, torch.float32)  # only into an empty cache


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_static_caches_give_and_take_the_prompt(kind):
    """A static target cache (``cache_implementation="static"``) gives its prompt (output still target-only's), and
    a static drafter cache (a compiled draft step's) takes one: the buffer's first columns, its fill level moved."""
    target, drafter = _own_body(kind)
    ids, mask = left_padded([7, 4, 6])
    kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=20)
    out = target.generate(ids, assistant_model=drafter, cache_implementation="static", **kw)
    stats = drafter.last_speculation_stats
    assert torch.equal(out, target.generate(ids, **kw)) and stats.shared_prompt_cache
    assert stats.target_cache == "StaticCache"
    theirs = _AlignedCache(DynamicCache(config=target.config))
    with torch.no_grad():
        target(input_ids=ids, attention_mask=mask, use_cache=True, **{cache_kwarg(target): theirs.cache})
    theirs.grew(ids.shape[1])
    static = _AlignedCache(engine_cache(drafter.model.config, 64), capacity=64)
    assert static.static and static.take(theirs, torch.float32) and static.length == ids.shape[1]
    for given, taken in zip(theirs.cache.layers, static.cache.layers):
        assert torch.equal(given.keys, taken.keys[:, :, : ids.shape[1]])
        assert torch.equal(given.values, taken.values[:, :, : ids.shape[1]])
        assert int(taken.cumulative_length) == ids.shape[1]


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_greedy_output_is_the_targets_and_the_prompt_is_read_once(kind):
    target, drafter = _own_body(kind)
    drafter.generation_config.batched_speculation = "on"
    g = torch.Generator().manual_seed(0)
    seen, handle = _widths(drafter)
    try:
        for _ in range(4):
            prompt = torch.randint(3, VOCAB, (1, int(torch.randint(6, 14, (1,), generator=g))), generator=g)
            seen.clear()
            ref = target.generate(prompt, do_sample=False, max_new_tokens=30)
            out = target.generate(prompt, do_sample=False, max_new_tokens=30, assistant_model=drafter)
            stats = drafter.last_speculation_stats
            assert torch.equal(ref, out) and stats.shared_prompt_cache and stats.accepted > 0
            assert seen and max(seen) <= 2, seen  # the last token or two, never the prompt
        ids, mask = left_padded([9, 5, 12])
        seen.clear()
        ref = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20)
        out = target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=20,
                              assistant_model=drafter)
        assert torch.equal(ref, out) and drafter.last_speculation_stats.shared_prompt_cache
        assert max(seen) < ids.shape[1], seen
        # power: a drafter one ulp away reads the prompt itself (the hook sees it)
        with torch.no_grad():
            w = drafter.model.layers[0].mlp.up_proj.weight
            w[0, 0] = torch.nextafter(w[0, 0], torch.tensor(float("inf")))
        seen.clear()
        out = target.generate(prompt, do_sample=False, max_new_tokens=30, assistant_model=drafter)
        assert not drafter.last_speculation_stats.shared_prompt_cache and seen[0] == prompt.shape[1]
    finally:
        handle.remove()


def test_repeated_prompts_take_the_prompt_once():
    """num_return_sequences: the prompt is encoded once by the target and repeated; the drafter takes it
    (``drafter.share_prompt_cache = False``: it reads it)."""
    target, drafter = _own_body()
    seen, handle = _widths(drafter)
    try:
        torch.manual_seed(0)
        out = target.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), do_sample=True, max_new_tokens=8,
                              num_return_sequences=3, assistant_model=drafter)
        assert out.shape[0] == 3 and drafter.last_speculation_stats.shared_prompt_cache
        assert seen and max(seen) <= 2, seen
        drafter.share_prompt_cache = False  # the switch: the drafter reads the prompt (all but its last two tokens)
        seen.clear()
        target.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), do_sample=True, max_new_tokens=8,
                        num_return_sequences=3, assistant_model=drafter)
        assert not drafter.last_speculation_stats.shared_prompt_cache and seen[0] == PROMPT.shape[1] - 2
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def shared_pair():
    """The target itself trimmed so that its 2nd most likely first token is pruned (the residual's path)."""
    target, base = make_pair("llama", seed=0, head_scale=12.0, noise=0.0)
    with torch.no_grad():
        order = target(PROMPT).logits[0, -1].argsort(descending=True).tolist()
    probe = order[1]
    pruned = {probe, *[t for t in order[3:] if t != 2][:23]}
    drafter = hf_vocabspec.trim_drafter(base, [t for t in range(VOCAB) if t not in pruned])
    return target, drafter, probe


def test_sampling_with_a_shared_prompt_is_lossless(shared_pair):
    """Token 1 is the target's own step, token 2 a round's after the drafter took the prompt: both marginals are
    target-only's (chi-square, p >= 1e-3; tests/marginals.py), and the pruned probe keeps its rate."""
    target, drafter, probe = shared_pair
    check_lossless(target, drafter, {"temperature": 0.9}, pruned_probe=probe)
    stats = drafter.last_speculation_stats
    assert stats.shared_prompt_cache and stats.proposed > 0 and stats.plain_steps == 1


def test_a_wrong_law_after_a_shared_prompt_is_detected(shared_pair, monkeypatch):
    """Power: the same draws with q scattered through a permuted map fail."""
    target, drafter, probe = shared_pair
    monkeypatch.setattr(DraftVocabulary, "scatter", permuted_scatter(drafter.config.vocab_size))
    check_detected(target, drafter, {"temperature": 0.9}, pruned_probe=probe)
    assert drafter.last_speculation_stats.shared_prompt_cache
