"""End-to-end generate on a GPU (issue #36): target-only (eager; transformers' static cache + compile),
transformers' own assisted loop (static cache where transformers >= 5.24 accepts it) and our engine (eager; and
on the static cache with its verify and draft steps compiled, where target-only compiles), by batch size, on models built from the real configs with random weights (a forward's time does not depend on the
values; the weights cannot reach a lent GPU machine).

Acceptance is pinned by construction, so the two bounds are measured rather than hoped for:
- "all accepted": the target's and the drafter's LM heads are zero, so every logit is 0 and greedy picks id 0 in
  both (the drafter's kept ids are 0..k-1, so its draft id 0 is target id 0): every draft is accepted;
- "none accepted": the drafter's head keeps its random weights, so its argmax is almost never id 0: every draft
  is rejected (rounds of L drafter steps + 1 verify yield 1 token).
The confidence stop is off (zero logits have confidence 1/k), L is fixed, and batched speculation is forced on
(`batched_speculation="on"`: the speculative loop itself is timed, not the "auto" rule's fallback). Costs are the real shapes': pair Q
(Qwen2.5-Coder-1.5B target, its 0.5B drafter trimmed to the default 95% kept size k=15,519) and a 7B-class target
(Qwen2.5-7B-Instruct's published shape: hidden 3584, 28 layers, 28/4 heads, MLP 18944; vocabulary 151,936 so it
shares the drafter's) with the same drafter.

Projected rows: our round at pair Q's measured tau (`--project-tau`), with the round time measured in the
all-accepted run (tokens/s = batch * tau / round seconds); "compiled (projected)" puts the compiled decode step
measured by transformers' static cache + compile in place of each eager forward (L drafter steps + 1 verify,
launch-bound: the verify of L+1 positions costs about one decode step on a GPU), next to the measured row "ours
static cache, compiled verify + draft steps" (not measured on a GPU yet).

Host syncs: torch.cuda.set_sync_debug_mode("warn") counts every synchronizing CUDA call of one generate call.
Rows "stop read per draft" (batch 1): the confidence stop on at a threshold no draft falls below, so the rounds are
the same and the difference is the stop's read per drafted token, the price on a GPU of the default policy's
stop (L=12, stop below 0.4): on CUDA that flag is read one draft late (host.LaggedRead, lagged_reads_per_round in
the JSON), so the row shows what the lagged read still costs (never stopping, it drafts nothing extra).

Writes a markdown table (and JSON) as it goes; sections are skipped, with a line saying so, once --budget seconds
are spent. On a CPU (no CUDA) it runs the same code for a smoke test (tiny --scale, no compile, no sync count):

    .venv/bin/python scripts/bench_gpu_generate.py --device cpu --scale tiny --new-tokens 8 --repeats 1
    python3 scripts/bench_gpu_generate.py --configs .gpu/configs --out $OUT     # on a lent GPU (scripts/gpu_generate.sh)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
import warnings

import torch

T0 = time.perf_counter()

PAIR_Q_KEPT = 15_519  # trim_drafter's default kept size for pair Q (95% ShareGPT coverage)
QWEN_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4)
STOP_READ_THRESHOLD = 1e-9  # a confidence stop no draft falls below: the stop's reads without its stops
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def collect_syncs(fn):
    """Run ``fn`` with every warning shown; count those about a synchronizing CUDA call (torch's sync debug mode
    warns once per call) and tally each one's call site: the innermost three frames of hf_vocabspec, transformers
    or torch code (innermost first)."""
    import collections
    import traceback

    sites: collections.Counter = collections.Counter()
    count = 0

    def show(message, category, filename, lineno, file=None, line=None):
        nonlocal count
        if "synchroniz" not in str(message):
            return
        count += 1
        frames = [f for f in traceback.extract_stack()[:-1]
                  if any(k in f.filename for k in ("hf_vocabspec", "transformers", "torch")) and "warnings" not in f.filename]
        sites[" < ".join(f"{f.filename.rsplit('/', 2)[-2]}/{f.filename.rsplit('/', 1)[-1]}:{f.lineno} {f.name}"
                         for f in reversed(frames[-3:]))] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        fn()
    return count, sites


@contextlib.contextmanager
def stop_reads(drafter, on: bool):
    """``on``: the drafter's confidence stop at STOP_READ_THRESHOLD for the call (restored after)."""
    gc = drafter.generation_config
    threshold = gc.assistant_confidence_threshold
    if on:
        gc.assistant_confidence_threshold = STOP_READ_THRESHOLD
    try:
        yield
    finally:
        gc.assistant_confidence_threshold = threshold


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=".gpu/configs", help="folder with qwen2.5-coder-{1.5b,0.5b}-instruct/config.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--scale", choices=["real", "tiny"], default="real", help="tiny: shrunk shapes (CPU smoke test)")
    ap.add_argument("--plan", nargs="+", default=["pair-q:eager:1,4,16", "pair-q:compiled:1", "7b:eager:1,16",
                                                  "pair-q:assisted:1", "7b:compiled:1", "pair-q:compiled:16",
                                                  "7b:compiled:16"],
                    help="shape:phase:batch sizes, in priority order (phases: eager, assisted, compiled)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--none-new-tokens", type=int, default=24, help="new tokens in the none-accepted runs")
    ap.add_argument("--draft-length", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--project-tau", type=float, nargs="+", default=[2.38, 3.72],
                    help="pair Q's measured tau (ShareGPT 99%% L=5: 2.38; JSON prompts 95%% L=5: 3.72)")
    ap.add_argument("--budget", type=float, default=360.0, help="seconds; later sections are skipped past it")
    ap.add_argument("--static-on-cpu", action="store_true",
                    help="run the static-cache sections on a CPU too (transformers compiles on CUDA only): smoke test")
    ap.add_argument("--compile-on-cpu", action="store_true",
                    help="with --static-on-cpu: really compile on a CPU (a compile_config that compiles on every "
                         "device; Inductor without CUDA graphs): smoke test of the compiled path's tracing")
    ap.add_argument("--assisted-caches", nargs="+", choices=["dynamic", "static"], default=["dynamic", "static"],
                    help="the caches transformers' own assisted loop is timed with (static: ~80 s of compiles on CUDA)")
    ap.add_argument("--drafter-shape", action=argparse.BooleanOptionalAction, default=True,
                    help="time the untrimmed 0.5B drafter's compiled decode for the projected rows (~40 s of compiles "
                         "on CUDA; measured on an H200 2026-11-28: 3.58 ms per token)")
    ap.add_argument("--profile", action="store_true",
                    help="torch.profiler tables of one call (ours eager, transformers' assisted, ours compiled, at "
                         "batch 1) into profile.txt; each synchronizing call's site into sync_sites.txt")
    ap.add_argument("--out", default=os.environ.get("OUT", "results"))
    args = ap.parse_args()

    from hf_vocabspec.configuration import set_draft_length
    from hf_vocabspec.trimming import trim_drafter
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    os.makedirs(args.out, exist_ok=True)
    md_path, json_path = os.path.join(args.out, "gpu_generate.md"), os.path.join(args.out, "gpu_generate.json")
    cuda = args.device.startswith("cuda")
    dtype = getattr(torch, args.dtype)
    rows: list[dict] = []
    name = torch.cuda.get_device_name() if cuda else "cpu"

    def failed(where: str, e: Exception) -> str:
        """A failure is a row (its first line) and a traceback in errors.log beside the table."""
        import traceback
        with open(os.path.join(args.out, "errors.log"), "a") as f:
            f.write(f"--- {where}\n{traceback.format_exc()}\n")
        return f"failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"

    def graphs() -> int:
        """Graphs torch.compile has built so far in this process (each new shape or guard failure adds one)."""
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])

    compile_kw = {}
    if args.compile_on_cpu and not cuda:
        compile_config = transformers.CompileConfig()
        compile_config._compile_all_devices = True
        compile_kw = {"compile_config": compile_config}

    def emit(line: str) -> None:
        print(line, flush=True)
        with open(md_path, "a") as f:
            f.write(line + "\n")

    open(md_path, "w").close()
    emit(f"Machine: {name}, torch {torch.__version__}, transformers {transformers.__version__}, "
         f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; dtype {args.dtype}; prompt {args.prompt_tokens} "
         f"tokens, {args.new_tokens} new ({args.none_new_tokens} when none accepted), L={args.draft_length}, greedy; "
         f"median of {args.repeats} after a warm-up call")
    emit("")
    emit("| shape | batch | method | tokens/s | ms per token | vs target-only eager | vs target-only compiled "
         "| rounds | tau | host syncs per round (per token) |")
    emit("|---|---|---|---|---|---|---|---|---|---|")

    def left() -> float:
        return args.budget - (time.perf_counter() - T0)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def build(cfg_dir: str, overrides: dict, seed: int, zero_head: bool):
        config = AutoConfig.from_pretrained(cfg_dir)
        for k, v in {**overrides, **(TINY if args.scale == "tiny" else {})}.items():
            setattr(config, k, v)
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:1] * config.num_hidden_layers
        config.tie_word_embeddings = False
        torch.manual_seed(seed)
        with torch.device(args.device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.eval().requires_grad_(False)
        if zero_head:
            model.lm_head.weight.zero_()
        gc = model.generation_config
        gc.pad_token_id = config.pad_token_id if config.pad_token_id is not None else 0
        gc.do_sample, gc.temperature, gc.top_p, gc.top_k = False, None, None, None
        return model

    def timed(fn, repeats: int):
        out = fn()  # warm-up (and compile, where there is one)
        times = []
        for _ in range(repeats):
            sync()
            t = time.perf_counter()
            out = fn()
            sync()
            times.append(time.perf_counter() - t)
        return statistics.median(times), out

    def count_syncs(fn, label: str) -> int | None:
        """Synchronizing CUDA calls of one call of ``fn``; with --profile each one's Python call site (the innermost
        frames of the library code) is tallied under ``label`` into sync_sites.txt beside the table."""
        if not cuda:
            return None
        torch.cuda.set_sync_debug_mode("warn")
        try:
            n, sites = collect_syncs(fn)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        if args.profile:
            with open(os.path.join(args.out, "sync_sites.txt"), "a") as f:
                f.write(f"=== {label}: {n} synchronizing calls\n")
                f.writelines(f"{k:5d}  {site}\n" for site, k in sites.most_common(25))
        return n

    def profile(label: str, fn) -> None:
        """--profile: torch.profiler over one call of ``fn`` (CPU time and, on CUDA, kernel launches by op) into
        profile.txt beside the table, to place a round's host time."""
        if not args.profile or left() < 30:
            return
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with torch_profile(activities=activities) as p:
            fn()
            sync()
        averages = p.key_averages()
        launches = {e.key: e.count for e in averages if e.key.startswith(("cudaLaunch", "cuLaunch", "cudaGraphLaunch",
                                                                          "cudaMemcpy", "cudaStreamSynchronize"))}
        ops = sum(e.count for e in averages if e.key.startswith("aten::"))
        with open(os.path.join(args.out, "profile.txt"), "a") as f:
            f.write(f"=== {label}: {ops} aten ops; launches and copies {launches}\n")
            f.write(averages.table(sort_by="self_cpu_time_total", row_limit=30) + "\n")

    def record(shape, b, method, seconds, tokens, base=None, compiled_base=None, rounds=None, tau=None, syncs=None,
               projected=False, stats=None):
        tps = tokens / seconds
        row = dict(shape=shape, batch=b, method=method, tokens_per_s=tps, ms_per_token=1000 * seconds / tokens * b,
                   rounds=rounds, tau=tau, syncs=syncs, projected=projected)
        if stats is not None:  # the engine's own count of its reads (SpeculationStats.host_syncs), on any device
            row["engine_reads_per_round"] = stats.host_syncs / max(stats.rounds, 1)
            row["lagged_reads_per_round"] = stats.lagged_reads / max(stats.rounds, 1)  # the stop's, no stall
        row["vs_eager"] = tps / base if base else None
        row["vs_compiled"] = tps / compiled_base if compiled_base else None
        rows.append(row)
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=1)
        fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
        per_round = "-" if syncs is None else (f"{syncs / rounds:.1f}" if rounds else f"({syncs / (tokens / b):.2f})")
        emit(f"| {shape} | {b} | {method} | {tps:.1f} | {row['ms_per_token']:.2f} | {fmt(row['vs_eager'], '.2f')}x | "
             f"{fmt(row['vs_compiled'], '.2f')}x | {fmt(rounds, 'd')} | {fmt(tau, '.2f')} | {per_round} |")
        return tps

    def skip(what: str) -> None:
        emit(f"| - | - | {what}: skipped ({time.perf_counter() - T0:.0f} s of the {args.budget:.0f} s budget spent) "
             "| - | - | - | - | - | - | - |")

    c15 = os.path.join(args.configs, "qwen2.5-coder-1.5b-instruct")
    c05 = os.path.join(args.configs, "qwen2.5-coder-0.5b-instruct")
    shapes = {"pair-q": (c15, {}), "7b": (c15, QWEN_7B)}
    L = args.draft_length
    kept = min(PAIR_Q_KEPT, 1000) if args.scale == "tiny" else PAIR_Q_KEPT
    drafter_compiled_step: dict[int, float] = {}

    models: dict[str, dict] = {}
    eager: dict[tuple[str, int], float] = {}
    compiled: dict[tuple[str, int], float] = {}

    def pair(shape: str) -> dict:
        if shape not in models:
            cfg, overrides = shapes[shape]
            m = dict(target=build(cfg, overrides, seed=0, zero_head=True))
            base = m["base"] = models[next(iter(models))]["base"] if models else build(c05, {}, seed=1, zero_head=True)
            if models:
                m["accept_all"], m["reject_all"] = (models[next(iter(models))][k] for k in ("accept_all", "reject_all"))
            else:
                m["accept_all"] = trim_drafter(base, torch.arange(kept))
                m["reject_all"] = trim_drafter(build(c05, {}, seed=2, zero_head=False), torch.arange(kept))
                for d in (m["accept_all"], m["reject_all"]):
                    d.to(args.device)
                    set_draft_length(d.generation_config, L)
                    d.generation_config.assistant_confidence_threshold = 0.0
                    d.generation_config.batched_speculation = "on"  # the speculative loop itself at every batch size
                gc = base.generation_config  # untrimmed, zero head: transformers' own loop, every draft accepted
                gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = L, "constant"
                gc.assistant_confidence_threshold = 0.0
            models[shape] = m
        return models[shape]

    def prompt(shape: str, b: int) -> torch.Tensor:
        vocab = min(pair(shape)["target"].config.vocab_size, 15_000)
        return torch.randint(100, vocab, (b, args.prompt_tokens), generator=torch.Generator().manual_seed(b)).to(
            args.device)

    def run_eager(shape: str, b: int) -> None:
        m, ids, n = pair(shape), prompt(shape, b), args.new_tokens
        target = m["target"]

        def target_only(new=n, **kw):
            return target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, **kw)

        s, ref = timed(target_only, args.repeats)
        eager[shape, b] = record(shape, b, "target-only eager", s, b * n,
                                 syncs=count_syncs(target_only, f"{shape} {b} target-only eager"))
        rows[-1]["vs_eager"] = 1.0
        for label, drafter, new in (("ours eager, all accepted", m["accept_all"], n),
                                    *((("ours eager, all accepted, stop read per draft", m["accept_all"], n),)
                                      if b == 1 else ()),
                                    ("ours eager, none accepted", m["reject_all"], args.none_new_tokens)):
            def ours(d=drafter, new=new, watch=label.endswith("stop read per draft")):
                with stop_reads(d, watch):
                    return target_only(new, assistant_model=d)
            s, out = timed(ours, args.repeats if new == n else 1)
            st = drafter.last_speculation_stats
            if new == n and not torch.equal(out, ref):
                emit(f"| {shape} | {b} | {label}: OUTPUT DIFFERS from target-only | | | | | | | |")
            record(shape, b, label, s, b * new, base=eager[shape, b], rounds=st.rounds, tau=st.mean_accepted_length,
                   syncs=count_syncs(ours, f"{shape} {b} {label}"), stats=st)
            if "stop read" in label:
                continue
            if b == 1 and new == n:
                profile(f"{shape} {b} {label}", ours)
            if drafter is m["accept_all"] and b == 1 and left() > 60:  # the static target cache (eager), batch 1
                def ours_static(d=drafter):
                    return target_only(n, assistant_model=d, cache_implementation="static")
                s_static, out = timed(ours_static, args.repeats)
                if not torch.equal(out, ref):
                    emit(f"| {shape} | {b} | ours static cache: OUTPUT DIFFERS from target-only | | | | | | | |")
                st_static = drafter.last_speculation_stats  # on CUDA a static cache compiles (transformers' rule)
                how = "compiled verify + draft steps" if st_static.compiled_verify else "eager"
                record(shape, b, f"ours {how}, static target cache, all accepted", s_static, b * n, base=eager[shape, b],
                       rounds=st_static.rounds, tau=st_static.mean_accepted_length)
            if drafter is m["accept_all"]:
                for tau in args.project_tau:
                    record(shape, b, f"ours eager at tau {tau:g} (projected)", s / max(st.rounds, 1), b * tau,
                           base=eager[shape, b], projected=True)

    def run_assisted(shape: str, b: int) -> None:
        m, ids = pair(shape), prompt(shape, 1)
        for label, kw in (("transformers assisted, dynamic cache", {}),
                          ("transformers assisted, static cache", {"cache_implementation": "static"})):
            if ("static" if kw else "dynamic") not in args.assisted_caches:
                continue
            if left() < 60:
                skip(f"{shape} {label}")
                continue
            try:
                def hf(kw=kw):
                    return m["target"].generate(ids, attention_mask=torch.ones_like(ids),
                                                max_new_tokens=args.new_tokens, assistant_model=m["base"], **kw)
                t = time.perf_counter()
                s, _ = timed(hf, args.repeats)
                record(shape, 1, f"{label} (warm-up {time.perf_counter() - t - s * args.repeats:.0f} s)",
                       s, args.new_tokens, base=eager.get((shape, 1)),
                       syncs=count_syncs(hf, f"{shape} 1 {label}"))
                if not kw:
                    profile(f"{shape} 1 {label}", hf)
            except Exception as e:  # noqa: BLE001 - a method that fails is a row, not the end of the run
                emit(f"| {shape} | 1 | {label}: {failed(f'{shape} {label}', e)} | | | | | | | |")

    def run_compiled(shape: str, b: int) -> None:
        if not cuda and not args.static_on_cpu:
            skip(f"{shape} batch {b} target-only static cache + compile (CUDA only)")
            return
        m, ids = pair(shape), prompt(shape, b)

        def comp(model=m["target"], new=args.new_tokens, **kw):
            return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                  cache_implementation="static", **compile_kw, **kw)
        t, g = time.perf_counter(), graphs()
        s, ref = timed(comp, args.repeats)
        warm = time.perf_counter() - t - s * args.repeats
        compiled[shape, b] = record(shape, b, f"target-only static cache + compile (warm-up {warm:.0f} s, "
                                    f"{graphs() - g} graphs)", s, b * args.new_tokens, base=eager.get((shape, b)),
                                    syncs=count_syncs(comp, f"{shape} {b} target-only compiled"))
        rows[-1]["vs_compiled"] = 1.0
        from hf_vocabspec.generation.draft_step import DraftStep
        # our engine on the same static cache: the target's verify and the drafter's steps compiled; then the
        # verify alone compiled (the drafter eager, as transformers' own assisted loop keeps it)
        # "stop read": the confidence stop on at a threshold no draft falls below (1e-9; zero logits give 1/k), so
        # the rounds and drafts are the same as the first row's and the difference is the one read per drafted token
        # the stop makes (the default policy, L=12 stop 0.4, reads so on every draft)
        for variant, drafter, new in (("", m["accept_all"], args.new_tokens),
                                      *((("stop read per draft", m["accept_all"], args.new_tokens),) if b == 1 else ()),
                                      ("eager drafter", m["accept_all"], args.new_tokens),
                                      ("", m["reject_all"], args.none_new_tokens)):
            if left() < (80 if drafter is m["accept_all"] else 150):  # none accepted: its drafter compiles anew
                skip(f"{shape} batch {b} ours static cache {variant}")
                continue
            compile_step = DraftStep.compile
            if variant == "eager drafter":
                DraftStep.compile = lambda self, options, static_length: None
            try:
                def ours(d=drafter, new=new, watch=variant.startswith("stop read")):
                    with stop_reads(d, watch):
                        return comp(new=new, assistant_model=d)
                t, g = time.perf_counter(), graphs()
                s_ours, out = timed(ours, args.repeats)
                warm = time.perf_counter() - t - s_ours * args.repeats
                st = drafter.last_speculation_stats
                how = ("compiled verify + draft steps" if st.compiled_verify and st.compiled_draft else
                       "compiled verify" if st.compiled_verify else "eager verify")
                how += f", {variant}" if variant else ""
                accepted = "all accepted" if drafter is m["accept_all"] else "none accepted"
                if new == args.new_tokens and not torch.equal(out, ref):
                    emit(f"| {shape} | {b} | ours static cache, {how}: OUTPUT DIFFERS from target-only | | | | | | | |")
                record(shape, b, f"ours static cache, {how}, {accepted} (warm-up {warm:.0f} s, {graphs() - g} graphs)",
                       s_ours, b * new, base=eager.get((shape, b)), compiled_base=compiled[shape, b],
                       rounds=st.rounds, tau=st.mean_accepted_length,
                       syncs=count_syncs(ours, f"{shape} {b} ours compiled {variant}"), stats=st)
                if b == 1 and not variant and drafter is m["accept_all"]:
                    profile(f"{shape} {b} ours static cache, {how}", ours)
            except Exception as e:  # noqa: BLE001 - a variant that fails is a row
                emit(f"| {shape} | {b} | ours static cache {variant}: {failed(f'{shape} {b} ours {variant}', e)} "
                     "| | | | | | | |")
            finally:
                DraftStep.compile = compile_step
        if args.drafter_shape and b not in drafter_compiled_step and left() > 80:
            s_d, _ = timed(lambda: comp(model=m["base"]), args.repeats)
            drafter_compiled_step[b] = s_d / args.new_tokens
            record(shape, b, "drafter shape (0.5B, untrimmed head) static cache + compile", s_d,
                   b * args.new_tokens, base=eager.get((shape, b)), compiled_base=compiled[shape, b])
        if b in drafter_compiled_step:
            round_s = L * drafter_compiled_step[b] + s / args.new_tokens
            for tau in [float(L + 1)] + args.project_tau:
                record(shape, b, f"ours compiled at tau {tau:g} (projected: {L} compiled drafter steps + 1 compiled "
                       "verify)", round_s, b * tau, base=eager.get((shape, b)), compiled_base=compiled[shape, b],
                       projected=True)

    phases = {"eager": (run_eager, 20), "assisted": (run_assisted, 60), "compiled": (run_compiled, 100)}
    for step in args.plan:
        shape, phase, batches = step.split(":")
        fn, need = phases[phase]
        for b in map(int, batches.split(",")):
            if left() < need:
                skip(f"{shape} {phase} batch {b}")
                continue
            try:
                fn(shape, b)
            except Exception as e:  # noqa: BLE001 - a phase that fails is a row, not the end of the run
                emit(f"| {shape} | {b} | {phase}: {failed(f'{shape} {phase} {b}', e)} | | | | | | | |")

    emit("")
    emit(f"Total {time.perf_counter() - T0:.0f} s.")


if __name__ == "__main__":
    main()
