"""transformers' generate contract, exactly: one case table (architectures x batch sizes x generate kwargs), each
case's WHOLE output compared token for token (pads and length included) with ``target.generate(**same_kwargs)``
without an assistant, and the streamer's puts compared one by one.

Row-dependent processors and criteria are the point: structured-generation processors key per-row state on the
row index, evaluation harnesses' stop criteria track every row of the batch (lm-eval's returns ONE bool: all
rows done), ``prefix_allowed_tokens_fn`` receives the row's batch index. Power checks: handing the processors
the rows in another order, or not ending a row where its criterion fired, must make a case differ. Tiny float64
models (float32 for the MoE ones), so no near-tie can flip an argmax between the two layouts.
"""

from __future__ import annotations

import os
import string

import pytest
import torch
import transformers as T
from tiny import EOS, VOCAB, fake_compile
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

import hf_vocabspec
from hf_vocabspec import kernels
from hf_vocabspec.generation import engine

_COMMON = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=EOS, pad_token_id=0)
_SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256)
ARCHS = {
    "llama": lambda: T.LlamaConfig(**_SMALL, tie_word_embeddings=False, **_COMMON),
    "gemma3": lambda: T.Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=4,
                                         layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                         max_position_embeddings=256, final_logit_softcapping=30.0, **_COMMON),
    "gpt2": lambda: T.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=256, **_COMMON),
    "bloom": lambda: T.BloomConfig(hidden_size=32, n_layer=2, n_head=4, **_COMMON),  # alibi
    "codegen": lambda: T.CodeGenConfig(n_embd=32, n_layer=2, n_head=4, n_positions=256, rotary_dim=4, **_COMMON),
    "lfm2": lambda: T.Lfm2Config(**{**_SMALL, "num_hidden_layers": 3}, layer_types=["conv", "full_attention", "conv"],
                                 **_COMMON),  # a convolution cache layer
    "lfm2_moe": lambda: T.Lfm2MoeConfig(**{**_SMALL, "num_hidden_layers": 3}, moe_intermediate_size=32, num_experts=4,
                                        num_experts_per_tok=2, num_dense_layers=1,
                                        layer_types=["conv", "full_attention", "conv"], **_COMMON),
    "deepseek_v32": lambda: T.DeepseekV32Config(**{**_SMALL, "num_key_value_heads": 4}, moe_intermediate_size=32,
                                                n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                                kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, v_head_dim=8,
                                                qk_nope_head_dim=8, head_dim=8, index_topk=64, index_head_dim=8,
                                                index_n_heads=2, first_k_dense_replace=1, **_COMMON),  # indexer cache
    "mixtral": lambda: T.MixtralConfig(**_SMALL, num_local_experts=4, num_experts_per_tok=2, **_COMMON),
    "llama4": lambda: T.Llama4TextConfig(**_SMALL, head_dim=8, intermediate_size_mlp=64, num_local_experts=2,
                                         **_COMMON),
}
# float32: bloom's float64 mask gives NaN logits to left-padded rows in target-only generate itself. MoE models
# run their experts eagerly (the grouped matmul has no float64 kernel).
FLOAT32 = {"bloom"}
KEEP = sorted({i for i in range(VOCAB) if i % 3 != 1} | {1, EOS})
CHARS = (string.ascii_letters + string.digits)[: VOCAB - 3]


def char_tokenizer() -> T.PreTrainedTokenizerFast:
    """A real fast tokenizer over the tiny vocabulary: one character per token (ids 3..63), for stop strings and
    the pipeline."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.decoder = decoders.Fuse()
    return T.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                     padding_side="left")


_PAIRS: dict[str, tuple] = {}
# The whole contract runs on a GPU too: HF_VOCABSPEC_TEST_DEVICE=cuda (models and inputs there, same comparisons).
DEVICE = torch.device(os.environ.get("HF_VOCABSPEC_TEST_DEVICE", "cpu"))


def pair(arch: str):
    if arch not in _PAIRS:
        dtype = torch.float32 if arch in FLOAT32 else torch.float64
        torch.manual_seed(0)
        config = ARCHS[arch]()
        config._experts_implementation = "eager"
        target = T.AutoModelForCausalLM.from_config(config).eval().to(dtype)
        base = T.AutoModelForCausalLM.from_config(config).eval().to(dtype)
        with torch.no_grad():
            base.load_state_dict(target.state_dict())
            for p in base.parameters():
                p.add_(0.05 * p.std() * torch.randn_like(p))
            target.get_output_embeddings().weight.mul_(4.0)
        target.generation_config.pad_token_id = 0
        drafter = hf_vocabspec.trim_drafter(base, KEEP).to(dtype)
        target, drafter = target.to(DEVICE), drafter.to(DEVICE)
        drafter.generation_config.num_assistant_tokens = 4
        drafter.generation_config.batched_speculation = "on"
        _PAIRS[arch] = (target, drafter)
    return _PAIRS[arch]


def prompts(batch: int):
    """Left-padded prompts of unequal lengths (batch 3), or the longest alone (batch 1)."""
    g = torch.Generator().manual_seed(1)
    lengths = [7, 11, 4][:batch] if batch > 1 else [9]
    P = max(lengths)
    ids = torch.zeros(batch, P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, P - n :] = torch.randint(3, VOCAB, (n,), generator=g)
        mask[i, P - n :] = 1
    return ids.to(DEVICE), mask.to(DEVICE)


# --- row-dependent processors and criteria (fresh objects per generate call) --------------------------------
class RowBan(LogitsProcessor):
    """Row b may not emit its b likeliest tokens: keyed by the row index, as structured generation is."""

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        for b in range(input_ids.shape[0]):
            if b:
                scores[b, scores[b].topk(b).indices] = float("-inf")
        return scores


class AllRowsDone(StoppingCriteria):
    """lm-eval's stop-sequence criterion, in miniature: tracks every row of the batch past the prompt width and
    answers ONE bool (all rows done). A row is done once it generated 3 + 2b tokens or a token divisible by 11."""

    def __init__(self, prompt_width: int, batch: int):
        self.width, self.done = prompt_width, [False] * batch

    def __call__(self, input_ids, scores, **kwargs):
        for b, row in enumerate(input_ids[:, self.width :].tolist()):
            self.done[b] = self.done[b] or len(row) >= 3 + 2 * b or any(t % 11 == 0 for t in row)
        return all(self.done)


class RowLength(StoppingCriteria):
    """Row b stops after 3 + 2b new tokens: rows end at different lengths, in the middle of rounds."""

    def __init__(self, prompt_width: int):
        self.width = prompt_width

    def __call__(self, input_ids, scores, **kwargs):
        n = input_ids.shape[1] - self.width
        return torch.tensor([n >= 3 + 2 * b for b in range(input_ids.shape[0])], device=input_ids.device)


def allowed(batch_id: int, sent: torch.Tensor) -> list[int]:
    """prefix_allowed_tokens_fn: row b draws from ids = b (mod 3), and from ids past its last token's (mod 5)."""
    last = int(sent[-1])
    return [t for t in range(3, VOCAB) if t % 3 == batch_id % 3 or t % 5 == last % 5] + [EOS]


