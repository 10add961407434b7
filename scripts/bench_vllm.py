"""vLLM (CPU build here) with a trimmed drafter vs the untrimmed one vs no speculation: tokens/s and acceptance.

Runs in the vLLM virtualenv (``make test-vllm`` builds it), engines in this process one after another (executor
"uni"), greedy, batch 1 and batch ``--batch``:

    .venv-vllm/bin/python scripts/bench_vllm.py --target DIR --drafter TRIMMED_DIR --untrimmed PLAIN_DIR
    .venv-vllm/bin/python scripts/bench_vllm.py --smollm2 /tmp/pair   # builds the SmolLM2-135M self-drafting pair

``--smollm2 DIR``: target = offline SmolLM2-135M-Instruct, untrimmed drafter = the same model, trimmed drafter =
the same model keeping ``--keep`` ids (the first ones, plus the specials), saved under DIR once. Output: one JSON
line per (setting, batch) with tokens/s (generated tokens over the generate() wall time), acceptance (accepted /
drafted tokens from vLLM's metrics) and the mean accepted length per round. The draft step's own time is not
exposed by vLLM's metrics: not reported.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from pathlib import Path

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain recursion in one sentence.",
           "Name three primary colours.", "How do I reverse a list in Python?", "Why is the sky blue?",
           "Give me a recipe for pancakes.", "What does a CPU cache do?"]


def build_smollm2_pair(out: Path, keep: int) -> tuple[Path, Path, Path]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_vocabspec import trim_drafter
    from hf_vocabspec.evaluation.offline import resolve_model_path

    target = Path(resolve_model_path("offline:smollm2-135m-instruct"))
    trimmed = out / f"smollm2-135m-trimmed-{keep}"
    if not (trimmed / "config.json").is_file():
        tok = AutoTokenizer.from_pretrained(target)
        model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
        drafter = trim_drafter(model, sorted(set(range(keep)) | set(tok.all_special_ids)), tokenizer=tok)
        drafter.save_pretrained(trimmed)
        tok.save_pretrained(trimmed)
    return target, trimmed, target


def run(args) -> list[dict]:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    tok = AutoTokenizer.from_pretrained(args.target)
    chats = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True)
             for p in PROMPTS]
    chats = [list(c["input_ids"]) if hasattr(c, "keys") else list(c) for c in chats]
    settings = [("no speculation", None), ("untrimmed drafter", args.untrimmed), ("trimmed drafter", args.drafter)]
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    rows, outputs = [], {}
    for name, drafter in settings:
        spec = None if drafter is None else {"method": "draft_model", "model": str(drafter),
                                             "num_speculative_tokens": args.k}
        t0 = time.perf_counter()
        llm = LLM(model=str(args.target), dtype=args.dtype, enforce_eager=True, max_model_len=1024, seed=0,
                  distributed_executor_backend="uni", speculative_config=spec, disable_log_stats=False,
                  kv_cache_memory_bytes=512 << 20)
        load_s = time.perf_counter() - t0
        greedy_warmup = llm.generate([TokensPrompt(prompt_token_ids=chats[0])],
                                     SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
        del greedy_warmup
        for batch in sorted({1, args.batch}):
            prompts = [TokensPrompt(prompt_token_ids=c) for c in chats[:batch]]
            before = _spec(llm)
            t0 = time.perf_counter()
            outs = llm.generate(prompts, sp, use_tqdm=False)
            wall = time.perf_counter() - t0
            after = _spec(llm)
            generated = sum(len(o.outputs[0].token_ids) for o in outs)
            drafted, accepted, rounds = (after[i] - before[i] for i in range(3))
            outputs[(name, batch)] = [list(o.outputs[0].token_ids) for o in outs]
            row = {"setting": name, "batch": batch, "tokens_per_s": round(generated / wall, 2),
                   "generated": generated, "wall_s": round(wall, 2), "load_s": round(load_s, 1)}
            if drafter is not None:
                row |= {"drafted": drafted, "accepted": accepted,
                        "acceptance": round(accepted / drafted, 3) if drafted else None,
                        "mean_accepted_length": round(1 + accepted / rounds, 2) if rounds else None,
                        "identical_to_no_speculation": outputs[(name, batch)] == outputs[("no speculation", batch)]}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del llm
        gc.collect()
    return rows


def draft_steps(args, chats) -> list[dict]:
    """The draft step alone, trimmed vs untrimmed, in vLLM and in transformers in this same process: each drafter
    decodes ``--max-tokens`` tokens greedily by itself at batch 1 (vLLM: our model class served as the main model;
    transformers: ``TrimmedDrafter`` / the plain model, ``F.linear``), ms per token. Both drafters stay loaded and
    their timed runs alternate (ABBA...) ``--repeats`` times, because this host's speed drifts by +-25% between
    runs: the ratio is the median of the per-repeat ratios, with its range."""
    import statistics

    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams, TokensPrompt

    from hf_vocabspec import TrimmedDrafter

    n, prompt = args.max_tokens, chats[0]
    paths = {"untrimmed drafter": args.untrimmed, "trimmed drafter": args.drafter}

    def alternate(run_once) -> dict[str, list[float]]:
        got = {name: [] for name in paths}
        for r in range(args.repeats):
            for name in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
                t0 = time.perf_counter()
                run_once(name)
                got[name].append(1000 * (time.perf_counter() - t0) / n)
        return got

    llms = {name: LLM(model=str(path), dtype=args.dtype, enforce_eager=True, max_model_len=1024, seed=0,
                      distributed_executor_backend="uni", kv_cache_memory_bytes=512 << 20)
            for name, path in paths.items()}
    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    for llm in llms.values():
        llm.generate([TokensPrompt(prompt_token_ids=prompt)], SamplingParams(temperature=0.0, max_tokens=4),
                     use_tqdm=False)
    vllm_ms = alternate(lambda name: llms[name].generate([TokensPrompt(prompt_token_ids=prompt)], sp,
                                                         use_tqdm=False))
    op_ms = {}
    if args.profile:  # CPU time inside torch ops per token (the host's drift moves wall time, far less op time)
        from torch.profiler import ProfilerActivity, profile

        for name, llm in llms.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)
            op_ms[name] = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1000 / n
    del llms
    gc.collect()
    models = {name: (TrimmedDrafter if name.startswith("trimmed") else AutoModelForCausalLM).from_pretrained(
        path, dtype=getattr(torch, args.dtype)).eval() for name, path in paths.items()}
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for model in models.values():
            model.generate(ids, max_new_tokens=4, do_sample=False)
        hf_ms = alternate(lambda name: models[name].generate(ids, max_new_tokens=n, min_new_tokens=n,
                                                               do_sample=False))
    del models
    gc.collect()
    rows = []
    for name in paths:
        row = {"draft_step": name, "vllm_ms_per_token": round(statistics.median(vllm_ms[name]), 2),
               "transformers_ms_per_token": round(statistics.median(hf_ms[name]), 2), "repeats": args.repeats,
               "torch_threads": torch.get_num_threads()}
        if op_ms:
            row["vllm_op_ms_per_token"] = round(op_ms[name], 2)
        rows.append(row)
        print(json.dumps(row), flush=True)

    def ratios(ms):
        each = [t / u for u, t in zip(ms["untrimmed drafter"], ms["trimmed drafter"])]
        return round(statistics.median(each), 3), [round(min(each), 3), round(max(each), 3)]

    (v, v_range), (h, h_range) = ratios(vllm_ms), ratios(hf_ms)
    ratio = {"draft_step": "trimmed / untrimmed", "vllm": v, "vllm_range": v_range, "transformers": h,
             "transformers_range": h_range}
    if op_ms:
        ratio["vllm_op_time"] = round(op_ms["trimmed drafter"] / op_ms["untrimmed drafter"], 3)
    print(json.dumps(ratio), flush=True)
    return rows + [ratio]


def _spec(llm) -> tuple[int, int, int]:
    got = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    return tuple(int(got.get(f"vllm:spec_decode_{n}") or 0) for n in ("num_draft_tokens", "num_accepted_tokens",
                                                                       "num_drafts"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", type=Path)
    ap.add_argument("--drafter", type=Path, help="trimmed drafter folder (hf-vocabspec trim / save_pretrained)")
    ap.add_argument("--untrimmed", type=Path, help="the plain model it was trimmed from")
    ap.add_argument("--smollm2", type=Path, metavar="DIR", help="build and use the SmolLM2-135M self-drafting pair")
    ap.add_argument("--keep", type=int, default=8192)
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--draft-step", action="store_true",
                    help="also time each drafter's step alone, trimmed vs untrimmed, in vLLM and in transformers")
    ap.add_argument("--only-draft-step", action="store_true",
                    help="only the draft-step timing (e.g. a drafter vLLM cannot use as draft_model: Gemma 3)")
    ap.add_argument("--repeats", type=int, default=6,
                    help="timed repeats of each --draft-step measurement, alternating trimmed / untrimmed")
    ap.add_argument("--profile", action="store_true",
                    help="with the draft step: also report vLLM's per-token CPU time inside torch ops (torch profiler)")
    ap.add_argument("--out", type=Path, help="also write the rows (and the machine) to this JSON file")
    args = ap.parse_args()
    if args.smollm2 is not None:
        args.target, args.drafter, args.untrimmed = build_smollm2_pair(args.smollm2, args.keep)
    if not (args.target and args.drafter and args.untrimmed):
        sys.exit("pass --target, --drafter and --untrimmed, or --smollm2 DIR")
    rows = [] if args.only_draft_step else run(args)
    if args.draft_step or args.only_draft_step:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.target)
        chat = tok.apply_chat_template([{"role": "user", "content": PROMPTS[0]}], add_generation_prompt=True,
                                       tokenize=True)
        rows += draft_steps(args, [list(chat["input_ids"]) if hasattr(chat, "keys") else list(chat)])
    if args.out:
        args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or
                                        platform.machine(), "cpus": os.cpu_count(), "args": {k: str(v) for k, v in
                                        vars(args).items()}, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    for name, value in {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1",
                        "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}.items():
        os.environ.setdefault(name, value)
    main()
