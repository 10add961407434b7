"""generate() integration: the usual knobs, num_assistant_tokens, errors, and the hot-path rule."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB, llama_config, make_pair
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from hf_vocabspec import VocabularyMapError, trim_drafter
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


def test_a_drafter_config_left_unset_drafts_on_transformers_defaults(pair, monkeypatch):
    """transformers 5 leaves a GenerationConfig's drafting fields None (its defaults: L=20, stop below 0.4): a
    trimmed drafter whose config leaves them unset drafts as HF's own loop would, not on our batched fallback (5)."""
    target, drafter = pair
    monkeypatch.setattr(drafter, "adapt_confidence_threshold", False, raising=False)  # the configured stop
    saved = drafter.generation_config
    drafter.generation_config = GenerationConfig(pad_token_id=0)
    try:
        assert drafter.generation_config.num_assistant_tokens is None
        ref = target.generate(PROMPT, max_new_tokens=30, do_sample=False)
        out = target.generate(PROMPT, max_new_tokens=30, do_sample=False, assistant_model=drafter,
                              assistant_confidence_threshold=0.0)
        full = drafter.last_speculation_stats  # (the output ends at an EOS: later drafts are not proposed)
        assert torch.equal(out, ref) and full.draft_steps >= 20 and full.draft_steps % 20 == 0, full.draft_steps
        assert torch.equal(target.generate(PROMPT, max_new_tokens=30, do_sample=False, assistant_model=drafter), ref)
        stopped = drafter.last_speculation_stats
        assert stopped.draft_steps < full.draft_steps, (stopped.draft_steps, full.draft_steps)  # the stop at 0.4
    finally:
        drafter.generation_config = saved


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


# --- bad input to generate(): tokenizers, dtypes, drafting settings, position limits, attention masks ---------------
def test_generate_mismatch_gets_our_error_not_universal_assisted_decoding(tok, same_size_other_tok):
    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config(vocab_size=len(tok), eos_token_id=tok.eos_token_id,
                                          bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id)).eval()
    drafter = trim_drafter(model, torch.arange(3, 300), tokenizer=tok)
    ids = torch.tensor([[1, 5, 6]])
    with pytest.raises(VocabularyMapError, match="fingerprints differ") as err:
        model.generate(ids, assistant_model=drafter, tokenizer=same_size_other_tok, max_new_tokens=3)
    assert "universal" not in str(err.value).lower()
    model.generate(ids, assistant_model=drafter, tokenizer=tok, max_new_tokens=3)  # the right one passes
    # fewer rows than the drafter's ids (a target padded past the tokenizer, MORE rows, is compatible)
    other_target = LlamaForCausalLM(llama_config(vocab_size=len(tok) - 64)).eval()
    with pytest.raises(VocabularyMapError, match="must share a tokenizer") as err:
        other_target.generate(ids, assistant_model=drafter, max_new_tokens=3)
    assert "universal" not in str(err.value).lower()
    with pytest.raises(ValueError, match="num_assistant_tokens must be a positive integer"):
        model.generate(ids, assistant_model=drafter, num_assistant_tokens=0, max_new_tokens=3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_drafter_dtype_other_than_the_target_s(dtype, kind):
    """A half-precision drafter for an fp32 target: greedy output identical to target-only, sampling runs."""
    from tiny import make_pair

    target, base = make_pair(kind)
    drafter = trim_drafter(base.to(dtype), torch.arange(3, 40))
    ids = torch.tensor([[1, 5, 6, 7, 9]])
    for context_tokens in (False, True) if drafter.supports_context_tokens else (False,):
        drafter.use_context_tokens = context_tokens
        out = target.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=False)
        assert torch.equal(out, target.generate(ids, max_new_tokens=12, do_sample=False))
        torch.manual_seed(0)
        sampled = target.generate(ids, assistant_model=drafter, max_new_tokens=12, do_sample=True)
        assert sampled.shape[1] > ids.shape[1]


