"""lm-evaluation-harness backend ``hf-vocabspec``: lm-eval's ``hf`` backend generating with a trimmed drafter.

lm-eval (0.4.13) discovers no backend from other packages, so importing this module registers it with lm-eval's
own registry (``register_model``); :func:`run_cli` then hands every argument unchanged to lm-eval's CLI. The
backend is :class:`~lm_eval.models.huggingface.HFLM` with one change: ``_model_generate`` adds
``assistant_model=<drafter>`` to the target's ``generate`` call, so every generated token is still the target's
(greedy outputs equal the ``hf`` backend's; loglikelihood requests never see the drafter). Model names are what
the hf-vocabspec CLI accepts (Hub ids, local paths, ``offline:`` names); a drafter trimmed for another tokenizer
is refused in one line before the target loads. The speculation counters of every generate call are summed and
reported with lm-eval's results (``config.speculation`` in results_*.json, a printed line, and
``speculation_<date>.json`` beside the results when ``--output_path`` is given).

    model_args: pretrained=<target>,drafter=<trimmed drafter>[,dtype=...,drafter_dtype=...,<HFLM's own args>]
"""

from __future__ import annotations

import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from ..configuration import check_compile_draft_step
from ..generation.stats import SpeculationStats

BACKEND = "hf-vocabspec"
TASKS_DIR = Path(__file__).with_name("lmeval_tasks")  # offline task YAMLs: pass as --include_path
_LATEST: dict[str, Any] = {}  # rank and speculation report of the last backend run in this process (for the CLI)


def _resolve(name: str, option: str) -> str:
    """An hf-vocabspec model name (Hub id, path, ``offline:`` name) as something from_pretrained reads."""
    from .usage import check_model_name
    from .offline import resolve_model_path

    check_model_name(name, option)
    return resolve_model_path(name)


def _dtype(value: str | torch.dtype | None) -> torch.dtype | str:
    """lm-eval's dtype spelling ("auto", "bfloat16", torch.float32) as from_pretrained takes it."""
    from lm_eval.models.utils_hf import get_dtype

    return "auto" if value in (None, "auto") else get_dtype(value)


def check_drafter_for(drafter: str, target: str, tokenizer: str | None = None) -> None:
    """Refuse, from the tokenizer and the drafter's config alone (no weights), a ``drafter`` that is not a trimmed
    drafter or was trimmed for another tokenizer than ``target``'s (or ``tokenizer``'s): one line, before any
    model or task loads."""
    from transformers import AutoConfig

    from ..compatibility import check_compatibility
    from ..configuration import MODEL_TYPE
    from .offline import load_tokenizer

    config = AutoConfig.from_pretrained(_resolve(drafter, "drafter"))
    if config.model_type != MODEL_TYPE:
        raise ValueError(f"drafter={drafter} is a {config.model_type!r} model, not an hf_vocabspec trimmed drafter: "
                         "trim it first (`hf-vocabspec trim`) and pass the trimmed folder.")
    check_compatibility(types.SimpleNamespace(config=config), tokenizer=load_tokenizer(tokenizer or target),
                        fix=f"pass a drafter trimmed for {tokenizer or target}")


