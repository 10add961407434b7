"""What every CLI command shares: dtype names, logging to stderr, counting under accelerate, selection options."""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import math
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

# A bad argument and the checks of model/dataset names live below the CLI (the lm-eval backend raises and runs them
# too); the commands import them from here.
from ..evaluation.usage import UsageError, check_dataset_name, check_model_name  # noqa: F401


class _Dtypes(Mapping):
    """dtype name -> torch dtype, torch imported on first lookup: building the parser (``--help``, a bad command
    line) imports neither torch nor transformers (tests/test_cli.py checks it)."""

    _NAMES = ("auto", "float32", "bfloat16", "float16")

    def __getitem__(self, name: str):
        if name not in self._NAMES:
            raise KeyError(name)
        if name == "auto":
            from ..kernels import auto_drafter_dtype

            return auto_drafter_dtype()
        import torch

        return getattr(torch, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._NAMES)

    def __len__(self) -> int:
        return len(self._NAMES)


DTYPES = _Dtypes()


def resolve_auto_dtypes(args) -> None:
    """A parsed command's ``--dtype`` / ``--drafter-dtype`` "auto" as the dtype it stands for on this machine (what
    the command then loads, times, saves and reports)."""
    for name in ("dtype", "drafter_dtype"):
        if getattr(args, name, None) == "auto":
            setattr(args, name, str(DTYPES["auto"]).removeprefix("torch."))


# --dtype / --drafter-dtype's help for "auto" (kernels.auto_drafter_dtype), the default where a drafter is made or timed
AUTO_DTYPE_HELP = ("auto = bfloat16 where a CUDA GPU or a CPU with native bf16 (AVX-512 BF16, AMX) runs it, else "
                   "float32 (bf16 is emulated there, and slower)")


# --weight-quantization's choices: configuration.WEIGHT_QUANTIZATIONS and "none" (full precision), written out here
# because building the parser imports no transformers (tests/test_cli.py checks it)
WEIGHT_QUANTIZATION_CHOICES = ("none", "int8", "int4")


def weight_scheme(choice: str) -> str | None:
    """A ``--weight-quantization`` choice as ``drafter.quantize_weights`` takes it ("none": None)."""
    return None if choice == "none" else choice


def log(msg: str) -> None:
    print(f"[hf-vocabspec] {msg}", file=sys.stderr, flush=True)


def count_for_args(args):
    """Count on this process, or sharded over all processes under `accelerate launch` (identical result)."""
    from ..coverage import count_assistant_tokens_distributed
    from ..evaluation.offline import load_chat_dataset, load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    dataset = load_chat_dataset(args.dataset)
    return count_assistant_tokens_distributed(dataset, tokenizer, max_examples=args.max_examples, progress=True)


def is_main_process() -> bool:
    from accelerate import PartialState

    return PartialState(cpu=True).is_main_process


def confidence_threshold(text: str) -> float:
    """argparse type: a drafter confidence threshold in [0, 1) (0: never stop drafting early)."""
    from ..configuration import check_confidence_threshold

    try:
        return check_confidence_threshold(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def coverage_fraction(text: str) -> float:
    """argparse type: a coverage share in (0, 1] (checked on the command line, before any work)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], e.g. 0.95; got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1] (a share, e.g. 0.95 for 95%); got {text}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer; got {text}")
    return value




def selection_args(p) -> None:
    p.add_argument("--min-coverage", type=coverage_fraction, default=0.95,
                   help="smallest share of counted assistant tokens the kept vocabulary must cover, in (0, 1]")
    p.add_argument("--objective", choices=["throughput", "utility"], default="throughput",
                   help="what the search maximises: predicted speculative-decoding throughput, or a*C+(1-a)*R utility")
    p.add_argument("--cost", choices=["measured", "flops"], default="measured",
                   help="draft cost model: measured step latency on this device, or architecture-aware FLOPs")
    p.add_argument("--n-trials", type=positive_int, default=100, help="Optuna TPE trials")
    p.add_argument("--seed", type=int, default=42, help="Optuna sampler seed")
    p.add_argument("--max-k", type=positive_int, default=65536, help="largest kept vocabulary size searched")
    p.add_argument("--storage", default=None, help="journal file (or sqlite:///...) to resume/share the study")


# --- option validators (argparse types: checked while parsing, before any model or dataset is loaded) -------
def _number(text: str, kind, what: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None


def non_negative_int(text: str) -> int:
    """argparse type: an integer >= 0."""
    value = _number(text, int, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0; got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (a temperature, a learning rate, seconds)."""
    value = _number(text, float, "a number > 0")
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0; got {text}")
    return value


def pruned_share(text: str) -> float:
    """argparse type: a pruned share of the vocabulary in [0, 1) (0.9 = keep the top 10%)."""
    value = _number(text, float, "a number in [0, 1), e.g. 0.9")
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1) (the share of the vocabulary pruned, e.g. 0.9); got {text}")
    return value


