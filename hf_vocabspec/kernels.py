"""Fast linear kernels for the whole model: oneDNN packed weights where they measure faster than ``F.linear``.

Why (issue #28): a decode step or a verify of a few positions is memory-bound, its floor one read of the weights.
On CPU, ``F.linear`` with a plain (row-major) weight falls off that floor for a handful of rows: measured on a
2-core AMD EPYC with AVX-512 BF16 (2026-11-26, torch 2.13), an fp32 8960x1536 weight took 3.9 ms for one row
and 8-9 ms for 2-8 rows, while the same weight reordered once into oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``, what Inductor's CPU freezing pass uses) took 1.9-2.9 ms for any of
1-16 rows: one read of the weight at the machine's bandwidth, decode and verify alike. bf16 gains less (1.0-1.5 ms
vs 1.2-1.7 ms) with identical results.

How: :func:`fast_linears` swaps the ``forward`` of every plain ``nn.Linear`` of the given models while the block
runs (restored in ``finally``). Nothing is assumed about the machine: for every (dtype, weight shape, bias, rows
count (:func:`rows_bucket`: exact up to 16), torch threads) the first calls run ``F.linear`` and the packed kernel in turn on the
real data, timed (the trials do the real work), and the packed kernel is kept only if its median beats ``F.linear``
by ``MARGIN`` (at once after ``EARLY`` calls each where their times do not overlap). A module's
packed weight is made on its first use and kept, keyed by the weight's storage and version (a changed weight is
packed again), so later generate calls pay nothing; :func:`release` drops them (the packed copy costs as much
memory as the weight itself).

A drafter's layers (``fast_linears(..., draft=...)``), for forwards of up to ``DRAFT_MAX_ROWS`` rows, trial their
weight-only int8 copy against ``F.linear`` instead of the packed kernel (``DRAFT_CANDIDATES``): see there why, and
why only a drafter's. For forwards of more than ``MAX_ROWS`` rows (its prompt's prefill) they trial the int8 copy
with per-token int8 activations (``w8a8_linear``) and, bfloat16 ones, the weight widened to float32 against
``F.linear`` (``PREFILL_CANDIDATES``): the fast prefill.

Exactness: the packed kernel sums in another order than ``F.linear`` (~1e-6 relative in float32; bf16 measured
identical), the same order of difference as between transformers' own verify and decode forwards, which already
use different kernels. Skipped (the original ``F.linear`` runs): other devices than CPU, dtypes other than
float32/bfloat16, autograd, more than ``MAX_ROWS`` rows (prefill: GEMM kernels are efficient there; but for a
drafter's layers, above), subclasses of ``nn.Linear`` (quantised layers) and modules whose ``forward`` someone
already replaced (accelerate hooks).

Two timed-kernel paths, one choice. The verify head (:mod:`hf_vocabspec.verify_head`) also times kernels against
``F.linear``, for the target's LM head only. Both exist because each covers what the other cannot, and never both on
one layer: a generate call enters them through ONE function, :func:`hf_vocabspec.verify_head.generate_kernels`
(``generation.hooks`` calls nothing else), fast linears first; a head they wrap is left alone by the verify head.
- Where the fast linears are on, the verify head does nothing (the head is already theirs).
- Where they are off, the verify head still serves the head: ``drafter.use_fast_linears = False``; a torch without
  oneDNN; packed copies that would not fit (the verify head's weight-major GEMM reads the original weight, no
  copy); float16 on CPU (not packed). Measured there: on machine B (no AVX-512 BF16) it cut a 6-row Gemma-3-270M
  verify from 265 to 156 ms (docs/results/verify-head-gemma-2026-11-23.md).
- On CUDA (the fast linears are CPU-only) its trials keep ``F.linear``: on an H200 no weight-major kernel beat it
  by the 10% margin for 2..8 rows of three LM-head shapes in fp32/bf16/fp16 (1.0-2.6x slower; only 16-row fp32
  switches; docs/results/verify-head-cuda-h200-2026-11-27.md), so there it costs its trials and nothing else.
Folding the verify head into the fast linears (its kernel as one more candidate) would need per-module candidate
sets (no packing where copies do not fit) and a CUDA path for every linear layer: not done while the evidence
above shows no layer where both would apply.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .modeling import quantization_ops_available, quantize_weight, serve_quantized, version_of

__all__ = ["DRAFT_CANDIDATES", "DRAFT_MAX_ROWS", "EXACT_ROWS", "MARGIN", "MAX_ROWS", "MEMORY_SHARE", "PREFILL_CANDIDATES", "TRIALS",
           "FastLinears", "KernelChoice", "KernelKey", "available", "choices", "compiled_int8_copies", "decided_int8",
           "fast_linears", "fused_norm", "fused_norm_scale", "fused_norms", "int8_linear", "packed_linear", "release",
           "rows_bucket", "settle_choices", "stacked_int8", "trials_run", "wants_fast_linears", "wants_fused_norms",
           "auto_drafter_dtype", "int8_gemm_pays", "native_bf16", "w8a8_linear", "wants_fast_prefill",
           "wants_int8_copies", "widened_linear"]

MAX_ROWS = 64
# Timed calls per candidate (after one untimed call each) before choosing by median, and the speed-up the packed
# kernel must show over F.linear. After EARLY timed calls each, a choice whose candidates' times do not overlap
# (every packed time beats every F.linear time by MARGIN, or none can) is made at once: a layer called once per
# forward (the LM head) then runs its slower candidate in 2 forwards instead of 5.
TRIALS = 5
EARLY = 2
MARGIN = 0.9
_DTYPES = (torch.float32, torch.bfloat16)
CANDIDATES = ("linear", "packed")
# A drafter's layers (``fast_linears(..., draft=...)``) also trial a weight-only int8 copy of the weight, for forwards
# of up to DRAFT_MAX_ROWS rows (what a draft step runs). Only for a drafter: the copy's values differ from the
# weight's (round to nearest per output row), which changes what the drafter proposes and never what is output
# (verification judges every draft; a sampled draft's q is the law it was drawn from, whichever kernel computed
# it). Why: a draft step of a few rows is memory-bound, and the copy is half the bytes of bf16. Measured on machine D
# (Intel Xeon, AVX-512 BF16 + AMX, 2026-11-28), drafters with every layer int8: pair G's eager step 23 ms against
# 31 in bf16, pair Q's 59 against 82.
# The packed copy is no candidate there: per-call trials rank it level with the int8 copy on the 4864-wide layers
# of pair Q's drafter, and keeping it there made the whole step slower, a cost its own timings do not see.
# Measured on machine D (2026-11-29, Qwen2.5-Coder-0.5B trimmed to 32k ids, bf16, median step of 30, 4 alternating
# runs): every layer int8 69 ms against 93 for the choices the three-way trials made (packed kept for 4864x896 and
# more) and 96 with every layer packed; 70 / 87 at 2 rows, 76 / 80 at 4 rows. Pair G's drafter: the trials kept
# int8 everywhere (33 ms, 44 packed).
# - "int8_bf16" (float32 layers only): the same int8 copy with the input rounded to bfloat16 (and its scales), the
#   product widened back to float32: the one form of torch's int8 kernel (``_weight_int8pack_mm``) that is
#   vectorised on CPUs without AVX-512. Measured on machine F (AMD EPYC Zen 2, AVX2 only, 2026-12-07, torch 2.13):
#   the kernel with float32 input read its int8 weights at ~2.2 GB/s (7x slower than float32 ``F.linear``, so the
#   float32 drafter never kept its copies there), with bfloat16 input at 20-28 GB/s; a float32 Gemma-3-270M body's
#   126 linears for one row took 10.8 ms this way against 28.9 ms in ``F.linear`` (4 rows: 14.6 against 52.4).
#   What it changes is what the int8 copy already changes: the drafts, never the output. bfloat16 layers' "int8"
#   already runs on bfloat16 input.
DRAFT_CANDIDATES = ("linear", "int8", "int8_bf16")
# The fast prefill: a drafter's layers, for forwards of more than MAX_ROWS rows (its prompt's prefill), also trial
# - "w8a8" (:func:`w8a8_linear`): the layer's int8 copy (the one its draft steps run) times the input quantized to
#   int8 per row (token), summed in int32 by torch's int8 GEMM (``torch._int_mm``), scaled back;
# - "float32" (bfloat16 layers; :func:`widened_linear`): the same weights widened to float32 (copied into a buffer
#   shared by every layer of the shape), their product rounded once to bfloat16.
# Why: a prefill is compute-bound, and on a CPU without AMX torch's bf16 GEMM runs below its float32 one, which
# runs below its int8 one. Measured on machine E (Intel Xeon model 207, AVX-512 BF16 + VNNI, no AMX, 2026-12-07,
# torch 2.13, scripts/bench_fast_prefill.py, docs/results/fast-prefill-machine-e-2026-12-07.md): the default
# drafters' prefills of 100 / 250 / 500 positions took 1.9-2.0x less time in w8a8 than in bf16 (pair G's
# Gemma-3-270M: 0.976 -> 0.493 s at 500) and 2.9-3.0x less (pair Q's Qwen2.5-0.5B: 2.803 -> 0.969 s), float32
# 1.2-1.4x less; in generate, pair Q's drafter prefills of a 3-prompt HumanEval job 3.05 -> 0.99 s (2.25x -> 2.48x
# same-kernel target-only). What it costs: the drafter's prompt cache is computed with int8 activations, so the
# drafts may differ a little (a whole pair Q drafter forward in w8a8 chose bf16's next token at 92.3% of 637 prompt
# positions; float32 at 99.1%), and tau did not move in those runs; never the output. Only a drafter's, and only
# where the trials time it faster.
PREFILL_CANDIDATES = ("linear", "float32", "w8a8")


def available() -> bool:
    """Whether this torch can pack weights for oneDNN (x86/Arm CPU builds with mkldnn)."""
    return bool(torch.backends.mkldnn.is_available()) and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


@dataclass(frozen=True)
class KernelKey:
    """What a kernel choice depends on (here and for the verify head)."""

    device: str
    dtype: str
    out_features: int
    in_features: int
    bias: bool
    rows: int  # the fast linears key by :func:`rows_bucket`; the verify head by the exact count
    threads: int
    draft: bool = False  # a drafter's layer with candidates of its own: the int8 copy (up to DRAFT_MAX_ROWS rows)
    # or the fast prefill's (past MAX_ROWS rows; ``_candidates``)


@dataclass
class KernelChoice:
    """Timed trials of every candidate kernel for one :class:`KernelKey`, and the kernel kept (None while
    trialling); ``"linear"`` (``F.linear``) is the original every speed-up is taken against."""

    key: KernelKey
    timings_ms: dict[str, list[float]] = field(default_factory=dict)  # empty: the fast linears' candidates for key
    chosen: str | None = None
    warmed: set[str] = field(default_factory=set)  # candidates whose first (untimed) call ran

    def __post_init__(self) -> None:
        if not self.timings_ms:
            self.timings_ms = {name: [] for name in _candidates(self.key.draft, self.key.rows, self.key.dtype)}
        if list(self.timings_ms) == ["linear"]:  # nothing to trial (no other candidate for this key)
            self.chosen = "linear"

    def median_ms(self, name: str) -> float:
        return statistics.median(self.timings_ms[name])

    @property
    def speedup(self) -> float:
        """``F.linear``'s median / the kept kernel's (1.0 while trialling or when ``F.linear`` is kept)."""
        return 1.0 if self.chosen is None else self.median_ms("linear") / self.median_ms(self.chosen)

    def next_candidate(self) -> str:
        """Round-robin over the candidates (the original, listed first, on ties)."""
        return min(self.timings_ms, key=lambda n: len(self.timings_ms[n]))

    def record(self, name: str, ms: float, trials: int, margin: float, early: int | None = None) -> None:
        """Add one timed call; once every candidate has ``trials``, keep the fastest other kernel by median if it
        beats ``F.linear`` by ``margin``, else ``F.linear``. With ``early``: once every candidate has ``early``
        timed calls, decide at once where the times do not overlap (the same answer the medians would give)."""
        self.timings_ms[name].append(ms)
        _count_trial()
        if self.chosen is not None:
            return
        counts = [len(t) for t in self.timings_ms.values()]
        if all(n >= trials for n in counts):
            best = min((n for n in self.timings_ms if n != "linear"), key=self.median_ms)
            keep = self.median_ms(best) < margin * self.median_ms("linear")
            self.chosen = best if keep else "linear"
        elif early is not None and all(n >= early for n in counts):
            linear = self.timings_ms["linear"]
            others = {n: t for n, t in self.timings_ms.items() if n != "linear"}
            best = min(others, key=self.median_ms)
            # early only where the times do not overlap: the best against F.linear (with the margin) and against
            # every other candidate (two close kernels wait for their full trials)
            if max(others[best]) < margin * min(linear) and all(
                    max(others[best]) < min(t) for n, t in others.items() if n != best):
                self.chosen = best
            elif all(min(t) >= margin * max(linear) for t in others.values()):
                self.chosen = "linear"


# Calls that ran a kernel trial (an untimed first call or a timed one) in this process, in either timed-kernel path
# (the fast linears, the verify head): whoever times its own work (the auto rule's measurements) skips a span in
# which this moved, since a trial runs the slower kernel.
_TRIALS_RUN = 0


def trials_run() -> int:
    """Kernel trial calls made in this process so far (fast linears and verify head)."""
    return _TRIALS_RUN


def _count_trial() -> None:
    global _TRIALS_RUN
    _TRIALS_RUN += 1


_CHOICES: dict[KernelKey, KernelChoice] = {}
# The per-call fast path: (dtype, out, in, bias, rows_bucket(rows), threads) -> the kernel chosen for that KernelKey (a plain
# tuple: building and hashing a KernelKey on every call of every layer cost more than some small layers' matmuls).
_DECIDED: dict[tuple, str] = {}
_LOCK = threading.Lock()
# module -> (weight storage pointer, weight version, packed weight or None: cannot pack); weak so a freed model frees its copies.
_PACKED: weakref.WeakKeyDictionary[nn.Linear, tuple[int, int, torch.Tensor | None]] = weakref.WeakKeyDictionary()
# a drafter's module -> (weight storage pointer, weight version, its int8 copy or None: no int8 kernel), the same way.
_INT8: weakref.WeakKeyDictionary[nn.Linear, tuple] = weakref.WeakKeyDictionary()


def choices() -> list[KernelChoice]:
    """Every choice made (or in trial) in this process."""
    with _LOCK:
        return list(_CHOICES.values())


def forget_choices() -> None:
    """Drop every kernel choice of this process (the next calls trial again)."""
    with _LOCK:
        _CHOICES.clear()
        _DECIDED.clear()


def release(model: nn.Module | None = None) -> None:
    """Drop the packed (and int8) copies of ``model``'s linear layers (of every model when None) to free their
    memory."""
    with _LOCK:
        _WIDE.clear()  # (buffers shared by every layer of a shape: dropped on any release)
        if model is None:
            _PACKED.clear()
            _INT8.clear()
            _NORMS.clear()
            _STACKED.clear()
            _NARROW.clear()
            return
        for module in model.modules():
            _PACKED.pop(module, None)
            _INT8.pop(module, None)
            _NARROW.pop(module, None)
            _NORMS.pop(module, None)
            _STACKED.pop(module, None)


def _packed(module: nn.Linear) -> torch.Tensor | None:
    weight = module.weight
    stamp = (weight.data_ptr(), version_of(weight))
    entry = _PACKED.get(module)
    if entry is not None and entry[:2] == stamp:
        return entry[2]
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    except RuntimeError:  # a dtype or CPU this oneDNN build cannot pack for: remembered, not retried every call
        packed = None
    _PACKED[module] = (*stamp, packed)
    return packed


def _int8(module: nn.Linear):
    """The module's weight-only int8 copy (``modeling.quantize_weight``: the one home of the quantization), made on
    first use and kept like the packed copy."""
    weight = module.weight
    stamp = (weight.data_ptr(), version_of(weight))
    entry = _INT8.get(module)
    if entry is not None and entry[:2] == stamp:
        return entry[2]
    copy = quantize_weight(weight, "int8")[0]  # (``fast_linears`` runs no draft forward without the int8 kernel)
    _INT8[module] = (*stamp, copy)
    return copy


# modules[0] of layers stacked by ``stacked_int8`` -> (the layers' int8 copies it was made of, (weight, scales))
_STACKED: weakref.WeakKeyDictionary[nn.Linear, tuple] = weakref.WeakKeyDictionary()


def decided_int8(module: nn.Linear, rows: int):
    """``module``'s int8 copy where the fast linears run it for forwards of ``rows`` rows: a drafter's layer (its
    forward is theirs) whose choice for that count is made and is the int8 copy ("int8", or "int8_bf16": then the
    copy's scales are its bfloat16 ones, which :func:`int8_linear` takes as the input's dtype); else None (the caller
    calls the module). For the drafter's lean forward (:mod:`hf_vocabspec.lean_forward`), which calls the kernel
    itself."""
    if not _is_draft(module):
        return None
    weight = module.weight
    if weight.dtype not in _DTYPES or torch.is_grad_enabled():
        return None
    name = _DECIDED.get(_fast_key(module, rows, True))
    if name == "int8":
        return _int8(module)
    if name == "int8_bf16":
        return _int8(module)._replace(scales=_narrow_scales(module))
    return None


def stacked_int8(modules: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor]:
    """One int8 copy of layers that take the same input (a drafter's q/k/v, gate/up): their copies' rows stacked
    (per-row quantization: the same values), so one kernel call computes all their outputs. The layers' own copies
    become views of it (no second copy of the memory); kept like them and released with them."""
    copies = [_int8(m) for m in modules]
    entry = _STACKED.get(modules[0])
    if entry is not None and len(entry[0]) == len(copies) and all(a is b for a, b in zip(entry[0], copies)):
        return entry[1]
    weight = torch.cat([c.weight for c in copies])
    scales = torch.cat([c.scales for c in copies])
    start, views = 0, []
    with _LOCK:
        for m, c in zip(modules, copies):
            n = c.weight.shape[0]
            view = c._replace(weight=weight[start : start + n], scales=scales[start : start + n])
            _INT8[m] = (*_INT8[m][:2], view)
            views.append(view)
            start += n
        _STACKED[modules[0]] = (views, (weight, scales))
    return weight, scales


def int8_linear(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (weight * scales).T (+ bias)`` through torch's int8 kernel, as :func:`packed_linear` runs an int8 copy.
    The kernel computes in ``scales``' dtype: where it is not ``x``'s ("int8_bf16": bfloat16 scales for a float32
    ``x``), ``x`` is rounded to it and the product widened back to ``x``'s dtype before the bias is added."""
    dtype = x.dtype
    flat = x.reshape(-1, x.shape[-1])
    y = torch.ops.aten._weight_int8pack_mm((flat if scales.dtype == dtype else flat.to(scales.dtype)).contiguous(),
                                           weight, scales)
    y = y.reshape(*x.shape[:-1], y.shape[-1])
    if y.dtype != dtype:
        y = y.to(dtype)
    return y if bias is None else y + bias


# a float32 drafter's module -> (its int8 copy's scales tensor, those scales in bfloat16): the "int8_bf16" kernel's
_NARROW: weakref.WeakKeyDictionary[nn.Linear, tuple] = weakref.WeakKeyDictionary()


def _narrow_scales(module: nn.Linear) -> torch.Tensor:
    """``module``'s int8 copy's scales in bfloat16 (made once per copy; the kernel takes its input's dtype)."""
    scales = _int8(module).scales
    entry = _NARROW.get(module)
    if entry is None or entry[0] is not scales:
        entry = _NARROW[module] = (scales, scales.to(torch.bfloat16))
    return entry[1]


def fused_norm_scale(module: nn.Module):
    """``(scale,)`` where ``module`` (a drafter's RMSNorm) runs fused, its first call having matched its own forward
    (``scale``: Gemma's float32 ``1 + weight``, None in Llama's style); None where it runs its own forward or is
    not the fast linears' (the caller calls the module). See :func:`fused_norm`."""
    if getattr(module.__dict__.get("forward"), "__func__", None) is not _norm_forward:
        return None
    entry = _NORMS.get(module)
    weight = module.weight
    if entry is None or entry[:2] != (weight.data_ptr(), version_of(weight)) or not entry[3]:
        return None
    return (entry[2],)


def _run(name: str, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if name == "packed":
        packed = _packed(module)
        if packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, packed, module.bias, "none", [], "")
    elif name == "int8":
        q = _int8(module)
        return int8_linear(x, q.weight, q.scales, module.bias)
    elif name == "int8_bf16":
        return int8_linear(x, _int8(module).weight, _narrow_scales(module), module.bias)
    elif name == "float32":
        return widened_linear(x, module.weight, module.bias)
    elif name == "w8a8":
        q = _int8(module)
        return w8a8_linear(x, q.weight, q.scales, module.bias)
    return F.linear(x, module.weight, module.bias)


# a drafter's layers whose fast_linears block said ``prefill=False`` (``use_fast_prefill`` off): F.linear past MAX_ROWS
_NO_PREFILL: weakref.WeakSet[nn.Linear] = weakref.WeakSet()


def _prefill_candidates(dtype: torch.dtype | str) -> tuple[str, ...]:
    """The fast prefill's candidates for a drafter's layer of ``dtype``: float32 widening only for bfloat16, w8a8
    where this torch has an int8 GEMM (``torch._int_mm``) that is not slower than its float32 one here
    (:func:`int8_gemm_pays`)."""
    dtype = str(dtype).removeprefix("torch.")
    return tuple(n for n in PREFILL_CANDIDATES
                 if n == "linear" or (n == "float32" and dtype == "bfloat16")
                 or (n == "w8a8" and int8_gemm_pays()))


# Whether w8a8 is worth a trial on this machine: measured once per process (None: not yet), by ``int8_gemm_pays``.
# Why: a trial runs each candidate three times per shape and prompt-length bucket, on the real prefill, and where
# torch's int8 GEMM has no vector path it costs 25-50x float32's. Measured on machine F (AMD EPYC Zen 2, AVX2, no
# VNNI, 2026-12-07): ``_int_mm`` took 129 ms for a 256 x 640 x 2048 product that ``F.linear`` did in 5 ms; pair G's
# drafter's w8a8 trial calls took 6-42 ms against 0.3-2 ms (128 rows), a few hundred ms per new bucket, and it never
# won. (In the 8-prompt job of scripts/bench_int8_copies.py the saving was within noise: 15.9 against 16.0 s.) On
# machine E (VNNI) it ran ~3x float32.
_INT8_GEMM_PAYS: bool | None = None


def int8_gemm_pays() -> bool:
    """Whether ``torch._int_mm`` on a 128 x 1024 x 1024 product takes no longer than ``F.linear`` in float32 on the
    same shape (median of 3 after one untimed call each, ~1-100 ms once per process); False without ``_int_mm``."""
    global _INT8_GEMM_PAYS
    if _INT8_GEMM_PAYS is None:
        if not hasattr(torch, "_int_mm"):
            _INT8_GEMM_PAYS = False
        else:
            with torch.no_grad():
                gen = torch.Generator().manual_seed(0)
                a = torch.randint(-127, 128, (128, 1024), dtype=torch.int8, generator=gen)
                b = torch.randint(-127, 128, (1024, 1024), dtype=torch.int8, generator=gen)
                x, w = a.float(), b.float()
                _INT8_GEMM_PAYS = (_median_seconds(lambda: torch._int_mm(a, b.t()))
                                   <= _median_seconds(lambda: F.linear(x, w)))
    return _INT8_GEMM_PAYS


# Whether a float32 layer's int8 copy runs faster on bfloat16 input (the "int8_bf16" form) than on its own float32
# input: measured once per process (None: not yet), by ``narrow_int8_pays``, for the compiled steps' copies
# (``compiled_int8_copies``), which cannot run the eager trials that choose between the two forms per layer. Why:
# torch's int8 kernel has a vector path for bfloat16 input on AVX2 and none for float32 there. Measured on machine F
# (AMD EPYC Zen 2, AVX2, 2026-12-08), pair G's float32 default drafter with compiled steps (``compile_draft_step``),
# 8 ShareGPT prompts x 48 tokens: 78.7 ms a compiled step on float32 input against 17.8 ms on bfloat16 input (eager
# steps: 21.8 ms).
_NARROW_INT8_PAYS: bool | None = None


def narrow_int8_pays() -> bool:
    """Whether torch's int8 kernel on a 1 x 2048 x 2048 float32 product takes longer than the same product on its
    input rounded to bfloat16 with bfloat16 scales, casts included (median of 3 after one untimed call each, ~1-10 ms
    once per process); False without the int8 kernel."""
    global _NARROW_INT8_PAYS
    if _NARROW_INT8_PAYS is None:
        if not quantization_ops_available("int8"):
            _NARROW_INT8_PAYS = False
        else:
            with torch.no_grad():
                gen = torch.Generator().manual_seed(0)
                weight = torch.randint(-127, 128, (2048, 2048), dtype=torch.int8, generator=gen)
                scales = torch.rand(2048, generator=gen) / 127
                x = torch.randn(1, 2048, generator=gen)
                narrow = scales.to(torch.bfloat16)
                _NARROW_INT8_PAYS = (_median_seconds(lambda: int8_linear(x, weight, narrow))
                                     < _median_seconds(lambda: int8_linear(x, weight, scales)))
    return _NARROW_INT8_PAYS


def _median_seconds(fn) -> float:
    """``fn``'s median time of 3 calls after one untimed call (the one-off probes)."""
    fn()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def native_bf16() -> bool:
    """True when the CPU computes bfloat16 natively (``avx512_bf16`` or ``amx_bf16`` in /proc/cpuinfo); elsewhere
    torch emulates bf16 arithmetic (slower than float32)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                return "avx512_bf16" in flags or "amx_bf16" in flags
    return False


def auto_drafter_dtype() -> torch.dtype:
    """The drafter dtype ``"auto"`` stands for (``hf-vocabspec trim --dtype auto``, the default): bfloat16 where a
    CUDA GPU with bf16 is present or the CPU computes bf16 natively (:func:`native_bf16`), else float32.

    Why: on a CPU without bf16 hardware a bfloat16 drafter's norms, attention and activations run emulated while its
    linears run the same int8 copies as a float32 drafter's ("int8_bf16"). Measured on machine F (AMD EPYC Zen 2,
    AVX2, 2026-12-07, pair G, 8 ShareGPT prompts, interleaved): draft step 26.2 ms float32 against 38.5 ms bfloat16,
    1.665x against 1.356x same-kernel target-only (docs/results/int8-bf16-machine-f-2026-12-07.md). Where bf16 is
    native, bfloat16 is the faster drafter and half the size."""
    cuda = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return torch.bfloat16 if cuda or native_bf16() else torch.float32


def w8a8_linear(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (weight * scales).T (+ bias)`` with ``x`` quantized to int8 per row (symmetric, its largest magnitude
    to 127), summed in int32 by torch's int8 GEMM and scaled back in float32, then ``x``'s dtype: a drafter's
    prefill (``PREFILL_CANDIDATES``). ``weight``: int8 (out, in), ``scales``: (out,) (an int8 copy)."""
    flat = x.reshape(-1, x.shape[-1]).float()
    step = flat.abs().amax(dim=1, keepdim=True).clamp_min_(torch.finfo(torch.float32).tiny).div_(127.0)
    sums = torch._int_mm(torch.round(flat / step).to(torch.int8), weight.t())
    y = sums.float().mul_(step).mul_(scales.float())
    if bias is not None:
        y = y.add_(bias.float())
    return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])


