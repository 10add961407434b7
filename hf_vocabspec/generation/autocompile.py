"""``drafter.compile_draft_step = "auto"``: when to compile a drafter's steps (opt-in; a new trim's setting is False).

Compiled draft steps (``torch.compile`` on a static cache of the drafter's own, :meth:`DraftStep.compile`) run
about twice as fast as eager ones on a CPU with the int8 copies traced (pair G, machine D, 2026-12-03: 26 against
46 ms a step), but their compiles cost minutes on a 2-core CPU (one graph per fed width and cache bucket: 55 s with
Inductor's cache warm, 160 s cold). A short job never earns that back, a long one (an lm-eval run, a benchmark of
many prompts) does. The rule is the ski-rental one: run eager until the drafter's eager steps have cost
``AUTO_COMPILE_AFTER_SECONDS`` (what the compiles are expected to cost), then compile; so a job pays at most about
twice what the better choice in hindsight would have.

After compiling, the rule checks that it paid: once compiled calls that compiled nothing have run
``CHECK_STEPS`` steps, a compiled step slower than the eager ones puts the drafter back on eager steps for good, and
a compile that fails (no C++ compiler for Inductor, an op it cannot trace) does so at once, with one warning: the
call that failed finishes with eager steps. Either way the output is the target's (both paths are exact); only the
speed is at stake. ``True`` compiles from the first call, ``False`` never.

Why it is not the default (measured, ``scripts/bench_auto_compile.py --prompts 100``, pair G, machine D's kind,
2026-12-03): over 100 ShareGPT prompts x 48 tokens the eager default drafter gave 1.65x same-kernel target-only and
"auto" 1.33x. It compiled after 55 prompts (61 s of eager steps), and every new cache bucket (256/512/1024 columns)
and fed width then cost a graph of ~30 s, more than the 22 ms a step (54 -> 32) won back in the 45 prompts left. A
rule per bucket (compile a bucket once its own eager steps have cost its measured compile) is the next step.
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass

AUTO = "auto"

AUTO_COMPILE_AFTER_SECONDS = 60.0
"""Eager draft-step seconds (summed over a drafter's calls in this process) after which "auto" compiles: about what
the compiles cost for a 270M drafter on a 2-core CPU with Inductor's cache warm (machine D, 2026-12-03)."""

CHECK_STEPS = 32
"""Compiled steps (of calls that compiled nothing) measured before "auto" keeps or drops compiled steps."""


@dataclass
class AutoCompile:
    """One drafter's record under "auto": its eager and compiled draft steps so far, and the verdict."""

    eager_seconds: float = 0.0
    eager_steps: int = 0
    compiled_seconds: float = 0.0  # calls that ran compiled and compiled nothing (the steps' own speed)
    compiled_steps: int = 0
    verdict: str = ""  # "" (deciding), "compiled" (kept), "eager (why)" (dropped for good)
    warned: bool = False  # the one warning of the first compiling call was given

    def compiles(self) -> bool:
        """Whether the next call runs its steps compiled."""
        if self.verdict:
            return self.verdict == "compiled"
        return self.eager_steps > 0 and self.eager_seconds >= AUTO_COMPILE_AFTER_SECONDS

    def record(self, compiled: bool, seconds: float, steps: int, compiled_graphs: bool = False,
               failure: str | None = None) -> None:
        """A call's draft steps: ``compiled`` whether they ran compiled, ``compiled_graphs`` whether the call made a
        graph (then its time is the compile's, not the steps'), ``failure`` why a compile failed."""
        if failure is not None:
            self.verdict = f"eager (its compile failed: {failure})"
            return
        if not compiled:
            self.eager_seconds += seconds
            self.eager_steps += steps
            return
        if compiled_graphs or self.verdict:
            return
        self.compiled_seconds += seconds
        self.compiled_steps += steps
        if self.compiled_steps < CHECK_STEPS:
            return
        eager, fast = self.eager_seconds / self.eager_steps, self.compiled_seconds / self.compiled_steps
        self.verdict = "compiled" if fast < eager else (
            f"eager (compiled steps took {1e3 * fast:.1f} ms against {1e3 * eager:.1f} ms eager)")

    def describe(self) -> str:
        """What ``stats.kernels`` says of the rule's choice for a call that runs compiled."""
        if self.verdict == "compiled":
            return (f"compile_draft_step=\"auto\": compiled steps {1e3 * self.compiled_seconds / self.compiled_steps:.1f}"
                    f" ms against {1e3 * self.eager_seconds / self.eager_steps:.1f} ms eager")
        return f"compile_draft_step=\"auto\" after {self.eager_seconds:.0f} s of eager steps"


_RECORDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # drafter -> AutoCompile


def record_of(drafter) -> AutoCompile:
    """The drafter's "auto" record (a new one for a drafter not seen in this process)."""
    held = _RECORDS.get(drafter)
    if held is None:
        held = _RECORDS[drafter] = AutoCompile()
    return held


def warn_compiling(record: AutoCompile) -> None:
    """The one line a user sees when "auto" first compiles: why this call is slow, and how to keep steps eager
    (once per drafter: the calls after it may compile graphs of other shapes too)."""
    if record.warned:
        return
    record.warned = True
    warnings.warn(f"hf_vocabspec: compiling the drafter's draft steps (compile_draft_step=\"auto\", after "
                  f"{record.eager_seconds:.0f} s of eager steps); this call pays the compiles. Set "
                  "drafter.compile_draft_step = False to keep them eager.", stacklevel=2)
