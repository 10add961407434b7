"""Verify-time LM head: the target's head over the L+1 verified positions, reading its weight once.

Why: in speculative decoding the target scores L+1 positions per round. Its LM head is a (V x d) weight
(262,144 x 640 on Gemma 3), far larger than the last-level cache, so a head over a few rows should cost
about one read of the weight, like a decode step. On CPU the default ``F.linear`` kernel for a handful
of rows can cost 2-3x that (issue #15); computing ``W @ x.T`` (the weight as the large GEMM operand)
reads it once. Which kernel is faster depends on the BLAS, the CPU, the shape and the thread count, so
nothing is assumed: for every (device, dtype, weight shape, bias, rows, torch threads) the first calls
run the candidates in turn on the real data, timed (the trials do the real work, nothing is wasted), and
a candidate replaces ``F.linear`` only if its median beats it by a margin. One row (a decode step), more
than ``MAX_ROWS`` rows (prefill), other devices than CPU/CUDA, autograd, and non-``nn.Linear`` heads
(quantised layers, accelerate-offloaded heads) keep the original head.

Scope: the generation seam (:mod:`hf_vocabspec.generation.hooks`) enters :func:`generate_kernels` (the one kernel
choice: fast linears first, then this; why both exist is in :mod:`hf_vocabspec.kernels`), so the head is
replaced only while a generate call drafts with a :class:`~hf_vocabspec.modeling.TrimmedDrafter` (or an hf_vocabspec session
object such as SSD's) whose ``use_verify_head`` is on, and restored in ``finally``. Only the head module's
``forward`` is swapped: architecture transforms the causal-LM class applies AFTER the head (Gemma's
``final_logit_softcapping``) still apply, and a tied weight is read at call time, so ties hold.
Exactness: the kernels differ from ``F.linear`` only by float summation order (~1e-6 relative in float32,
the same order as HF's own verify-vs-decode difference); verification stays exact for the p it computes.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .kernels import (FastLinears, KernelChoice, KernelKey, compiled_int8_copies, fast_linears, wants_fast_linears,
                      wants_fast_prefill, wants_fused_norms, wants_int8_copies)
from .lean_forward import lean_forwards, wants_lean_forward
from .modeling import TrimmedDrafter, cache_kwarg, model_body

# Row counts above this are prefill-like: GEMM kernels are efficient there, keep the original head.
MAX_ROWS = 64
# Timed calls per candidate before choosing (median), and the speed-up a candidate must show over F.linear.
TRIALS = 3
MARGIN = 0.9


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def _weight_major(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(W @ x.T).T, copied back to row-major: the weight is the large operand of the GEMM."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.mm(weight, rows.T) if bias is None else torch.addmm(bias[:, None], weight, rows.T)
    return out.T.contiguous().reshape(*x.shape[:-1], weight.shape[0])


def _weight_major_view(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """(W @ x.T).T as a transposed view (no copy; downstream ops read it strided)."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.mm(weight, rows.T) if bias is None else torch.addmm(bias[:, None], weight, rows.T)
    return out.T.reshape(*x.shape[:-1], weight.shape[0])


KERNELS: dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]] = {
    "linear": _linear,
    "weight_major": _weight_major,
    "weight_major_view": _weight_major_view,
}
ORIGINAL = "linear"


# the timed-choice record is shared with the fast linears (one home: kernels.py)
HeadKey = KernelKey


_CHOICES: dict[HeadKey, KernelChoice] = {}
_LOCK = threading.Lock()


def kernel_choices() -> list[KernelChoice]:
    """Every choice made (or in trial) in this process."""
    with _LOCK:
        return list(_CHOICES.values())