# (thread, weight shape) -> the float32 buffer widened_linear copies a weight into: one per shape, shared by every
# layer of it, reused from call to call (a new tensor per call would page in fresh memory every time)
_WIDE: dict[tuple[int, torch.Size], torch.Tensor] = {}


def widened_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed in float32 (``x``, ``weight`` and ``bias`` widened, exactly), its
    result rounded to ``x``'s dtype: a drafter's prefill on CPUs whose bf16 GEMM is slower (``PREFILL_CANDIDATES``)."""
    key = (threading.get_ident(), weight.shape)
    wide = _WIDE.get(key)
    if wide is None:
        with torch.inference_mode(False):  # (a normal tensor: written in place in and out of inference mode)
            wide = _WIDE[key] = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
    wide.copy_(weight)
    return F.linear(x.float(), wide, None if bias is None else bias.float()).to(x.dtype)


# A drafter's RMSNorms (``fast_linears(..., draft=...)``) run torch's ``F.rms_norm`` in place of their module's eight
# to ten small ops. Why: an eager draft step is dispatch-bound beyond its linears; a Gemma-3-270M step runs 109
# norms. Measured on machine D's kind (2026-12-03, pair G default drafter, bf16, 24 ShareGPT prompts x 48 tokens,
# interleaved; scripts/bench_fused_norms.py): 42.4 -> 41.2 ms a draft step (median), 1.43x -> 1.48x same-run
# target-only, every output identical. The class's own arithmetic is kept (float32 normalisation; Gemma's
# ``1 + weight`` in float32 before the cast, Llama's weight after it), and each module's first call computes both
# and keeps the fused one only where they are bitwise equal (else the module's own forward, from then on): what the
# drafter computes is unchanged. Never a target's norms (``models``).
_NORM_STYLES = {"GemmaRMSNorm": "one_plus", "Gemma2RMSNorm": "one_plus", "Gemma3RMSNorm": "one_plus",
                "LlamaRMSNorm": "weight_after", "MistralRMSNorm": "weight_after", "Qwen2RMSNorm": "weight_after",
                "Qwen3RMSNorm": "weight_after", "SmolLM3RMSNorm": "weight_after"}
# module -> (weight storage pointer, weight version, float32 scale (Gemma's 1 + weight) or None, fused equal to own)
_NORMS: weakref.WeakKeyDictionary[nn.Module, tuple] = weakref.WeakKeyDictionary()


def _eligible_norm(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (type(module).__name__ in _NORM_STYLES and "forward" not in module.__dict__
            and isinstance(weight, torch.Tensor) and weight.dim() == 1 and weight.device.type == "cpu")


def fused_norm(module: nn.Module, x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """What ``module(x)`` runs where :func:`fused_norm_scale` gave ``(scale,)``: torch's ``F.rms_norm`` with the
    class's own arithmetic (see above)."""
    if scale is not None:  # Gemma: (x_hat * (1 + weight)) in float32, then x's dtype
        return F.rms_norm(x.float(), (x.shape[-1],), scale, module.eps).type_as(x)
    return module.weight * F.rms_norm(x.float(), (x.shape[-1],), None, module.variance_epsilon).to(x.dtype)


