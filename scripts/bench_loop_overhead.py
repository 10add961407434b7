"""The engine's own cost per round, with models so small that a forward costs almost nothing (issue #36).

A tiny random Llama target and, as drafter, the same weights trimmed to the whole vocabulary: every draft is
accepted (checked), L = 5, greedy, no EOS (every call emits all its new tokens), batch 1 and 4 (batch 4 forced
to speculate: ``batched_speculation="on"``). ``--checks`` adds what a default drafter's call checks at every
drafted position, a confidence stop and an EOS id, set so that neither fires (every round still drafts all L).
The drafter's steps (``DraftStep.logits``: body + head) and the target's forwards are wrapped with timers; the engine's own share of a round is the loop's wall time
(``SpeculativeEngine.run``) minus those forwards. Host syncs per round come from ``SpeculationStats.host_syncs``
(generation/host.py counts every device-to-host read of the loop). Repeats after one warm-up call; median and
range. Prints a markdown table naming the machine.

    .venv/bin/python scripts/bench_loop_overhead.py                # 256 new tokens, 5 repeats, batch 1 and 4
    .venv/bin/python scripts/bench_loop_overhead.py --quick        # a smoke test (seconds)
    .venv/bin/python scripts/bench_loop_overhead.py --checks       # + a default drafter's per-draft checks
    .venv/bin/python scripts/bench_loop_overhead.py --device cuda  # where a GPU is lent
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_vocabspec
from hf_vocabspec.evaluation.benchmark import machine_info
from hf_vocabspec.generation import draft_step, engine

VOCAB = 64
NEVER_UNSURE = 1e-6  # a confidence threshold no draft falls below (a draw's probability is far above it)
CHECKS = "per-draft checks (a stop that never fires, an EOS never drawn)"


def tiny_pair(device: str, eos: bool = False):
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    target = LlamaForCausalLM(config).eval()
    base = LlamaForCausalLM(config).eval()
    base.load_state_dict(target.state_dict())
    drafter = hf_vocabspec.trim_drafter(base, list(range(VOCAB))).eval()  # the same model: every draft accepted
    for m in (target, drafter):
        # no EOS: every call emits all its new tokens; ``eos``: an id past the vocabulary, never drawn, so the loop
        # runs its per-draft EOS check as a real model's call does, and still emits all its new tokens
        m.generation_config.eos_token_id = VOCAB if eos else None
        m.generation_config.pad_token_id = 0
    drafter.generation_config.batched_speculation = "on"
    # the drafter must compute what the target does: its int8 copies (on by default, kept where timed faster) would
    # change some drafts, and the bench needs every draft accepted
    drafter.use_int8_copies = False
    return target.to(device), drafter.to(device)


class Timers:
    """Seconds inside the drafter's steps and the target's forwards, and inside the engine's loop."""

    def __init__(self, target, device: str):
        self.draft = self.verify = self.loop = 0.0
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        step_logits, run, forward = draft_step.DraftStep.logits, engine.SpeculativeEngine.run, target.forward

        def timed(fn, name):
            def wrapper(*a, **k):
                sync()
                t0 = time.perf_counter()
                out = fn(*a, **k)
                sync()
                setattr(self, name, getattr(self, name) + time.perf_counter() - t0)
                return out
            return wrapper

        self._restore = lambda: (setattr(draft_step.DraftStep, "logits", step_logits),
                                 setattr(engine.SpeculativeEngine, "run", run), setattr(target, "forward", forward))
        draft_step.DraftStep.logits = timed(step_logits, "draft")
        engine.SpeculativeEngine.run = timed(run, "loop")
        target.forward = timed(forward, "verify")

    def close(self):
        self._restore()

    def reset(self):
        self.draft = self.verify = self.loop = 0.0