class Collect(BaseStreamer):
    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.clone())

    def end(self):
        self.ended = True


def _free(target, ids, mask) -> torch.Tensor:
    return target.generate(input_ids=ids, attention_mask=mask, max_new_tokens=14, do_sample=False)[:, ids.shape[1] :]


CASES = {
    "greedy": lambda ctx: {},
    "repetition_penalty": lambda ctx: dict(repetition_penalty=1.6),
    "no_repeat_ngram": lambda ctx: dict(no_repeat_ngram_size=2),
    "bad_words": lambda ctx: dict(bad_words_ids=[[int(ctx["free"][0, 2])], [5, 8]]),
    "min_new_tokens": lambda ctx: dict(min_new_tokens=8, eos_token_id=[EOS, int(ctx["free"][-1, 1])]),
    "several_eos": lambda ctx: dict(eos_token_id=[EOS, int(ctx["free"][-1, 3]), int(ctx["free"][0, 5])]),
    "stop_strings": lambda ctx: dict(stop_strings=[ctx["tok"].decode(ctx["free"][0, 4:6])], tokenizer=ctx["tok"]),
    "suppress_tokens": lambda ctx: dict(suppress_tokens=[int(ctx["free"][0, 1]), 9]),
    "sequence_bias": lambda ctx: dict(sequence_bias={(int(ctx["free"][0, 0]),): -8.0, (12,): 4.0}),
    "forced_eos": lambda ctx: dict(forced_eos_token_id=EOS, max_new_tokens=9),
    "max_length": lambda ctx: dict(max_length=ctx["P"] + 7, max_new_tokens=None),
    "row_processor": lambda ctx: dict(logits_processor=LogitsProcessorList([RowBan()])),
    "lm_eval_criterion": lambda ctx: dict(stopping_criteria=StoppingCriteriaList([AllRowsDone(ctx["P"], ctx["B"])])),
    "row_criterion": lambda ctx: dict(stopping_criteria=StoppingCriteriaList([RowLength(ctx["P"])])),
    "prefix_allowed_tokens_fn": lambda ctx: dict(prefix_allowed_tokens_fn=allowed),
    "confidence_threshold": lambda ctx: dict(assistant_confidence_threshold=0.5),
}
_FREE: dict[tuple, torch.Tensor] = {}


def run_case(arch: str, batch: int, case: str, **extra):
    """(target-only output, speculative output) of one case, each with fresh processor / criterion objects
    (``extra``: more generate kwargs for both)."""
    target, drafter = pair(arch)
    ids, mask = prompts(batch)
    if (arch, batch) not in _FREE:
        _FREE[arch, batch] = _free(target, ids, mask)
    ctx = {"free": _FREE[arch, batch], "tok": char_tokenizer(), "P": ids.shape[1], "B": batch}
    outs = []
    for assistant in (None, drafter):
        kw = {"max_new_tokens": 14, **CASES[case](ctx), **extra}
        kw = {k: v for k, v in kw.items() if v is not None}
        if assistant is None:
            kw.pop("assistant_confidence_threshold", None)
        outs.append(target.generate(input_ids=ids, attention_mask=mask, do_sample=False, assistant_model=assistant,
                                    **kw))
    return outs


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_identical_to_target_only(arch, batch, case):
    ref, out = run_case(arch, batch, case)
    assert out.shape == ref.shape and torch.equal(out, ref), (ref.tolist(), out.tolist())


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("arch", ["llama", "gemma3", "lfm2"])
def test_streamer_sees_what_target_only_streams(arch, batch):
    target, drafter = pair(arch)
    ids, mask = prompts(batch)
    streams = []
    for assistant in (None, drafter):
        streamer = Collect()
        target.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12, streamer=streamer,
                        assistant_model=assistant, stopping_criteria=StoppingCriteriaList([RowLength(ids.shape[1])]))
        assert streamer.ended
        streams.append(streamer.puts)
    ref, out = streams
    assert len(out) == len(ref) and all(torch.equal(a, b) for a, b in zip(ref, out))



class InferenceProbe(LogitsProcessor):
    """Records whether each call ran under torch.inference_mode (and changes nothing)."""

    def __init__(self):
        self.modes = []

    def __call__(self, input_ids, scores):
        self.modes.append(torch.is_inference_mode_enabled())
        return scores


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_loop_runs_in_inference_mode_and_hands_back_plain_tensors(arch):
    """The engine's loop runs under torch.inference_mode where the target's cache is dynamic
    (``hooks.runs_in_inference_mode``: no autograd bookkeeping on a round's small ops); with a static cache, which
    transformers may keep for the next call and write in place, or ``drafter.use_inference_mode = False``, it keeps
    generate's no_grad. Either way the caller gets plain tensors back (writable in place, as target-only's are), the
    next target-only call on the same model runs, and the output is target-only's."""
    target, drafter = pair(arch)
    ids, mask = prompts(1)
    try:
        for extra, switch, expected in (({}, True, True), ({"cache_implementation": "static"}, True, False),
                                        ({}, False, False)):
            drafter.use_inference_mode = switch
            kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=8,
                      return_dict_in_generate=True, output_scores=True, **extra)
            probe = InferenceProbe()
            out = target.generate(**kw, assistant_model=drafter, logits_processor=LogitsProcessorList([probe]))
            assert probe.modes and set(probe.modes) == {expected}, probe.modes
            assert not out.sequences.is_inference() and not any(s.is_inference() for s in out.scores)
            ref = target.generate(**kw)  # target-only after it, on the model (and cache) the engine used
            assert torch.equal(out.sequences, ref.sequences)
            out.sequences[0, -1] = 0
            out.scores[0].zero_()
    finally:
        drafter.__dict__.pop("use_inference_mode", None)