def _norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    stamp = (weight.data_ptr(), version_of(weight))
    entry = _NORMS.get(self)
    if entry is not None and entry[:2] == stamp:
        if not entry[3]:
            return type(self).forward(self, x)
        return fused_norm(self, x, entry[2])
    scale = (1.0 + weight.detach().float()) if _NORM_STYLES[type(self).__name__] == "one_plus" else None
    own = type(self).forward(self, x)
    _NORMS[self] = (*stamp, scale, torch.equal(own, fused_norm(self, x, scale)))
    return own


def fused_norms() -> tuple[int, int]:
    """(modules whose fused norm matched their own forward and runs, modules that kept their own forward)."""
    kept = sum(bool(e[3]) for e in _NORMS.values())
    return kept, len(_NORMS) - kept


# Row counts up to this are keyed as they are; longer forwards share a choice per power of two.
EXACT_ROWS = 16
# A drafter's layers trial their int8 copy (``DRAFT_CANDIDATES``) for forwards of up to this many rows: a batch's draft
# step runs B rows times the one or two tokens each row feeds (4 rows x 2 at batch 4). Up to 2026-12-07 it was
# QUANTIZED_MAX_ROWS (4, a quantized drafter's own kernel limit, untimed), so a batch-4 round's first draft step (8
# rows) ran the float32 weights: pair G on machine F (AVX2), int8_bf16 0.13 ms against F.linear's 0.38 for a 1024x640
# layer at 4 rows; its batch-4 draft step averaged 38 ms against 26 at batch 1, 7.3 ms of it the packed float32
# kernel of those 8-row steps. The trials keep F.linear where it is faster.
DRAFT_MAX_ROWS = EXACT_ROWS


