"""Evaluation data: which conversations are counted and which are held out, and the prompts built from them.

One split for every tool: the FIRST ``count_examples`` conversations of a chat dataset are counted (the
vocabulary is chosen on them); everything after is held out (prompts, acceptance scoring, calibration),
so no evaluation ever sees text the vocabulary was chosen on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Workload:
    """A target, its tokenizer, and a chat dataset split into counted (vocabulary chosen on) and held out."""

    tokenizer: object
    target: torch.nn.Module
    counts: object  # hf_vocabspec.coverage.TokenCounts of the counted part
    held_out: object  # datasets.Dataset


def load_workload(target: str, dataset: str, count_examples: int, *, progress: bool = False) -> Workload:
    """Load the fp32 target and its tokenizer, split ``dataset`` (:func:`count_split`), count the counted part."""
    from ..coverage import count_assistant_tokens
    from .offline import load_chat_dataset, load_model, load_tokenizer

    tokenizer = load_tokenizer(target)
    counted, held_out = count_split(load_chat_dataset(dataset), count_examples)
    counts = count_assistant_tokens(counted, tokenizer, progress=progress)
    return Workload(tokenizer, load_model(target, dtype=torch.float32).eval(), counts, held_out)


MIN_HELD_OUT = 500


def min_held_out(dataset_size: int) -> int:
    """Conversations every tool keeps back from counting: ``MIN_HELD_OUT``, or a fifth of a smaller dataset.

    Why one rule: the benchmark, tune, acceptance, trim and the demo each kept their own minimum (500, 100, 100,
    min(500, n // 5), 0), so one dataset split five ways; the demo's 0 left no prompt on a small dataset."""
    return min(MIN_HELD_OUT, int(dataset_size) // 5)


def count_split(dataset, count_examples: int):
    """(counted, held_out): the first ``count_examples`` conversations (fewer if that would leave under
    :func:`min_held_out`), and the rest."""
    n = max(0, min(int(count_examples), len(dataset) - min_held_out(len(dataset))))
    return dataset.select(range(n)), dataset.select(range(n, len(dataset)))


def first_exchange(example: dict, tokenizer, min_user_chars: int = 0) -> tuple[torch.LongTensor, str | None] | None:
    """A conversation's first user turn, chat-templated with a generation prompt ((1, T) ids), and the text of
    the assistant reply that follows it (stripped; None if none); None without a user turn of that length."""
    msgs = example["messages"]
    user = next((j for j, m in enumerate(msgs) if m["role"] == "user"), None)
    if user is None or len(msgs[user]["content"]) < min_user_chars:
        return None
    reply = msgs[user + 1] if user + 1 < len(msgs) and msgs[user + 1]["role"] == "assistant" else None
    ids = tokenizer.apply_chat_template([{"role": "user", "content": msgs[user]["content"]}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    return ids, (reply["content"].strip() if reply is not None else None)


def eval_prompts(
    dataset, tokenizer, start: int, n: int, max_prompt_tokens: int, answer_prefix_tokens: int = 0
) -> list[torch.LongTensor]:
    """Held-out prompts: a conversation's first user turn, chat-templated with a generation prompt.

    With ``answer_prefix_tokens`` > 0 the prompt also carries the first tokens of the reference assistant
    answer, so generation continues real assistant text: a realistic in-domain workload that also works
    for BASE models (Gemma-3-270M), which otherwise drift into repetition on bare chat prompts.
    """
    prompts = []
    for i in range(start, len(dataset)):
        exchange = first_exchange(dataset[i], tokenizer, min_user_chars=20)
        if exchange is None:
            continue
        ids, answer = exchange
        if answer_prefix_tokens:
            if answer is None:
                continue
            prefix = tokenizer(answer, add_special_tokens=False)["input_ids"]
            if len(prefix) < 4 * answer_prefix_tokens:
                continue
            ids = torch.cat([ids, torch.tensor([prefix[:answer_prefix_tokens]])], dim=1)
        if ids.shape[1] <= max_prompt_tokens:
            prompts.append(ids)
        if len(prompts) == n:
            break
    return prompts


@dataclass
class Conversation:
    """Prompt (chat-templated user turn with generation prompt) followed by the reference answer tokens."""

    ids: torch.LongTensor  # (T,)
    answer_start: int  # first answer position: predictions from answer_start - 1 onwards are scored


def held_out_conversations(dataset, tokenizer, *, start: int = 0, n: int = 16, max_prompt_tokens: int = 512,
                           max_answer_tokens: int = 256, min_answer_tokens: int = 16) -> list[Conversation]:
    """First user turn + its assistant answer of conversations ``start...``: realistic context for drafting."""
    out = []
    for i in range(start, len(dataset)):
        exchange = first_exchange(dataset[i], tokenizer)
        if exchange is None or exchange[1] is None:
            continue
        prompt = exchange[0][0]
        answer = tokenizer(exchange[1], add_special_tokens=False, return_tensors="pt")["input_ids"][0][:max_answer_tokens]
        if prompt.numel() > max_prompt_tokens or answer.numel() < min_answer_tokens:
            continue
        out.append(Conversation(torch.cat([prompt, answer]), prompt.numel()))
        if len(out) == n:
            break
    if not out:
        raise ValueError("No held-out conversation with a user turn followed by an assistant answer: pass a chat "
                         "dataset in `messages` format (e.g. offline:sharegpt).")
    return out