@pytest.mark.parametrize(("setting", "value", "needle"), [
    ("num_assistant_tokens", 0, "drafter.generation_config.num_assistant_tokens must be a positive integer (got 0)"),
    ("num_assistant_tokens", -2, "drafter.generation_config.num_assistant_tokens must be a positive integer (got -2)"),
    ("assistant_confidence_threshold", 1.5,
     "drafter.generation_config.assistant_confidence_threshold must be in [0, 1)"),
    ("assistant_confidence_threshold", 1.0,
     "drafter.generation_config.assistant_confidence_threshold must be in [0, 1)"),
    ("assistant_confidence_threshold", -0.1,
     "drafter.generation_config.assistant_confidence_threshold must be in [0, 1)"),
])
def test_drafting_settings_out_of_range_are_refused_on_the_drafter_and_in_generate(tmp_path, setting, value, needle):
    """Issue #38: a draft length or confidence threshold outside its range is refused in one line wherever it is set:
    on the drafter's own generation_config (was: drafted 5 per round / stopped every round after one draft without a
    word), passed to generate(), and on save."""
    from tiny import make_pair

    target, base = make_pair()
    drafter = trim_drafter(base, torch.arange(3, 40))
    ids = torch.tensor([[1, 5, 6]])
    setattr(drafter.generation_config, setting, value)
    for batch in (ids, ids.repeat(2, 1)):
        with pytest.raises(ValueError) as err:
            target.generate(batch, attention_mask=torch.ones_like(batch), assistant_model=drafter, max_new_tokens=3,
                            do_sample=False)
        assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="must be") as err:
        drafter.save_pretrained(tmp_path / "d")
    assert needle in str(err.value) and not (tmp_path / "d").exists()
    setattr(drafter.generation_config, setting, {"num_assistant_tokens": 4, "assistant_confidence_threshold": 0.3}[setting])
    with pytest.raises(ValueError) as err:  # passed to generate(): refused under its own name
        target.generate(ids, assistant_model=drafter, max_new_tokens=3, do_sample=False, **{setting: value})
    assert needle.removeprefix("drafter.generation_config.") in str(err.value)
    assert "drafter.generation_config" not in str(err.value)
    target.generate(ids, assistant_model=drafter, max_new_tokens=3, do_sample=False)  # in range: runs


def test_confidence_threshold_range_is_zero_up_to_one_excluded():
    from hf_vocabspec.configuration import check_confidence_threshold

    assert check_confidence_threshold(0) == 0.0 and check_confidence_threshold("0.99") == 0.99
    for bad in (1, 1.5, -0.01, float("nan"), "x", None):
        with pytest.raises(ValueError, match=r"must be in \[0, 1\)"):
            check_confidence_threshold(bad, name="x")


@pytest.mark.parametrize(("kwarg", "value", "fix"), [
    ("batched_speculation", "off", "set drafter.generation_config.batched_speculation = 'off'"),
    ("use_context_tokens", False, "set drafter.use_context_tokens = False"),
    ("use_fast_linears", False, "set drafter.use_fast_linears = False"),
    ("use_int8_copies", False, "set drafter.use_int8_copies = False"),
    ("use_fused_norms", False, "set drafter.use_fused_norms = False"),
    ("use_fast_prefill", False, "set drafter.use_fast_prefill = False"),
    ("use_lean_forward", False, "set drafter.use_lean_forward = False"),
    ("weight_quantization", "int4", "call drafter.quantize_weights('int4')"),
])
def test_drafter_settings_passed_to_generate_name_where_they_live(kwarg, value, fix):
    """Issue #38: transformers only said "model_kwargs are not used"; the one line now names the drafter setting."""
    from tiny import make_pair

    target, base = make_pair()
    drafter = trim_drafter(base, torch.arange(3, 40))
    with pytest.raises(ValueError) as err:
        target.generate(torch.tensor([[1, 5, 6]]), assistant_model=drafter, max_new_tokens=3, **{kwarg: value})
    assert str(err.value) == f"{kwarg} is a drafter setting, not a generate() argument: {fix} before generate()."
    with pytest.raises(ValueError, match="model_kwargs` are not used"):  # other unknown kwargs: transformers' own
        target.generate(torch.tensor([[1, 5, 6]]), assistant_model=drafter, max_new_tokens=3, not_a_setting=1)


def _gpt2_drafter(n_positions: int = 16):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=n_positions,
                                      bos_token_id=1, eos_token_id=2)).eval()
    return trim_drafter(base, torch.arange(3, 30))


def test_position_limit_read_under_each_architecture_s_name():
    from transformers import PretrainedConfig

    from hf_vocabspec.modeling import position_limit

    assert position_limit(_gpt2_drafter(16)) == 16  # a trimmed drafter's body: GPT-2's n_positions
    assert position_limit(LlamaForCausalLM(llama_config())) == 256
    for name in ("n_ctx", "max_sequence_length", "seq_length"):
        assert position_limit(type("M", (), {"config": PretrainedConfig(**{name: 12})})()) == 12
    assert position_limit(type("M", (), {"config": PretrainedConfig()})()) is None  # no limit declared: no check


