"""Structured generation with a drafter: the exact processor contract (generation/engine.py, "stepwise").

Processors with state (xgrammar, outlines, a caller's own, ``prefix_allowed_tokens_fn``) advance per-row state by
the LAST token of each call, so they must be called exactly as target-only generate calls them: once per step,
the whole batch, every row advanced by its emitted token (pad once finished), never a rejected draft, never twice.

- ``ProtocolChecker`` (ours) fails inside generate if it is called twice for a step, a step is skipped, a row's
  earlier tokens change, a token it masked is emitted, or the row count changes; its whole call log must equal
  target-only's, through every mode of the engine (batched auto/on/off, finished rows, criteria, several return
  sequences, sampling, schedules).
- The sampled law of the first two tokens under a processor whose masks follow its own call count (state) is
  exact (tests/marginals.py threshold); power: the old protocol (processing a round's positions at once) and a
  wrong law (no residual) both fail.
- The real clients, as their users call them (xgrammar's HF processor, outlines' ``from_transformers``), on a
  tiny random model with SmolLM2's tokenizer: output identical to target-only with the same constraint.
"""

from __future__ import annotations

import json

import pytest
import torch
from marginals import PVALUE_THRESHOLD, chi2_pvalue
from tiny import EOS, VOCAB, make_pair
from tiny import left_padded as _batch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

import hf_vocabspec
from hf_vocabspec.generation import engine, vocabulary

KEEP = sorted({i for i in range(VOCAB) if i % 3 != 1} | {1, EOS})
PAD = 0


class ProtocolChecker(LogitsProcessor):
    """Masks a row- and step-dependent third of the vocabulary and checks target-only's protocol on every call."""

    def __init__(self):
        self.calls: list[torch.Tensor] = []
        self.masked: torch.Tensor | None = None

    def __call__(self, input_ids, scores):
        if self.calls:
            prev = self.calls[-1]
            assert input_ids.shape[0] == prev.shape[0], "the row count changed"
            assert input_ids.shape[1] == prev.shape[1] + 1, "called twice for a step, or a step skipped"
            assert torch.equal(input_ids[:, :-1], prev), "a row's earlier tokens changed (a rejected draft was shown)"
            last = input_ids[:, -1]
            assert not bool(self.masked.gather(1, last[:, None]).any()), "a token it masked was emitted"
        self.calls.append(input_ids.clone())
        B, V = scores.shape
        cols = torch.arange(V, device=scores.device)
        rows = torch.arange(B, device=scores.device)
        self.masked = (cols[None, :] + 2 * rows[:, None] + input_ids.shape[1]) % 3 == 0
        self.masked[:, [PAD, EOS]] = False
        return scores.masked_fill(self.masked, float("-inf"))


class RowLength(StoppingCriteria):
    """Row b stops after 3 + 2b new tokens (rows end mid-round)."""

    def __init__(self, width: int):
        self.width = width

    def __call__(self, input_ids, scores, **kwargs):
        n = input_ids.shape[1] - self.width
        return torch.tensor([n >= 3 + 2 * b for b in range(input_ids.shape[0])])


def _pair(kind: str, length: int = 4, speculation: str = "on"):
    target, base = make_pair(kind, head_scale=4.0, noise=0.05)
    target, base = target.double(), base.double()
    drafter = hf_vocabspec.trim_drafter(base, KEEP).double()
    drafter.generation_config.num_assistant_tokens = length
    drafter.generation_config.batched_speculation = speculation
    return target, drafter


# (drafter setting, generate kwargs) per case; each runs at batch 1 and 3 on llama and gemma3
CASES = {
    "greedy": ({}, {}),
    "auto": ({"speculation": "auto"}, {}),
    "off": ({"speculation": "off"}, {}),
    "long_drafts": ({"length": 7}, {}),
    "early_eos": ({}, {"eos_token_id": [EOS, 17, 30]}),
    "row_criterion": ({}, {"criterion": True}),
    "min_new_tokens": ({}, {"min_new_tokens": 6, "eos_token_id": [EOS, 17, 30]}),
    "confidence_stop": ({}, {"assistant_confidence_threshold": 0.6}),
    "heuristic_schedule": ({}, {"num_assistant_tokens_schedule": "heuristic"}),
    "with_stateless": ({}, {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3}),
}


