"""Trimmed drafters on the Hugging Face Hub: push with a model card, load with compatibility checks.

    push_drafter_to_hub(drafter, "user/gemma-3-270m-trimmed", tokenizer=tok)        # one commit: weights + card
    drafter = load_drafter("user/gemma-3-270m-trimmed", target=target, tokenizer=tok)  # refuses a mismatch

A pushed repo holds ``config.json`` (``model_type: hf_vocabspec_trimmed_drafter``, ``draft_vocab_size``, the map's
checksum, target and tokenizer fingerprint), ``model.safetensors`` (trimmed head + ``d2t`` absolute ids; for an
untied base also ``context_head`` / ``context_ids``, the pruned rows context tokens read),
``generation_config.json``, the tokenizer when given, and ``README.md`` rendered from
``hf_vocabspec/templates/drafter_card.md`` (package data).
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from huggingface_hub.errors import EntryNotFoundError

from ._io import atomic_write, first_line
from .compatibility import DrafterMismatchError  # noqa: F401  (re-exported beside the other load errors)
from .compatibility import check_compatibility, tokenizer_sha256
from .configuration import MODEL_TYPE, VocabularyMapError
from .modeling import TrimmedDrafter

logger = logging.getLogger(__name__)

__all__ = [
    "CARD_TAGS", "DEFAULT_COMMIT_MESSAGE", "ORIGIN_PROVIDERS", "TEMPLATE", "WEIGHT_FILES", "DrafterFileMissingError",
    "DrafterLoadError", "DrafterMismatchError", "DrafterNotFoundError", "EvalResultRow", "NotATrimmedDrafterError",
    "build_model_card", "inherited_license", "load_drafter", "model_origin", "push_drafter_to_hub", "register_origin",
    "write_custom_generate",
]

TEMPLATE = Path(__file__).resolve().parent / "templates" / "drafter_card.md"  # package data (wheel installs)
CARD_TAGS = ["hf_vocabspec", "speculative-decoding", "draft-model", "trimmed-vocabulary"]
DEFAULT_COMMIT_MESSAGE = "Upload trimmed drafter (hf_vocabspec)"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


class DrafterLoadError(OSError):
    """A drafter could not be loaded from a repo or directory."""


class DrafterNotFoundError(DrafterLoadError):
    """No such repo, revision, or local directory (or no access to it)."""


class DrafterFileMissingError(DrafterLoadError, EntryNotFoundError):
    """The repo/directory exists but a file the drafter needs is missing (an ``EntryNotFoundError``)."""


class NotATrimmedDrafterError(VocabularyMapError):
    """The repo holds a model that is not an hf_vocabspec trimmed drafter (no vocabulary map)."""


# --- model card --------------------------------------------------------------------------------------------
def _is_hub_id(name: str | None) -> bool:
    """A plausible Hub repo id ("org/name"), not a local path or an ``offline:`` name."""
    if not name or not isinstance(name, str) or name.startswith(("/", ".", "~", "offline:")) or "://" in name:
        return False
    if os.path.isabs(name) or "\\" in name:
        return False
    return name.count("/") == 1 and all(name.split("/"))


def _fmt(key: str, value: Any) -> str:
    if isinstance(value, float):
        if "coverage" in key and 0.0 <= value <= 1.0:
            return f"{value:.2%}"
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        shown = ", ".join(_fmt(key, v) for v in value[:8])
        return f"[{shown}, ... ({len(value)} items)]" if len(value) > 8 else f"[{shown}]"
    if isinstance(value, dict):
        return json.dumps(value, default=str)[:200]
    return str(value).replace("|", "\\|").replace("\n", " ")


_RDK_CARD_KEYS = ("method", "num_targets", "moved_mass", "shrink", "fit_positions", "temperature", "enabled")
_SELECTION_TABLE_SKIP = ("pareto", "trials", "token_ids", "eval_results", "settings", "latency_curve")
# Hub origins of names that are not Hub ids (e.g. the evaluation tooling's ``offline:`` models and datasets):
# name -> {"hub_id", "license"}. Lets cards name the real base model / dataset without network access. The core
# holds only this registry; whoever owns a name prefix registers its names, on import or through an entry point
# of the group below (pyproject: ``offline = "hf_vocabspec.evaluation.offline:register_origins"``), which is
# loaded the first time a name with that prefix is looked up: the core never imports the tooling by name.
_ORIGINS: dict[str, dict] = {}
ORIGIN_PROVIDERS = "hf_vocabspec.origins"
_PROVIDED: set[str] = set()


def _provide_origins(name: object) -> None:
    """Run the ``hf_vocabspec.origins`` entry points for ``name``'s prefix (``offline`` for ``offline:x``)
    once, when such a name is first seen and not registered yet."""
    if not isinstance(name, str) or name in _ORIGINS or ":" not in name:
        return
    prefix = name.split(":", 1)[0]
    if prefix in _PROVIDED:
        return
    _PROVIDED.add(prefix)
    import importlib.metadata

    for entry in importlib.metadata.entry_points(group=ORIGIN_PROVIDERS, name=prefix):
        try:
            entry.load()()
        except ImportError:  # the provider's package is unavailable: its names stay unknown
            logger.debug("origin provider %s could not be loaded", entry.value)


def register_origin(name: str, hub_id: str | None, license: str | None = None) -> None:
    """Record the Hub id (and licence) a local/offline model or dataset name stands for, for model cards."""
    _ORIGINS[name] = {"hub_id": hub_id, "license": license}


def model_origin(name: str | None) -> dict:
    """``{"hub_id", "license"}`` of a base/target model name WITHOUT network access.

    ``offline:`` names -> their recorded Hub id and licence; a local directory -> its
    ``hf_vocabspec_offline.json`` or its model card's YAML (``license``, ``base_model``); a Hub id -> itself,
    licence unknown (the Hub is not called). Unknown fields are ``None``.
    """
    out = {"hub_id": None, "license": None}
    if not name or not isinstance(name, str):
        return out
    _provide_origins(name)
    if name in _ORIGINS:
        return dict(_ORIGINS[name])
    path = Path(name).expanduser()
    if path.is_dir():
        record = path / "hf_vocabspec_offline.json"
        if record.is_file():
            info = json.loads(record.read_text())
            return {"hub_id": info.get("hub_id"), "license": info.get("license")}
        readme = path / "README.md"
        if readme.is_file():
            from huggingface_hub import ModelCard

            try:
                data = ModelCard.load(readme).data
            except Exception:  # noqa: BLE001 - a broken card just means "unknown"
                return out
            base = data.get("base_model")
            base = base[0] if isinstance(base, list) and base else base
            return {"hub_id": base if _is_hub_id(base) else None, "license": data.get("license")}
        return out
    if _is_hub_id(name):
        out["hub_id"] = name
    return out


def inherited_license(drafter: TrimmedDrafter) -> tuple[str | None, list[tuple[str, str]]]:
    """(licence for the card's YAML, [(model, licence), ...]) inherited from the base drafter and the target.

    One licence shared by the known ones -> that licence; several -> ``"other"`` (the card lists each); none
    known -> ``None``.
    """
    cfg = drafter.config
    known = []
    for role, name in (("base drafter", cfg.base_drafter), ("target model", cfg.target_model)):
        lic = model_origin(name).get("license")
        if lic:
            known.append((f"{role} `{name}`", str(lic)))
    distinct = sorted({lic for _, lic in known})
    return (distinct[0] if len(distinct) == 1 else "other" if distinct else None), known


def _pareto_rows(points: list[dict] | None, chosen_k: int | None, limit: int = 14) -> list[tuple[str, str, str, str]]:
    """At most ``limit`` Pareto points (evenly spread, the chosen k always kept) as table rows. A point with
    ``"chosen": True`` (or ``k == chosen_k``) is marked; one that is not on the front itself says so."""
    points = [p for p in points or [] if "k" in p]
    front = {p["k"]: p for p in points if not p.get("chosen")}
    chosen = next((p for p in points if p.get("chosen")), None)
    chosen_k = chosen["k"] if chosen else chosen_k
    shown = {**({chosen["k"]: chosen} if chosen else {}), **front}
    pts = sorted(shown.values(), key=lambda p: p["k"])
    if len(pts) > limit:
        step = (len(pts) - 1) / (limit - 1)
        idx = {round(i * step) for i in range(limit)}
        idx |= {i for i, p in enumerate(pts) if p["k"] == chosen_k or p["k"] == max(front, default=None)}
        pts = [pts[i] for i in sorted(idx)]
    rows = []
    for p in pts:
        cost = p.get("relative_cost")
        rows.append((f"{int(p['k']):,}", f"{p['coverage']:.2%}" if p.get("coverage") is not None else "",
                     f"{cost:.3f}" if cost is not None else "",
                     ("**chosen**" if p["k"] in front else "**chosen** (off the front)") if p["k"] == chosen_k else ""))
    return rows


def _dataset_type(dataset_name: str) -> str:
    """The Hub id a workload name starts with (offline names map to their source), else a slug of it."""
    head = dataset_name.split(" ")[0]
    _provide_origins(head)
    if _ORIGINS.get(head, {}).get("hub_id"):
        return _ORIGINS[head]["hub_id"]
    if _is_hub_id(head):
        return head
    return re.sub(r"[^A-Za-z0-9._-]+", "-", dataset_name).strip("-") or "custom"


@dataclass(frozen=True)
class EvalResultRow:
    """One measured number for a drafter's card (its YAML model-index and its table).

    ``metric_type`` (e.g. "acceptance_rate", "speedup_vs_hf_assisted"), ``metric_value``, ``dataset_name`` (e.g.
    "offline:sharegpt (held-out)"); optional ``metric_name`` (default: the type), ``dataset_type`` (default: the
    Hub id the dataset name starts with), ``task_type``, ``source_name`` / ``source_url``. The card code takes
    these (or plain dicts with those keys, as ``config.eval_results`` stores them); reading a tool's report into
    them is the tool's job (e.g. hf_vocabspec.evaluation.benchmark.eval_results_from_benchmark).
    """

    metric_type: str
    metric_value: float
    dataset_name: str
    metric_name: str | None = None
    dataset_type: str | None = None
    task_type: str = "text-generation"
    source_name: str | None = None
    source_url: str | None = None

    @classmethod
    def from_dict(cls, row: Mapping) -> EvalResultRow:
        """From a dict with the field names (unknown keys are ignored); the three required ones must be there."""
        if isinstance(row, EvalResultRow):
            return row
        missing = {"metric_type", "metric_value", "dataset_name"} - set(row)
        if missing:
            raise ValueError(f"eval_results rows need {sorted(missing)} (got {sorted(row)}).")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in row.items() if k in known})

    def to_dict(self) -> dict:
        """The set fields, as ``config.eval_results`` stores rows."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def _eval_results(rows: Sequence[EvalResultRow | Mapping] | None):
    """Measured numbers (:class:`EvalResultRow` or dicts of its fields) -> huggingface_hub EvalResults for the
    card's model-index."""
    from huggingface_hub import EvalResult

    out = []
    for row in rows or []:
        r = EvalResultRow.from_dict(row)
        out.append(EvalResult(
            task_type=r.task_type,
            dataset_type=r.dataset_type or _dataset_type(str(r.dataset_name)),
            dataset_name=str(r.dataset_name),
            metric_type=r.metric_type,
            metric_value=r.metric_value,
            metric_name=r.metric_name or r.metric_type,
            source_name=r.source_name if r.source_url else None,
            source_url=r.source_url,
        ))
    return out


def build_model_card(drafter: TrimmedDrafter, repo_id: str = "<repo-id>", *, license: str | None = None,
                     tokenizer_fingerprint: str | None = None,
                     eval_results: Sequence[EvalResultRow | Mapping] | None = None,
                     pareto: list[dict] | None = None, custom_generate: bool = True, files: tuple[str, ...] = ()):
    """A ``huggingface_hub.ModelCard`` rendered from ``hf_vocabspec/templates/drafter_card.md`` and the drafter's config.

    ``eval_results`` (measured numbers, :class:`EvalResultRow` or dicts of its fields; default:
    ``config.eval_results`` when the drafter carries them) go to the YAML model-index and a table. ``pareto`` (``[{k, coverage,
    relative_cost}]``; default ``config.selection["pareto"]``) becomes the selection's Pareto table. The licence
    is ``license`` or the one inherited from the base drafter and target (:func:`inherited_license`).
    Offline: ``base_model`` / ``datasets`` are Hub ids taken as given (offline names map to the Hub ids they
    came from), nothing is fetched or validated against the Hub.
    """
    from huggingface_hub import ModelCard, ModelCardData

    cfg = drafter.config
    if eval_results is None:
        eval_results = getattr(cfg, "eval_results", None)
    results = _eval_results(eval_results)
    selection = dict(cfg.selection or {})
    if pareto is None:
        pareto = selection.get("pareto")
    dataset = selection.get("dataset")
    _provide_origins(dataset)
    dataset_id = ((_ORIGINS.get(dataset, {}).get("hub_id") or dataset) if isinstance(dataset, str) else None)
    fingerprint = tokenizer_fingerprint or cfg.target_tokenizer_sha256
    inherited, license_sources = inherited_license(drafter)
    license = license or inherited
    base_id = model_origin(cfg.base_drafter)["hub_id"]
    target_id = model_origin(cfg.target_model)["hub_id"]
    tags = list(CARD_TAGS) + (["custom_generate"] if custom_generate else [])
    kept_rows = int(getattr(cfg, "context_head_size", 0) or 0)  # pruned rows of an untied head, for context tokens
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=tags,
        base_model=base_id,
        datasets=[dataset_id] if _is_hub_id(dataset_id) else None,
        license=license,
        model_name=repo_id.split("/")[-1] if results else None,
        eval_results=results or None,
        # extra keys are kept in the YAML header: machine-readable facts about the trim
        draft_vocab_size=int(cfg.draft_vocab_size),
        vocab_size=int(cfg.vocab_size),
        target_model=cfg.target_model,
        target_model_hub_id=target_id if target_id != cfg.target_model else None,
        target_tokenizer_sha256=fingerprint,
        selection_coverage=float(selection["coverage"]) if selection.get("coverage") is not None else None,
        # the draft length and context-token setting the drafter ships with (`hf-vocabspec tune` picks them)
        num_assistant_tokens=int(getattr(drafter.generation_config, "num_assistant_tokens", 0) or 0) or None,
        assistant_confidence_threshold=float(getattr(drafter.generation_config, "assistant_confidence_threshold", 0)
                                             or 0) or None,
        context_tokens=bool(getattr(cfg, "context_tokens", False)),
    )
    return ModelCard.from_template(
        data,
        template_path=str(TEMPLATE),
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        base_drafter=cfg.base_drafter,
        base_hub_id=base_id if base_id != cfg.base_drafter else None,
        target_model=cfg.target_model,
        target_hub_id=target_id if target_id != cfg.target_model else None,
        usage_target=target_id or cfg.target_model,
        draft_vocab_size=f"{cfg.draft_vocab_size:,}",
        vocab_size=f"{cfg.vocab_size:,}",
        kept_share=f"{cfg.draft_vocab_size / max(cfg.vocab_size, 1):.1%}",
        tokenizer_sha256=fingerprint,
        vocab_map_sha256=cfg.vocab_map_sha256,
        selection=[(k, _fmt(k, v)) for k, v in selection.items() if v is not None and k not in _SELECTION_TABLE_SKIP],
        pareto=_pareto_rows(pareto, selection.get("k")),
        files=set(files),
        license_name=license,
        license_sources=license_sources,
        measured=[(r.dataset_name, r.metric_name, _fmt(r.metric_type, r.metric_value)) for r in results],
        rdk=[(k, _fmt(k, v)) for k, v in (cfg.rdk or {}).items() if k in _RDK_CARD_KEYS],
        context_tokens=bool(getattr(cfg, "context_tokens", False)),
        context_head_size=f"{kept_rows:,}" if kept_rows else "",
        max_context_tokens=f"{getattr(cfg, 'max_context_tokens', 0):,}",
        custom_generate=custom_generate,
    )