def sampling_mode(text: str) -> str:
    """argparse type: 'greedy' or 't<temperature>' with a temperature > 0 (t1, t0.7)."""
    if text == "greedy":
        return text
    if text.startswith("t"):
        try:
            temperature = float(text[1:])
        except ValueError:
            temperature = None
        if temperature is not None and math.isfinite(temperature) and temperature > 0:
            return text
    raise argparse.ArgumentTypeError(f"expected 'greedy' or 't<temperature>' with a temperature > 0 (e.g. t1, t0.7); "
                                     f"got {text!r}")


def explicit_options(parser: argparse.ArgumentParser, argv: list[str]) -> set[str]:
    """The dests the user typed (not defaults): a contradiction is only one when both options were given."""
    def suppress(p):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    suppress(sub)
            elif action.dest not in ("help", "command"):
                action.default = argparse.SUPPRESS
                action.required = False

    suppress(parser)
    try:
        return set(vars(parser.parse_args(argv))) - {"func", "command"}
    except SystemExit:  # cannot happen after the real parse succeeded; be safe
        return set()


def given(args, *names: str) -> list[str]:
    """Options among ``names`` (dests) that were typed on the command line, as --flag names."""
    typed = getattr(args, "explicit", None)
    if typed is None:  # called without main(): treat non-default values as typed
        typed = {n for n in names if getattr(args, n, None) not in (None, False, [])}
    return ["--" + n.replace("_", "-") for n in names if n in typed]


def refuse_together(args, first: str, others: tuple[str, ...], why: str) -> None:
    """UsageError when ``first`` and any of ``others`` were both typed (one of them would be ignored)."""
    if given(args, first) and given(args, *others):
        raise UsageError(f"{given(args, first)[0]} and {', '.join(given(args, *others))} contradict: {why}.")


def check_ks_in_vocabulary(ks, tokenizer_name: str, option: str = "--ks") -> int:
    """Kept sizes must fit the tokenizer's vocabulary (the tokenizer is cheap to load; the models are not)."""
    from ..evaluation.offline import load_tokenizer

    vocab = len(load_tokenizer(tokenizer_name))
    too_big = [k for k in ks if k > vocab]
    if too_big:
        raise UsageError(f"{option} {too_big[0]} is beyond the vocabulary of {tokenizer_name} ({vocab:,} tokens): "
                         f"pass kept sizes up to {vocab:,}.")
    return vocab


# --- output paths: the one place they are checked, refused or prepared -------------------------------------
# What each command writes: a previous output of the same kind may be replaced; anything else is refused
# unless --overwrite (nothing is deleted that hf-vocabspec did not write).
_TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "vocab.json", "vocab.txt", "merges.txt",
                    "added_tokens.json", "chat_template.*", "spiece.model")
_DRAFTER_FILES = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
                  "configuration.py", "modeling.py", "drafter.py",  # (drafter.py: shipped by releases before the split)
                  "custom_generate", "selection", "README.md", *_TOKENIZER_FILES)
OUTPUT_KINDS = {
    # kind: (marker files, one of which must be there; every entry must match these patterns)
    "drafter": (("config.json",), _DRAFTER_FILES),
    "selection": (("selection.json",), ("selection.json", "pareto.png", "latency.png")),
    "bench": (("results.json", "results.md"), ("results.json", "results.md", "*.png")),
    "acceptance": (("results.json", "results.md"), ("results.json", "results.md", "*.png")),
    "rdk-bench": (("results.json", "results.md"), ("results.json", "results.md", "*.png")),
    "tune": (("tune.json",), ("tune.json", "heatmap.png", "drafter")),
    "demo": (("results.json", "counts.safetensors"), ("results.json", "results.md", "counts.safetensors", "drafter")),
}


def _is_our_counts_file(path: Path) -> bool:
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            return (f.metadata() or {}).get("format", "").startswith("hf_vocabspec.TokenCounts")
    except Exception:  # noqa: BLE001 - not safetensors: not ours
        return False


def _foreign_entries(folder: Path, kind: str) -> list[str] | None:
    """None when ``folder`` is a previous output of ``kind``; else the entries that show it is not."""
    markers, patterns = OUTPUT_KINDS[kind]
    entries = sorted(p.name for p in folder.iterdir())
    if not entries:
        return None  # an empty folder: nothing to lose
    foreign = [e for e in entries if not any(fnmatch.fnmatch(e, p) for p in patterns)]
    if foreign:
        return foreign
    if not any((folder / m).is_file() for m in markers):
        return entries
    if kind == "drafter":
        try:
            if json.loads((folder / "config.json").read_text()).get("model_type") != "hf_vocabspec_trimmed_drafter":
                return ["config.json (not a trimmed drafter's)"]
        except (OSError, ValueError):
            return ["config.json (unreadable)"]
    return None


