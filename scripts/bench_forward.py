"""Microbench (issue #28): a forward of M = 1..16 new positions on a KV cache, per model and dtype, against the
physical limit of one read of the weights at the bandwidth this machine measures.

For each model (target and drafter of a pair), dtype and kernels (``F.linear`` as transformers runs it, and the fast
linears our generate runs, ``hf_vocabspec.kernels``): the median wall time of a forward of M new tokens after
a prompt of ``--context`` tokens (a fresh cache per repeat, the prompt prefilled untimed), as a multiple of the
M=1 decode step with F.linear (the first kernels listed) and of one weight read (non-embedding weight bytes / the bandwidth of ``tensor.sum()`` over a
buffer larger than the last-level cache, measured in the same run). Prints a markdown table naming the machine;
``--device cuda`` runs the same on a GPU (bandwidth then from a device-to-device copy).

    .venv/bin/python scripts/bench_forward.py                                  # pair G target, fp32 + bf16
    .venv/bin/python scripts/bench_forward.py --models offline:qwen2.5-coder-1.5b-instruct offline:qwen2.5-coder-0.5b-instruct
    .venv/bin/python scripts/bench_forward.py --positions 1 2 3 4 5 6 8 16 --repeats 5 --device cuda
    .venv/bin/python scripts/bench_forward.py --random-weights --models DIR_WITH_CONFIG_JSON ... --device cuda
    .venv/bin/python scripts/bench_forward.py --models offline:qwen2.5-coder-0.5b-instruct --dtypes bfloat16 \
        --kernels int4 --compile --positions 1       # + the step compiled, as compile_draft_step runs it

``--compile`` adds, after each row of kernels ``linear``, ``int8`` or ``int4``, the same forward compiled as a
drafter with ``compile_draft_step`` runs its steps: ``torch.compile`` of the model's call (transformers' default
compile config, static shapes) on a static cache (the engine's ``engine_cache``), one compile per M, untimed.
(``fast`` has no compiled twin: the fast linears are an eager kernel choice; a compiled step traces plain linears.)

``--random-weights`` builds each model from its config.json alone (random weights: a forward's time does not
depend on the values), for machines the weights cannot reach, e.g. a GPU host with no registry access.

Run it on a quiet machine (nothing else on the cores); the table is what the README's microbench section shows.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from hf_vocabspec import kernels
from hf_vocabspec.evaluation.benchmark import machine_info
from hf_vocabspec.evaluation.offline import load_model
from hf_vocabspec.modeling import apply_weight_quantization


def bandwidth_gb_s(device: str, megabytes: int = 512, repeats: int = 5) -> float:
    """Read bandwidth of a plain reduction over a buffer far larger than the caches (GB/s, median)."""
    x = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32, device=device)
    times = []
    for _ in range(repeats + 1):
        sync(device)
        t0 = time.perf_counter()
        x.sum()
        sync(device)
        times.append(time.perf_counter() - t0)
    return x.numel() * 4 / statistics.median(times[1:]) / 1e9


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def quantized_bytes(model: torch.nn.Module, scheme: str) -> int:
    """weight_bytes with each quantized layer's weight counted at its int width (scales ignored)."""
    total = weight_bytes(model)
    for module in model.modules():
        if "_vocabspec_quantized" in module.__dict__:
            w = module.weight
            total -= int(w.numel() * (w.element_size() - (1 if scheme == "int8" else 0.5)))
    return total


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a forward reads of the weights: all parameters but the input embedding (a lookup reads a few rows);
    a tied head counts once."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) in seen or (p is embed and (head is None or head.weight is not embed)):
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    return total


@torch.no_grad()
def forward_seconds(model, context: int, m: int, repeats: int, device: str, warmup: int = 1) -> float:
    """Median seconds of a forward of m new positions after ``context`` cached tokens (logits of all m); the first
    ``warmup`` runs of a shape are not timed (the fast linears' kernel trials run there)."""
    from transformers.cache_utils import DynamicCache

    from hf_vocabspec.modeling import cache_kwarg

    vocab = model.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, min(vocab, 30000), (1, context), generator=g).to(device)
    new = torch.randint(10, min(vocab, 30000), (1, m), generator=g).to(device)
    times = []
    for _ in range(repeats + warmup):
        cache = DynamicCache(config=model.config)
        model(input_ids=prompt, use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache})
        sync(device)
        t0 = time.perf_counter()
        model(input_ids=new, use_cache=True, logits_to_keep=m, **{cache_kwarg(model): cache})
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:])


@torch.no_grad()
def compiled_forward_seconds(model, context: int, m: int, repeats: int, device: str) -> float:
    """``forward_seconds`` with the m-position forward compiled, as ``DraftStep.compile`` runs a drafter's steps:
    the prompt eager on the engine's static cache (``static_step_cache``), then ``compiled_call`` of the model with
    generate's options (``draft_compile_options``: the default compile config, ``dynamic=False``); the first two
    runs (the compile) are not timed."""
    from hf_vocabspec.generation.draft_step import compiled_call, graph_call, static_columns
    from hf_vocabspec.generation.engine import static_step_cache
    from hf_vocabspec.generation.hooks import draft_compile_options
    from hf_vocabspec.modeling import cache_kwarg, refresh_weight_quantization

    refresh_weight_quantization(model)
    call = graph_call(compiled_call(model, draft_compile_options(model)))
    vocab = model.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, min(vocab, 30000), (1, context), generator=g).to(device)
    new = torch.randint(10, min(vocab, 30000), (1, m), generator=g).to(device)
    positions = torch.arange(context, context + m, device=device)[None]
    width = static_columns(context + m)
    times = []
    for _ in range(repeats + 2):  # (the engine's static cache: every layer a full-length buffer)
        cache = static_step_cache(model.config.get_text_config(decoder=True), width).cache
        model(input_ids=prompt, use_cache=True, logits_to_keep=1, **{cache_kwarg(model): cache})
        sync(device)
        t0 = time.perf_counter()
        call(input_ids=new, position_ids=positions, use_cache=True, logits_to_keep=m, **{cache_kwarg(model): cache})
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


