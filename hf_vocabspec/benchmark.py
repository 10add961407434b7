"""Side-by-side measurement of generation methods: tokens/s, acceptance, mean accepted length.

Methods are interleaved prompt by prompt and repeated, so slow drifts of a noisy machine hit all methods
alike; only ratios measured in the same run are reported as speedups.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

import torch
from transformers.generation.candidate_generator import AssistedCandidateGenerator

from .drafter import TrimmedDrafter


@dataclass
class Method:
    """One way to generate: target only (assistant None), HF assisted, or a TrimmedDrafter."""

    name: str
    assistant: torch.nn.Module | None = None


@dataclass
class MethodResult:
    name: str
    new_tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    tokens_per_s_runs: list[float] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None

    @property
    def mean_accepted_length(self) -> float | None:
        return 1.0 + self.accepted / self.rounds if self.rounds else None

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("outputs")
        d.update(tokens_per_s=self.tokens_per_s, acceptance_rate=self.acceptance_rate,
                 mean_accepted_length=self.mean_accepted_length)
        if len(self.tokens_per_s_runs) > 1:
            d["tokens_per_s_median"] = statistics.median(self.tokens_per_s_runs)
            d["tokens_per_s_spread"] = max(self.tokens_per_s_runs) - min(self.tokens_per_s_runs)
        return d


@contextlib.contextmanager
def count_hf_acceptance() -> Iterator[dict]:
    """Count rounds/proposed/accepted of HF's own AssistedCandidateGenerator (the peer baseline)."""
    counters = {"rounds": 0, "proposed": 0, "accepted": 0}
    original = AssistedCandidateGenerator.update_candidate_strategy

    def counting(self, input_ids, scores, num_matches):
        if type(self) is AssistedCandidateGenerator:
            counters["rounds"] += 1
            counters["proposed"] += scores.shape[1] - 1
            counters["accepted"] += int(num_matches)
        return original(self, input_ids, scores, num_matches)

    AssistedCandidateGenerator.update_candidate_strategy = counting
    try:
        yield counters
    finally:
        AssistedCandidateGenerator.update_candidate_strategy = original


def compare_methods(
    target,
    methods: Sequence[Method],
    prompts: Sequence[torch.LongTensor],
    *,
    max_new_tokens: int = 64,
    repeats: int = 1,
    generate_kwargs: dict | None = None,
    progress: Callable | None = None,
    seed: int = 0,
) -> dict[str, MethodResult]:
    """Generate every prompt with every method (interleaved), ``repeats`` times; return per-method totals."""
    generate_kwargs = dict(generate_kwargs or {})
    results = {m.name: MethodResult(m.name) for m in methods}
    steps = [(r, i, m) for r in range(repeats) for i in range(len(prompts)) for m in methods]
    per_run = {(m.name, r): [0, 0.0] for m in methods for r in range(repeats)}
    iterator = progress(steps) if progress else steps
    # warm-up: first calls pay one-off allocation costs
    for m in methods:
        target.generate(prompts[0], max_new_tokens=4, assistant_model=m.assistant, **generate_kwargs)
    for r, i, m in iterator:
        ids = prompts[i]
        torch.manual_seed(seed + i)
        with count_hf_acceptance() as hf_counts:
            t0 = time.perf_counter()
            out = target.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                assistant_model=m.assistant, **generate_kwargs,
            )
            dt = time.perf_counter() - t0
        res = results[m.name]
        n_new = out.shape[1] - ids.shape[1]
        res.new_tokens += n_new
        res.seconds += dt
        per_run[(m.name, r)][0] += n_new
        per_run[(m.name, r)][1] += dt
        if r == 0:
            res.outputs.append(out[0, ids.shape[1]:].tolist())
        if isinstance(m.assistant, TrimmedDrafter):
            stats = m.assistant.last_speculation_stats
            res.rounds += stats.rounds
            res.proposed += stats.proposed
            res.accepted += stats.accepted
        elif m.assistant is not None:
            res.rounds += hf_counts["rounds"]
            res.proposed += hf_counts["proposed"]
            res.accepted += hf_counts["accepted"]
    for (name, _r), (n, dt) in per_run.items():
        results[name].tokens_per_s_runs.append(n / dt if dt else 0.0)
    return results


def format_table(results: dict[str, MethodResult], baseline: str | None = None) -> str:
    """Markdown table; speedups are relative to ``baseline`` (same run)."""
    base = results[baseline].tokens_per_s if baseline else None
    lines = [
        "| method | tokens/s | speedup | acceptance | mean accepted length (tau) |",
        "|---|---|---|---|---|",
    ]
    for r in results.values():
        acc = f"{r.acceptance_rate:.1%}" if r.acceptance_rate is not None else "-"
        tau = f"{r.mean_accepted_length:.2f}" if r.mean_accepted_length is not None else "-"
        speed = f"{r.tokens_per_s / base:.2f}x" if base else "-"
        lines.append(f"| {r.name} | {r.tokens_per_s:.1f} | {speed} | {acc} | {tau} |")
    return "\n".join(lines)


