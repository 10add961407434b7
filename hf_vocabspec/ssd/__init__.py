"""SSD, speculative speculative decoding (Kumar et al., 2026): pre-draft the likely next rounds while the
target verifies. ``core`` holds the config, the speculation cache/tree generator, the cost model and the
fallback rule; ``worker`` runs the drafter in its own process; this module ties them into the session
object ``drafter.with_ssd(SSDConfig(...))`` returns (design and measurements: docs/ssd.md)."""

from __future__ import annotations

from ..drafter import TrimmedDrafter
from ..generation import TrimmedCandidateGenerator
from .core import (  # noqa: F401 (public names)
    SSDCandidateGenerator,
    SSDConfig,
    SSDProjection,
    SSDStats,
    project_from_stats,
    project_speedup,
    should_fall_back,
)

__all__ = ["SSDCandidateGenerator", "SSDConfig", "SSDProjection", "SSDSession", "SSDStats", "project_from_stats",
           "project_speedup", "should_fall_back"]


class SSDSession:
    """What ``drafter.with_ssd(config)`` returns: pass it as ``assistant_model=``; ``close()`` (or leaving
    the ``with`` block) stops the worker. ``config``/``generation_config``/``device`` are the drafter's,
    so transformers' assistant checks see a drafter with the target's vocabulary."""

    def __init__(self, drafter: TrimmedDrafter, config: SSDConfig | None = None):
        if not isinstance(drafter, TrimmedDrafter):
            raise TypeError(f"with_ssd needs a TrimmedDrafter; got {type(drafter).__name__}.")
        if config is not None and not isinstance(config, SSDConfig):
            raise TypeError(f"with_ssd takes an hf_vocabspec.ssd.SSDConfig; got {type(config).__name__}.")
        self.drafter = drafter
        self.ssd_config = config or SSDConfig()
        self.last_stats: SSDStats | None = None
        self.fallback_reason: str | None = None  # set once a call fell back: later calls draft ordinarily
        self.closed = False
        self.worker = None
        if self.ssd_config.mode == "worker":
            from .worker import DraftWorker

            self.worker = DraftWorker(drafter, self.ssd_config)

    @property
    def config(self):
        return self.drafter.config

    @property
    def generation_config(self):
        return self.drafter.generation_config

    @property
    def device(self):
        return self.drafter.device

    def _hf_vocabspec_candidate_generator(self, *, input_ids, generation_config, model_kwargs, inputs_tensor=None,
                                          logits_processor=None, target_vocab_size=None, **_unused):
        """Factory called by hf_vocabspec.generation's routing of ``assistant_model=``."""
        if self.closed:
            raise RuntimeError("This SSD session is closed: create a new one with drafter.with_ssd(config).")
        if self.last_stats is not None and self.last_stats.fell_back and self.fallback_reason is None:
            self.fallback_reason = self.last_stats.fallback_reason
        if self.fallback_reason is not None and self.ssd_config.fallback:
            # An earlier call measured that SSD cannot pay with this drafter on this machine: draft ordinarily from
            # the first round (re-probing every call would pay the probe rounds again each time).
            gen = TrimmedCandidateGenerator(input_ids, self.drafter, generation_config, model_kwargs, inputs_tensor,
                                            logits_processor, target_vocab_size)
            if self.ssd_config.num_assistant_tokens is not None:
                gen.num_assistant_tokens = self.ssd_config.num_assistant_tokens
            gen.stats = SSDStats(mode=self.ssd_config.mode, fell_back=True,
                                 fallback_reason=f"an earlier call of this session fell back ({self.fallback_reason})")
            self.drafter.last_speculation_stats = gen.stats
            self.last_stats = gen.stats
            return gen
        if self.worker is not None:
            from .worker import WorkerCandidateGenerator

            gen = WorkerCandidateGenerator(input_ids, self.drafter, generation_config, model_kwargs, inputs_tensor,
                                           logits_processor, target_vocab_size, ssd_config=self.ssd_config,
                                           worker=self.worker)
        else:
            gen = SSDCandidateGenerator(input_ids, self.drafter, generation_config, model_kwargs, inputs_tensor,
                                        logits_processor, target_vocab_size, ssd_config=self.ssd_config)
        self.last_stats = gen.stats
        return gen

    def close(self) -> None:
        """Stop the worker (idempotent)."""
        self.closed = True
        if self.worker is not None:
            self.worker.close()
            self.worker = None

    def __enter__(self) -> SSDSession:  # noqa: PYI034 - final in practice
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass
