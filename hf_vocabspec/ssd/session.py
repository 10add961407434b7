"""The SSD session: what users pass as ``assistant_model=``; it picks the candidate generator of every call.

    from hf_vocabspec.ssd import SSDConfig, SSDSession
    with SSDSession(drafter, SSDConfig(fan_out=3)) as ssd:
        out = target.generate(**inputs, assistant_model=ssd)

Per call: ordinary drafting once an earlier call measured that SSD cannot pay (or the worker failed), else the
worker's generator (``mode="worker"``), else the inline one. A call whose logits processors the worker cannot
rebuild (a custom ``logits_processor=``) runs inline, with one warning saying why. SSD drafts one sequence:
a batch of several is refused.
"""

from __future__ import annotations

import dataclasses
import warnings

from ..generation import TrimmedCandidateGenerator
from ..modeling import TrimmedDrafter
from .config import SSDConfig, SSDStats, fix_draft_length
from .generator import SSDCandidateGenerator
from .processors import PromptFacts, unrebuildable


class SSDSession:
    """Pass it as ``assistant_model=``; ``close()`` (or leaving the ``with`` block) stops the worker.

    ``ssd_config`` holds the SSD settings. ``config``, ``generation_config`` and ``device`` are the DRAFTER's
    (transformers reads them from any assistant: the model config must show the target's vocabulary).
    """

    def __init__(self, drafter: TrimmedDrafter, ssd_config: SSDConfig | None = None):
        if not isinstance(drafter, TrimmedDrafter):
            raise TypeError(f"SSDSession needs a TrimmedDrafter (hf_vocabspec.trim_drafter); got {type(drafter).__name__}.")
        if ssd_config is not None and not isinstance(ssd_config, SSDConfig):
            raise TypeError(f"SSDSession takes an hf_vocabspec.ssd.SSDConfig; got {type(ssd_config).__name__}.")
        if ssd_config is not None and ssd_config.mode == "sync" and ssd_config.device is not None:
            raise ValueError(f"SSDConfig.device={ssd_config.device!r} and mode='sync' contradict: device places the "
                             "worker's drafter, and sync drafts in this process on the drafter's own device; use "
                             "mode='worker', or drop device and move the drafter (drafter.to(device)).")
        self.drafter = drafter
        self.ssd_config = ssd_config or SSDConfig()
        self.last_stats: SSDStats | None = None
        self.fallback_reason: str | None = None  # set once a call fell back: later calls draft ordinarily
        self.closed = False
        self.worker = None
        if self.ssd_config.mode == "worker":
            from .worker import DraftWorker

            self.worker = DraftWorker(drafter, self.ssd_config)

    @property
    def config(self):
        """The drafter's model config (what transformers checks on an assistant), not the SSD settings."""
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
            raise RuntimeError("This SSD session is closed: open a new one, hf_vocabspec.ssd.SSDSession(drafter, config).")
        if input_ids.shape[0] != 1:
            raise ValueError(f"SSD drafts one sequence at a time; got a batch of {input_ids.shape[0]}: call generate() "
                             "per prompt, or pass the drafter itself as assistant_model for ordinary drafting.")
        args = (input_ids, self.drafter, generation_config, model_kwargs, inputs_tensor, logits_processor,
                target_vocab_size)
        if self.last_stats is not None and self.last_stats.fell_back and self.fallback_reason is None:
            self.fallback_reason = self.last_stats.fallback_reason
        worker_failure = None if self.worker is None else self.worker.failure
        if worker_failure is not None or (self.fallback_reason is not None and self.ssd_config.fallback):
            # Measured earlier that SSD cannot pay here (re-probing every call would pay the probe rounds again),
            # or the worker was lost: draft ordinarily from the first round.
            gen = TrimmedCandidateGenerator(*args)
            fix_draft_length(gen, self.ssd_config)
            why = f"the SSD drafter worker stopped ({worker_failure})" if worker_failure else self.fallback_reason
            gen.stats = SSDStats(mode=self.ssd_config.mode, fell_back=True,
                                 fallback_reason=f"an earlier call of this session fell back ({why})")
            self.drafter.last_speculation_stats = gen.stats
        elif self.worker is not None and (why := unrebuildable(logits_processor, generation_config,
                                                                PromptFacts.of(input_ids, model_kwargs))) is None:
            from .worker import WorkerCandidateGenerator

            gen = WorkerCandidateGenerator(*args, ssd_config=self.ssd_config, worker=self.worker)
        else:
            if self.worker is not None:
                warnings.warn(f"hf_vocabspec: SSD runs this call synchronously in this process: {why}.", stacklevel=5)
            gen = SSDCandidateGenerator(*args, ssd_config=dataclasses.replace(self.ssd_config, mode="sync"))
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
