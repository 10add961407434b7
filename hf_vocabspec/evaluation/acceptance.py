"""Exact expected acceptance of a trimmed drafter on held-out conversations, with and without context tokens.

Why: measured tau from a few hundred generated tokens is noisy (two runs of one method differed by 25%),
so methods are compared first by the exact per-token acceptance of an IDEAL trimmed drafter: the target's
own distribution restricted to what the drafter can propose, D_t (the kept ids; with context tokens also
the pruned ids already present in the conversation up to position t). For that drafter
q = p restricted to D_t and renormalised, so the expected acceptance sum_j min(p_j, q_j) is exactly
p(D_t) under sampling, and 1[argmax p in D_t] under greedy. The gap to 1 is what pruning costs; the gain
from context tokens is what they recover. Predicted tau with L draft tokens: (1 - a^(L+1)) / (1 - a)
(hf_vocabspec.cost.tokens_per_round).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .._io import atomic_write
from ..cost import tokens_per_round
from .data import Conversation, count_split, held_out_conversations


@torch.no_grad()
def ideal_acceptance(
    target,
    conversations: Sequence[Conversation],
    kept: dict[str, torch.Tensor],
    *,
    temperatures: Sequence[float] = (1.0,),
    progress: Callable | None = None,
) -> dict[str, dict[str, float]]:
    """Mean expected acceptance per kept vocabulary and mode, vanilla vs context tokens (see module doc).

    ``kept`` maps a name to kept target ids. Returns {name: {"greedy": a, "greedy+context": a,
    "t1.0": a, "t1.0+context": a, ...}} averaged over all scored answer positions; one target pass per
    conversation serves every vocabulary and temperature.
    """
    vocab = int(target.config.get_text_config().vocab_size)
    masks = {}
    for name, ids in kept.items():
        m = torch.zeros(vocab, dtype=torch.bool)
        m[torch.as_tensor(ids, dtype=torch.long)] = True
        masks[name] = m
    modes = ["greedy"] + [f"t{t:g}" for t in temperatures]
    totals = {name: {f"{mode}{ctx}": 0.0 for mode in modes for ctx in ("", "+context")} for name in kept}
    n_positions = 0
    for conv in progress(conversations) if progress else conversations:
        ids = conv.ids
        logits = target(input_ids=ids[None].to(target.device)).logits[0].float().cpu()
        rows = torch.arange(conv.answer_start - 1, ids.numel() - 1)  # position t predicts ids[t + 1]
        logits = logits[rows]
        n_positions += rows.numel()
        # first occurrence of every id in the conversation: draftable as a context token from then on
        uniq, inverse = torch.unique(ids, return_inverse=True)
        first = torch.full((uniq.numel(),), ids.numel(), dtype=torch.long).scatter_reduce(
            0, inverse, torch.arange(ids.numel()), reduce="amin")
        seen = first[None, :] <= rows[:, None]  # (positions, distinct ids): id already in context at t
        argmax = logits.argmax(-1)
        probs = {mode: (logits / float(mode[1:])).softmax(-1) for mode in modes[1:]}
        for name, mask in masks.items():
            pruned_seen = seen & ~mask[uniq][None, :]  # pruned ids that are context tokens at t
            in_ctx_argmax = (pruned_seen & (uniq[None, :] == argmax[:, None])).any(1)
            totals[name]["greedy"] += float(mask[argmax].sum())
            totals[name]["greedy+context"] += float((mask[argmax] | in_ctx_argmax).sum())
            for mode, p in probs.items():
                kept_mass = p[:, mask].sum(1)
                ctx_mass = (p[:, uniq] * pruned_seen).sum(1)
                totals[name][mode] += float(kept_mass.sum())
                totals[name][f"{mode}+context"] += float((kept_mass + ctx_mass).sum())
    return {name: {k: v / max(n_positions, 1) for k, v in t.items()} for name, t in totals.items()}


def run_acceptance_report(target_name: str, out_dir, *, dataset: str = "offline:sharegpt", count_examples: int = 4000,
                          levels: Sequence[float] = (0.5, 0.75, 0.9, 0.95, 0.97), conversations: int = 24,
                          temperatures: Sequence[float] = (1.0, 0.7), num_draft_tokens: int = 5,
                          progress: Callable | None = None) -> dict:
    """Count on ``count_examples`` conversations, score held-out ones; write results.json/.md and a PNG."""
    import json
    import time
    from pathlib import Path

    from ..coverage import count_assistant_tokens
    from ..rdk import iter_pruning_levels
    from ..trimming import special_token_ids
    from .offline import load_chat_dataset, load_model, load_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(target_name)
    ds = load_chat_dataset(dataset)
    counted, held_out = count_split(ds, count_examples)
    n_count = len(counted)
    counts = count_assistant_tokens(counted, tokenizer, progress=False)
    target = load_model(target_name, dtype=torch.float32).eval()
    vocab = int(target.config.get_text_config().vocab_size)
    special = set(special_token_ids(target, tokenizer))
    kept = {f"{level:g}": torch.tensor(sorted(set(counts.top_k(k).tolist()) | special))
            for level, k in iter_pruning_levels(levels, vocab)}
    convs = held_out_conversations(held_out, tokenizer, n=conversations)
    scores = ideal_acceptance(target, convs, kept, temperatures=temperatures, progress=progress)
    rows = [{"pruned": float(level), "kept": int(kept[level].numel()), **{
        mode: {"acceptance": a, "predicted_tau": tokens_per_round(num_draft_tokens, acceptance=a)} for mode, a in s.items()}}
        for level, s in scores.items()]
    report = {"target": target_name, "dataset": dataset, "count_examples": n_count, "date": time.strftime("%Y-%m-%d"),
              "conversations": len(convs), "positions": sum(c.ids.numel() - c.answer_start + 1 for c in convs),
              "num_draft_tokens": num_draft_tokens, "vocab_size": vocab, "rows": rows}
    atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(report, indent=2)))
    atomic_write(out / "results.md", lambda p: p.write_text(format_acceptance(report)))
    plot_acceptance(report, out / "acceptance_vs_vocab.png")
    return report


def format_acceptance(report: dict) -> str:
    modes = [m for m in report["rows"][0] if m not in ("pruned", "kept") and not m.endswith("+context")]
    head = "| pruned | kept | " + " | ".join(f"{m} vanilla | {m} +context" for m in modes) + " |"
    lines = [head, "|---|---|" + "---|---|" * len(modes)]
    for r in report["rows"]:
        cells = []
        for m in modes:
            for key in (m, f"{m}+context"):
                cells.append(f"{r[key]['acceptance']:.1%} (tau {r[key]['predicted_tau']:.2f})")
        lines.append(f"| {r['pruned']:.0%} | {r['kept']:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_acceptance(report: dict, path) -> None:
    import matplotlib
    from matplotlib.figure import Figure  # no pyplot: leaves the user's backend alone

    rows = report["rows"]
    ks = [r["kept"] for r in rows]
    fig = Figure(figsize=(6.5, 4))
    ax = fig.subplots()
    modes = [m for m in rows[0] if m not in ("pruned", "kept") and not m.endswith("+context")]
    for color, m in zip(matplotlib.rcParams["axes.prop_cycle"].by_key()["color"], modes):
        ax.plot(ks, [r[m]["predicted_tau"] for r in rows], "o--", color=color, label=f"{m} vanilla pruned")
        ax.plot(ks, [r[f"{m}+context"]["predicted_tau"] for r in rows], "o-", color=color, label=f"{m} + context tokens")
    ax.axhline(report["num_draft_tokens"] + 1, ls=":", color="gray", lw=1, label="untrimmed (ideal drafter)")
    ax.set_xscale("log")
    ax.set_xlabel("kept vocabulary size")
    ax.set_ylabel(f"predicted tau (L={report['num_draft_tokens']})")
    ax.set_title(f"{report['target'].removeprefix('offline:')}: ideal trimmed drafter, held-out {report['dataset'].removeprefix('offline:')}",
                 fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