@dataclass
class BenchConfig:
    """One benchmark run: a (target, drafter) pair, vocabulary sizes, workloads and decoding modes."""

    target: str = "offline:gemma-3-270m"
    drafter: str | None = None  # default: reduced-precision copy of the target
    drafter_dtype: str = "bfloat16"
    vocab_dataset: str = "offline:sharegpt"  # the domain the vocabulary is chosen on
    count_examples: int = 4000
    coverages: tuple[float, ...] = (0.9, 0.95, 0.99)
    ks: tuple[int, ...] = ()  # explicit kept sizes (e.g. a selected k and its neighbours), besides coverages
    workloads: tuple[str, ...] = ("offline:sharegpt", "offline:humaneval")
    modes: tuple[str, ...] = ("greedy",)  # "greedy", "t0.7", "t1"
    prompts: int = 3
    max_new_tokens: int = 48
    answer_prefix_tokens: int = 32
    repeats: int = 2
    num_assistant_tokens: int = 5


_MODES = {"greedy": {"do_sample": False}, "t0.7": {"do_sample": True, "temperature": 0.7, "top_k": 0},
          "t1": {"do_sample": True, "temperature": 1.0, "top_k": 0}}


def run_benchmark(cfg: BenchConfig, out_dir, progress: Callable | None = None) -> dict:
    """Measure every method on every workload and mode; write results.json, results.md and PNG plots."""
    import json
    from pathlib import Path

    from .coverage import count_assistant_tokens
    from .drafter import trim_drafter
    from .offline import load_chat_dataset, load_model, load_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dtype = getattr(torch, cfg.drafter_dtype)
    tokenizer = load_tokenizer(cfg.target)
    vocab_ds = load_chat_dataset(cfg.vocab_dataset)
    n_count = min(cfg.count_examples, len(vocab_ds) - 500)
    counts = count_assistant_tokens(vocab_ds.select(range(n_count)), tokenizer, progress=progress is not None)
    target = load_model(cfg.target, dtype=torch.float32).eval()
    drafter_name = cfg.drafter or cfg.target
    full = load_model(drafter_name, dtype=dtype).eval()
    gen = full.generation_config
    gen.num_assistant_tokens, gen.num_assistant_tokens_schedule = cfg.num_assistant_tokens, "constant"
    gen.assistant_confidence_threshold = 0.0
    methods = [Method("target only"), Method("HF assisted (untrimmed)", full)]
    kept = {}
    sizes = [counts.smallest_k_for_coverage(c) for c in cfg.coverages] + list(cfg.ks)
    for k in sorted(set(sizes)):
        d = trim_drafter(load_model(drafter_name, dtype=dtype), counts.top_k(k), tokenizer=tokenizer)
        d.generation_config.num_assistant_tokens = cfg.num_assistant_tokens
        kept[f"trimmed k={d.config.draft_vocab_size}"] = d
        methods.append(Method(f"trimmed k={d.config.draft_vocab_size}", d))

    from .cost import measure_draft_latency

    curve = measure_draft_latency(full, sorted({d.config.draft_vocab_size for d in kept.values()} | {len(tokenizer)}))
    curve.plot(out / "draft_latency_vs_vocab.png")
    report = {"config": asdict(cfg), "date": time.strftime("%Y-%m-%d"), "torch_threads": torch.get_num_threads(),
              "full_vocab": len(tokenizer), "draft_step_latency": curve.to_dict(), "runs": []}
    for workload in cfg.workloads:
        ds = vocab_ds if workload == cfg.vocab_dataset else load_chat_dataset(workload)
        start = n_count if workload == cfg.vocab_dataset else 0
        held_out = ds.select(range(start, len(ds)))
        eval_counts = count_assistant_tokens(held_out, tokenizer, progress=False)
        prompts = eval_prompts(held_out, tokenizer, 0, cfg.prompts, 512, cfg.answer_prefix_tokens)
        for mode in cfg.modes:
            res = compare_methods(target, methods, prompts, max_new_tokens=cfg.max_new_tokens, repeats=cfg.repeats,
                                  generate_kwargs=_MODES[mode], progress=progress)
            base = res["target only"]
            hf = res["HF assisted (untrimmed)"]
            rows = {}
            for name, r in res.items():
                row = r.to_dict()
                row["speedup_vs_target"] = _median_ratio(r, base)
                row["speedup_vs_hf_assisted"] = _median_ratio(r, hf)
                if name in kept:
                    row["kept_vocab"] = kept[name].config.draft_vocab_size
                    row["eval_coverage"] = eval_counts.coverage_of(kept[name].d2t)
                rows[name] = row
            identical = all(res[m.name].outputs == base.outputs for m in methods) if mode == "greedy" else None
            report["runs"].append({"workload": workload, "in_domain": workload == cfg.vocab_dataset, "mode": mode,
                                   "prompts": len(prompts), "methods": rows, "greedy_identical": identical})
            (out / "results.json").write_text(json.dumps(report, indent=2))
    (out / "results.md").write_text(format_report(report))
    plot_report(report, out)
    return report