def test_text_generation_pipeline_batches_exactly():
    target, drafter = pair("llama")
    tok = char_tokenizer()
    pipe = T.pipeline("text-generation", model=target, tokenizer=tok)
    texts = ["abcQ", "Zz9", "hello1"]
    kw = dict(batch_size=3, max_new_tokens=10, do_sample=False, return_full_text=False)
    ref = pipe(texts, **kw)
    out = pipe(texts, assistant_model=drafter, **kw)
    assert out == ref
    assert drafter.last_speculation_stats.batch_size == 3


def test_finished_rows_are_compacted_out_invisibly():
    """Rows that end early leave the compute batch; what processors and criteria see still has all rows."""
    ref, out = run_case("llama", 3, "row_criterion")
    assert torch.equal(out, ref)
    target, drafter = pair("llama")
    assert drafter.last_speculation_stats.row_rounds < 3 * drafter.last_speculation_stats.rounds


# --- power: the comparison catches a wrong row and a stop that is not honoured -------------------------------
def test_power_row_by_row_processing_differs(monkeypatch):
    """The old loop's bug: processors called one row at a time (every row sees itself as row 0). RowBan is taken
    for stateless here so the round's positions are processed at once (``_process_target``); the stepwise path's
    own row mix-up check is in test_structured.py."""
    monkeypatch.setattr(engine, "is_stateless", lambda proc: True)

    def row_by_row(self, logits, drafts):
        out = logits.clone()
        for i, r in enumerate(self.row_list):
            for j in range(logits.shape[1]):
                out[i, j] = self.processors(self.prompt[r : r + 1], logits[i : i + 1, j])[0]
        return out

    monkeypatch.setattr(engine.SpeculativeEngine, "_process_target", row_by_row)
    ref, out = run_case("llama", 3, "row_processor")
    assert not torch.equal(out, ref)


def test_power_a_stop_that_is_not_honoured_differs(monkeypatch):
    monkeypatch.setattr(engine.SpeculativeEngine, "_commit", lambda self: None)
    ref, out = run_case("llama", 1, "row_criterion")
    assert not torch.equal(out, ref)


# --- what cannot be kept exact is refused in one line ------------------------------------------------------
def _prefilled(target, ids):
    from transformers.cache_utils import DynamicCache

    from hf_vocabspec.modeling import cache_kwarg

    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(input_ids=ids[:, :-1], use_cache=True, **{cache_kwarg(target): cache})
    return {cache_kwarg(target): cache}  # the name the installed transformers takes