def _key(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> HeadKey:
    rows = x.numel() // x.shape[-1]
    return HeadKey(str(x.device), str(weight.dtype).removeprefix("torch."), weight.shape[0], weight.shape[1],
                   bias is not None, rows, torch.get_num_threads())


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def head_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with the kernel measured fastest for this key (trials while undecided)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (
        rows <= 1 or rows > MAX_ROWS or x.device.type not in ("cpu", "cuda") or x.dtype != weight.dtype
        or (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
    ):
        return F.linear(x, weight, bias)
    key = _key(x, weight, bias)
    choice = _CHOICES.get(key)
    if choice is not None and choice.chosen is not None:
        return KERNELS[choice.chosen](x, weight, bias)
    with _LOCK:
        choice = _CHOICES.setdefault(key, KernelChoice(key, {name: [] for name in KERNELS}))
        name = choice.next_candidate()
    _sync(x.device)
    start = time.perf_counter()
    out = KERNELS[name](x, weight, bias)
    _sync(x.device)
    elapsed = (time.perf_counter() - start) * 1e3
    with _LOCK:
        choice.record(name, elapsed, TRIALS, MARGIN)
    return out


def measure_head(weight: torch.Tensor, rows: int, bias: torch.Tensor | None = None,
                 seed: int = 0) -> KernelChoice:
    """Run the trials for ``rows`` rows now, on the real weight with random inputs; returns the choice.

    For scripts and the tuner (verify latency per L+1), so the first generate call does not pay the trials.
    An already-made choice is returned as is.
    """
    if rows <= 1 or rows > MAX_ROWS:
        raise ValueError(f"The verify head is chosen for 2..{MAX_ROWS} rows (got {rows}); other counts keep F.linear.")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(1, rows, weight.shape[1], generator=gen).to(weight.device, weight.dtype)
    with torch.no_grad():
        for _ in range(TRIALS * len(KERNELS) + 1):
            head_forward(x, weight, bias)
            choice = _CHOICES[_key(x, weight, bias)]
            if choice.chosen is not None:
                return choice
    return choice  # pragma: no cover - the loop always decides


def _eligible_head(model: nn.Module) -> nn.Linear | None:
    """The model's output head if the verify head can stand in for it, else None (original head kept)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    # Exactly nn.Linear: subclasses (quantised layers) have other weight semantics; an instance-level forward
    # means someone (accelerate offload hooks) already wraps it.
    if type(head) is not nn.Linear or "forward" in head.__dict__:
        return None
    if head.weight.device.type == "meta":
        return None
    return head


def _verify_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return head_forward(x, self.weight, self.bias)


@contextmanager
def verify_head(model: nn.Module, enabled: bool = True) -> Iterator[bool]:
    """Within the block, ``model``'s LM head runs :func:`head_forward`; restored on exit (also on errors).

    Yields whether this block replaced the head (an inner block on an already-replaced head is a no-op).
    """
    head = _eligible_head(model) if enabled else None
    if head is None:
        yield False
        return
    head.forward = _verify_forward.__get__(head, nn.Linear)
    try:
        yield True
    finally:
        del head.forward


@contextmanager
def generate_kernels(target: nn.Module, assistant, compiled: bool = False,
                     compiled_draft: bool = False, head: bool = True) -> Iterator[FastLinears]:
    """The one kernel choice of a generate call with one of our assistants (``generation.hooks`` enters only this):
    the fast linears (:func:`hf_vocabspec.kernels.fast_linears`) on the target's and drafter's linear layers unless
    ``use_fast_linears`` is off (the drafter's with their int8 copies among the candidates unless ``use_int8_copies``
    is off, its prefill trialling the fast prefill's kernels unless ``use_fast_prefill`` is off, its RMSNorms fused
    unless ``use_fused_norms`` is off), then the verify head on the target's LM head unless ``use_verify_head`` is
    off, and a trimmed drafter's body through the lean forward (:mod:`hf_vocabspec.lean_forward`) unless
    ``use_lean_forward`` is off or its steps run compiled. The fast linears are entered first: a head they wrap is
    left alone by the verify head (it sees a replaced forward), so
    the verify head serves only where they do not (see :mod:`hf_vocabspec.kernels` for why both exist). Yields the
    fast linears' report (``stats.kernels``). ``compiled`` (the verify and the draft steps run compiled): neither,
    so the layers stay what the compiler traces; ``compiled_draft`` (only a trimmed drafter's steps run compiled,
    ``compiles_draft_step``): the fast linears on the target and the drafter's head, and on its body (what the
    compiler traces) the int8 copies as traced layers (:func:`hf_vocabspec.kernels.compiled_int8_copies`; unless
    ``use_fast_linears`` or ``use_int8_copies`` is off). ``head=False``: without the verify head (``tune``'s timed
    steps, whose verify timing enters it itself)."""
    # compiled draft steps: the drafter's body is what the compiler traces; its head (outside the compiled call)
    # keeps the fast linears (and its int8 copy among their candidates)
    draft = assistant.lm_head if compiled_draft else assistant
    fast_on = not compiled and wants_fast_linears(assistant)
    with fast_linears(target, enabled=fast_on, draft=(draft,), int8=wants_int8_copies(assistant),
                      norms=wants_fused_norms(assistant), prefill=wants_fast_prefill(assistant)) as fast, \
            compiled_int8_copies(model_body(assistant) if compiled_draft else None,
                                 enabled=compiled_draft and fast_on and wants_int8_copies(assistant)) as traced, \
            verify_head(target, enabled=head and not compiled and wants_verify_head(assistant)), \
            lean_forwards(model_body(assistant) if isinstance(assistant, TrimmedDrafter) else None,
                          enabled=not compiled and not compiled_draft and wants_lean_forward(assistant)) as lean:
        fast.compiled_int8_layers = traced
        fast.lean_forward = lean
        yield fast


def wants_verify_head(assistant) -> bool:
    """Whether a generate call with this ``assistant_model`` uses the verify head (hf_vocabspec drafters only)."""
    if isinstance(assistant, TrimmedDrafter):
        return bool(getattr(assistant, "use_verify_head", True))
    if getattr(assistant, "_hf_vocabspec_candidate_generator", None) is not None:  # SSD session and the like
        flag = getattr(assistant, "use_verify_head", None)
        if flag is None:
            flag = getattr(getattr(assistant, "drafter", None), "use_verify_head", True)
        return bool(flag)
    return False


@dataclass
class VerifyLatency:
    """Target forward latency per number of new positions (1 = a decode step, L+1 = a verify step).

    ``ms`` holds every timed forward per row count; ``ratio(n)`` is the median of verify/decode ratios
    paired within one repeat (both measured back to back, so load drifts cancel better than in a ratio of
    medians).
    """

    ms: dict[int, list[float]]
    paired_ratios: dict[int, list[float]]
    verify_head: bool
    context_length: int
    threads: int
    kernels: dict[int, str]  # rows -> kernel used (F.linear where the verify head is off or kept it)

    def median_ms(self, rows: int) -> float:
        return statistics.median(self.ms[rows])

    def ratio(self, rows: int) -> float:
        return statistics.median(self.paired_ratios[rows])

    def spread(self, rows: int) -> tuple[float, float]:
        """(min, max) of the paired verify/decode ratios."""
        return min(self.paired_ratios[rows]), max(self.paired_ratios[rows])


@torch.no_grad()
def measure_verify_latency(target: nn.Module, rows: tuple[int, ...] = (6,), context_length: int = 256,
                           repeats: int = 7, use_verify_head: bool = True, seed: int = 0) -> VerifyLatency:
    """Time the target's decode step and its verify forwards over ``rows`` positions, with the KV cache of a
    ``context_length``-token context (random ids: latency does not depend on the text).

    Each repeat times one decode step and one forward per row count, back to back, cropping the cache after
    each, so every forward sees the same context length. The verify head (trials run first, off the clock)
    is used when ``use_verify_head``.
    """
    from transformers.cache_utils import DynamicCache

    if any(n < 2 for n in rows):
        raise ValueError(f"rows are verify widths L+1 >= 2 (got {rows}); the decode step (1 row) is always timed.")
    device = next(target.parameters()).device
    vocab = target.config.get_text_config().vocab_size
    gen = torch.Generator(device="cpu").manual_seed(seed)
    context = torch.randint(3, vocab, (1, context_length), generator=gen).to(device)
    new = torch.randint(3, vocab, (1, max(rows)), generator=gen).to(device)
    cache = DynamicCache(config=target.config)
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()  # sliding-window layers must be croppable back after each forward
    target(input_ids=context, use_cache=True, logits_to_keep=1, **{cache_kwarg(target): cache})
    widths = (1, *rows)
    ms: dict[int, list[float]] = {n: [] for n in widths}
    head = _eligible_head(target)
    kernels = {n: ORIGINAL for n in widths}
    wrapped = getattr(target.get_output_embeddings(), "__dict__", {}).get("forward") is not None
    if head is None and wrapped:  # inside hf_vocabspec.kernels.fast_linears: they run the head, not F.linear
        kernels = {n: "wrapped (fast linears or a hook)" for n in widths}
    with verify_head(target, enabled=use_verify_head):
        if use_verify_head and head is not None:
            for n in rows:
                if n <= MAX_ROWS:
                    kernels[n] = measure_head(head.weight, n, head.bias).chosen
        for _ in range(repeats + 1):  # the first repeat warms up and is dropped
            for n in widths:
                _sync(device)
                start = time.perf_counter()
                target(input_ids=new[:, :n], use_cache=True, logits_to_keep=n, **{cache_kwarg(target): cache})
                _sync(device)
                ms[n].append((time.perf_counter() - start) * 1e3)
                cache.crop(-n)
    ms = {n: t[1:] for n, t in ms.items()}
    paired = {n: [v / d for v, d in zip(ms[n], ms[1])] for n in rows}
    return VerifyLatency(ms, paired, use_verify_head and head is not None, context_length,
                         torch.get_num_threads(), kernels)