def _run(target, drafter, ids, mask, kw, assistant):
    kw = dict(kw)
    if kw.pop("criterion", False):
        kw["stopping_criteria"] = StoppingCriteriaList([RowLength(ids.shape[1])])
    if assistant is None:
        kw.pop("assistant_confidence_threshold", None)
        kw.pop("num_assistant_tokens_schedule", None)
    checker = ProtocolChecker()
    kw.setdefault("do_sample", False)
    out = target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=16,
                          logits_processor=LogitsProcessorList([checker]), assistant_model=assistant, **kw)
    return out, checker.calls


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_called_exactly_as_target_only(kind, batch, case):
    setting, kw = CASES[case]
    target, drafter = _pair(kind, **setting)
    ids, mask = _batch([11] if batch == 1 else [7, 11, 4])
    ref, ref_calls = _run(target, drafter, ids, mask, kw, None)
    out, calls = _run(target, drafter, ids, mask, kw, drafter)
    assert torch.equal(out, ref), (ref.tolist(), out.tolist())
    assert len(calls) == len(ref_calls) and all(torch.equal(a, b) for a, b in zip(calls, ref_calls))
    stats = drafter.last_speculation_stats
    assert stats.stepwise
    if case not in ("off",):
        assert stats.proposed > stats.accepted > 0  # drafts were accepted AND rejected: both paths ran


def test_sampled_rows_follow_the_protocol():
    target, drafter = _pair("llama")
    ids, mask = _batch([7, 11, 4])
    torch.manual_seed(0)
    out, calls = _run(target, drafter, ids, mask, {"do_sample": True, "num_return_sequences": 2}, drafter)
    assert out.shape[0] == 6 and len(calls) >= 2  # ProtocolChecker raised inside generate otherwise


def test_only_known_stateless_processors_take_the_batched_path():
    from transformers.generation.logits_process import PrefixConstrainedLogitsProcessor, TopKLogitsWarper

    assert vocabulary.is_stateless(TopKLogitsWarper(3))
    assert not vocabulary.is_stateless(ProtocolChecker())
    assert not vocabulary.is_stateless(PrefixConstrainedLogitsProcessor(lambda b, s: [3], 1))

    class Sub(TopKLogitsWarper):  # a subclass may add state
        pass

    assert not vocabulary.is_stateless(Sub(3))


def test_power_the_old_protocol_is_caught(monkeypatch):
    """Calling the checker the way the engine did before (a round's positions at once) must fail."""
    monkeypatch.setattr(engine, "is_stateless", lambda proc: True)
    target, drafter = _pair("llama")
    ids, mask = _batch([7, 11, 4])
    with pytest.raises(AssertionError):
        _run(target, drafter, ids, mask, {}, drafter)


def test_power_a_row_mix_up_is_caught(monkeypatch):
    """Handing the processors the batch in another row order must change the output."""
    target, drafter = _pair("llama")
    ids, mask = _batch([7, 11, 4])
    ref, _ = _run(target, drafter, ids, mask, {}, None)
    original = engine.SpeculativeEngine._stepwise_round

    def mixed(self, L, plain):
        procs = self.processors
        self.processors = lambda ids, scores: procs(ids, scores.roll(1, 0)).roll(-1, 0)
        try:
            return original(self, L, plain)
        finally:
            self.processors = procs

    monkeypatch.setattr(engine.SpeculativeEngine, "_stepwise_round", mixed)
    try:
        out, _ = _run(target, drafter, ids, mask, {}, drafter)
    except AssertionError:
        return  # the checker caught it
    assert not torch.equal(out, ref)


# --- the sampled law under a processor with state ----------------------------------------------------------------
class CallCountMask(LogitsProcessor):
    """Masks ids = its own call count (mod 3): state, not a function of the ids (no protocol assertions)."""

    def __init__(self):
        self.count = 0

    def __call__(self, input_ids, scores):
        masked = torch.arange(scores.shape[-1]) % 3 == self.count % 3
        masked[[PAD, EOS]] = False
        self.count += 1
        return scores.masked_fill(masked, float("-inf"))


PROMPT = torch.tensor([[1, 5, 7, 12, 9]])
N = 1200


@torch.no_grad()
def _exact(target):
    def law(ctx, call):
        logits = target(ctx).logits[:, -1].float()
        logits[:, EOS] = float("-inf")  # min_new_tokens=3
        masked = torch.arange(VOCAB) % 3 == call % 3
        masked[[PAD, EOS]] = False
        return logits.masked_fill(masked, float("-inf")).softmax(-1).double()

    p1 = law(PROMPT, 0)[0]
    ctx = torch.cat([PROMPT.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], dim=1)
    return p1, p1 @ law(ctx, 1)