def rows_bucket(rows: int) -> int:
    """The row count a choice is keyed by: the count itself up to ``EXACT_ROWS`` (decode, a verify of L + 1
    positions), then the next power of two (17-32, 33-64). Why exact: a choice shared by several counts was trialled
    on whichever came first, and kernels do not rank the same across counts. Measured on machine D (Intel Xeon,
    AVX-512 BF16 + AMX, 2026-11-29, fp32 Qwen2.5-Coder-1.5B in the model): ``F.linear`` won the trial on 3 rows but
    cost about twice as much on 4 rows as on 3, so a 3-4 bucket trialled on 3 rows ran every
    4-row verify at 1.8x a decode step (491 ms; 296 ms keyed by the exact count). A new count costs one forward of
    trials (every layer of a shape shares its key), paid once per process."""
    return rows if rows <= EXACT_ROWS else 1 << (rows - 1).bit_length()


def _fast_key(module: nn.Linear, rows: int, draft: bool = False) -> tuple:
    """The per-call key of ``_DECIDED``: (dtype, out, in, bias, rows_bucket(rows), threads, draft) where ``draft``
    says a drafter's own candidates apply (a drafter's layer: the int8 copy for a forward of at most
    DRAFT_MAX_ROWS rows, the fast prefill's for one of more than MAX_ROWS)."""
    weight = module.weight
    return (weight.dtype, weight.shape[0], weight.shape[1], module.bias is not None, rows_bucket(rows),
            torch.get_num_threads(), draft and (rows <= DRAFT_MAX_ROWS or rows > MAX_ROWS))