# --- custom_generate ---------------------------------------------------------------------------------------
CUSTOM_GENERATE_TEMPLATE = Path(__file__).resolve().parent / "custom_generate" / "generate.py"


def write_custom_generate(directory: str | os.PathLike, drafter_repo: str) -> Path:
    """Write ``custom_generate/generate.py`` so that
    ``target.generate(..., custom_generate=<repo or dir>, trust_remote_code=True)`` drafts with the trimmed
    drafter stored at ``drafter_repo`` (a Hub repo id or a local directory)."""
    out = Path(directory) / "custom_generate"
    out.mkdir(parents=True, exist_ok=True)
    code = CUSTOM_GENERATE_TEMPLATE.read_text().replace("{{DRAFTER_REPO}}", str(drafter_repo))
    atomic_write(out / "generate.py", lambda p: p.write_text(code))
    # No requirements.txt on purpose: transformers checks it whenever the DRAFTER is loaded with
    # trust_remote_code, which must keep working without hf_vocabspec installed; the recipe itself
    # raises an ImportError naming `pip install hf_vocabspec` when it needs the package.
    return out / "generate.py"


# --- push ----------------------------------------------------------------------------------------------------
def push_drafter_to_hub(
    drafter: TrimmedDrafter,
    repo_id: str,
    *,
    tokenizer=None,
    token: str | None = None,
    private: bool = False,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    license: str | None = None,
    revision: str | None = None,
    custom_generate: bool = True,
    eval_results: Sequence[EvalResultRow | Mapping] | None = None,
    pareto: list[dict] | None = None,
    extra_files: dict[str, str | os.PathLike] | None = None,
) -> str:
    """Push the drafter (safetensors with the map inside, config, generation config), the tokenizer when
    given, a generated model card (README.md) and, with ``custom_generate``, a ``custom_generate/`` recipe
    (``target.generate(custom_generate=repo_id, trust_remote_code=True)``) in ONE commit; return the repo URL.
    ``eval_results``: measured numbers for the card's model-index (:class:`EvalResultRow`, see
    :func:`build_model_card`; default: the drafter's ``config.eval_results``). A benchmark report's rows are read
    by the tooling (``hf_vocabspec.evaluation.benchmark.eval_results_from_benchmark``) and passed here: the
    ``benchmark=`` argument (a results.json path or dict) was removed in issue #29.
    ``pareto``: the selection's Pareto front for the card; ``extra_files``: ``{path_in_repo: local_path}``
    shipped in the same commit (e.g. ``selection/pareto.png``, which the card then shows).

    With ``tokenizer``, its fingerprint must match the one recorded at trim time (a drafter trimmed without
    a tokenizer gets it recorded in the pushed config).
    """
    from huggingface_hub import HfApi

    drafter.validate_vocab_map()
    for path_in_repo, local in (extra_files or {}).items():
        if not Path(local).is_file():
            raise FileNotFoundError(f"extra_files[{path_in_repo!r}]: no such file {str(local)!r}.")
    fingerprint = None
    if tokenizer is not None:
        check_compatibility(drafter, tokenizer=tokenizer, fix="push the target's tokenizer, or none")
        fingerprint = tokenizer_sha256(tokenizer)
    api = HfApi(token=token)
    repo_url = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    full_id = getattr(repo_url, "repo_id", None) or repo_id
    with tempfile.TemporaryDirectory(prefix="hf-vocabspec-push-") as tmp:
        drafter.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
            cfg_path = Path(tmp) / "config.json"
            cfg = json.loads(cfg_path.read_text())
            if not cfg.get("target_tokenizer_sha256"):
                cfg["target_tokenizer_sha256"] = fingerprint
                cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        for path_in_repo, local in (extra_files or {}).items():
            dest = Path(tmp) / path_in_repo
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(Path(local).read_bytes())
        card = build_model_card(drafter, full_id, license=license, tokenizer_fingerprint=fingerprint,
                                eval_results=eval_results, pareto=pareto, custom_generate=custom_generate,
                                files=tuple(extra_files or ()))
        card.save(str(Path(tmp) / "README.md"))
        if custom_generate:
            write_custom_generate(tmp, full_id)
        api.upload_folder(repo_id=full_id, folder_path=tmp, repo_type="model", revision=revision,
                          commit_message=commit_message)
    return str(repo_url)