REFUSED = {
    "guidance_scale": (lambda t, ids: dict(guidance_scale=1.5), "guidance_scale"),
    "prefilled_cache": (lambda t, ids: _prefilled(t, ids), "past_key_values"),
    "output_attentions": (lambda t, ids: dict(output_attentions=True, return_dict_in_generate=True),
                          "output_attentions"),
    "no_cache": (lambda t, ids: dict(use_cache=False), "cache"),
    "custom_position_ids": (lambda t, ids: dict(position_ids=torch.arange(ids.shape[1])[None] + 3), "position_ids"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_refused_in_one_line(case):
    target, drafter = pair("llama")
    ids, mask = prompts(1)
    make, word = REFUSED[case]
    with pytest.raises(ValueError, match=word) as info:
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4,
                        **make(target, ids))
    assert "\n" not in str(info.value)


# --- static caches (cache_implementation="static"): fixed buffers, rolled back by moving their fill level ------
STATIC_ARCHS = [a for a in ARCHS if a != "deepseek_v32"]  # its indexer layers are refused (below)


@pytest.mark.parametrize("case", ["greedy", "row_criterion", "several_eos"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("arch", STATIC_ARCHS)
def test_static_cache_identical_to_target_only(arch, batch, case):
    """Target-only with a static cache against the engine holding the target's cache static (left padding, rows
    realigned, finished rows compacted out, every round's rejected columns rolled back)."""
    ref, out = run_case(arch, batch, case, cache_implementation="static")
    assert out.shape == ref.shape and torch.equal(out, ref), (ref.tolist(), out.tolist())
    stats = pair(arch)[1].last_speculation_stats
    # target-only compiles where transformers' criteria say so: a static cache on CUDA, not on a CPU
    assert stats.target_cache == "StaticCache" and stats.compiled_verify == (DEVICE.type == "cuda")


def test_static_cache_with_compile_runs_compiled_steps(monkeypatch):
    """Where target-only generate decodes with the target's compiled forward (transformers' criteria: a static
    cache on CUDA, or ``compile_config._compile_all_devices``, as here on a CPU), the engine's target forwards after
    the prompt run that same compiled call, and the drafter's steps after its first run compiled on a static cache
    of its own: left-padded rows, output identical to compiled target-only."""
    from hf_vocabspec.generation import draft_step

    target, drafter = pair("llama")
    ids, mask = prompts(3)
    config = T.CompileConfig()
    config._compile_all_devices = True
    calls = []
    get_compiled_call = target.get_compiled_call

    def fresh(kwargs) -> bool:
        """A compiled call's ids and positions are their own tensors: a view's storage offset would become a
        symbol under torch.compile, and CUDA graphs record a new graph for every value it takes."""
        return all(kwargs[k].storage_offset() == 0 and kwargs[k].is_contiguous() for k in ("input_ids", "position_ids"))

    def counted(compile_config):
        compiled = get_compiled_call(compile_config)

        def call(*args, **kwargs):
            calls.append(kwargs["input_ids"].shape[1])
            assert fresh(kwargs)
            return compiled(*args, **kwargs)
        return call

    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10, cache_implementation="static",
              compile_config=config)
    ref = target.generate(**kw)
    drafts = []
    compiled_call = draft_step.compiled_call

    def counted_draft(module, options):
        compiled = compiled_call(module, options)

        def call(*args, **kwargs):
            drafts.append(kwargs["input_ids"].shape[1])
            assert fresh(kwargs)
            return compiled(*args, **kwargs)
        return call

    eager = {k: v for k, v in kw.items() if k != "compile_config"}
    # the drafts are what the eager steps propose (disable_compile: on CUDA a static cache alone compiles)
    target.generate(**eager, disable_compile=True, assistant_model=drafter)
    assert not drafter.last_speculation_stats.compiled_verify
    accepted = drafter.last_speculation_stats.per_round_accepted
    monkeypatch.setattr(target, "get_compiled_call", counted)  # (after the eager run: counts this call's alone)
    monkeypatch.setattr(draft_step, "compiled_call", counted_draft)
    out = target.generate(**kw, assistant_model=drafter)
    assert torch.equal(out, ref), (ref.tolist(), out.tolist())
    stats = drafter.last_speculation_stats
    assert stats.compiled_verify and len(calls) == stats.rounds + stats.plain_steps - 1  # all but the prompt's
    assert stats.compiled_draft and len(drafts) == stats.draft_steps - 1  # all but the first (the prompt's)
    assert stats.per_round_accepted == accepted  # the compiled drafter on its static cache drafts the same tokens


@pytest.mark.parametrize("max_new", [7, 10])
def test_compiled_verify_keeps_one_width_to_the_calls_end(monkeypatch, max_new):
    """With a compiled verify every round verifies L + 1 positions, the call's last rounds too (each new width
    would be a recompile; CUDA graphs capture one graph per shape): output identical to target-only, and the stats
    count what eager rounds within the budget count. The eager run's widths show the case is exercised: there,
    the last rounds shrink to the budget."""
    target, drafter = pair("llama")
    ids, mask = prompts(3)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new)
    ref = target.generate(**kw)
    eager_widths = []
    forward = target.forward

    def recorded(*args, **kwargs):
        eager_widths.append(kwargs["input_ids"].shape[1])
        return forward(*args, **kwargs)

    monkeypatch.setattr(target, "forward", recorded)
    target.generate(**kw, assistant_model=drafter)
    monkeypatch.setattr(target, "forward", forward)
    eager = drafter.last_speculation_stats
    L = int(drafter.generation_config.num_assistant_tokens)
    assert any(1 < w < L + 1 for w in eager_widths[1:]), eager_widths  # eager: the end's rounds verify fewer
    widths = fake_compile(monkeypatch, target)
    out = target.generate(**kw, assistant_model=drafter)
    assert torch.equal(out, ref), (ref.tolist(), out.tolist())
    stats = drafter.last_speculation_stats
    assert stats.compiled_verify and set(widths) <= {1, L + 1} and L + 1 in widths, widths
    assert stats.per_round_accepted == eager.per_round_accepted
    assert stats.per_round_proposed == eager.per_round_proposed


def test_static_cache_grows_where_a_round_needs_room(monkeypatch):
    """Rows at different lengths each verify up to L positions, past generate's max_length: the buffers grow
    (here from generate's max_length itself) and the output is unchanged."""
    monkeypatch.setattr(engine, "FORCED_ROOM", -5)  # capacity = max_length + L + FORCED_ROOM + 1 = max_length
    grown = []
    reserve = engine._AlignedCache.reserve

    def spy(self, columns):
        before = self.width
        reserve(self, columns)
        grown.extend([(before, self.width)] if self.width != before else [])

    monkeypatch.setattr(engine._AlignedCache, "reserve", spy)
    ref, out = run_case("llama", 3, "greedy", cache_implementation="static", max_new_tokens=24)
    assert torch.equal(out, ref)
    assert grown, "no round needed more room than max_length: the test does not exercise growth"


def test_power_static_cache_not_rolled_back_differs(monkeypatch):
    """Where rejected columns stay in the static cache (its fill level is not moved back), the output differs."""
    set_length = engine._AlignedCache._set_length

    def stuck(self, layer, length, columns):
        if not isinstance(layer, engine.StaticLayer):
            set_length(self, layer, length, columns)

    monkeypatch.setattr(engine._AlignedCache, "_set_length", stuck)
    ref, out = run_case("llama", 3, "greedy", cache_implementation="static")
    assert not torch.equal(out, ref)


def test_power_compiled_drafter_misaligned_drafts_differently(monkeypatch):
    """The acceptance comparison above catches a wrong drafter cache: rows of the drafter's static cache not
    realigned after a round propose other drafts (the output stays exact: verification)."""
    target, drafter = pair("llama")
    ids, mask = prompts(3)
    config = T.CompileConfig()
    config._compile_all_devices = True
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10, cache_implementation="static")
    target.generate(**kw, assistant_model=drafter)
    accepted = drafter.last_speculation_stats.per_round_accepted
    keep, init, current = engine._AlignedCache.keep, engine.SpeculativeEngine.__init__, []

    def remember(self, *args, **kwargs):
        init(self, *args, **kwargs)
        current[:] = [self]

    def not_realigned(self, kept, new_length):
        if self is current[0].draft_cache:
            kept = [new_length] * len(kept)
        keep(self, kept, new_length)

    monkeypatch.setattr(engine.SpeculativeEngine, "__init__", remember)
    monkeypatch.setattr(engine._AlignedCache, "keep", not_realigned)
    target.generate(**kw, assistant_model=drafter, compile_config=config)
    assert drafter.last_speculation_stats.compiled_draft
    assert drafter.last_speculation_stats.per_round_accepted != accepted