@register_model(BACKEND)
class VocabSpecLM(HFLM):
    """HFLM whose generate calls draft with a trimmed drafter (``drafter=``; without one it is the ``hf`` backend).

    ``drafter_dtype`` defaults to the dtype the drafter was saved in (``dtype`` is the target's, as in HFLM).
    ``compile_draft_step=True`` / ``False`` / ``auto``: the drafter's steps run compiled, eager, or compiled once the
    eager ones have cost what the compiles are expected to (``drafter.compile_draft_step``; default: as the drafter
    was saved; compiled, one request pays the compiles, every later one reuses them: what a task of many prompts
    wants on a CPU).

    ``pretrained`` / ``drafter`` may also be loaded models (the Python route, ``simple_evaluate(model=...)``).
    Under ``accelerate launch`` on CPU (no GPUs) the requests are split across the processes too, which lm-eval's
    ``hf`` backend only does on GPUs.
    """

    def __init__(self, pretrained: str | Any, drafter: str | Any = None, drafter_dtype: str | None = None,
                 compile_draft_step: bool | str | None = None, **kwargs: Any) -> None:
        tokenizer = kwargs.get("tokenizer")
        if isinstance(drafter, str) and isinstance(pretrained, str):
            check_drafter_for(drafter, pretrained, tokenizer if isinstance(tokenizer, str) else None)
        if isinstance(pretrained, str):
            pretrained = _resolve(pretrained, "pretrained")
        if isinstance(tokenizer, str):
            kwargs["tokenizer"] = _resolve(tokenizer, "tokenizer")
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
            from accelerate import PartialState

            PartialState(cpu=True)  # HFLM's Accelerator() would see one process on a GPU-less machine
        super().__init__(pretrained, **kwargs)
        self._split_on_cpu()
        self.drafter_name = drafter if isinstance(drafter, str) else getattr(drafter, "name_or_path", None)
        self.drafter = self._load_drafter(drafter, drafter_dtype)
        if compile_draft_step is not None:  # the drafter setting's own check, naming lm-eval's way to pass it
            check_compile_draft_step(compile_draft_step, "--model_args ...,compile_draft_step=True")
        if self.drafter is not None and compile_draft_step is not None:
            self.drafter.compile_draft_step = compile_draft_step  # compiled once, reused by every request's generate
        self.speculation = SpeculationStats()
        self.generate_calls = 0
        self.generate_seconds = 0.0
        self.decisions: dict[str, int] = {}  # the batched loop's decision per generate call ("" at batch 1)
        self._all_ranks: list[dict] | None = None
        self._publish()

    def _split_on_cpu(self) -> None:
        """HFLM shards requests across `accelerate launch` processes only when it counts GPUs; do it on CPU too."""
        acc = getattr(self, "accelerator", None)
        if acc is not None and acc.num_processes > 1 and self.world_size == 1 and self.device.type == "cpu":
            self._rank, self._world_size = acc.process_index, acc.num_processes

    def _load_drafter(self, drafter: str | Any, dtype: str | torch.dtype | None):
        from ..compatibility import check_compatibility
        from ..hub import load_drafter
        from ..modeling import TrimmedDrafter
        from .offline import resolve_model_path

        if drafter is None:
            return None
        if isinstance(drafter, str):
            drafter = load_drafter(resolve_model_path(drafter), dtype=_dtype(dtype))
        elif not isinstance(drafter, TrimmedDrafter):
            raise TypeError(f"drafter= takes a trimmed drafter (name or TrimmedDrafter), not {type(drafter).__name__}: "
                            "trim it first with hf_vocabspec.trim_drafter.")
        check_compatibility(drafter, target=self.model, tokenizer=self.tokenizer)
        return drafter.to(self.device).eval()

    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs):
        """HFLM's generate call with the drafter as assistant; its counters are added to :attr:`speculation`."""
        if self.drafter is None:
            return super()._model_generate(context, max_length, stop, **generation_kwargs)
        self.drafter.last_speculation_stats = None
        start = time.perf_counter()
        out = super()._model_generate(context, max_length, stop, assistant_model=self.drafter, **generation_kwargs)
        self.generate_seconds += time.perf_counter() - start
        self.generate_calls += 1
        stats = self.drafter.last_speculation_stats
        if stats is not None:
            self.speculation.add(stats)
            if stats.decision:
                self.decisions[stats.decision] = self.decisions.get(stats.decision, 0) + 1
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = super().generate_until(requests, disable_tqdm=disable_tqdm)
        if self.world_size > 1:  # every rank calls generate_until once per task type: a safe collective
            self._all_ranks = self.gather_object(self._own_counters(), dst=0)
        self._publish()
        return out

    def _publish(self) -> None:
        """Keep the latest report where the CLI finds it after lm-eval has dropped the backend."""
        _LATEST.update(rank=self.rank, report=self.speculation_report())

    def _own_counters(self) -> dict:
        return {"stats": self.speculation.to_dict(), "calls": self.generate_calls, "seconds": self.generate_seconds,
                "decisions": self.decisions}

    def speculation_report(self) -> dict:
        """Summed speculation counters of this run (all processes on rank 0 under accelerate launch)."""
        ranks = self._all_ranks if self._all_ranks else [self._own_counters()]
        total = SpeculationStats()
        for r in ranks:
            total.add(SpeculationStats.from_dict(r["stats"]))
        decisions: dict[str, int] = {}
        for r in ranks:
            for what, n in r["decisions"].items():
                decisions[what] = decisions.get(what, 0) + n
        return {
            "drafter": self.drafter_name, "processes": len(ranks),
            "generate_calls": sum(r["calls"] for r in ranks),
            "generate_seconds": round(sum(r["seconds"] for r in ranks), 4),
            "tau": round(total.mean_accepted_length, 4), "acceptance_rate": round(total.acceptance_rate, 4),
            "accepted": total.accepted, "proposed": total.proposed, "rounds": total.rounds,
            "row_rounds": total.row_rounds, "decision": ", ".join(f"{d} x{n}" for d, n in sorted(decisions.items())),
            "draft_seconds": round(total.draft_seconds, 4), "verify_seconds": round(total.verify_seconds, 4),
        }

    def get_model_info(self) -> dict:
        """lm-eval writes this into results["config"]: the speculation report goes next to the scores."""
        info = super().get_model_info()
        info.update(drafter=self.drafter_name, speculation=self.speculation_report())
        return info


