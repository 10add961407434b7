"""Structured workload: JSON-schema extraction prompts made from held-out chat text, speculative vs target-only
with the SAME constraint (xgrammar's HF processor, a fresh one per call), greedy.

Methods, interleaved prompt by prompt and repeated (the first repeat warms up and is dropped):
- target-only + schema; speculative + schema with the draft constraint (the drafter's own copy of the grammar,
  the default, with forced drafts: the grammar's jump-forward tokens drafted without a drafter forward), the same
  without forced drafts (``engine.FORCED_ROOM = 0``), speculative + schema without it (``constrain_drafts = False``);
- target-only and speculative without a schema (the unconstrained speedup on the same prompts).
Prints a markdown table naming the machine: tokens/s median and range, ratio to target-only with the same
constraint, acceptance (accepted / proposed drafts, tau), and whether every output equals target-only's.

    .venv/bin/python scripts/bench_structured.py                                  # pair G
    .venv/bin/python scripts/bench_structured.py --target offline:qwen2.5-coder-1.5b-instruct \\
        --drafter offline:qwen2.5-coder-0.5b-instruct --prompts 3 --max-new-tokens 48        # pair Q
    .venv/bin/python scripts/bench_structured.py --target offline:smollm2-135m-instruct --prompts 2 \\
        --max-new-tokens 24 --repeats 1                                                        # a quick look
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from hf_vocabspec.evaluation.benchmark import machine_info
from hf_vocabspec.evaluation.data import first_exchange, load_workload
from hf_vocabspec.evaluation.offline import load_model
from hf_vocabspec.trimming import trim_drafter

SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "maxLength": 40},
        "language": {"type": "string", "maxLength": 16},
        "is_question": {"type": "boolean"},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
    },
    "required": ["topic", "language", "is_question", "keywords"],
    "additionalProperties": False,
}
INSTRUCTION = ("Read the text below and answer only with a JSON object with the fields topic (string), language "
               "(string), is_question (boolean) and keywords (up to 3 strings).\n\nText: ")


def json_prompts(dataset, tokenizer, n: int, max_chars: int = 400) -> list[torch.Tensor]:
    """Held-out first user turns wrapped in the extraction instruction, chat-templated where the tokenizer has a
    template (plain text otherwise)."""
    out = []
    for i in range(len(dataset)):
        exchange = first_exchange(dataset[i], tokenizer, min_user_chars=40)
        if exchange is None:
            continue
        user = next(m["content"] for m in dataset[i]["messages"] if m["role"] == "user")[:max_chars]
        text = INSTRUCTION + user
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"]
        else:
            ids = tokenizer(text + "\nJSON: ", return_tensors="pt")["input_ids"]
        out.append(ids)
        if len(out) == n:
            break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="offline:gemma-3-270m")
    ap.add_argument("--drafter", default=None, help="the untrimmed drafter (default: the target's own copy)")
    ap.add_argument("--drafter-dtype", default="bfloat16")
    ap.add_argument("--coverage", type=float, default=0.95)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-sizes", type=int, nargs="*", default=[],
                    help="also time target-only vs speculative, both with the schema, on the first B prompts as one "
                         "left-padded batch, for each B (needs --prompts >= B)")
    ap.add_argument("--num-assistant-tokens", type=int, default=None,
                    help="the drafter's L (default: the trimmed drafter's own, 5); forced drafts come on top")
    ap.add_argument("--batched-only", action="store_true", help="only the --batch-sizes table (skip the batch-1 methods)")
    args = ap.parse_args()
    if args.batch_sizes and max(args.batch_sizes) > args.prompts:
        ap.error(f"--batch-sizes {max(args.batch_sizes)} needs --prompts >= {max(args.batch_sizes)}")

    import xgrammar as xgr
    from xgrammar.contrib.hf import LogitsProcessor as XgrProcessor

    work = load_workload(args.target, "offline:sharegpt", 4000, progress=False)
    tokenizer, target = work.tokenizer, work.target
    k = work.counts.smallest_k_for_coverage(args.coverage)
    base = load_model(args.drafter or args.target, dtype=getattr(torch, args.drafter_dtype))
    drafter = trim_drafter(base, work.counts.top_k(k), tokenizer=tokenizer).eval()
    if args.num_assistant_tokens is not None:
        drafter.generation_config.num_assistant_tokens = args.num_assistant_tokens
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=target.get_output_embeddings().weight.shape[0])
    grammar = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA), any_whitespace=False)
    prompts = json_prompts(work.held_out, tokenizer, args.prompts)
    gen = dict(do_sample=False, max_new_tokens=args.max_new_tokens)

    from hf_vocabspec.generation import engine

    def run(p, assistant, schema: bool, constrain: bool = True, forced: bool = True):
        if assistant is not None:
            assistant.generation_config.constrain_drafts = constrain
        kw = {"logits_processor": [XgrProcessor(grammar)]} if schema else {}
        room = engine.FORCED_ROOM
        engine.FORCED_ROOM = room if forced else 0  # the ablation: forced drafts off (restored below)
        try:
            return target.generate(p, attention_mask=torch.ones_like(p), assistant_model=assistant, **gen, **kw)
        finally:
            engine.FORCED_ROOM = room

    methods = {
        "target-only + schema": lambda p: run(p, None, True),
        "speculative + schema, draft constraint": lambda p: run(p, drafter, True, True),
        "speculative + schema, draft constraint without forced drafts": lambda p: run(p, drafter, True, True, False),
        "speculative + schema, drafts unconstrained": lambda p: run(p, drafter, True, False),
        "target-only, no schema": lambda p: run(p, None, False),
        "speculative, no schema": lambda p: run(p, drafter, False),
    }
    baseline = {m: ("target-only + schema" if "schema," in m or m.endswith("+ schema") else "target-only, no schema")
                for m in methods}
    if args.batched_only:
        if not args.batch_sizes:
            ap.error("--batched-only needs --batch-sizes")
        print(f"Machine: {machine_info()}; target {args.target}, drafter {args.drafter or args.target} "
              f"{args.drafter_dtype} k={k}, L={drafter.generation_config.num_assistant_tokens}, "
              f"{args.max_new_tokens} new tokens, {args.repeats} repeats, greedy")
        batched_table(args, target, drafter, tokenizer, grammar, prompts, XgrProcessor)
        return
    refs = {True: [run(p, None, True) for p in prompts], False: [run(p, None, False) for p in prompts]}
    tps = {m: [] for m in methods}
    identical = {m: True for m in methods}
    acc = {m: [0, 0, 0] for m in methods}  # accepted, proposed, row rounds
    forced = dict.fromkeys(methods, 0)  # drafts the grammar forced (no drafter forward)
    with torch.no_grad():
        for rep in range(args.repeats + 1):
            spent, made = dict.fromkeys(methods, 0.0), dict.fromkeys(methods, 0)
            for i, p in enumerate(prompts):
                for name, fn in methods.items():
                    t0 = time.perf_counter()
                    out = fn(p)
                    spent[name] += time.perf_counter() - t0
                    made[name] += out.shape[1] - p.shape[1]
                    identical[name] &= torch.equal(out, refs["no schema" not in name][i])
                    if name.startswith("speculative") and rep:
                        s = drafter.last_speculation_stats
                        acc[name][0] += s.accepted
                        acc[name][1] += s.proposed
                        acc[name][2] += s.row_rounds
                        forced[name] += s.forced_proposed
            if rep:
                for m in methods:
                    tps[m].append(made[m] / spent[m])
    machine = machine_info()
    print(f"Machine: {machine['cpu']} ({machine['torch_threads']} torch threads, AVX-512 BF16: "
          f"{machine['native_bf16']}), torch {machine['torch']}, transformers {machine['transformers']}, "
          f"{machine['date']}; target {args.target}, drafter {args.drafter or args.target} {args.drafter_dtype} "
          f"k={k} ({args.coverage:.0%} coverage), L={drafter.generation_config.num_assistant_tokens}, "
          f"{len(prompts)} JSON-schema prompts x {args.max_new_tokens} new tokens, {args.repeats} repeats, greedy")
    if args.batch_sizes:
        batched_table(args, target, drafter, tokenizer, grammar, prompts, XgrProcessor)
    print("| method | tokens/s median (range) | vs target-only, same constraint (median, range) | acceptance | tau "
          "| forced drafts | identical to target-only |")
    print("|---|---|---|---|---|---|---|")
    for m in methods:
        ratios = [a / b for a, b in zip(tps[m], tps[baseline[m]])]
        a, prop, rr = acc[m]
        rate = f"{a / prop:.2f} ({a}/{prop})" if prop else "-"
        tau = f"{1 + a / rr:.2f}" if rr else "-"
        print(f"| {m} | {statistics.median(tps[m]):.2f} ({min(tps[m]):.2f}-{max(tps[m]):.2f}) | "
              f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | {rate} | {tau} | "
              f"{forced[m] if m.startswith('speculative') else '-'} | {identical[m]} |")


def batched_table(args, target, drafter, tokenizer, grammar, prompts, XgrProcessor) -> None:
    """Target-only vs speculative, both with the schema (a fresh processor per call), each batch size's prompts
    left-padded into one batch; tokens/s counts every row's generated columns (the same for both: outputs equal)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    drafter.generation_config.constrain_drafts = True
    print("| batch | target-only + schema tokens/s | speculative + schema tokens/s | ratio median (range) "
          "| acceptance | forced drafts | decision | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for b in args.batch_sizes:
        rows = prompts[:b]
        P = max(r.shape[1] for r in rows)
        ids = torch.full((b, P), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, P - r.shape[1]:], mask[i, P - r.shape[1]:] = r[0], 1
        gen = dict(do_sample=False, max_new_tokens=args.max_new_tokens, pad_token_id=pad)

        def run(assistant):
            return target.generate(ids, attention_mask=mask, assistant_model=assistant,
                                   logits_processor=[XgrProcessor(grammar)], **gen)

        ref = run(None)
        tps = {"t": [], "s": []}
        same, a, prop, forced, decision = True, 0, 0, 0, ""
        with torch.no_grad():
            for rep in range(args.repeats + 1):
                for key, assistant in (("t", None), ("s", drafter)):
                    t0 = time.perf_counter()
                    out = run(assistant)
                    dt = time.perf_counter() - t0
                    same &= torch.equal(out, ref)
                    if rep:
                        tps[key].append(b * (out.shape[1] - P) / dt)
                        if assistant is not None:
                            a += drafter.last_speculation_stats.accepted
                            prop += drafter.last_speculation_stats.proposed
                            forced += drafter.last_speculation_stats.forced_proposed
                            decision = drafter.last_speculation_stats.decision
        ratios = [s / t for s, t in zip(tps["s"], tps["t"])]
        print(f"| {b} | {statistics.median(tps['t']):.2f} | {statistics.median(tps['s']):.2f} | "
              f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | "
              f"{a / max(prop, 1):.2f} ({a}/{prop}) | {forced} | {decision} | {same} |")


if __name__ == "__main__":
    main()
