"""Evidence for RDK: acceptance and tau vs kept-vocabulary size, vanilla pruned vs RDK vs untrimmed.

For each pruning level the same trimmed drafter runs three ways (vanilla pruned sampling, RDK with the
fitted kernel, RDK with the embedding prior) next to the untrimmed drafter (full vocabulary, same
generator), all interleaved prompt by prompt under sampling. Expected one-token acceptance of each
kernel (exact, teacher-forced on held-out text, ideal drafter) is reported next to the generation
numbers: it is noise-free, while tau from a few hundred generated tokens is not.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .._io import atomic_write
from ..configuration import set_draft_length
from ..cost import tokens_per_round
from .benchmark import Method, MethodResult, compare_methods
from ._format import cell as _f
from .benchmark import Method, MethodResult, compare_methods
from .data import eval_prompts, load_workload

CALIBRATION_CONVERSATIONS = 3000
from ..rdk import (
    calibration_sequences,
    collect_calibration,
    embedding_prior_kernel,
    fit_rdk_kernel,
    identity_kernel,
    iter_pruning_levels,
    score_kernels,
)


@dataclass
class RDKBenchConfig:
    target: str = "offline:gemma-3-270m"
    drafter_dtype: str = "bfloat16"  # drafter = reduced-precision copy of the target
    dataset: str = "offline:sharegpt"
    count_examples: int = 4000
    levels: tuple[float, ...] = (0.5, 0.75, 0.9, 0.95, 0.97)  # pruned share of the vocabulary
    temperatures: tuple[float, ...] = (1.0, 0.7)
    calibration_sequences: int = 60
    score_sequences: int = 12
    num_targets: int = 8
    prompts: int = 3
    max_new_tokens: int = 48
    repeats: int = 1
    answer_prefix_tokens: int = 32
    num_draft_tokens: int = 5  # L (transformers' num_assistant_tokens), constant
    generate: bool = True


def run_rdk_benchmark(cfg: RDKBenchConfig, out_dir, progress: Callable | None = None) -> dict:
    """Fit kernels, score them, generate; write results.json, results.md and rdk_tau_vs_vocab.png."""
    from ..coverage import count_assistant_tokens
    from ..trimming import trim_drafter
    from .offline import load_model

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    dtype = getattr(torch, cfg.drafter_dtype)
    work = load_workload(cfg.target, cfg.dataset, cfg.count_examples, progress=progress is not None)
    tokenizer, target, counts, held_out = work.tokenizer, work.target, work.counts, work.held_out
    vocab = int(target.config.get_text_config().vocab_size)
    # held-out part: the first CALIBRATION_CONVERSATIONS (at most half of it) calibrate kernels, prompts and eval
    # coverage come after (a held-out part of 3000 or fewer conversations had left nothing to evaluate on: IndexError)
    if len(held_out) < 2:
        raise ValueError(f"--dataset {cfg.dataset}: {len(held_out)} conversation(s) held out after the "
                         f"{counts.num_examples} counted; rdk-bench calibrates on held-out conversations and evaluates "
                         "on others: pass a dataset with more conversations (10 or more).")
    calib_ds = held_out.select(range(min(len(held_out) // 2, CALIBRATION_CONVERSATIONS)))
    eval_ds = held_out.select(range(len(calib_ds), len(held_out)))
    seqs = calibration_sequences(calib_ds, tokenizer, max_sequences=cfg.calibration_sequences + cfg.score_sequences)
    fit_seqs, score_seqs = seqs[: cfg.calibration_sequences], seqs[cfg.calibration_sequences :]
    prompts = eval_prompts(eval_ds, tokenizer, 0, cfg.prompts, 512, cfg.answer_prefix_tokens)
    eval_counts = count_assistant_tokens(eval_ds, tokenizer, progress=False)
    seen = (counts.counts > 0).nonzero().squeeze(1)

    def drafter_for(keep):
        d = trim_drafter(load_model(cfg.target, dtype=dtype).eval(), keep, tokenizer=tokenizer)
        set_draft_length(d.generation_config, cfg.num_draft_tokens)
        return d

    untrimmed = drafter_for(torch.arange(vocab))
    levels = []
    for level, k in iter_pruning_levels(cfg.levels, vocab):
        drafter = drafter_for(counts.top_k(k))
        d2t = drafter.d2t.cpu()
        t0 = time.perf_counter()
        prior = embedding_prior_kernel(drafter.get_input_embeddings().weight, d2t,
                                       pruned_mass=max(0.0, 1 - counts.coverage_of(d2t)),
                                       num_targets=cfg.num_targets, candidate_ids=seen, progress=False)
        levels.append({"level": level, "kept": int(d2t.numel()), "drafter": drafter, "prior": prior,
                       "prior_seconds": time.perf_counter() - t0,
                       "coverage_counted": counts.coverage_of(d2t), "coverage_eval": eval_counts.coverage_of(d2t)})

    report = {"config": asdict(cfg), "date": time.strftime("%Y-%m-%d"), "torch_threads": torch.get_num_threads(),
              "vocab": vocab, "prompts": len(prompts), "runs": []}
    for temp in cfg.temperatures:
        t0 = time.perf_counter()
        calib = collect_calibration(target, fit_seqs, temperature=temp, progress=progress is not None)
        collect_s = time.perf_counter() - t0
        kernels = {}
        for lv in levels:
            t0 = time.perf_counter()
            lv[f"fitted_{temp}"] = fit_rdk_kernel(calib, lv["drafter"].d2t.cpu(), num_targets=cfg.num_targets)
            lv[f"fit_seconds_{temp}"] = time.perf_counter() - t0
            kernels[(lv["level"], "vanilla")] = identity_kernel(lv["drafter"].d2t.cpu(), vocab, cfg.num_targets)
            kernels[(lv["level"], "RDK fitted")] = lv[f"fitted_{temp}"]
            kernels[(lv["level"], "RDK prior")] = lv["prior"]
        named = {f"{lvl}|{m}": kern for (lvl, m), kern in kernels.items()}
        expected = score_kernels(target, score_seqs, named, temperature=temp, progress=progress is not None)

        # generation: the bench's one measurement loop (warm-up, interleaved, forward timing); a level's drafter
        # gets each method's kernel attached before its calls (untimed), vanilla/untrimmed switch RDK off; all context-free
        # (context tokens are scored by `hf-vocabspec acceptance`)
        free = {"use_context_tokens": False}
        methods = [Method("untrimmed", untrimmed, attrs={**free, "use_rdk": False})]
        keys = {"untrimmed": ("untrimmed", None)}
        for lv in levels:
            for mname, kern in (("vanilla", None), ("RDK fitted", lv[f"fitted_{temp}"]), ("RDK prior", lv["prior"])):
                drafter, name = lv["drafter"], f"{mname} @{lv['level']}"
                prepare = None if kern is None else (lambda d=drafter, k=kern: d.set_rdk_kernel(k))
                methods.append(Method(name, drafter, attrs={**free, "use_rdk": kern is not None}, prepare=prepare))
                keys[name] = (mname, lv["level"])
        gen_kwargs = {"do_sample": True, "temperature": temp, "top_k": 0, "top_p": 1.0}
        if cfg.generate and prompts:
            measured = compare_methods(target, methods, prompts, max_new_tokens=cfg.max_new_tokens,
                                       repeats=cfg.repeats, generate_kwargs=gen_kwargs, progress=progress)
        else:
            measured = {m.name: MethodResult(m.name, speculative=True) for m in methods}
        results = {keys[name]: r for name, r in measured.items()}
        base = results[("untrimmed", None)]
        rows = [{"method": "untrimmed", "level": 0.0, "kept": vocab, "coverage_eval": 1.0,
                 "expected_acceptance": None, **_gen_row(base, base)}]
        for lv in levels:
            for mname in ("vanilla", "RDK fitted", "RDK prior"):
                r = results[(mname, lv["level"])]
                rows.append({"method": mname, "level": lv["level"], "kept": lv["kept"],
                             "coverage_eval": lv["coverage_eval"],
                             "expected_acceptance": expected[f"{lv['level']}|{mname}"],
                             **_gen_row(r, base)})
        report["runs"].append({
            "temperature": temp, "calibration_positions": calib.num_positions, "calibration_seconds": collect_s,
            "rows": rows,
            "kernels": {str(lv["level"]): {"fitted": lv[f"fitted_{temp}"].info, "fit_seconds": lv[f"fit_seconds_{temp}"],
                                           "prior_seconds": lv["prior_seconds"],
                                           "fitted_moved_mass": lv[f"fitted_{temp}"].moved_mass,
                                           "prior_moved_mass": lv["prior"].moved_mass} for lv in levels},
        })
        atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(report, indent=2, default=str)))
    report["seconds_total"] = time.perf_counter() - t_start
    atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(report, indent=2, default=str)))
    atomic_write(out / "results.md", lambda p: p.write_text(format_rdk_report(report)))
    plot_rdk_report(report, out / "rdk_tau_vs_vocab.png")
    return report


def _gen_row(r: MethodResult, base: MethodResult) -> dict:
    tau = r.mean_accepted_length
    return {"tokens_per_s": r.tokens_per_s, "acceptance": r.acceptance_rate, "tau": tau,
            "tau_vs_untrimmed": tau / base.mean_accepted_length if tau and base.mean_accepted_length else None,
            "tokens_per_s_vs_untrimmed": r.tokens_per_s / base.tokens_per_s if base.tokens_per_s else None,
            "rounds": r.rounds, "new_tokens": r.new_tokens, "pruned_proposed": r.stats.pruned_proposed}


def format_rdk_report(report: dict) -> str:
    draft_tokens = int(report["config"].get("num_draft_tokens", report["config"].get("num_assistant_tokens", 5)))
    lines = []
    for run in report["runs"]:
        lines += [f"\nTemperature {run['temperature']} ({report['prompts']} prompts x "
                  f"{report['config']['max_new_tokens']} tokens, {report['config']['repeats']} repeat(s)):\n",
                  "| pruned | kept | eval coverage | method | expected acceptance (ideal drafter) | "
                  f"predicted tau (L={draft_tokens}) | acceptance | tau | "
                  "tau vs untrimmed | tokens/s vs untrimmed | pruned tokens proposed |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in run["rows"]:
            expected = row["expected_acceptance"]
            predicted_tau = None if expected is None else tokens_per_round(draft_tokens, acceptance=expected)
            lines.append(
                f"| {row['level']:.0%} | {row['kept']:,} | {row['coverage_eval']:.1%} | {row['method']} | "
                f"{_f(row['expected_acceptance'], '.1%')} | "
                f"{_f(predicted_tau, '.2f')} | "
                f"{_f(row['acceptance'], '.1%')} | {_f(row['tau'], '.2f')} | "
                f"{_f(row['tau_vs_untrimmed'], '.3f')} | {_f(row['tokens_per_s_vs_untrimmed'], '.2f')} | "
                f"{row['pruned_proposed']} |")
    return "\n".join(lines) + "\n"


def plot_rdk_report(report: dict, path) -> None:
    from matplotlib.figure import Figure  # no pyplot: leaves the user's backend alone

    runs = report["runs"]
    fig = Figure(figsize=(5.5 * len(runs), 7.5))
    axes = fig.subplots(2, len(runs), squeeze=False)
    for col, run in enumerate(runs):
        base = next(r for r in run["rows"] if r["method"] == "untrimmed")
        for method, style in (("vanilla", "o-"), ("RDK fitted", "s-"), ("RDK prior", "^--")):
            rows = [r for r in run["rows"] if r["method"] == method]
            kept = [r["kept"] for r in rows]
            axes[0][col].plot(kept, [r["expected_acceptance"] for r in rows], style, label=method)
            axes[1][col].plot(kept, [r["tau"] or float("nan") for r in rows], style, label=method)
        if base["tau"]:
            axes[1][col].axhline(base["tau"], color="k", ls=":", label="untrimmed")
        axes[0][col].axhline(1.0, color="k", ls=":", lw=0.5)
        for row, ylabel in ((0, "expected acceptance per token\n(teacher-forced, ideal drafter)"),
                            (1, "tau (mean accepted length)\nmeasured in generation")):
            ax = axes[row][col]
            ax.set_xscale("log")
            ax.set_xlabel("kept vocabulary size")
            ax.set_ylabel(ylabel)
            ax.set_title(f"T={run['temperature']}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"RDK vs vanilla pruned sampling ({report['config']['target']})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