def _draws(target, drafter, batch=6):
    torch.manual_seed(7)
    out = []
    for _ in range(N // batch):
        seq = target.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), do_sample=True, top_k=0,
                              max_new_tokens=3, min_new_tokens=3, num_assistant_tokens=2, assistant_model=drafter,
                              num_return_sequences=batch, logits_processor=LogitsProcessorList([CallCountMask()]))
        out.append(seq[:, PROMPT.shape[1] : PROMPT.shape[1] + 2])
    return torch.cat(out)


def _pvalues(target, samples):
    p1, p2 = _exact(target)
    return chi2_pvalue(samples[:, 0], p1), chi2_pvalue(samples[:, 1], p2)


@pytest.fixture(scope="module")
def law_pair():
    target, base = make_pair("llama", head_scale=12.0)
    return target, hf_vocabspec.trim_drafter(base, KEEP)


def test_sampled_law_is_exact_under_a_processor_with_state(law_pair):
    target, drafter = law_pair
    assert min(_pvalues(target, _draws(target, drafter))) >= PVALUE_THRESHOLD
    assert drafter.last_speculation_stats.stepwise and drafter.last_speculation_stats.accepted > 0


def test_power_the_old_protocol_changes_the_law(law_pair, monkeypatch):
    monkeypatch.setattr(engine, "is_stateless", lambda proc: True)
    target, drafter = law_pair
    assert min(_pvalues(target, _draws(target, drafter))) < PVALUE_THRESHOLD


def test_power_a_wrong_law_fails(law_pair, monkeypatch):
    """Rejected drafts resampled from p instead of the residual (p - q)+: the classic bias must be caught."""
    target, drafter = law_pair
    original = engine.SpeculativeEngine._decide

    def no_residual(self, scores, entries):
        tokens, ok = original(self, scores, entries)
        p = scores.softmax(-1)
        redraw = torch.multinomial(p, 1)[:, 0].tolist()
        return [t if good or e.draft < 0 else r for t, good, e, r in zip(tokens, ok, entries, redraw)], ok

    monkeypatch.setattr(engine.SpeculativeEngine, "_decide", no_residual)
    assert min(_pvalues(target, _draws(target, drafter))) < PVALUE_THRESHOLD


# --- the real clients, as their users call them ----------------------------------------------------------------
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
REGEX = r"[0-9]{3}-[a-z]{2,5}"
TEXTS = ["Give me a JSON record for a cat.", "Answer as JSON:", "Describe a person named Bob in JSON with his age."]


@pytest.fixture(scope="module")
def client_pair():
    """A tiny random llama with SmolLM2's tokenizer (49,152 ids), float64 (no near-ties), and its trimmed copy."""
    import transformers as T

    from hf_vocabspec.evaluation.offline import load_tokenizer

    tok = load_tokenizer("offline:smollm2-135m-instruct")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    cfg = dict(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
               bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    target = T.LlamaForCausalLM(T.LlamaConfig(**cfg)).eval()
    base = T.LlamaForCausalLM(T.LlamaConfig(**cfg)).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(8.0)
        base.load_state_dict(target.state_dict())
        for p in base.parameters():
            p.add_(0.05 * p.std() * torch.randn_like(p))
    target, base = target.double(), base.double()
    for m in (target, base):
        m.generation_config.pad_token_id = tok.pad_token_id
    drafter = hf_vocabspec.trim_drafter(base, range(12000)).double()
    drafter.generation_config.batched_speculation = "on"  # (tiny models: "auto" would measure plain decoding faster)
    return target, drafter, tok


def _encode(tok, batch):
    return tok(TEXTS[:batch], return_tensors="pt", padding=True, padding_side="left")


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("grammar", ["json", "regex", "choice"])
def test_xgrammar_identical_to_target_only(client_pair, grammar, batch):
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.contrib.hf import LogitsProcessor as XgrProcessor

    target, drafter, tok = client_pair
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=target.config.vocab_size)
    compiler = xgr.GrammarCompiler(info)
    compiled = {"json": lambda: compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False),
                "regex": lambda: compiler.compile_regex(REGEX),
                "choice": lambda: compiler.compile_regex("(yes|no|maybe)")}[grammar]()
    enc = _encode(tok, batch)
    outs = [target.generate(**enc, max_new_tokens=20, do_sample=False, assistant_model=a,
                            logits_processor=[XgrProcessor(compiled)]) for a in (None, drafter)]
    assert torch.equal(outs[0], outs[1]), [tok.batch_decode(o) for o in outs]
    assert drafter.last_speculation_stats.stepwise and drafter.last_speculation_stats.accepted > 0


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("grammar", ["json", "regex", "choice"])
def test_outlines_identical_to_target_only(client_pair, grammar, batch):
    outlines = pytest.importorskip("outlines")
    from typing import Literal

    from outlines.types import JsonSchema, Regex

    target, drafter, tok = client_pair
    model = outlines.from_transformers(target, tok)
    output_type = {"json": JsonSchema(json.dumps(SCHEMA)), "regex": Regex(REGEX),
                   "choice": Literal["yes", "no", "maybe"]}[grammar]
    kw = dict(max_new_tokens=20, do_sample=False)
    if batch == 1:
        ref = model(TEXTS[0], output_type, **kw)
        out = model(TEXTS[0], output_type, assistant_model=drafter, **kw)
    else:
        ref = model.batch(TEXTS[:batch], output_type, **kw)
        out = model.batch(TEXTS[:batch], output_type, assistant_model=drafter, **kw)
    assert out == ref
    assert drafter.last_speculation_stats.stepwise


