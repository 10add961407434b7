"""Batched speculative decoding bench (``hf-vocabspec bench --batch-sizes 1 2 4 8``).

Per batch size B, on the first B held-out prompts (left-padded together), methods interleaved per repeat:
- batched target-only decoding (``target.generate(**batch)``),
- batched trimmed speculative decoding (``target.generate(**batch, assistant_model=trimmed)``, our loop at B > 1),
- what a user can do today: a loop of batch-1 HF assisted calls with the same UNTRIMMED drafter.
Reported: total new tokens/s, ratios measured side by side (median and range over repeats), per-row tau, the
share of the speculative call spent in cache realignment, the loop's speculate/decode decision, peak extra RSS
per call (Linux VmHWM, reset before each call), and greedy identity with batched target-only (rows that differ
are reported with the target's top-2 logit margin at the first difference: near-ties are reported, not hidden).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .._io import atomic_write
from ..configuration import CAPPED_FROM_ROWS
from ..generation import SpeculationStats


@dataclass
class BatchBenchConfig:
    target: str = "offline:gemma-3-270m"
    drafter: str | None = None  # default: reduced-precision copy of the target
    drafter_dtype: str = "bfloat16"
    vocab_dataset: str = "offline:sharegpt"
    count_examples: int = 4000
    coverage: float = 0.95
    context_tokens: bool = True
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    max_new_tokens: int = 48
    answer_prefix_tokens: int = 32
    repeats: int = 2
    num_draft_tokens: int | None = None  # None: the trimmed drafter's own default (L and confidence stop)
    confidence_threshold: float = 0.0  # with num_draft_tokens: its confidence stop (0: none)
    batched_speculation: str = "auto"
    compile_draft_step: bool = False  # the trimmed drafter's steps compiled (drafter.compile_draft_step)
    weight_quantization: str | None = None  # the trimmed drafter's weights int8 / int4 (drafter.quantize_weights)
    hf_loop: bool = True  # also time the batch-1 HF assisted loop (untrimmed drafter)


@dataclass
class CallResult:
    seconds: float
    new_tokens: int
    outputs: list[list[int]]
    peak_extra_mb: float | None = None
    stats: dict = field(default_factory=dict)


def _rss_mb(key: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: reset VmHWM (peak RSS) to the current RSS
        return True
    except OSError:
        return False


def _new_tokens(seq: torch.Tensor, prompt_len: int, eos: set[int], pad: int | None) -> list[list[int]]:
    rows = []
    for row in seq[:, prompt_len:].tolist():
        out = []
        for t in row:
            out.append(t)
            if t in eos:
                break
        rows.append(out)
    return rows


def left_padded(prompts: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts (each ``[1, n]``) as one left-padded batch: ``input_ids`` and ``attention_mask``."""
    P = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), P), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), P), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - p.shape[1] :], mask[i, P - p.shape[1] :] = p[0], 1
    return ids, mask


def eos_ids(model) -> set[int]:
    """The token ids that end a row of ``model.generate`` (its generation config's ``eos_token_id``)."""
    eos = model.generation_config.eos_token_id
    return {int(t) for t in ([eos] if isinstance(eos, int) else (eos or []))}


def timed_call(fn, prompt_len: int, eos: set[int], pad) -> CallResult:
    base = _rss_mb("VmRSS") if _reset_peak() else None
    start = time.perf_counter()
    seqs = fn()
    seconds = time.perf_counter() - start
    peak = _rss_mb("VmHWM")
    outputs = []
    for s, plen in seqs:
        outputs += _new_tokens(s, plen, eos, pad)
    extra = (peak - base) if base is not None and peak is not None else None
    return CallResult(seconds, sum(len(o) for o in outputs), outputs, extra)


def _first_diff_margin(target, prompt: torch.Tensor, ours: list[int], ref: list[int]) -> dict | None:
    """Where a row differs from target-only: position and the target's top-2 logit margin there (fp32)."""
    n = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    if n is None:
        return None if len(ours) == len(ref) else {"position": min(len(ours), len(ref)), "margin": None}
    ctx = torch.cat([prompt[0], torch.tensor(ref[:n], dtype=torch.long)])[None]
    with torch.no_grad():
        logits = target(input_ids=ctx).logits[0, -1].float()
    top = logits.topk(2).values
    return {"position": n, "margin": float(top[0] - top[1])}


def target_only_call(target, ids: torch.Tensor, mask: torch.Tensor, gen: dict,
                     fast: bool = True) -> list[tuple[torch.Tensor, int]]:
    """Batched target-only generate as the benches time it, in target-only's grad mode (``benchmark.baseline_mode``:
    inference mode) and, with ``fast``, the linear kernels our generate runs (the speed-up left to speculation
    itself); ``[(sequences, prompt width)]`` for :func:`timed_call`."""
    from ..kernels import fast_linears
    from .benchmark import baseline_mode

    with fast_linears(target, enabled=fast), baseline_mode("target"):
        return [(target.generate(input_ids=ids, attention_mask=mask, **gen), ids.shape[1])]