def test_compile_draft_step_alone_compiles_only_the_drafters_steps(monkeypatch):
    """``drafter.compile_draft_step = True`` (no static cache, no compile_config): the drafter's steps after its
    first run through torch.compile (a real Inductor compile, static shapes) on a static cache of its own, the
    target eager with the fast linears, the drafter's head too; its body's layers run their int8 copies as functions
    the compiler traces (``kernels.compiled_int8_copies``: no trials, no fast linears inside the graph).
    Left-padded rows: output identical to target-only, and the compiled steps draft what eager steps on the same
    int8 copies draft."""
    from hf_vocabspec.generation import draft_step

    target, drafter = pair("llama")
    ids, mask = prompts(3)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10)
    ref = target.generate(**kw)
    with kernels.compiled_int8_copies(drafter.model) as traced:  # eager steps on the copies the compiled ones trace
        target.generate(**kw, assistant_model=drafter)
    eager = drafter.last_speculation_stats
    body = sorted(id(m) for m in drafter.model.modules() if isinstance(m, torch.nn.Linear))
    if not traced:  # no int8 kernel in this torch: the body keeps its own layers for the compiler
        body = []
    compiled_call = draft_step.compiled_call
    seen, wrapped, traced_layers = [], [], []

    def counted(module, options):
        seen.append(options)
        compiled = compiled_call(module, options)

        def call(*args, **kwargs):
            wrapped.append(sorted(id(m) for m in module.modules() if "forward" in m.__dict__
                                  and "_vocabspec_quantized" not in m.__dict__))
            traced_layers.append(sorted(id(m) for m in module.modules() if "forward" in m.__dict__
                                        and "_vocabspec_quantized" in m.__dict__))
            return compiled(*args, **kwargs)
        return call

    monkeypatch.setattr(draft_step, "compiled_call", counted)
    monkeypatch.setattr(drafter, "compile_draft_step", True, raising=False)
    out = target.generate(**kw, assistant_model=drafter)
    assert torch.equal(out, ref), (ref.tolist(), out.tolist())
    stats = drafter.last_speculation_stats
    assert stats.compiled_draft and not stats.compiled_verify and stats.target_cache == "DynamicCache"
    assert "drafter steps compiled" in stats.kernels
    assert seen and seen[0]["dynamic"] is False and len(wrapped) == stats.draft_steps - 1, (seen, len(wrapped))
    assert all(not w for w in wrapped)  # no fast linears inside what the compiler traces
    assert all(t == body for t in traced_layers), (len(body), [len(t) for t in traced_layers])
    if traced:
        assert f"compiled steps on int8 copies of {len(body)} layers" in stats.kernels, stats.kernels
    assert stats.per_round_accepted == eager.per_round_accepted


def _stand_in_compile(monkeypatch, fail: bool = False) -> list[int]:
    """``draft_step.compiled_call`` as an eager stand-in (no compile; ``fail``: a compile that raises); returns the
    widths the "compiled" drafter call is fed, as they arrive."""
    from hf_vocabspec.generation import draft_step

    fed: list[int] = []

    def compiled_call(module, options):
        def call(**kwargs):
            fed.append(kwargs["input_ids"].shape[1])
            if fail:
                raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")
            return module(**kwargs)
        return call

    monkeypatch.setattr(draft_step, "compiled_call", compiled_call)
    return fed


def test_auto_compile_draft_step_compiles_once_its_eager_steps_cost_the_budget(monkeypatch):
    """``compile_draft_step="auto"``: the first call runs eager (nothing
    measured yet); once its eager steps have cost AUTO_COMPILE_AFTER_SECONDS (0 here) the next calls compile, with
    one warning: their steps after the first run the compiled call (an eager stand-in) on the drafter's static cache.
    A Gemma-3-shaped drafter (sliding window 4, prompts past it): every static layer of that cache holds one width,
    the compiled step's bucket (a sliding layer once kept only the call's capacity: one mask did not fit all
    layers). Output identical to target-only, left-padded rows and one row alone."""
    import warnings
    import weakref

    from hf_vocabspec.generation import autocompile

    target, drafter = pair("gemma3")
    monkeypatch.setattr(drafter, "compile_draft_step", "auto", raising=False)
    monkeypatch.setattr(autocompile, "_RECORDS", weakref.WeakKeyDictionary())
    monkeypatch.setattr(autocompile, "AUTO_COMPILE_AFTER_SECONDS", 0.0)
    monkeypatch.setattr(autocompile, "CHECK_STEPS", 10**9)  # no verdict from the stand-in's timing
    fed = _stand_in_compile(monkeypatch)
    ids, mask = prompts(3)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=12)
    ref = target.generate(**kw)
    out = target.generate(**kw, assistant_model=drafter)
    assert torch.equal(out, ref) and not fed and not drafter.last_speculation_stats.compiled_draft
    record = autocompile.record_of(drafter)
    assert record.eager_steps == drafter.last_speculation_stats.draft_steps > 0
    with pytest.warns(UserWarning, match='compiling the drafter.s draft steps .compile_draft_step="auto"'):
        out = target.generate(**kw, assistant_model=drafter)
    assert torch.equal(out, ref), (ref.tolist(), out.tolist())
    stats = drafter.last_speculation_stats
    assert stats.compiled_draft and 'compile_draft_step="auto" after' in stats.kernels, stats.kernels
    assert len(fed) == stats.draft_steps - 1 and set(fed) == {1}, fed
    assert record.compiled_steps == stats.draft_steps and record.eager_steps == record.eager_steps
    ids, _ = prompts(1)
    ref = target.generate(input_ids=ids, do_sample=False, max_new_tokens=12)
    with warnings.catch_warnings(record=True) as seen:  # the warning is given once per drafter
        warnings.simplefilter("always")
        out = target.generate(input_ids=ids, do_sample=False, max_new_tokens=12, assistant_model=drafter)
    assert torch.equal(out, ref) and drafter.last_speculation_stats.compiled_draft
    assert not [w for w in seen if "compiling the drafter" in str(w.message)]