def latest_report() -> tuple[int, dict] | None:
    """(rank, speculation report) of the hf-vocabspec backend run last in this process; None if none ran."""
    return (_LATEST["rank"], _LATEST["report"]) if _LATEST else None


def format_speculation(report: dict) -> str:
    """One line for the terminal, next to lm-eval's table."""
    if not report.get("generate_calls"):
        return "hf-vocabspec: no generate calls (loglikelihood tasks only, or no drafter)"
    return (f"hf-vocabspec speculation ({report['drafter']}, {report['processes']} process(es)): "
            f"tau {report['tau']:.2f}, accepted {report['accepted']:,}/{report['proposed']:,} "
            f"({report['acceptance_rate']:.1%}), {report['rounds']:,} rounds, decision: {report['decision'] or '-'}, "
            f"draft {report['draft_seconds']:.1f} s, verify {report['verify_seconds']:.1f} s, "
            f"{report['generate_calls']} generate calls in {report['generate_seconds']:.1f} s")


def write_speculation(output_path: str, report: dict, since: float) -> Path | None:
    """Write ``report`` as ``speculation_<date>.json`` beside the results file lm-eval wrote after ``since``
    (``--output_path`` is a folder, results under ``<model>/results_<date>.json``, or a ``.json`` file name)."""
    out = Path(output_path).expanduser()
    folder, pattern = (out.parent, f"{out.stem}_*.json") if out.suffix == ".json" else (out, "**/results_*.json")
    written = [p for p in folder.glob(pattern) if p.stat().st_mtime >= since - 1]
    if not written:
        return None
    newest = max(written, key=lambda p: p.stat().st_mtime)
    date = newest.stem.split("_", 1)[1] if "_" in newest.stem else time.strftime("%Y-%m-%dT%H-%M-%S")
    path = newest.with_name(f"speculation_{date}.json")
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def _option(argv: list[str], *names: str) -> str | None:
    """The value of ``--name VALUE`` / ``--name=VALUE`` (or an alias) in lm-eval's arguments (the last wins)."""
    value = None
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                value = argv[i + 1]
            elif arg.startswith(name + "="):
                value = arg[len(name) + 1:]
    return value


def precheck(argv: list[str]) -> None:
    """For ``--model hf-vocabspec``: refuse a mismatched drafter (or unknown model name) before lm-eval parses
    its tasks; lm-eval checks everything else itself."""
    if _option(argv, "--model", "-M") != BACKEND:
        return
    from lm_eval.utils import simple_parse_args_string

    args = simple_parse_args_string(_option(argv, "--model_args", "-a") or "")
    target = args.get("pretrained")
    if not target:
        from .usage import UsageError

        raise UsageError("--model hf-vocabspec needs --model_args pretrained=<target>[,drafter=<trimmed drafter>]: "
                         "add pretrained=...")
    if args.get("drafter"):
        tokenizer = args.get("tokenizer")
        check_drafter_for(str(args["drafter"]), str(target), str(tokenizer) if tokenizer else None)
    else:
        _resolve(str(target), "pretrained")


def run_cli(argv: list[str]) -> int:
    """Run lm-eval's own CLI on ``argv`` (unchanged) with the backend registered; then print the speculation
    report and write it beside the results. ``tasks-dir`` alone prints the offline task folder instead."""
    if argv[:1] == ["tasks-dir"]:
        print(TASKS_DIR)
        return 0
    precheck(argv)
    from lm_eval.__main__ import cli_evaluate

    start = time.time()
    _LATEST.clear()
    saved = sys.argv
    sys.argv = ["lm-eval", *argv]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved
    latest = latest_report()
    if latest is not None and latest[0] == 0:
        report = latest[1]
        print(format_speculation(report))
        output_path = _option(argv, "--output_path", "-o")
        if output_path:
            path = write_speculation(output_path, report, since=start)
            if path is not None:
                print(f"hf-vocabspec: speculation report written to {path}")
    return 0
