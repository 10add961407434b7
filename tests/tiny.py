"""Tiny random target/drafter pairs with a small vocabulary, for fast exact tests.

The target's head is scaled up so its next-token distributions are peaked (a near-uniform p would let a
wrong q pass unnoticed); the drafter is a perturbed copy, so q is close to p but not equal.
"""

from __future__ import annotations

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
)

import hf_vocabspec
from hf_vocabspec.cost import LatencyCurve
from hf_vocabspec.rdk import RDKKernel
from hf_vocabspec.selection import AcceptanceProfile, ThroughputModel

VOCAB = 64
EOS = 2


def llama_config(**kw) -> LlamaConfig:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    base.update(kw)
    return LlamaConfig(**base)


def gemma3_config(**kw) -> Gemma3TextConfig:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=256,
        tie_word_embeddings=True,
        final_logit_softcapping=30.0,
        bos_token_id=1,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    base.update(kw)
    return Gemma3TextConfig(**base)


def make_pair(kind: str = "llama", seed: int = 0, head_scale: float = 40.0, noise: float = 0.3):
    """(target, drafter) in fp32, eval mode; drafter = target + noise (same tokenizer / vocabulary)."""
    torch.manual_seed(seed)
    if kind == "llama":
        target = LlamaForCausalLM(llama_config()).eval()
        drafter = LlamaForCausalLM(llama_config()).eval()
    elif kind == "gemma3":
        target = Gemma3ForCausalLM(gemma3_config()).eval()
        drafter = Gemma3ForCausalLM(gemma3_config()).eval()
    else:
        raise ValueError(kind)
    with torch.no_grad():
        head = target.get_output_embeddings().weight
        head.mul_(head_scale)
        drafter.load_state_dict(target.state_dict())
        for p in drafter.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    target.generation_config.pad_token_id = 0
    drafter.generation_config.pad_token_id = 0
    return target, drafter


# --- shared helpers of several test modules (one home: test modules never import each other) -----------------------
def tiny_tokenizer(shuffle: bool = False):
    """A 64-token word-level fast tokenizer matching tiny.VOCAB (``shuffle`` permutes the id table)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(3, VOCAB)]
    if shuffle:
        names = names[:3] + names[3:][::-1]
    tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


HUB_PROMPT = [[1, 6, 9, 14, 3]]


def greedy(target, drafter, prompt=HUB_PROMPT) -> list[int]:
    """Greedy output of 20 new tokens with ``drafter`` (None: target-only) on a short prompt."""
    return target.generate(torch.tensor(prompt), max_new_tokens=20, do_sample=False, assistant_model=drafter)[0].tolist()


def context_pair(seed: int = 0, kind: str = "gemma3"):
    """(target, drafter, prompt, probe): the target's top-3 first tokens are pruned and sit in the prompt."""
    target, base = make_pair(kind, seed=seed, head_scale=12.0)
    prompt = torch.tensor([[1, 5, 7, 12, 9]])
    with torch.no_grad():
        p1 = target(prompt).logits[0, -1].softmax(-1)
    top = [t for t in p1.argsort(descending=True).tolist() if t > 2][:3]
    prompt = torch.cat([prompt, torch.tensor([top])], dim=1)
    with torch.no_grad():
        p1 = target(prompt).logits[0, -1].softmax(-1)
    probe = max((t for t in top), key=lambda t: float(p1[t]))
    pruned = set(top) | set(range(40, VOCAB))
    drafter = hf_vocabspec.trim_drafter(base, [t for t in range(VOCAB) if t not in pruned])
    drafter.use_context_tokens = True
    return target, drafter, prompt, probe


def hand_kernel(drafter, towards: list[int], moved=0.35) -> RDKKernel:
    """Every kept row moves ``moved`` of its mass onto the pruned tokens ``towards`` (equal split)."""
    k = drafter.d2t.numel()
    targets = torch.tensor(towards).expand(k, len(towards)).clone()
    w = torch.zeros(k, len(towards) + 1)
    w[:, 0] = 1 - moved
    w[:, 1:] = moved / len(towards)
    return RDKKernel(drafter.d2t, targets, w, VOCAB, "hand").validate()