def test_auto_compile_keeps_compiled_steps_only_where_they_pay_and_survives_a_failed_compile(monkeypatch):
    """The "auto" rule on measured seconds: eager until the eager steps cost AUTO_COMPILE_AFTER_SECONDS; a call that
    compiled a graph is the compile's cost, not the steps'; after CHECK_STEPS compiled steps it keeps them where
    faster than eager, else goes back to eager for good. A compile that fails (no C++ compiler) costs nothing but
    speed: one warning, the call finishes eager with the target-only output, and later calls stay eager."""
    import weakref

    from hf_vocabspec.generation import autocompile

    rule = autocompile.AutoCompile()
    rule.record(False, 0.6 * autocompile.AUTO_COMPILE_AFTER_SECONDS, 1000)
    assert not rule.compiles()
    rule.record(False, 0.6 * autocompile.AUTO_COMPILE_AFTER_SECONDS, 1000)
    assert rule.compiles() and not rule.verdict
    rule.record(True, 500.0, 100, compiled_graphs=True)  # the compiling call: not the steps' speed
    assert rule.compiled_steps == 0 and rule.compiles()
    slow = autocompile.AutoCompile(**{**vars(rule)})
    per_eager = rule.eager_seconds / rule.eager_steps
    rule.record(True, 0.5 * per_eager * autocompile.CHECK_STEPS, autocompile.CHECK_STEPS)
    assert rule.verdict == "compiled" and rule.compiles()
    slow.record(True, 1.5 * per_eager * autocompile.CHECK_STEPS, autocompile.CHECK_STEPS)
    assert slow.verdict.startswith("eager (compiled steps took") and not slow.compiles()

    target, drafter = pair("llama")
    monkeypatch.setattr(autocompile, "_RECORDS", weakref.WeakKeyDictionary())
    monkeypatch.setattr(autocompile, "AUTO_COMPILE_AFTER_SECONDS", 0.0)
    monkeypatch.setattr(drafter, "compile_draft_step", "auto", raising=False)
    fed = _stand_in_compile(monkeypatch, fail=True)
    ids, mask = prompts(3)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=10)
    ref = target.generate(**kw)
    target.generate(**kw, assistant_model=drafter)  # eager: measures the eager steps
    with pytest.warns(UserWarning, match="compiling the drafter.s steps failed .RuntimeError: InvalidCxxCompiler"):
        out = target.generate(**kw, assistant_model=drafter)
    assert torch.equal(out, ref), (ref.tolist(), out.tolist())
    assert len(fed) == 1 and "InvalidCxxCompiler" in drafter.last_speculation_stats.draft_compile_failure
    record = autocompile.record_of(drafter)
    assert record.verdict.startswith("eager (its compile failed: RuntimeError") and not record.compiles()
    out = target.generate(**kw, assistant_model=drafter)
    assert torch.equal(out, ref) and len(fed) == 1 and not drafter.last_speculation_stats.compiled_draft


@pytest.mark.skipif(not kernels.available(), reason="this torch has no oneDNN packed kernels")
def test_compiled_draft_steps_keep_the_fast_linears_off_the_drafters_body():
    """The one kernel choice with compiled draft steps alone: the fast linears on the target and on the drafter's
    head (outside the compiled call), not on the body the compiler traces, whose layers run their int8 copies as
    traced functions (none with ``use_int8_copies`` or ``use_fast_linears`` off); with nothing compiled, the fast
    linears on all three."""
    import copy

    from hf_vocabspec.modeling import quantization_ops_available
    from hf_vocabspec.verify_head import generate_kernels

    target, drafter = (copy.deepcopy(m).float() for m in pair("llama"))
    body = {id(m) for m in drafter.model.modules() if isinstance(m, torch.nn.Linear)}

    def swapped(module, traced=False):
        return {id(m) for m in module.modules() if "forward" in m.__dict__
                and ("_vocabspec_quantized" in m.__dict__) is traced}

    with generate_kernels(target, drafter, compiled_draft=True) as fast:
        assert swapped(target) and id(drafter.lm_head) in swapped(drafter) and not swapped(drafter.model)
        if quantization_ops_available("int8"):
            assert swapped(drafter.model, traced=True) == body and fast.compiled_int8_layers == len(body)
            assert f"compiled steps on int8 copies of {len(body)} layers" in str(fast)
    for off in ("use_int8_copies", "use_fast_linears"):
        setattr(drafter, off, False)
        try:
            with generate_kernels(target, drafter, compiled_draft=True) as fast:
                assert not swapped(drafter.model, traced=True) and not fast.compiled_int8_layers, off
        finally:
            delattr(drafter, off)
    with generate_kernels(target, drafter):
        assert swapped(target) and id(drafter.lm_head) in swapped(drafter) and swapped(drafter.model)
        assert not swapped(drafter, traced=True)
    assert not swapped(target) and not swapped(drafter) and not swapped(drafter, traced=True)  # restored


def test_compile_draft_step_passed_to_generate_names_where_it_lives():
    target, drafter = pair("llama")
    ids, mask = prompts(1)
    with pytest.raises(ValueError, match="drafter.compile_draft_step = True") as info:
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4,
                        compile_draft_step=True)
    assert "\n" not in str(info.value)


def test_power_positions_of_a_stale_padding_layout_differ(monkeypatch):
    """Position ids and masks are views of grids built once per padding layout: a grid kept after rows shift
    right (a round where rows accepted different numbers of drafts; rebuilt here only when rows leave the batch)
    must make the output differ."""
    shifts = []

    def stale(name):
        def setter(self, value):
            old = getattr(self, name, None)
            setattr(self, name, value)
            if old is None or len(old) != len(value):
                self._grids = None
            else:
                shifts.append(name)
        return setter

    for name in ("pad_cols", "pad_list"):
        prop = getattr(engine.SpeculativeEngine, name)
        monkeypatch.setattr(engine.SpeculativeEngine, name, property(prop.fget, stale("_" + name)))
    ref, out = run_case("llama", 3, "greedy")
    assert shifts, "no round shifted rows: the test does not exercise a layout change"
    assert not torch.equal(out, ref)


def test_static_cache_sampling_matches_the_dynamic_cache():
    """Sampling: the same seed gives the same tokens with the target's cache static or dynamic (the same logits,
    the same draws), so the sampled law tests of the dynamic cache carry over."""
    target, drafter = pair("gemma3")
    ids, mask = prompts(3)
    outs = []
    for cache in ("static", None):
        torch.manual_seed(7)
        outs.append(target.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=14,
                                    assistant_model=drafter, cache_implementation=cache))
    assert torch.equal(*outs)