def test_constrain_drafts_must_be_a_bool(client_pair):
    from xgrammar.contrib.hf import LogitsProcessor as XgrProcessor
    import xgrammar as xgr

    target, drafter, tok = client_pair
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=target.config.vocab_size)
    grammar = xgr.GrammarCompiler(info).compile_regex(REGEX)
    drafter.generation_config.constrain_drafts = "no"
    try:
        with pytest.raises(ValueError, match=r"constrain_drafts = True or False"):
            target.generate(**_encode(tok, 1), max_new_tokens=4, do_sample=False, assistant_model=drafter,
                            logits_processor=[XgrProcessor(grammar)])
        drafter.generation_config.constrain_drafts = False
        target.generate(**_encode(tok, 1), max_new_tokens=4, do_sample=False, assistant_model=drafter,
                        logits_processor=[XgrProcessor(grammar)])
        assert drafter.last_speculation_stats.draft_constraint == ""
    finally:
        drafter.generation_config.constrain_drafts = True


@pytest.mark.parametrize("batch", [1, 3])
def test_xgrammar_sampled_rows_are_valid(client_pair, batch):
    """Sampled rows (two return sequences each) under a JSON schema: every emitted token is one the grammar allows
    (replayed through a fresh matcher), with drafts both accepted and rejected."""
    import xgrammar as xgr
    from xgrammar.contrib.hf import LogitsProcessor as XgrProcessor

    target, drafter, tok = client_pair
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=target.config.vocab_size)
                                   ).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    enc = _encode(tok, batch)
    torch.manual_seed(1)
    out = target.generate(**enc, max_new_tokens=16, do_sample=True, num_return_sequences=2, assistant_model=drafter,
                          logits_processor=[XgrProcessor(compiled)])
    stats = drafter.last_speculation_stats
    assert stats.stepwise and 0 < stats.accepted < stats.proposed
    for row in out[:, enc["input_ids"].shape[1]:].tolist():
        matcher = xgr.GrammarMatcher(compiled)
        for t in row:
            if matcher.is_terminated():
                assert t == tok.pad_token_id, tok.decode(row)
                continue
            assert matcher.accept_token(t), tok.decode(row)


def _forced_law_case(client_pair, n=1200, batch=6):
    """Tokens 1-2 sampled under a JSON schema whose first tokens the grammar forces (``{"name": "``): the exact law
    (target-only with xgrammar's processor, computed) and the draws with the drafter (forced drafts, point-mass q)."""
    import xgrammar as xgr
    from xgrammar.contrib.hf import LogitsProcessor as XgrProcessor

    target, drafter, tok = client_pair
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=target.config.vocab_size)
                                   ).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    ids = _encode(tok, 1)["input_ids"]
    V = target.config.vocab_size

    def masked(ctx, tokens):
        matcher = xgr.GrammarMatcher(compiled)
        assert all(matcher.accept_token(t) for t in tokens)
        bitmask = xgr.allocate_token_bitmask(1, V)
        matcher.fill_next_token_bitmask(bitmask, 0)
        logits = target(ctx).logits[:, -1].float()
        xgr.apply_token_bitmask_inplace(logits, bitmask)
        return logits.softmax(-1)[0].double()

    with torch.no_grad():
        p1 = masked(ids, [])
        p2 = sum(p1[t] * masked(torch.cat([ids, torch.tensor([[t]])], dim=1), [t]) for t in p1.nonzero()[:, 0].tolist())
    torch.manual_seed(3)
    draws, forced = [], 0
    for _ in range(n // batch):
        out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0, max_new_tokens=3,
                              num_return_sequences=batch, assistant_model=drafter,
                              logits_processor=[XgrProcessor(compiled)])
        draws.append(out[:, ids.shape[1] : ids.shape[1] + 2])
        forced += drafter.last_speculation_stats.forced_proposed
    samples = torch.cat(draws)
    return chi2_pvalue(samples[:, 0], p1), chi2_pvalue(samples[:, 1], p2), forced