def _draft_candidates(dtype: torch.dtype | str) -> tuple[str, ...]:
    """A drafter's layer's candidates for a draft step's rows: "int8_bf16" only for float32 layers (a bfloat16
    layer's "int8" is that kernel already)."""
    dtype = str(dtype).removeprefix("torch.")
    return tuple(n for n in DRAFT_CANDIDATES if n != "int8_bf16" or dtype == "float32")


def _candidates(draft: bool, rows: int, dtype: torch.dtype | str) -> tuple[str, ...]:
    """The kernels a key trials, from its ``draft`` field, rows and dtype (``_fast_key``'s rule, ``KernelKey``)."""
    if not draft:
        return CANDIDATES
    return _prefill_candidates(dtype) if rows > MAX_ROWS else _draft_candidates(dtype)


def _kernel_key(fast: tuple) -> KernelKey:
    """The :class:`KernelKey` of a ``_fast_key`` tuple."""
    return KernelKey("cpu", str(fast[0]).removeprefix("torch."), *fast[1:])


def _choice(module: nn.Linear, rows: int) -> KernelChoice | None:
    return _CHOICES.get(_kernel_key(_fast_key(module, rows, _is_draft(module))))


def _is_draft(module: nn.Linear) -> bool:
    return getattr(module.__dict__.get("forward"), "__func__", None) is _draft_forward