def test_static_cache_of_unsupported_layers_is_refused():
    target, drafter = pair("deepseek_v32")
    ids, mask = prompts(1)
    with pytest.raises(ValueError, match="StaticIndexedLayer.*dynamic cache") as info:
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4,
                        cache_implementation="static")
    assert "\n" not in str(info.value)


def test_sparse_indexer_beyond_its_topk_is_refused():
    """DeepSeek-V3.2-style sparse attention picks other keys for a multi-position verify than for a decode step
    once the sequence is longer than index_topk (transformers' own assisted loop differs from target-only)."""
    config = ARCHS["deepseek_v32"]()
    config.index_topk = 6
    config._experts_implementation = "eager"
    target = T.AutoModelForCausalLM.from_config(config).eval().double()
    _, drafter = pair("llama")
    ids, mask = prompts(1)
    with pytest.raises(ValueError, match="index_topk") as info:
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4)
    assert "\n" not in str(info.value)


def test_model_without_a_kv_cache_is_refused():
    config = T.OpenAIGPTConfig(n_embd=32, n_layer=2, n_head=4, n_positions=64, **_COMMON)
    target = T.OpenAIGPTLMHeadModel(config).eval()
    drafter = hf_vocabspec.trim_drafter(T.OpenAIGPTLMHeadModel(config).eval(), KEEP)
    ids, mask = prompts(3)
    with pytest.raises(ValueError, match="no KV cache"):
        target.generate(input_ids=ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=4)


def test_stateful_drafter_is_refused_at_trim():
    model = T.RwkvForCausalLM(T.RwkvConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                           attention_hidden_size=32, intermediate_size=64)).eval()
    with pytest.raises(ValueError, match="stateful"):
        hf_vocabspec.trim_drafter(model, KEEP)


def test_trim_reads_configs_without_special_ids():
    """CodeGen's config has no pad_token_id attribute at all (AttributeError before)."""
    config = T.CodeGenConfig(n_embd=32, n_layer=2, n_head=4, rotary_dim=4, vocab_size=VOCAB)
    drafter = hf_vocabspec.trim_drafter(T.CodeGenForCausalLM(config).eval(), KEEP)
    assert drafter.config.pad_token_id is None


@pytest.mark.parametrize("lagged", [False, True], ids=["read-at-once", "read-lagged"])
@pytest.mark.parametrize("batch", [1, 3])
def test_confidence_threshold_stops_rows_at_every_batch_size(batch, lagged, monkeypatch):
    """A tuned drafter's confidence stop behaves the same at batch 1 and 3: rows propose fewer drafts after an
    unsure one, and the output is still target-only's. ``lagged``: the stop's flag read one draft late (as on a GPU,
    host.LaggedRead): no read per drafted position (one per round), the same output, a draft more where it stops."""
    monkeypatch.setattr("hf_vocabspec.generation.engine.lags_reads", lambda device: lagged)
    monkeypatch.setattr(pair("llama")[1], "adapt_confidence_threshold", False, raising=False)  # the configured stop
    ref, out = run_case("llama", batch, "confidence_threshold")
    assert torch.equal(out, ref)
    stats = pair("llama")[1].last_speculation_stats
    assert any(p < 4 for p in stats.per_round_proposed)
    if lagged:
        assert stats.host_syncs == stats.rounds + stats.plain_steps and stats.lagged_reads > 0
        if batch == 1:  # the stop comes one draft late: never after the first (the last round: the budget's cut)
            assert min(stats.per_round_proposed[:-1]) >= 2, stats.per_round_proposed
    else:
        assert stats.host_syncs > stats.rounds + stats.plain_steps and stats.lagged_reads == 0


def _recorded_drafting(monkeypatch, batch: int, ignore_drafted_eos: bool = False):
    """Run a case of many EOS ids with a confidence stop, read at once (CPU), recording each round's drafter steps:
    (L, the EOS ids, per step each computing row's (unsure, drafted token)). ``ignore_drafted_eos``: a wrong loop
    that does not see a drafted EOS (its host set emptied: the power side)."""
    from hf_vocabspec.generation import draft_step

    monkeypatch.setattr("hf_vocabspec.generation.engine.lags_reads", lambda device: False)
    rounds = []
    draft, call = engine.SpeculativeEngine._draft, draft_step.DraftStep.__call__

    def recording_draft(self, L, *args, **kwargs):
        if ignore_drafted_eos:
            self.eos_set = set()
        rounds.append((L, set(self.eos.tolist()), []))
        return draft(self, L, *args, **kwargs)

    def recording_call(self, *args, **kwargs):
        d = call(self, *args, **kwargs)
        if rounds and d.unsure is not None:
            rounds[-1][2].append(list(zip(d.unsure.view(-1).tolist(), d.token.view(-1).tolist())))
        return d

    monkeypatch.setattr(engine.SpeculativeEngine, "_draft", recording_draft)
    monkeypatch.setattr(draft_step.DraftStep, "__call__", recording_call)
    # about half the tiny drafter's draws fall below the threshold (its laws are flat: max 0.023-0.028), and one
    # draft in five or so is an EOS id
    ref, out = run_case("llama", batch, "greedy", assistant_confidence_threshold=0.0245, max_new_tokens=40,
                        eos_token_id=[EOS, *KEEP[20:23]])
    return ref, out, rounds


def _drafting_violations(rounds) -> list:
    """Rounds that break the stop rule: the batch drafts until every row has had an unsure draft or an EOS since
    the round began, or L drafts."""
    bad = []
    for i, (L, eos, steps) in enumerate(rounds):
        ended = [False] * (len(steps[0]) if steps else 0)
        for j, step in enumerate(steps):
            ended = [e or unsure or token in eos for e, (unsure, token) in zip(ended, step)]
            if all(ended) and j + 1 < len(steps):
                bad.append((i, "drafted past the batch's end", j + 1, len(steps)))
        if steps and not all(ended) and len(steps) < L:
            bad.append((i, "stopped early", len(steps), L))
    return bad