# toy measurements for the throughput model (no model runs)
def random_profile(seed=0, segments=(7, 1, 12), ks=(10, 20, 40), context=True):
    g = torch.Generator().manual_seed(seed)
    n = sum(segments)
    base = torch.rand(n, 1, generator=g)
    # acceptance grows with k (a larger kept set drafts at least what a smaller one does)
    vanilla = torch.cat([base * (i + 1) / len(ks) for i in range(len(ks))], dim=1).double()
    ctx = (vanilla + 0.1).clamp(max=1.0) if context else None
    return AcceptanceProfile(list(ks), vanilla, ctx, list(segments), agreement=0.9)


def toy_model(profile=None) -> ThroughputModel:
    profile = profile or random_profile()
    curve = LatencyCurve([10, 20, 40], [0.004, 0.006, 0.010], 0.003)
    verify = {1: 0.020, **{n + 1: 0.020 + 0.002 * n for n in (2, 3, 4, 6, 8)}}
    return ThroughputModel(profile, curve, verify, draft_lengths=[2, 3, 4, 6, 8])


# --- a tiny model as the CLI takes it: a saved folder with a chat-templated tokenizer, and a chat .jsonl ------------
# w3 / w4 play the role markers (the word-level tokenizer keeps CLI tests free of real models)
CHAT_TEMPLATE = ("{% for m in messages %}{{ 'w3' if m['role'] != 'assistant' else 'w4' }} {{ m['content'] }} </s> "
                 "{% endfor %}{% if add_generation_prompt %}w4 {% endif %}")


def tiny_chat_tokenizer():
    """tiny_tokenizer() with a chat template (what counting, prompts and trimming through the CLI need)."""
    tok = tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_chats(n: int = 30, seed: int = 0, answer_words: int = 140) -> list[dict]:
    """``n`` one-exchange chats in the ``messages`` format over tiny.VOCAB's words, skewed towards low ids (so a
    coverage picks a strict subset). User turns pass eval_prompts' 20 characters and answers its 4 x 32-token
    answer prefix (the bench's default)."""
    import random

    rng = random.Random(seed)

    def words(count):
        return " ".join(f"w{min(VOCAB - 1, 5 + int(rng.expovariate(0.12)))}" for _ in range(count))

    return [{"messages": [{"role": "user", "content": words(8)},
                          {"role": "assistant", "content": words(answer_words)}]} for _ in range(n)]


def save_tiny_cli_model(folder, seed: int = 0) -> None:
    """A tiny Llama (fp32) with the chat tokenizer saved in ``folder``: a model path any CLI command takes."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config()).eval()
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    tiny_chat_tokenizer().save_pretrained(folder)


def left_padded(lengths: list[int], seed: int = 0):
    """(ids, mask): random prompts of these lengths, left-padded with 0 (the batched tests' batch)."""
    from hf_vocabspec.evaluation.batch_bench import left_padded as batch_of

    g = torch.Generator().manual_seed(seed)
    return batch_of([torch.randint(3, VOCAB, (n,), generator=g)[None] for n in lengths], pad=0)


def fake_compile(monkeypatch, target) -> list[int]:
    """The compiled path's rounds without compiling (eager cost): hooks takes the call for one target-only would
    compile, and the "compiled" verify and draft calls are the eager modules. Returns the widths the verify call
    is given, as they arrive."""
    from hf_vocabspec.generation import draft_step, hooks

    widths: list[int] = []

    def get_compiled_call(compile_config):
        def call(*args, **kwargs):
            widths.append(kwargs["input_ids"].shape[1])
            return target(*args, **kwargs)
        return call

    monkeypatch.setattr(hooks, "compiled_verify", lambda model, bound: True)
    monkeypatch.setattr(target, "get_compiled_call", get_compiled_call)
    monkeypatch.setattr(draft_step, "compiled_call", lambda module, options: module)
    return widths