def test_sampled_law_is_exact_with_forced_drafts(client_pair):
    """Forced drafts (the grammar's jump-forward tokens, drafted without a drafter forward) carry a point-mass q:
    the first two tokens' law stays target-only's (chi-square, marginals.py threshold)."""
    first, second, forced = _forced_law_case(client_pair)
    assert forced > 0
    assert min(first, second) >= PVALUE_THRESHOLD, (first, second)


def test_power_a_wrong_law_for_forced_drafts_fails(client_pair, monkeypatch):
    """Forced drafts verified as if drawn uniformly (q = 1/n_ids instead of a point mass) are accepted almost
    always: the same check must fail."""
    monkeypatch.setattr(engine.SpeculativeEngine, "_point_mass",
                        lambda self, idx: torch.full((*idx.shape, self.step.draft_width()), 1.0 / self.step.draft_width()))
    first, second, forced = _forced_law_case(client_pair)
    assert forced > 0
    assert min(first, second) < PVALUE_THRESHOLD, (first, second)


def test_forced_drafts_cost_no_drafter_forward_and_keep_greedy_identity(client_pair):
    """A JSON schema's keys are drafted without drafter forwards (fewer draft steps than drafts), greedy output
    identical to target-only with the same processor; with forcing off (FORCED_ROOM = 0) none is forced."""
    import xgrammar as xgr
    from xgrammar.contrib.hf import LogitsProcessor as XgrProcessor

    target, drafter, tok = client_pair
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=target.config.vocab_size)
                                   ).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    enc = _encode(tok, 1)
    kw = dict(max_new_tokens=16, do_sample=False)
    ref = target.generate(**enc, **kw, logits_processor=[XgrProcessor(compiled)])
    out = target.generate(**enc, **kw, assistant_model=drafter, logits_processor=[XgrProcessor(compiled)])
    stats = drafter.last_speculation_stats
    assert torch.equal(out, ref) and stats.forced_proposed >= 2
    assert stats.draft_steps < stats.proposed
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "FORCED_ROOM", 0)
        out = target.generate(**enc, **kw, assistant_model=drafter, logits_processor=[XgrProcessor(compiled)])
    assert torch.equal(out, ref) and drafter.last_speculation_stats.forced_proposed == 0


def test_xgrammar_replay_has_power(client_pair):
    """The replay above rejects a row the grammar forbids."""
    import xgrammar as xgr

    target, _, tok = client_pair
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=target.config.vocab_size)
                                   ).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    matcher = xgr.GrammarMatcher(compiled)
    assert not all(matcher.accept_token(t) for t in tok("name: Bob")["input_ids"])


@pytest.mark.integration
@pytest.mark.parametrize("batch", [1, 3])
def test_real_pair_xgrammar_and_outlines_identical(batch):
    """The issue's table on a real model: SmolLM2-135M-Instruct and its trimmed copy (its first 12,000 ids),
    xgrammar's JSON-schema processor and outlines' JSON schema, greedy, identical to target-only."""
    import outlines
    import xgrammar as xgr
    from outlines.types import JsonSchema
    from xgrammar.contrib.hf import LogitsProcessor as XgrProcessor

    from hf_vocabspec.evaluation.offline import load_model, load_tokenizer

    tok = load_tokenizer("offline:smollm2-135m-instruct")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    target = load_model("offline:smollm2-135m-instruct", dtype=torch.float32).eval()
    drafter = hf_vocabspec.trim_drafter(load_model("offline:smollm2-135m-instruct", dtype=torch.float32),
                                        range(12000), tokenizer=tok).eval()
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"{t} Answer as JSON with a name and an age."}],
                                       add_generation_prompt=True, tokenize=False) for t in TEXTS[:batch]]
    enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left")
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=target.config.vocab_size)
                                   ).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    outs = [target.generate(**enc, max_new_tokens=24, do_sample=False, assistant_model=a,
                            logits_processor=[XgrProcessor(compiled)]) for a in (None, drafter)]
    assert torch.equal(outs[0], outs[1]), [tok.batch_decode(o) for o in outs]
    assert drafter.last_speculation_stats.accepted > 0
    model = outlines.from_transformers(target, tok)
    kw = dict(max_new_tokens=24, do_sample=False)
    assert (model.batch(prompts, JsonSchema(json.dumps(SCHEMA)), assistant_model=drafter, **kw)
            == model.batch(prompts, JsonSchema(json.dumps(SCHEMA)), **kw))
