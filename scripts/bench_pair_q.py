"""Pair Q bench (README "Pair Q" tables): Qwen2.5-Coder-0.5B-Instruct drafting for Qwen2.5-Coder-1.5B-Instruct.

One process, methods interleaved prompt by prompt and repeated (benchmark.compare_methods), per workload and mode:
target only; HF assisted with the same untrimmed drafter at HF's default schedule and at fixed L (set on the
assistant's generation_config: target.generate(num_assistant_tokens=) is ignored by HF's candidate generator);
the trimmed drafter without and with context tokens; the tuned drafter (``--tuned DIR`` from ``hf-vocabspec tune``).
Also: the draft step with full head / trimmed head / no-head floor, the zero-cost-drafter limit (per row), the
target in bf16 where the CPU has native bf16 (greedy agreement with bf16 target-only reported, not hidden), the
drafter checkpoint's file size with and without the kept pruned rows, and the peak RSS of generation with both
models loaded (a fresh process per checkpoint). Writes results.json and results.md under --output.

Smallest check: python scripts/bench_pair_q.py --prompts 1 --max-new-tokens 4 --repeats 1 --modes greedy \
    --workloads offline:sharegpt --hf-draft-lengths 3 --count-examples 200 --output /tmp/bench-q
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

from hf_vocabspec import TrimmedDrafter, trim_drafter
from hf_vocabspec.configuration import set_draft_length
from hf_vocabspec.coverage import count_assistant_tokens
from hf_vocabspec.evaluation.benchmark import (
    _MODES,
    Method,
    compare_methods,
    format_report,
    machine_info,
    method_rows,
)
from hf_vocabspec.evaluation.data import eval_prompts, load_workload
from hf_vocabspec.evaluation.offline import load_chat_dataset, load_model
from hf_vocabspec.kernels import native_bf16

TARGET = "offline:qwen2.5-coder-1.5b-instruct"
DRAFTER = "offline:qwen2.5-coder-0.5b-instruct"
HF_DEFAULT = "HF assisted (default schedule)"


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def peak_rss_probe(target: str, drafter_dir: str, dtype: str, new_tokens: int) -> None:
    """Child process: load the fp32 target and a saved drafter, generate; print as JSON the peak RSS of generation
    with both models loaded (VmHWM, reset after loading via clear_refs; safetensors are memory-mapped, so weights
    count once touched) and the process's overall peak (ru_maxrss, loading included)."""
    tgt = load_model(target, dtype=torch.float32).eval()
    drafter = TrimmedDrafter.from_pretrained(drafter_dir, dtype=getattr(torch, dtype)).eval()
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak resident set size (VmHWM) to now
        f.write("5")
    ids = torch.tensor([[151644, 872, 198, 9707, 0, 151645, 198, 151644, 77091, 198]])  # "<|im_start|>user\nHello!..."
    tgt.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                 assistant_model=drafter)
    print(json.dumps({"generation_peak_rss_mib": _status_mib("VmHWM"),
                      "process_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def peak_rss(target: str, drafter_dir: Path, dtype: str, new_tokens: int) -> dict | None:
    proc = subprocess.run([sys.executable, __file__, "--rss-probe", str(drafter_dir), "--target", target,
                           "--drafter-dtype", dtype, "--max-new-tokens", str(new_tokens)],
                          capture_output=True, text=True, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode or not lines:
        print(f"peak RSS probe failed: {proc.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(lines[-1])


def greedy_agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    """Prompts identical to the reference, and the share of positions before the first divergence."""
    same, matched, total = 0, 0, 0
    for out, ref in zip(outputs, reference):
        n = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
        same += out == ref
        matched += n
        total += max(len(ref), 1)
    return {"identical_prompts": same, "prompts": len(reference), "tokens_before_divergence": matched / total}


def summarize(run: dict, rows: dict, hf_fixed: list[str]) -> dict:
    """Ratios the issue's goals name: best method vs HF default, vs HF's best fixed L, vs target."""
    best_hf = max(hf_fixed, key=lambda n: rows[n]["tokens_per_s"]) if hf_fixed else None
    out = {"best_hf_fixed_L": best_hf}
    for name, row in rows.items():
        if row.get("kind") != "trimmed":
            continue
        out[name] = {
            "vs_target": row["tokens_per_s"] / rows["target only"]["tokens_per_s"],
            "vs_hf_default": row["tokens_per_s"] / rows[HF_DEFAULT]["tokens_per_s"],
            "vs_hf_best_fixed_L": row["tokens_per_s"] / rows[best_hf]["tokens_per_s"] if best_hf else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--drafter", default=DRAFTER)
    ap.add_argument("--drafter-dtype", default=None, choices=["float32", "bfloat16"],
                    help="default: bfloat16 where the CPU has native bf16 (avx512_bf16/amx_bf16), else float32")
    ap.add_argument("--dataset", default="offline:sharegpt", help="domain the vocabulary is counted on")
    ap.add_argument("--count-examples", type=int, default=4000)
    ap.add_argument("--coverage", type=float, default=0.99, help="kept vocabulary of the trimmed rows")
    ap.add_argument("--workloads", nargs="+", default=["offline:sharegpt", "offline:humaneval"])
    ap.add_argument("--modes", nargs="+", choices=sorted(_MODES), default=["greedy", "t0.7", "t1"])
    ap.add_argument("--bf16-target-modes", nargs="*", choices=sorted(_MODES), default=["greedy"],
                    help="modes re-run with the target in bf16 (only where the CPU has native bf16; none: skip)")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--hf-draft-lengths", type=int, nargs="*", default=[2, 3, 5, 8])
    ap.add_argument("--num-assistant-tokens", type=int, default=None,
                    help="draft length of the trimmed rows (default: the trimmed drafter's own, with its confidence stop)")
    ap.add_argument("--confidence-threshold", type=float, default=0.0,
                    help="with --num-assistant-tokens: the trimmed rows' confidence stop (0: none)")
    ap.add_argument("--constant-draft-lengths", type=int, nargs="*", default=[],
                    help="also the trimmed drafter (+context) drafting these L every round, no confidence stop "
                         "(e.g. 5: the default before 2026-11-28)")
    ap.add_argument("--weight-quantization", nargs="*", default=["int8", "int4"], choices=["int8", "int4"],
                    help="also the trimmed drafter (+context) with weight-only quantized linears (its draft step reads "
                         "fewer bytes; acceptance may change, output does not)")
    ap.add_argument("--compile-draft-step", action="store_true",
                    help="also time the default drafter with its steps compiled (drafter.compile_draft_step; the "
                         "warm-up call pays the compiles), and each --weight-quantization drafter so")
    ap.add_argument("--own-forward", action="store_true",
                    help="also the default drafter (+context) with its body's own forward (use_lean_forward = False): "
                         "what the lean forward contributes, in the same run")
    ap.add_argument("--no-fast-prefill", action="store_true",
                    help="also the default drafter (+context) with its prefill in F.linear (use_fast_prefill = False): "
                         "what the fast prefill contributes, in the same run")
    ap.add_argument("--tuned", default=None, help="a drafter saved by `hf-vocabspec tune` (its k, L, context setting)")
    ap.add_argument("--rss-tokens", type=int, default=16, help="tokens generated by each peak-RSS probe (0: skip)")
    ap.add_argument("--output", default="results/bench-pair-q")
    ap.add_argument("--rss-probe", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rss_probe:
        return peak_rss_probe(args.target, args.rss_probe, args.drafter_dtype or "float32", args.max_new_tokens)

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    bf16_native = native_bf16()
    dtype_name = args.drafter_dtype or ("bfloat16" if bf16_native else "float32")
    dtype = getattr(torch, dtype_name)
    t0 = time.time()
    work = load_workload(args.target, args.dataset, args.count_examples)
    tokenizer, target, counts = work.tokenizer, work.target, work.counts
    k = counts.smallest_k_for_coverage(args.coverage)

    full = load_model(args.drafter, dtype=dtype).eval()
    hf_default = copy.deepcopy(full.generation_config)  # HF's own defaults for an assistant (untouched)
    methods = [Method("target only"), Method("target only (fast linears)", fast_linears=True),
               Method(HF_DEFAULT, full, attrs={"generation_config": hf_default})]
    hf_fixed = []
    for L in args.hf_draft_lengths:
        methods.append(Method(f"HF assisted L={L}", full,
                              attrs={"generation_config": set_draft_length(copy.deepcopy(hf_default), L)}))
        hf_fixed.append(methods[-1].name)
    trimmed = trim_drafter(load_model(args.drafter, dtype=dtype), counts.top_k(k), tokenizer=tokenizer,
                           target_model=args.target)
    if args.num_assistant_tokens:
        set_draft_length(trimmed.generation_config, args.num_assistant_tokens, args.confidence_threshold)
    kk, L = trimmed.config.draft_vocab_size, trimmed.generation_config.num_assistant_tokens
    stop = trimmed.generation_config.assistant_confidence_threshold
    L = f"{L} stop<{stop:g}" if stop else L
    methods.append(Method(f"trimmed k={kk} L={L}", trimmed, attrs={"use_context_tokens": False}))
    methods.append(Method(f"trimmed k={kk} L={L} +context", trimmed, attrs={"use_context_tokens": True}))
    methods.append(Method(f"trimmed k={kk} L={L} +context F.linear", trimmed,
                          attrs={"use_context_tokens": True, "use_fast_linears": False}))
    if args.own_forward:  # the body's own forward instead of the lean one (hf_vocabspec.lean_forward)
        methods.append(Method(f"trimmed k={kk} L={L} +context own forward", trimmed,
                              attrs={"use_context_tokens": True, "use_lean_forward": False}))
    if args.no_fast_prefill:  # the drafter's prefill in F.linear instead of the fast prefill's kernels
        methods.append(Method(f"trimmed k={kk} L={L} +context prefill in F.linear", trimmed,
                              attrs={"use_context_tokens": True, "use_fast_prefill": False}))
    if args.compile_draft_step:  # the drafter's one-token steps through torch.compile (drafter.compile_draft_step)
        methods.append(Method(f"trimmed k={kk} L={L} +context compiled steps", trimmed,
                              attrs={"use_context_tokens": True, "compile_draft_step": True}))
    for n in args.constant_draft_lengths:
        methods.append(Method(f"trimmed k={kk} L={n} +context", trimmed,
                              attrs={"use_context_tokens": True,
                                     "generation_config": set_draft_length(copy.deepcopy(trimmed.generation_config), n)}))
    for scheme in args.weight_quantization:
        quantized = copy.deepcopy(trimmed).quantize_weights(scheme)
        methods.append(Method(f"trimmed k={kk} L={L} +context {scheme}", quantized, attrs={"use_context_tokens": True}))
        if args.compile_draft_step:  # the quantized drafter's steps compiled (its int kernels traced into the graph)
            methods.append(Method(f"trimmed k={kk} L={L} +context {scheme} compiled steps", quantized,
                                  attrs={"use_context_tokens": True, "compile_draft_step": True}))
    # trimming on top of HF's own default schedule (L=20, stop below confidence 0.4): what trimming adds alone
    methods.append(Method(f"trimmed k={kk} HF default schedule +context", trimmed,
                          attrs={"use_context_tokens": True, "generation_config": copy.deepcopy(hf_default)}))
    tuned = None
    if args.tuned:
        tuned = TrimmedDrafter.from_pretrained(args.tuned, dtype=dtype).eval()
        ctx = " +context" if tuned.use_context_tokens else ""
        stop = tuned.generation_config.assistant_confidence_threshold
        n_tuned = tuned.generation_config.num_assistant_tokens
        # tuned for compiled steps (tune --compile-draft-step): saved with compile_draft_step on, run as loaded
        methods.append(Method(f"tuned k={tuned.config.draft_vocab_size} L={n_tuned}{ctx}"
                              + (f" stop<{stop:g}" if stop else "")
                              + (" compiled steps" if tuned.compile_draft_step else ""), tuned))
        # the untrimmed drafter on the tuned schedule: separates what the schedule gives from what trimming gives
        methods.append(Method(f"HF assisted, tuned schedule L={n_tuned}" + (f" stop<{stop:g}" if stop else ""), full,
                              attrs={"generation_config": set_draft_length(copy.deepcopy(hf_default), n_tuned, stop)}))

    from hf_vocabspec.cost import measure_draft_latency

    kept_sizes = {kk} | ({tuned.config.draft_vocab_size} if tuned is not None else set())
    curve = measure_draft_latency(full, sorted(kept_sizes | {len(tokenizer)}))
    head_share = 1 - curve.floor_seconds / curve.seconds[-1]
    report = {"config": vars(args) | {"drafter_dtype": dtype_name, "kept_vocab": kk}, "machine": machine_info(),
              "full_vocab": len(tokenizer), "draft_step_latency": curve.to_dict(),
              "head_share_of_draft_step": head_share, "runs": [], "summary": []}

    workload_prompts = {}
    for workload in args.workloads:
        held_out = work.held_out if workload == args.dataset else load_chat_dataset(workload)
        # in-domain prompts from the held-out half that `hf-vocabspec tune` does not score (it scores the first
        # held-out conversations): the tuned setting is not chosen on the prompts it is benched on
        start = len(held_out) // 2 if workload == args.dataset else 0
        workload_prompts[workload] = eval_prompts(held_out, tokenizer, start, args.prompts, 512, 32)
    target_dtypes = [("float32", args.modes)]
    if bf16_native and args.bf16_target_modes:
        target_dtypes.append(("bfloat16", args.bf16_target_modes))
    fp32_outputs = {}
    for target_dtype, modes in target_dtypes:
        target = target.to(getattr(torch, target_dtype))
        for workload, prompts in workload_prompts.items():
            for mode in modes:
                res = compare_methods(target, methods, prompts, max_new_tokens=args.max_new_tokens,
                                      repeats=args.repeats, generate_kwargs=_MODES[mode])
                rows = method_rows(res, "target only", HF_DEFAULT)
                base = res["target only"].outputs
                run = {"workload": workload, "in_domain": workload == args.dataset, "mode": mode,
                       "target_dtype": target_dtype, "prompts": len(prompts), "methods": rows}
                if mode == "greedy":
                    run["greedy_identical"] = all(r.outputs == base for r in res.values())
                    run["greedy_agreement_with_target_only"] = {n: greedy_agreement(r.outputs, base)
                                                                for n, r in res.items()}
                    if target_dtype == "float32":
                        fp32_outputs[workload] = base
                    elif workload in fp32_outputs:
                        run["bf16_target_only_vs_fp32_target_only"] = greedy_agreement(base, fp32_outputs[workload])
                hf_row = rows[HF_DEFAULT]
                draft_share = hf_row["drafter_seconds"] / hf_row["seconds"] if hf_row["seconds"] else None
                run["trim_bound"] = {"draft_share_of_hf_default_time": draft_share, "head_share_of_draft_step": head_share,
                                     "bound": draft_share * head_share if draft_share is not None else None}
                report["runs"].append(run)
                report["summary"].append({"workload": workload, "mode": mode, "target_dtype": target_dtype,
                                          **summarize(run, rows, hf_fixed)})
                (out / "results.json").write_text(json.dumps(report, indent=2))
    target = target.to(torch.float32)

    sizes = {}  # the drafter checkpoint on disk, with and without the kept pruned rows (files, not estimates)
    lean = trim_drafter(load_model(args.drafter, dtype=dtype), counts.top_k(k), tokenizer=tokenizer,
                        target_model=args.target, keep_pruned_rows=False)
    for name, d in (("with_pruned_rows", trimmed), ("without_pruned_rows", lean)):
        d.save_pretrained(out / f"drafter-{name}")
        sizes[name] = sum(f.stat().st_size for f in (out / f"drafter-{name}").glob("*.safetensors"))
    sizes["untrimmed_drafter_tensors"] = sum(t.numel() * t.element_size() for t in full.state_dict().values())
    report["checkpoint_bytes"] = sizes
    if args.rss_tokens:
        report["peak_rss_mib"] = {name: peak_rss(args.target, out / f"drafter-{name}", dtype_name, args.rss_tokens)
                                  for name in ("with_pruned_rows", "without_pruned_rows")}
    report["seconds_total"] = time.time() - t0
    (out / "results.json").write_text(json.dumps(report, indent=2))
    (out / "results.md").write_text(render(report))
    print(render(report))


def render(report: dict) -> str:
    """format_report's table per target dtype, then the summary ratios, trim bound, sizes and RSS."""
    lines = []
    for dt in dict.fromkeys(r["target_dtype"] for r in report["runs"]):
        part = dict(report, runs=[r for r in report["runs"] if r["target_dtype"] == dt])
        lines += [f"### Target {dt}, drafter {report['config']['drafter_dtype']}", "", format_report(part)]
    lines += ["### Ratios (tokens/s, same run)", "",
              "| target | workload | mode | method | vs target | vs HF default | vs HF best fixed L (which) |",
              "|---|---|---|---|---|---|---|"]
    for s in report["summary"]:
        for name, r in s.items():
            if isinstance(r, dict):
                best = f"{r['vs_hf_best_fixed_L']:.2f}x ({s['best_hf_fixed_L']})" if r["vs_hf_best_fixed_L"] else "-"
                lines.append(f"| {s['target_dtype']} | {s['workload']} | {s['mode']} | {name} | {r['vs_target']:.2f}x | "
                             f"{r['vs_hf_default']:.2f}x | {best} |")
    lines += ["", f"LM head share of a draft step (full head vs no-head floor): {report['head_share_of_draft_step']:.1%}"]
    for run in report["runs"]:
        b = run["trim_bound"]
        if b["bound"] is not None:
            lines.append(f"- trimming bound, {run['target_dtype']} {run['workload']} {run['mode']}: draft share of an HF "
                         f"round {b['draft_share_of_hf_default_time']:.1%} x head share {b['head_share_of_draft_step']:.1%}"
                         f" = {b['bound']:.1%} of generation time")
        if "bf16_target_only_vs_fp32_target_only" in run:
            a = run["bf16_target_only_vs_fp32_target_only"]
            lines.append(f"- bf16 target-only vs fp32 target-only, {run['workload']}: {a['identical_prompts']}/"
                         f"{a['prompts']} prompts identical, {a['tokens_before_divergence']:.1%} of tokens before "
                         "the first divergence")
        if run.get("target_dtype") == "bfloat16" and run.get("greedy_agreement_with_target_only"):
            for n, a in run["greedy_agreement_with_target_only"].items():
                lines.append(f"  - bf16 {run['workload']} {n}: {a['identical_prompts']}/{a['prompts']} prompts identical "
                             f"to bf16 target-only ({a['tokens_before_divergence']:.1%} before divergence)")
    sizes = report.get("checkpoint_bytes", {})
    if sizes:
        lines += ["", "Drafter checkpoint (model.safetensors, " + report["config"]["drafter_dtype"] + "): " + ", ".join(
            f"{k.replace('_', ' ')} {v / 2**20:,.1f} MiB" for k, v in sizes.items())]
    if report.get("peak_rss_mib"):
        lines.append("Peak RSS of generation with the fp32 target and the drafter loaded (fresh process per drafter; "
                     "the process's peak, loading included, in brackets): " + ", ".join(
                         f"{k.replace('_', ' ')} {v['generation_peak_rss_mib']:,.0f} MiB "
                         f"({v['process_peak_rss_mib']:,.0f})" if v else f"{k}: failed"
                         for k, v in report["peak_rss_mib"].items()))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