@torch.no_grad()
def decide_trials(model, m: int, device: str) -> None:
    """Run each linear layer on m random rows until the fast linears' trials for that shape are decided, so the
    timed forwards measure the chosen kernels (a forward runs the head once: its trials would spill into them)."""
    seen = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and (module.weight.shape, module.weight.dtype) not in seen:
            seen.add((module.weight.shape, module.weight.dtype))
            x = torch.randn(1, m, module.in_features, device=device).to(module.weight.dtype)
            for _ in range(2 * (kernels.TRIALS + 1)):
                module(x)


def _model(name: str, dtype: torch.dtype, random_weights: bool):
    if not random_weights:
        return load_model(name, dtype=dtype)
    from transformers import AutoConfig, AutoModelForCausalLM

    from hf_vocabspec.evaluation.offline import is_offline_name, resolve_model_path

    path = resolve_model_path(name) if is_offline_name(name) else name
    config = AutoConfig.from_pretrained(path)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["offline:gemma-3-270m"])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--positions", nargs="+", type=int, default=[1, 2, 3, 4, 5, 6, 8, 16])
    ap.add_argument("--context", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--kernels", nargs="+", choices=["linear", "fast", "int8", "int4"], default=["linear", "fast"],
                    help="linear: F.linear as transformers runs it; fast: hf_vocabspec.kernels.fast_linears (what "
                         "our generate runs), trials untimed; int8 / int4: a copy with weight-only quantized linears "
                         "(what drafter.quantize_weights runs; one weight read then counts the int bytes)")
    ap.add_argument("--compile", action="store_true",
                    help="after each linear / int8 / int4 row, the same forward compiled as compile_draft_step runs "
                         "a drafter's steps (torch.compile, static cache; compiles untimed)")
    ap.add_argument("--random-weights", action="store_true",
                    help="build each model from its config.json (a folder or offline name) with random weights")
    args = ap.parse_args()
    if 1 not in args.positions:
        ap.error("--positions must include 1 (the decode step every ratio is taken against)")
    info = machine_info()
    bw = bandwidth_gb_s(args.device)
    print(f"Machine: {info['cpu']} ({info['torch_threads']} torch threads, AVX-512 BF16: {info['native_bf16']}), "
          f"torch {info['torch']}, transformers {info['transformers']}, {info['date']}, device {args.device}; "
          f"read bandwidth {bw:.1f} GB/s (tensor.sum over 512 MiB); context {args.context} tokens, median of "
          f"{args.repeats}")
    head = " | ".join(f"M={m}" for m in args.positions)
    print(f"| model | dtype | kernels | one weight read | {head} |")
    print("|---|---|---|---|" + "---|" * len(args.positions))
    for name in args.models:
        for dtype in args.dtypes:
            model = _model(name, getattr(torch, dtype), args.random_weights).eval().to(args.device)
            read_s = weight_bytes(model) / (bw * 1e9)
            base = None
            for kind in args.kernels:
                run, read = model, read_s
                if kind in ("int8", "int4"):
                    run = copy.deepcopy(model)
                    n = apply_weight_quantization(list(run.modules()), kind)
                    read = quantized_bytes(run, kind) / (bw * 1e9)
                with kernels.fast_linears(run, enabled=kind != "linear") as report:
                    warmup = 1
                    if report.layers:  # decide every layer's kernel trials up front, on the linears alone
                        for m in args.positions:
                            decide_trials(run, m, args.device)
                    secs = {m: forward_seconds(run, args.context, m, args.repeats, args.device, warmup)
                            for m in args.positions}
                base = base or secs[1]  # ratios against the first kernels' decode step
                cells = [f"{secs[m] / base:.2f}x decode, {secs[m] / read:.2f}x read" + (
                    f" ({secs[m] * 1e3:.0f} ms)" if m == 1 else "") for m in args.positions]
                label = ("F.linear" if kind == "linear" else str(report) if kind == "fast"
                         else f"{kind} weights on {n} layers")
                print(f"| {name} | {dtype} | {label} | {read * 1e3:.0f} ms | " + " | ".join(cells) + " |", flush=True)
                if args.compile and kind != "fast":
                    secs = {m: compiled_forward_seconds(run, args.context, m, args.repeats, args.device)
                            for m in args.positions}
                    cells = [f"{secs[m] / base:.2f}x decode, {secs[m] / read:.2f}x read" + (
                        f" ({secs[m] * 1e3:.0f} ms)" if m == 1 else "") for m in args.positions]
                    print(f"| {name} | {dtype} | {label}, compiled step | {read * 1e3:.0f} ms | " + " | ".join(cells)
                          + " |", flush=True)
                if run is not model:
                    del run
            kernels.release(model)
            del model


if __name__ == "__main__":
    main()