@pytest.mark.parametrize("batch", [1, 3])
def test_a_confidence_stop_read_at_once_ends_drafting_where_every_row_has_ended(batch, monkeypatch):
    """Read at once (CPU), the draft loop drafts until every computing row has had an unsure draft or drafted an
    EOS since its round began (host-side ends), or L drafts; the output is target-only's. Both ends occur."""
    ref, out, rounds = _recorded_drafting(monkeypatch, batch)
    assert torch.equal(out, ref)
    assert not _drafting_violations(rounds), _drafting_violations(rounds)
    seen = [x for _, eos, steps in rounds for step in steps for x in step]
    assert any(u for u, _ in seen) and any(not u for u, _ in seen)
    # a sure draft of an EOS id ends its row (what the power side breaks)
    assert any(t in eos and not u for _, eos, steps in rounds for step in steps for u, t in step)
    if batch > 1:  # rounds where a row's earlier end still counts: the batch ends before its rows end together
        assert any(_ends_apart(eos, steps) for _, eos, steps in rounds)


def _ends_apart(eos, steps) -> bool:
    ended = [False] * len(steps[0])
    for step in steps:
        now = [unsure or token in eos for unsure, token in step]
        ended = [e or x for e, x in zip(ended, now)]
        if all(ended):
            return not all(now)
    return False


@pytest.mark.parametrize("batch", [1, 3])
def test_power_a_loop_blind_to_drafted_eos_breaks_the_stop_rule(batch, monkeypatch):
    _, _, rounds = _recorded_drafting(monkeypatch, batch, ignore_drafted_eos=True)
    assert _drafting_violations(rounds)


def test_the_hosts_confidence_comparison_decides_as_the_devices():
    """The read-at-once stop compares each draft's probability on the host (``DraftStep.host_threshold``); it must
    decide as ``DraftedToken.unsure`` (float32 on the device) does, also at the threshold's float32 value itself,
    and the greedy draw that comes with the probability is the logits' argmax."""
    from types import SimpleNamespace

    from hf_vocabspec.generation.draft_step import DraftedToken, DraftStep

    drafter = pair("llama")[1]
    for t in (0.4, 0.1, 1e-6, 0.0245):  # 1e-6 and 0.0245 round down to float32: a float64 host comparison fails
        step = DraftStep(drafter, LogitsProcessorList(), do_sample=False, confidence_threshold=t)
        threshold = torch.tensor(t, dtype=torch.float32)
        at = threshold.clone()
        for c in (torch.nextafter(at, torch.tensor(0.0)), at, torch.nextafter(at, torch.tensor(1.0))):
            d = DraftedToken(None, None, None, c.reshape(1, 1), threshold)
            assert d.unsure.item() == (c.item() < step.host_threshold), (t, c.item())
        assert d.unsure.item() is False  # (the last probability: just above the threshold)
        assert DraftedToken(None, None, None, at.reshape(1, 1) / 2, threshold).unsure.item()
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    idx, probs, confidence = DraftStep.draw_with_confidence(SimpleNamespace(do_sample=False), logits)
    assert probs is None and torch.equal(idx, logits.argmax(dim=-1, keepdim=True))
    assert torch.allclose(confidence, logits.softmax(dim=-1).amax(dim=-1, keepdim=True))


# --- a target whose embedding is padded past the tokenizer (Qwen2.5-7B: 152,064 rows, its 0.5B drafter: 151,936) ---
PADDED = VOCAB + 8


def padded_pair():
    """Target with 72 head rows (8 padded, as real checkpoints pad to a multiple of 64/128), drafter with 64 ids."""
    torch.manual_seed(0)
    target = T.LlamaForCausalLM(T.LlamaConfig(**_SMALL, tie_word_embeddings=False,
                                              **{**_COMMON, "vocab_size": PADDED})).eval().double()
    base = T.LlamaForCausalLM(T.LlamaConfig(**_SMALL, tie_word_embeddings=False, **_COMMON)).eval().double()
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(6.0)
        # the drafter: the target's first 64 rows and a perturbed copy of its body (q close to p, not equal)
        base.load_state_dict({k: v[:VOCAB] if v.shape[0] == PADDED else v for k, v in target.state_dict().items()})
        for p in base.parameters():
            p.add_(0.3 * p.std() * torch.randn_like(p))
    target.generation_config.pad_token_id = 0
    drafter = hf_vocabspec.trim_drafter(base, KEEP).double()
    target, drafter = target.to(DEVICE), drafter.to(DEVICE)
    drafter.generation_config.num_assistant_tokens = 3
    drafter.generation_config.batched_speculation = "on"
    return target, drafter


@pytest.mark.parametrize("batch", [1, 3])
def test_padded_target_embedding_is_compatible_and_exact(batch):
    target, drafter = padded_pair()
    ids, mask = prompts(batch)
    kw = dict(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16, repetition_penalty=1.3)
    assert torch.equal(target.generate(**kw, assistant_model=drafter), target.generate(**kw))


@pytest.mark.parametrize("wrong", [False, True])
def test_padded_target_sampled_law_is_exact(wrong, monkeypatch):
    """First-token marginal over all 72 target rows (50 rows of one call x 30 calls), chi-square p >= 1e-3; the
    same draw with the draft law scattered onto the wrong ids must fail (power)."""
    from marginals import PVALUE_THRESHOLD, chi2_pvalue

    from hf_vocabspec.generation import DraftVocabulary

    target, drafter = padded_pair()
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(0.5)  # a flatter p: pruned and padded rows carry mass
    if wrong:
        original = DraftVocabulary.scatter

        def wrong_scatter(self, values, fill=float("-inf"), size=None):
            return original(self, values.flip(-1), fill, size)

        monkeypatch.setattr(DraftVocabulary, "scatter", wrong_scatter)
    prompt = torch.tensor([[1, 5, 7, 12, 9]], device=DEVICE)
    with torch.no_grad():
        p1 = target(prompt).logits[0, -1].softmax(-1).double()
    torch.manual_seed(3)
    firsts = torch.cat([target.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True, top_k=0,
                                        max_new_tokens=2, num_return_sequences=50, assistant_model=drafter)[:, 5]
                        for _ in range(30)])
    pvalue = chi2_pvalue(firsts, p1)
    assert (pvalue < PVALUE_THRESHOLD) if wrong else (pvalue >= PVALUE_THRESHOLD), pvalue