def prepare_output(path: str | None, kind: str, *, overwrite: bool = False, option: str = "--output",
                   parent_must_exist: bool = True) -> Path | None:
    """Check an output path before any work; raise UsageError (nothing created or deleted) when it is refused.

    ``kind`` is "counts" (a file) or a folder kind of OUTPUT_KINDS. An existing path that is not a previous
    output of this kind is refused unless ``overwrite``; a file where a folder is expected (or the reverse) is
    always refused. The caller writes atomically (``_io``); this function creates nothing.
    """
    if path is None:
        return None
    out = Path(path).expanduser()
    parent = out.resolve().parent
    if parent_must_exist and not parent.is_dir():
        raise UsageError(f"{option} {path}: the directory {str(parent)!r} does not exist (create it first or fix "
                         f"the path).")
    if not parent_must_exist:
        for above in [parent, *parent.parents]:
            if above.exists():
                if not above.is_dir():
                    raise UsageError(f"{option} {path}: {str(above)!r} is a file, not a folder: choose another path.")
                parent = above
                break
    check_writable(parent, f"{option} {path}")
    if not out.exists() and not out.is_symlink():
        return out
    if kind == "counts":
        if out.is_dir():
            raise UsageError(f"{option} {path} is a folder; a counts file is written there: pass a file name, "
                             f"e.g. {Path(path) / 'counts.safetensors'}.")
        if not overwrite and not _is_our_counts_file(out):
            raise UsageError(f"{option} {path} exists and is not an hf-vocabspec counts file: choose another name "
                             "or pass --overwrite to replace it.")
        return out
    if not out.is_dir():
        raise UsageError(f"{option} {path} is a file, not a folder: choose a folder name (it is created) or move "
                         f"the file away.")
    foreign = None if overwrite else _foreign_entries(out, kind)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f", ... ({len(foreign)} entries)" if len(foreign) > 3 else "")
        raise UsageError(f"{option} {path} exists and is not an earlier hf-vocabspec {kind} output (it holds "
                         f"{shown}): choose a new folder, or pass --overwrite to replace it and everything in it.")
    return out


def check_writable(folder: Path, what: str) -> None:
    """``folder`` must take new entries (outputs are written to a temp sibling and renamed): tried with a temp file,
    removed at once, since permission bits say nothing for root or a read-only mount. Checked before any work."""
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(prefix=".hf-vocabspec-probe-", dir=folder)
    except OSError as err:
        raise UsageError(f"{what}: cannot write in {str(folder)!r} ({err.strerror or type(err).__name__}): choose a "
                         "folder you can write, or fix its permissions.") from None
    os.close(fd)
    os.unlink(probe)


@contextlib.contextmanager
def output_folder(out: Path):
    """Create ``out`` for a command that writes into it as it goes; if the run fails before writing anything,
    remove the folder again (a failed run leaves no empty folder behind)."""
    created = [p for p in [out, *out.parents] if not p.exists()]  # this folder and any parents made for it
    out.mkdir(parents=True, exist_ok=True)
    try:
        yield out
    except BaseException:
        for folder in created:  # innermost first; stop at the first that is not empty
            if not folder.is_dir() or any(folder.iterdir()):
                break
            folder.rmdir()
        raise


def overwrite_arg(p) -> None:
    p.add_argument("--overwrite", action="store_true",
                   help="replace --output even if it is not an earlier output of this command (its files are deleted)")


def check_tokenizer_of(name: str, tokenizer, *, option: str, other: str) -> None:
    """``name`` (a model given as ``option``) must use ``tokenizer``: read its tokenizer, or its config's vocabulary
    size where it was saved without one, and ask hf_vocabspec.compatibility (which raises DrafterMismatchError, exit
    2). Cheap: no model is loaded."""
    from .._io import first_line
    from ..compatibility import check_same_tokenizer as same_tokenizer
    from ..evaluation.offline import load_tokenizer, resolve_model_path

    try:
        its = load_tokenizer(name)
    except Exception:  # noqa: BLE001 - no tokenizer there: fall back to the config below
        its = None
    if its is None:
        from transformers import AutoConfig

        try:
            its = AutoConfig.from_pretrained(resolve_model_path(name)).get_text_config().vocab_size
        except Exception as err:  # noqa: BLE001
            raise UsageError(f"{option} {name}: neither a tokenizer nor a model config could be read "
                             f"({first_line(err)}): pass a model directory, Hub id or offline name.") from err
    same_tokenizer(its, tokenizer, what=f"{option} {name}", other_name=other)


def check_storage(storage: str | None, option: str = "--storage") -> None:
    """A journal file must be creatable where it is named (else optuna fails after the latency measurement)."""
    if storage is None or "://" in storage or storage.startswith("sqlite:"):
        return
    path = Path(storage).expanduser()
    if path.is_dir():
        raise UsageError(f"{option} {storage} is a folder: name a journal file, e.g. {Path(storage) / 'study.journal'}.")
    for above in path.resolve().parents:
        if above.exists():
            if not above.is_dir():
                raise UsageError(f"{option} {storage}: {str(above)!r} is a file, not a folder: choose another path.")
            break


def check_bench_results(path: str, option: str = "--bench-results") -> None:
    """The results.json of `hf-vocabspec bench`, checked before trimming (it is read only when pushing)."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UsageError(f"{option} {path} is not readable JSON ({str(err)[:100]}): pass the results.json written "
                         "by `hf-vocabspec bench`.") from None
    if not isinstance(report, dict) or not isinstance(report.get("runs"), list):
        raise UsageError(f"{option} {path} has no 'runs' list: pass the results.json written by `hf-vocabspec bench`.")