def test_prompt_plus_new_tokens_beyond_the_drafter_s_positions_is_refused():
    from tiny import make_pair

    from hf_vocabspec.generation.hooks import check_inputs

    target, _ = make_pair()
    drafter = _gpt2_drafter(16)
    long_prompt = torch.randint(3, 60, (1, 20))
    with pytest.raises(ValueError, match="prompt has 20 tokens but the drafter handles at most 16 positions"):
        target.generate(long_prompt, assistant_model=drafter, max_new_tokens=4, do_sample=False)
    ids = torch.randint(3, 60, (1, 10))
    check_inputs(target, drafter, ids, None, max_length=16)
    with pytest.raises(ValueError, match="reaches 20 positions but the drafter handles at most 16: shorten the prompt "
                                         "or lower max_new_tokens to at most 6") as err:
        check_inputs(target, drafter, ids, None, max_length=20)
    assert "\n" not in str(err.value)


def test_generate_refuses_prompt_plus_new_tokens_beyond_the_drafter_s_positions():
    from tiny import make_pair

    target, _ = make_pair()
    try:  # 10 + 10 > 16: the drafter's position embedding is indexed past its end (IndexError) unless refused
        target.generate(torch.randint(3, 60, (1, 10)), assistant_model=_gpt2_drafter(16), max_new_tokens=10,
                        do_sample=False)
    except ValueError as err:
        assert "lower max_new_tokens" in str(err)
    else:
        raise AssertionError("generated past the drafter's positions")


def re_escape(text: str) -> str:
    import re

    return re.escape(text)


@pytest.mark.parametrize(("mask", "needle"), [
    (torch.ones(3, 4, dtype=torch.long), "attention_mask has 3 rows but input_ids has 2 prompts"),
    (torch.ones(4, dtype=torch.long), "attention_mask is 1-D (4,) but input_ids is (2, 4)"),
    (torch.ones(2, 5, dtype=torch.long), "attention_mask has shape (2, 5) but input_ids has (2, 4)"),
    (torch.full((2, 4), 2), "values other than 0 and 1"),
    (torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]]), "row 1 is all zeros"),
    ([[1, 1, 1, 1], [1, 1, 1, 1]], "is a list, not a tensor"),
])
def test_attention_mask_is_checked_as_given(mask, needle):
    from hf_vocabspec.generation.hooks import check_attention_mask

    ids = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    check_attention_mask(ids, None)
    check_attention_mask(ids, torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match=re_escape(needle)) as err:
        check_attention_mask(ids, mask)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="1-D"):  # batch 1 too: transformers raises IndexError on it
        check_attention_mask(ids[:1], torch.ones(4, dtype=torch.long))


def test_generate_checks_the_attention_mask_as_given():
    from tiny import make_pair

    target, base = make_pair()
    drafter = trim_drafter(base, torch.arange(3, 40))
    ids = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    for mask in (torch.ones(3, 4, dtype=torch.long), torch.ones(4, dtype=torch.long)):
        try:
            target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=3, do_sample=False)
        except ValueError as err:
            assert "attention_mask" in str(err)
        else:
            raise AssertionError("accepted a mask that does not fit input_ids")


def test_assistant_model_with_prompt_lookup_is_refused():
    from transformers import GenerationConfig

    from hf_vocabspec.generation.hooks import check_generate_kwargs

    check_generate_kwargs(GenerationConfig(prompt_lookup_num_tokens=3))
    check_generate_kwargs(GenerationConfig(), assistant_model=object())
    with pytest.raises(ValueError, match="assistant_model= and prompt_lookup_num_tokens= each choose how drafts are "
                                         "made .*pass one of them"):
        check_generate_kwargs(GenerationConfig(prompt_lookup_num_tokens=3), assistant_model=object())


def test_generate_refuses_assistant_model_with_prompt_lookup():
    from tiny import make_pair

    target, base = make_pair()
    drafter = trim_drafter(base, torch.arange(3, 40))
    try:
        target.generate(torch.tensor([[1, 5, 6, 7]]), assistant_model=drafter, prompt_lookup_num_tokens=3,
                        max_new_tokens=3, do_sample=False)
    except ValueError as err:
        assert "prompt_lookup_num_tokens" in str(err)
    else:
        raise AssertionError("drafted with the assistant and dropped prompt lookup without a word")
