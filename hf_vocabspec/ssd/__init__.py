"""SSD, speculative speculative decoding (Kumar et al., 2026): pre-draft the likely next rounds while the
target verifies (design and measurements: docs/ssd.md).

    from hf_vocabspec.ssd import SSDConfig, SSDSession
    with SSDSession(drafter, SSDConfig(fan_out=3, saguaro_scale=0.5)) as ssd:
        out = target.generate(**inputs, assistant_model=ssd)

One idea per module: ``config`` (settings, counters, the draft length), ``outcomes`` (outcome prediction),
``cache`` (the speculation cache), ``saguaro`` (Saguaro sampling), ``generator`` (tree drafting inside HF's
loop), ``fallback`` (when SSD falls back to ordinary drafting; the round-time model itself is
hf_vocabspec.cost's: ``RoundModel.ssd_round_seconds``, ``project_ssd_speedup``), ``session`` (what ``assistant_model=`` gets),
``processors``/``protocol``/``worker`` (the drafter in its own process).
"""

from __future__ import annotations

from ..cost import SSDProjection, project_ssd_speedup
from .config import SSDConfig, SSDStats
from .generator import SSDCandidateGenerator
from .fallback import should_fall_back, worker_fallback_reason
from .protocol import PROTOCOL_VERSION, SSDWorkerError
from .session import SSDSession

__all__ = ["PROTOCOL_VERSION", "SSDCandidateGenerator", "SSDConfig", "SSDProjection", "SSDSession", "SSDStats",
           "SSDWorkerError", "project_ssd_speedup", "should_fall_back", "worker_fallback_reason"]