# --- load ----------------------------------------------------------------------------------------------------
def _causes(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def _read_config(repo_or_path: str, kwargs: dict) -> tuple[dict, bool]:
    """(config.json as a dict, is_local_dir), with clear errors for a missing repo/revision/file."""
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    path = Path(repo_or_path).expanduser()
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            raise DrafterFileMissingError(f"{repo_or_path!r} is a directory without config.json: not a saved drafter "
                                          "(save one with `drafter.save_pretrained(dir)`).")
        return _parse_config(cfg, repo_or_path), True
    if path.exists():
        raise DrafterLoadError(f"{repo_or_path!r} is a file: pass the directory that holds config.json and the weights.")
    revision = kwargs.get("revision")
    where = f"{repo_or_path!r}" + (f" at revision {revision!r}" if revision else "")
    try:
        cfg_file = hf_hub_download(
            str(repo_or_path), "config.json", revision=revision, token=kwargs.get("token"),
            cache_dir=kwargs.get("cache_dir"), local_files_only=bool(kwargs.get("local_files_only", False)),
        )
    except HFValidationError as err:
        raise DrafterNotFoundError(f"{repo_or_path!r} is neither a local directory nor a valid Hub repo id "
                                   f"('owner/name'). ({first_line(err, with_type=True)})") from err
    except RepositoryNotFoundError as err:
        raise DrafterNotFoundError(
            f"Could not load a drafter from {repo_or_path!r}: no such repo on {constants.ENDPOINT} and no local "
            "directory of that name (or it is private/gated and your token cannot read it). Check the repo id "
            f"and log in with `hf auth login` or pass token=... ({first_line(err, with_type=True)})") from err
    except RevisionNotFoundError as err:
        raise DrafterNotFoundError(f"Could not load a drafter from {where}: the repo has no such revision "
                                   f"(branch, tag or commit). ({first_line(err, with_type=True)})") from err
    except LocalEntryNotFoundError as err:
        raise DrafterLoadError(f"Could not load a drafter from {where}: not in the local cache and the Hub is "
                               f"unreachable or offline mode is on. ({first_line(err, with_type=True)})") from err
    except EntryNotFoundError as err:
        raise DrafterFileMissingError(f"Could not load a drafter from {where}: the repo exists but has no "
                                      "config.json, so it holds no transformers model. "
                                      f"({first_line(err, with_type=True)})") from err
    return _parse_config(Path(cfg_file), repo_or_path), False


def _parse_config(path: Path, where: str) -> dict:
    """config.json as a dict; a damaged or edited one fails in one line naming it (not json's decoder message)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DrafterLoadError(f"The config.json of {where!r} is not readable JSON ({first_line(err, with_type=True)}): "
                               "copy or download the drafter again, or re-save it.") from err
    if not isinstance(config, dict):
        raise DrafterLoadError(f"The config.json of {where!r} holds a JSON {type(config).__name__}, not an object: "
                               "copy or download the drafter again, or re-save it.")
    return config


def load_drafter(repo_or_path: str | os.PathLike, *, target=None, tokenizer=None, **kwargs) -> TrimmedDrafter:
    """Load a :class:`TrimmedDrafter` from a Hub repo id or a local directory, with clear errors.

    Refuses: a missing repo/revision/directory (:class:`DrafterNotFoundError`), a repo holding another kind
    of model (:class:`NotATrimmedDrafterError`), a missing file (:class:`DrafterFileMissingError`, also an
    ``EntryNotFoundError``), a drafter for another target vocabulary or tokenizer
    (:class:`DrafterMismatchError`). ``kwargs`` go to ``TrimmedDrafter.from_pretrained`` (revision, token,
    dtype, cache_dir, ...).
    """
    repo_or_path = str(repo_or_path)
    config, _ = _read_config(repo_or_path, kwargs)
    model_type = config.get("model_type")
    if model_type != MODEL_TYPE or "draft_vocab_size" not in config:
        arch = ", ".join(config.get("architectures") or []) or "unknown architecture"
        raise NotATrimmedDrafterError(
            f"{repo_or_path!r} holds a {model_type!r} model ({arch}), not an hf_vocabspec trimmed drafter: it has no "
            "draft->target vocabulary map. Trim it first: `hf_vocabspec.trim_drafter(model, keep_token_ids, "
            "tokenizer=tok)`, then `push_drafter_to_hub(...)`."
        )
    try:
        drafter = TrimmedDrafter.from_pretrained(repo_or_path, **kwargs)
    except VocabularyMapError:
        raise
    except OSError as err:
        missing = any(isinstance(e, EntryNotFoundError) for e in _causes(err)) or "does not appear to have" in str(err)
        if missing:
            raise DrafterFileMissingError(
                f"{repo_or_path!r} has a trimmed-drafter config.json but no weights ({' / '.join(WEIGHT_FILES[:1])} "
                "missing): the upload is incomplete. Push it again with push_drafter_to_hub. "
                f"({first_line(err, with_type=True)})"
            ) from err
        raise DrafterLoadError(f"Could not load the drafter from {repo_or_path!r}: "
                               f"{first_line(err, with_type=True)}") from err
    check_compatibility(drafter, target=target, tokenizer=tokenizer,
                        fix="use a drafter trimmed for this target and its tokenizer")
    return drafter