def settle_choices(model: nn.Module, rows: Iterable[int], *, max_forwards: int | None = None, draft: bool = False,
                   int8: bool = True) -> int:
    """Make the kernel choices of ``model``'s linear layers for every count in ``rows`` now, with forwards of that
    many positions (outputs discarded; at most ``max_forwards`` per count, by default enough for a layer called once
    per forward, the LM head, to try every candidate ``TRIALS`` times), so that later calls run their steady
    kernels. For benchmarks: a count's trials run its slower kernel a few times, once per process, and in a short
    timed run those calls would show (one forward of a count usually decides every layer of it: layers of a shape
    share a key). ``draft`` (a drafter; ``int8`` as its ``use_int8_copies``): its layers' choices as a generate call
    makes them, int8 copies among the candidates. Returns the forwards run."""
    vocab = model.get_input_embeddings().weight.shape[0]
    runs = 0
    with torch.no_grad(), (fast_linears(draft=(model,), int8=int8) if draft else fast_linears(model)):
        # the layers this block (or one around it) runs through the fast linears; none where the copies do not fit
        layers = [m for m in model.modules()
                  if type(m) is nn.Linear and getattr(m.__dict__.get("forward"), "__func__", None) in _FORWARDS]
        touched = False
        for count in rows:
            ids = torch.arange(count, device=model.device)[None] % vocab
            left = [m for m in layers if getattr(_choice(m, count), "chosen", None) is None]
            if left and not touched:  # first a forward the fast linears leave to F.linear (more than MAX_ROWS
                # positions, as a prompt's prefill): every weight is read once before any trial times it. Loaded
                # weights may be pages of the checkpoint not yet read (safetensors maps the file): measured on
                # machine D (2026-11-29, fp32 Qwen2.5-Coder-1.5B), trials without it timed F.linear's first reads
                # (8960x1536: 3.3 against 2.1 ms) and kept the packed kernel for decode, 7% slower there.
                model(input_ids=torch.arange(MAX_ROWS + 1, device=model.device)[None] % vocab, use_cache=False)
                runs, touched = runs + 1, True
            most = max((len(_candidates(_fast_key(m, count, _is_draft(m))[-1], count, m.weight.dtype)) for m in left),
                       default=0)
            for _ in range((max_forwards or most * (TRIALS + 1)) if left else 0):
                model(input_ids=ids, use_cache=False)
                runs += 1
                # (a layer that a forward of ``count`` positions does not reach has no trial: not waited for)
                left = [m for m in left if (c := _choice(m, count)) is not None and c.chosen is None]
                if not left:
                    break
    return runs