def measure(target, drafter, timers: Timers, batch: int, new_tokens: int, length: int, repeats: int, device: str,
            threshold: float = 0.0):
    ids = torch.randint(3, VOCAB, (batch, 16), generator=torch.Generator().manual_seed(batch)).to(device)
    kw = dict(attention_mask=torch.ones_like(ids), assistant_model=drafter, do_sample=False,
              max_new_tokens=new_tokens, num_assistant_tokens=length, num_assistant_tokens_schedule="constant",
              assistant_confidence_threshold=threshold)  # 0: every round drafts all L (no confidence stop)
    target.generate(ids, **kw)  # warm-up
    rows = []
    for _ in range(repeats):
        timers.reset()
        t0 = time.perf_counter()
        out = target.generate(ids, **kw)
        wall = time.perf_counter() - t0
        st = drafter.last_speculation_stats
        assert out.shape[1] == ids.shape[1] + new_tokens, "a call ended early"
        assert st.accepted == st.proposed, f"not every draft accepted: {st.accepted} of {st.proposed}"
        n = st.rounds + st.plain_steps
        rows.append({"round_ms": 1e3 * timers.loop / n, "draft_ms": 1e3 * timers.draft / n,
                     "verify_ms": 1e3 * timers.verify / n,
                     "engine_ms": 1e3 * (timers.loop - timers.draft - timers.verify) / n,
                     "share": (timers.loop - timers.draft - timers.verify) / timers.loop,
                     "generate_ms": 1e3 * wall / n, "syncs": getattr(st, "host_syncs", float("nan")) / n,
                     "rounds": n, "draft_steps_per_round": st.draft_steps / n})
    return rows


def cell(values, fmt):
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    return fmt.format(med) + (f" ({fmt.format(lo)}-{fmt.format(hi)})" if len(values) > 1 else "")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--draft-length", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (tiny models are dispatch-bound)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="smoke test: 32 new tokens, 1 repeat")
    ap.add_argument("--checks", action="store_true",
                    help="the per-draft checks of a default drafter's call: a confidence stop that never fires "
                         f"(threshold {NEVER_UNSURE}: every draft of the {VOCAB}-id model is surer) and an EOS id "
                         "that is never drawn; every round still drafts all L")
    args = ap.parse_args(argv)
    if args.quick:
        args.new_tokens, args.repeats = 32, 1
    torch.set_num_threads(args.threads)
    target, drafter = tiny_pair(args.device, eos=args.checks)
    timers = Timers(target, args.device)
    try:
        table(args, target, drafter, timers)
    finally:
        timers.close()


def table(args, target, drafter, timers: Timers) -> None:
    info = machine_info()
    print(f"Loop overhead, tiny llama (every draft accepted), L={args.draft_length}, {args.new_tokens} new tokens, "
          f"greedy, {CHECKS if args.checks else 'no per-draft checks'}, "
          f"{args.repeats} repeats (median (min-max)); {info['cpu']}, {info['torch_threads']} torch "
          f"threads, device {args.device}, torch {info['torch']}, transformers {info['transformers']}, "
          f"{info['date']}\n")
    print("| batch | round (ms) | drafter steps (ms) | verify (ms) | engine's own (ms) | engine share | host syncs "
          "/ round | draft steps / round | rounds | generate / round (ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for b in args.batch:
        rows = measure(target, drafter, timers, b, args.new_tokens, args.draft_length, args.repeats, args.device,
                       NEVER_UNSURE if args.checks else 0.0)
        col = {k: [r[k] for r in rows] for k in rows[0]}
        print(f"| {b} | {cell(col['round_ms'], '{:.2f}')} | {cell(col['draft_ms'], '{:.2f}')} | "
              f"{cell(col['verify_ms'], '{:.2f}')} | {cell(col['engine_ms'], '{:.2f}')} | "
              f"{cell([100 * s for s in col['share']], '{:.1f}')}% | {cell(col['syncs'], '{:.2f}')} | "
              f"{cell(col['draft_steps_per_round'], '{:.1f}')} | {rows[0]['rounds']} | "
              f"{cell(col['generate_ms'], '{:.2f}')} |")
    print("\nengine's own = the loop's wall time minus the drafter steps (body + head) and the target's forwards; "
          "host syncs / round = device-to-host reads of the loop (SpeculationStats.host_syncs) per round; "
          "generate / round adds transformers' generate setup and the call's checks.")


if __name__ == "__main__":
    main()