def _median_ratio(r: MethodResult, base: MethodResult) -> dict:
    """Per-repeat tokens/s ratios (same run, interleaved): median and spread."""
    ratios = [a / b for a, b in zip(r.tokens_per_s_runs, base.tokens_per_s_runs) if b]
    if not ratios:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def format_report(report: dict) -> str:
    lat = report.get("draft_step_latency")
    head = ""
    if lat:
        steps = ", ".join(f"k={k:,}: {t * 1e3:.1f} ms" for k, t in zip(lat["ks"], lat["seconds"]))
        head = f"Draft step ({lat['dtype']}, context {lat['context_length']}): {steps}; body-only floor {lat['floor_seconds'] * 1e3:.1f} ms\n\n"
    lines = ["| workload | mode | method | kept vocab | eval coverage | tokens/s | vs target | vs HF assisted | "
             "acceptance | tau |", "|---|---|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        dom = "in-domain" if run["in_domain"] else "out-of-domain"
        for name, row in run["methods"].items():
            vs_t, vs_h = row["speedup_vs_target"], row["speedup_vs_hf_assisted"]
            fmt = lambda d: f"{d['median']:.2f}x ({d['min']:.2f}-{d['max']:.2f})" if d["median"] else "-"  # noqa: E731
            acc = f"{row['acceptance_rate']:.1%}" if row["acceptance_rate"] is not None else "-"
            tau = f"{row['mean_accepted_length']:.2f}" if row["mean_accepted_length"] is not None else "-"
            kv = f"{row['kept_vocab']:,}" if "kept_vocab" in row else ("full" if "HF" in name else "-")
            cov = f"{row['eval_coverage']:.1%}" if "eval_coverage" in row else "-"
            lines.append(f"| {run['workload']} ({dom}) | {run['mode']} | {name} | {kv} | {cov} | "
                         f"{row['tokens_per_s']:.2f} | {fmt(vs_t)} | {fmt(vs_h)} | {acc} | {tau} |")
    return head + "\n".join(lines) + "\n"


def plot_report(report: dict, out_dir) -> None:
    """tokens/s and tau vs kept vocabulary size (full vocabulary = HF assisted), per workload and mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for run in report["runs"]:
        label = f"{run['workload'].removeprefix('offline:')} {run['mode']}"
        pts = sorted((row.get("kept_vocab", report["full_vocab"]), row["tokens_per_s"], row["mean_accepted_length"])
                     for name, row in run["methods"].items() if name != "target only")
        ks = [p[0] for p in pts]
        axes[0].plot(ks, [p[1] for p in pts], "o-", label=label)
        axes[1].plot(ks, [p[2] for p in pts], "o-", label=label)
        axes[0].axhline(run["methods"]["target only"]["tokens_per_s"], ls=":", lw=1, color="gray")
    for ax, yl in zip(axes, ("tokens/s (dotted: target only)", "mean accepted length tau")):
        ax.set_xscale("log")
        ax.set_xlabel("kept vocabulary size (rightmost: untrimmed)")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(f"{out_dir}/throughput_vs_vocab.png", dpi=120)
    plt.close(fig)


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
        msgs = dataset[i]["messages"]
        user = next((j for j, m in enumerate(msgs) if m["role"] == "user"), None)
        if user is None or len(msgs[user]["content"]) < 20:
            continue
        answer = msgs[user + 1] if user + 1 < len(msgs) and msgs[user + 1]["role"] == "assistant" else None
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": msgs[user]["content"]}], add_generation_prompt=True,
            return_tensors="pt", return_dict=True,
        )["input_ids"]
        if answer_prefix_tokens:
            if answer is None:
                continue
            prefix = tokenizer(answer["content"].strip(), add_special_tokens=False)["input_ids"]
            if len(prefix) < 4 * answer_prefix_tokens:
                continue
            ids = torch.cat([ids, torch.tensor([prefix[:answer_prefix_tokens]])], dim=1)
        if ids.shape[1] <= max_prompt_tokens:
            prompts.append(ids)
        if len(prompts) == n:
            break
    return prompts