def packed_linear(module: nn.Linear, x: torch.Tensor, draft: bool = False) -> torch.Tensor:
    """``module(x)`` with the kernel measured fastest for its key (trials while undecided); ``draft`` (a drafter's
    layer): the int8 copy is a candidate too, for forwards of up to DRAFT_MAX_ROWS rows."""
    weight = module.weight
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if (
        not (1 <= rows <= MAX_ROWS or (draft and rows > MAX_ROWS and module not in _NO_PREFILL
                                       and len(_prefill_candidates(weight.dtype)) > 1))
        or x.device.type != "cpu" or x.dtype != weight.dtype or weight.dtype not in _DTYPES
        or (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
    ):
        return F.linear(x, weight, module.bias)
    fast = _fast_key(module, rows, draft)
    name = _DECIDED.get(fast)
    if name is not None:
        return _run(name, module, x)
    key = _kernel_key(fast)
    choice = _CHOICES.get(key)
    if choice is not None and choice.chosen is not None:
        _DECIDED[fast] = choice.chosen
        return _run(choice.chosen, module, x)
    with _LOCK:
        choice = _CHOICES.setdefault(key, KernelChoice(key))
        name = choice.next_candidate()
        warm = name in choice.warmed
        choice.warmed.add(name)
        if name == "packed":
            _packed(module)  # packing is a one-off per module: not part of the kernel's time
        elif name in ("int8", "w8a8"):
            _int8(module)
        elif name == "int8_bf16":
            _narrow_scales(module)
    start = time.perf_counter()
    out = _run(name, module, x)
    elapsed = (time.perf_counter() - start) * 1e3
    if not warm:  # a kernel's first call for a shape builds its primitive (oneDNN JIT): not its steady cost
        _count_trial()
        return out
    with _LOCK:
        choice.record(name, elapsed, TRIALS, MARGIN, EARLY)
    return out


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return packed_linear(self, x)


def _draft_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return packed_linear(self, x, True)


_FORWARDS = (_forward, _draft_forward)


def _eligible(module: nn.Module) -> bool:
    # Exactly nn.Linear: subclasses (quantised layers) have other weight semantics; an instance-level forward
    # means someone (accelerate offload hooks, the verify head) already wraps it.
    return (type(module) is nn.Linear and "forward" not in module.__dict__ and module.weight.device.type == "cpu"
            and module.weight.dtype in _DTYPES)


# Packed copies may take at most this share of the memory the OS reports available (they double the weights).
MEMORY_SHARE = 0.5


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass
class FastLinears:
    """What a :func:`fast_linears` block did: layers swapped, how many of them are a drafter's (the int8 copy among
    their candidates), and why the others (or all) run ``F.linear`` ("" when none is left out; stats and benches
    report it)."""

    layers: int = 0
    reason: str = ""
    draft_layers: int = 0
    compiled_int8_layers: int = 0  # the drafter body's layers its compiled steps run on int8 copies (compiled_int8_copies)
    draft_norms: int = 0  # the drafter's RMSNorms run through F.rms_norm (_norm_forward)
    lean_forward: bool = False  # the drafter's body runs hf_vocabspec.lean_forward (where checked equal)
    fast_prefill: bool = False  # some of the drafter's layers trial PREFILL_CANDIDATES past MAX_ROWS rows

    def __str__(self) -> str:
        lean = "; the drafter's body through the lean forward" if self.lean_forward else ""
        if not self.layers:
            return f"F.linear ({self.reason})" + lean
        draft = (f", the drafter's {self.draft_layers} with int8 copies as candidates"
                 + (" (w8a8 / float32 for prefills)" if self.fast_prefill else "") if self.draft_layers else "")
        traced = (f"; the drafter's compiled steps on int8 copies of {self.compiled_int8_layers} layers"
                  if self.compiled_int8_layers else "")
        norms = f"; the drafter's {self.draft_norms} RMSNorms fused where bitwise equal" if self.draft_norms else ""
        return (f"fast linears on {self.layers} layers{draft}"
                + (f" (the rest F.linear: {self.reason})" if self.reason else "") + traced + norms + lean)


def _copy_bytes(module: nn.Linear, draft: bool) -> int:
    """Memory the copies not yet made of ``module`` will take: packed (the weight's size), int8 (a byte a value)."""
    weight = module.weight
    more = 0 if module in _PACKED else weight.numel() * weight.element_size()
    return more + (_int8_bytes(module) if draft else 0)


def _int8_bytes(module: nn.Linear) -> int:
    """Memory ``module``'s int8 copy will take if not yet made (a byte a value)."""
    return 0 if module in _INT8 else module.weight.numel()


@contextmanager
def fast_linears(*models: nn.Module, enabled: bool = True, draft: Iterable[nn.Module] = (),
                 int8: bool = True, norms: bool = True, prefill: bool = True) -> Iterator[FastLinears]:
    """Within the block, every eligible ``nn.Linear`` of ``models`` runs :func:`packed_linear`; restored on exit
    (also on errors). Yields a :class:`FastLinears` report. Nothing is swapped when disabled or when this torch has
    no oneDNN; a model whose copies not yet made would take the ones before it past ``MEMORY_SHARE`` of available
    memory keeps ``F.linear`` (whole models, in the order given; the report says so).

    ``draft``: the drafter's modules (also swapped, after ``models``; a layer already listed in ``models`` stays
    theirs). With ``int8`` (a drafter's ``use_int8_copies``), their forwards of up to DRAFT_MAX_ROWS rows also
    trial a weight-only int8 copy (``DRAFT_CANDIDATES``), which changes what the drafter proposes, never what is
    output; with ``prefill`` too (a drafter's ``use_fast_prefill``), their forwards of more than MAX_ROWS rows trial
    the fast prefill's kernels (``PREFILL_CANDIDATES``), which change what the drafter proposes, never the output.
    With ``norms`` (a drafter's ``use_fused_norms``) the drafter's RMSNorms run ``F.rms_norm`` (``_NORM_STYLES``:
    bitwise their own result, checked per module). Never pass a target as ``draft``."""
    swapped: list[tuple[nn.Linear, bool]] = []
    draft_norms: list[nn.Module] = []
    report = FastLinears(reason="" if enabled else "off")
    int8 = int8 and quantization_ops_available("int8")
    if enabled and not available():
        report.reason = "this torch build has no oneDNN packed kernels"
    elif enabled:
        seen: set[int] = set()
        per_model: list[list[tuple[nn.Linear, bool]]] = []
        for i, (model, is_draft) in enumerate([*((m, False) for m in models), *((m, int8) for m in draft)]):
            per_model.append([])
            for module in model.modules():
                if id(module) in seen:
                    continue
                if _eligible(module):
                    seen.add(id(module))
                    per_model[-1].append((module, is_draft))
                elif _eligible_norm(module):  # a drafter's RMSNorm; a target's (``models``) is only marked seen
                    seen.add(id(module))
                    if i >= len(models) and norms:
                        draft_norms.append(module)
        # whole models in the order given (a generate call passes the target first: its verify of several rows is
        # where packing pays most) while their copies not yet made fit in MEMORY_SHARE of available memory
        free, new_bytes, left_out = _available_bytes(), 0, 0
        for layers in per_model:
            more = sum(_copy_bytes(m, d) for m, d in layers)
            if free is not None and new_bytes + more > MEMORY_SHARE * free:
                left_out += more
                continue
            new_bytes += more
            swapped += layers
        if left_out:
            report.reason = (f"copies of {left_out / 2**30:.1f} GiB more would not fit in "
                             f"{MEMORY_SHARE:.0%} of {free / 2**30:.1f} GiB available: hf_vocabspec.kernels.release() "
                             f"frees earlier ones")
        elif not swapped:
            report.reason = "no float32/bfloat16 nn.Linear on CPU"
    report.layers = len(swapped)
    report.draft_layers = sum(d for _, d in swapped)
    report.fast_prefill = prefill and any(d and len(_prefill_candidates(m.weight.dtype)) > 1 for m, d in swapped)
    draft_norms = draft_norms if swapped else []  # the drafter's RMSNorms run fused wherever linears are swapped
    report.draft_norms = len(draft_norms)
    with ExitStack() as stack:
        for module, is_draft in swapped:
            module.forward = (_draft_forward if is_draft else _forward).__get__(module, nn.Linear)
            stack.callback(module.__dict__.pop, "forward", None)
            if is_draft and not prefill:
                _NO_PREFILL.add(module)
                stack.callback(_NO_PREFILL.discard, module)
        for module in draft_norms:
            module.forward = _norm_forward.__get__(module, type(module))
            stack.callback(module.__dict__.pop, "forward", None)
        yield report


@contextmanager
def compiled_int8_copies(model: nn.Module | None, enabled: bool = True) -> Iterator[int]:
    """Within the block, every eligible ``nn.Linear`` of ``model`` (a drafter's body whose steps run compiled,
    ``compile_draft_step``) runs its weight-only int8 copy for forwards of up to QUANTIZED_MAX_ROWS rows through the
    forward a ``quantize_weights("int8")`` drafter's layers run (``modeling.serve_quantized``), which torch.compile
    traces into the step's graph; restored on exit. Yields the layers so served (0: disabled,
    no int8 kernel in this torch, or copies that would not fit in MEMORY_SHARE of available memory).

    Why: the eager fast linears choose per layer by timed trials, which a compiled graph cannot run; what the
    compiler traces is otherwise ``F.linear`` on the bf16 weights, and then the compiled step was slower than the
    eager one with its int8 copies (pair G on machine D, 2026-12-02: 24.1 against 21.3 ms per drafted token). With
    the copies traced the step reads half the bytes with its small ops fused, as a ``quantize_weights("int8")``
    drafter's compiled step does (14.4 ms there). Every layer takes the copy: the eager trials kept it on every
    layer of pair G's drafter, and on pair Q's every layer int8 beat the trials' own mix (``DRAFT_CANDIDATES``). A
    float32 layer's copy runs on bfloat16 input (the "int8_bf16" form) where :func:`narrow_int8_pays`.
    Like the eager copies it changes what the drafter proposes, never the output, and leaves the weights as they
    are."""
    layers = []
    if enabled and model is not None and quantization_ops_available("int8"):
        layers = [m for m in model.modules() if _eligible(m)]
        free = _available_bytes()
        if free is not None and sum(map(_int8_bytes, layers)) > MEMORY_SHARE * free:
            layers = []
    with ExitStack() as stack:
        for module in layers:
            copy = _int8(module)
            if copy.scales.dtype == torch.float32 and narrow_int8_pays():  # the "int8_bf16" form (see above)
                copy = copy._replace(scales=_narrow_scales(module))
            serve_quantized(module, copy)  # the forward of quantize_weights("int8") drafters' layers
            stack.callback(serve_quantized, module, None)
        yield len(layers)


def wants_fast_linears(assistant) -> bool:
    """A generate call with one of our drafters runs the target's and drafter's linear layers through
    :func:`fast_linears` unless the drafter (or SSD session) says ``use_fast_linears = False``."""
    return bool(getattr(assistant, "use_fast_linears", True))


def wants_fused_norms(assistant) -> bool:
    """Whether the drafter's RMSNorms run fused in the fast linears (``norms=``): unless the drafter (or SSD session)
    says ``use_fused_norms = False``."""
    return bool(getattr(assistant, "use_fused_norms", True))


def wants_fast_prefill(assistant) -> bool:
    """Whether the drafter's layers may also trial the fast prefill's kernels for forwards of more than MAX_ROWS
    rows (``prefill=``, ``PREFILL_CANDIDATES``): unless the drafter (or SSD session) says ``use_fast_prefill =
    False``; a drafter's own candidates need its int8 copies on (``use_int8_copies``)."""
    return bool(getattr(assistant, "use_fast_prefill", True))


def wants_int8_copies(assistant) -> bool:
    """Whether the drafter's layers may also trial their int8 copies in the fast linears (``int8=``): unless the
    drafter (or SSD session) says ``use_int8_copies = False``."""
    return bool(getattr(assistant, "use_int8_copies", True))