def run_batch_bench(cfg: BatchBenchConfig, out_dir, progress=None) -> dict:
    from ..configuration import capped_draft_length, set_draft_length
    from ..trimming import trim_drafter
    from .benchmark import machine_info
    from .data import eval_prompts, load_workload
    from .offline import load_model

    out = Path(out_dir)
    dtype = getattr(torch, cfg.drafter_dtype)
    work = load_workload(cfg.target, cfg.vocab_dataset, cfg.count_examples, progress=progress is not None)
    tokenizer, target = work.tokenizer, work.target
    k = work.counts.smallest_k_for_coverage(cfg.coverage)
    drafter_name = cfg.drafter or cfg.target
    trimmed = trim_drafter(load_model(drafter_name, dtype=dtype), work.counts.top_k(k), tokenizer=tokenizer).eval()
    trimmed.use_context_tokens = cfg.context_tokens and trimmed.supports_context_tokens
    if cfg.num_draft_tokens:
        set_draft_length(trimmed.generation_config, cfg.num_draft_tokens, cfg.confidence_threshold)
    trimmed.generation_config.batched_speculation = cfg.batched_speculation
    trimmed.compile_draft_step = cfg.compile_draft_step  # (compiled in the warm-up repeat, which is dropped)
    if cfg.weight_quantization:
        trimmed.quantize_weights(cfg.weight_quantization)
    full = None
    if cfg.hf_loop:
        full = load_model(drafter_name, dtype=dtype).eval()
        set_draft_length(full.generation_config, int(trimmed.generation_config.num_assistant_tokens),
                         trimmed.generation_config.assistant_confidence_threshold or 0.0)
    prompts = eval_prompts(work.held_out, tokenizer, 0, max(cfg.batch_sizes), 512, cfg.answer_prefix_tokens)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = eos_ids(target)
    gen = {"do_sample": False, "max_new_tokens": cfg.max_new_tokens, "pad_token_id": pad}
    report = {"config": asdict(cfg), "machine": machine_info(), "kept_vocab": int(k), "full_vocab": len(tokenizer),
              "draft_length": int(trimmed.generation_config.num_assistant_tokens),
              "confidence_threshold": float(trimmed.generation_config.assistant_confidence_threshold or 0.0),
              "runs": []}
    # what rounds of CAPPED_FROM_ROWS rows or more draft (the engine's cap where a confidence stop cannot end it)
    report["batched_draft_length"] = capped_draft_length(report["draft_length"], report["confidence_threshold"])

    with torch.no_grad():
        for b in cfg.batch_sizes:
            ids, mask = left_padded(prompts[:b], pad)
            P = ids.shape[1]
            calls = {"target only": lambda: target_only_call(target, ids, mask, gen, fast=False),
                     "target only (fast linears)": lambda: target_only_call(target, ids, mask, gen),
                     "trimmed speculative": lambda: [(target.generate(input_ids=ids, attention_mask=mask,
                                                                      assistant_model=trimmed, **gen), P)]}
            if full is not None:
                calls["HF assisted batch-1 loop"] = lambda: [
                    (target.generate(input_ids=p, attention_mask=torch.ones_like(p), assistant_model=full, **gen),
                     p.shape[1]) for p in prompts[:b]]
            results: dict[str, list[CallResult]] = {name: [] for name in calls}
            for _ in range(cfg.repeats + 1):  # first repeat warms up, dropped
                for name, fn in calls.items():
                    r = timed_call(fn, P, eos, pad)
                    if name == "trimmed speculative":
                        r.stats = trimmed.last_speculation_stats.to_dict()
                        r.stats.pop("per_round_accepted", None)
                        r.stats.pop("per_round_proposed", None)
                    results[name].append(r)
                    if progress:
                        progress(f"batch {b}: {name} {r.new_tokens / r.seconds:.2f} tok/s")
            results = {n: rs[1:] for n, rs in results.items()}
            run = {"batch": b, "methods": {}}
            base = results["target only"]
            for name, rs in results.items():
                tps = [r.new_tokens / r.seconds for r in rs]
                entry = {"tokens_per_s": statistics.median(tps), "tokens_per_s_all": tps,
                         "peak_extra_mb": max((r.peak_extra_mb or 0) for r in rs)}
                ratios = [r_tps / (x.new_tokens / x.seconds) for r_tps, x in zip(tps, base)]
                entry["vs_target"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
                if name == "trimmed speculative":
                    st = rs[-1].stats
                    entry["tau"] = SpeculationStats.from_dict(st).mean_accepted_length or None  # 0: no round
                    total = sum(r.seconds for r in rs)
                    entry["realign_share"] = sum(r.stats.get("realign_seconds", 0.0) for r in rs) / total
                    entry["decision"] = st.get("decision") or ("HF loop (batch 1)" if b == 1 else "")
                    diffs = []
                    for i, (o, ref) in enumerate(zip(rs[-1].outputs, base[-1].outputs)):
                        d = _first_diff_margin(target, prompts[i], o, ref)
                        if d is not None:
                            diffs.append({"row": i, **d})
                    entry["rows_differing_from_target_only"] = diffs
                    fast = results["target only (fast linears)"]
                    fr = [(r.new_tokens / r.seconds) / (x.new_tokens / x.seconds) for r, x in zip(rs, fast)]
                    entry["vs_target_fast"] = {"median": statistics.median(fr), "min": min(fr), "max": max(fr)}
                    if "HF assisted batch-1 loop" in results:
                        loop = results["HF assisted batch-1 loop"]
                        lr = [(r.new_tokens / r.seconds) / (x.new_tokens / x.seconds) for r, x in zip(rs, loop)]
                        entry["vs_hf_loop"] = {"median": statistics.median(lr), "min": min(lr), "max": max(lr)}
                run["methods"][name] = entry
            report["runs"].append(run)
            atomic_write(out / "results.json", lambda p: p.write_text(json.dumps(report, indent=2)))
    atomic_write(out / "results.md", lambda p: p.write_text(format_batch_report(report)))
    return report


def _draft_length_words(report: dict) -> str:
    """The header's draft length: what a round of several rows drafts, and the drafter's own L where it differs."""
    L, stop = report["draft_length"], report.get("confidence_threshold", 0.0)
    batched = report.get("batched_draft_length", L)
    if batched == L:
        return f"L={L}" + (f" (confidence stop {stop:g})" if stop else "")
    return (f"L={batched} at batch >= {CAPPED_FROM_ROWS} (the drafter's L={L} with its confidence stop {stop:g}, capped; "
            "rounds of fewer rows draft L)")


def _weights_words(report: dict) -> str:
    cfg = report["config"]
    words = [f"{cfg['weight_quantization']} weights"] if cfg.get("weight_quantization") else []
    words += ["steps compiled"] if cfg.get("compile_draft_step") else []
    return f" ({', '.join(words)})" if words else ""


def format_batch_report(report: dict) -> str:
    m = report["machine"]
    lines = [f"Machine: {m['cpu']}, {m['cpu_count']} cores, {m['torch_threads']} torch threads, torch {m['torch']}, "
             f"transformers {m['transformers']}, {m['date']}. Target {report['config']['target']} fp32, drafter "
             f"{report['config']['drafter_dtype']}{_weights_words(report)} trimmed to k={report['kept_vocab']:,} of "
             f"{report['full_vocab']:,}, "
             f"{_draft_length_words(report)}, greedy, {report['config']['max_new_tokens']} new tokens, "
             f"{report['config']['repeats']} repeats (median, range).", "",
             "| batch | target-only tok/s | trimmed spec tok/s | spec vs target-only | spec vs target-only with fast "
             "linears | HF batch-1 loop tok/s | spec vs HF loop | tau | realign share | decision | peak extra MB "
             "(target-only / spec) | rows differing |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        t = run["methods"]["target only"]
        s = run["methods"]["trimmed speculative"]
        h = run["methods"].get("HF assisted batch-1 loop")
        vs, fast = s["vs_target"], s.get("vs_target_fast")
        loop = s.get("vs_hf_loop")
        lines.append(
            f"| {run['batch']} | {t['tokens_per_s']:.2f} | {s['tokens_per_s']:.2f} | {vs['median']:.2f}x "
            f"({vs['min']:.2f}-{vs['max']:.2f}) | "
            + (f"{fast['median']:.2f}x ({fast['min']:.2f}-{fast['max']:.2f}) | " if fast else "- | ")
            + (f"{h['tokens_per_s']:.2f} | " if h else "- | "))
        lines[-1] += (f"{loop['median']:.2f}x ({loop['min']:.2f}-{loop['max']:.2f}) | " if loop else "- | ")
        tau = f"{s['tau']:.2f}" if s.get("tau") else "-"
        lines[-1] += (f"{tau} | {s['realign_share']:.1%} | {s['decision'] or '-'} | "
                      f"{t['peak_extra_mb']:.0f} / {s['peak_extra_mb']:.0f} | "
                      f"{len(s['rows_differing_from_target_only'])} |")
    return "\n".join(lines) + "\n"
