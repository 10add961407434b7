"""Drive every bad input of issue 29 (and the older ones the bad-input tests of tests/test_cli.py, test_drafter.py,
test_generation.py, ... cover) through the real CLI and API, and print one table: case | expected | outcome (good / silent / crash / late / unclear).

good: refused in one line that says what was expected (or, for a combination that must work, it worked);
silent: accepted (or a saved value lost) without a word; crash: a traceback or a library's own exception type;
late: refused only after loading, counting or timing began; unclear: refused, but the message misses the point.

    PYTHONPATH=. python scripts/bad_inputs.py            # the table; exit 1 when any case is not good
    PYTHONPATH=. python scripts/bad_inputs.py --only cli # cases whose name holds 'cli'

CLI cases run ``hf_vocabspec.cli.main`` in this process with loading, counting and the runs replaced by a sentinel
(reaching one = the command went on to work), plus one real subprocess; API cases use the tiny models of
tests/tiny.py. A script, not a test: it reports, it does not assert.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # tiny.py

import torch  # noqa: E402

SMOL = "offline:smollm2-135m-instruct"
LIBRARY_ERRORS = (IndexError, KeyError, AttributeError, TypeError, RuntimeError, AssertionError, ZeroDivisionError)


class Reached(BaseException):  # noqa: N818 - a sentinel, not an error (main() must not catch it)
    """A CLI command got past its checks into loading, counting or running."""


@dataclass
class Case:
    name: str
    expected: str  # the words a good refusal holds; "works" for a combination that must run
    run: Callable[[], object]  # raises on refusal; returns for acceptance (a CLI case returns (rc, stderr))
    accept: Callable[[object], bool] | None = None  # for "works" cases: whether what ran is right
    fails_later: bool = False  # reaching work means "late" (the write fails after it), not "silent"


# --- helpers ----------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def sentinels():
    """Loading, counting and the command runs raise Reached (so a refused command costs nothing)."""
    import hf_vocabspec.cli._common as common
    from hf_vocabspec.evaluation import batch_bench, benchmark, offline, tune

    def reached(*a, **k):
        raise Reached("reached work")

    patched = [(offline, "load_model"), (offline, "load_chat_dataset"), (common, "count_for_args"),
               (benchmark, "run_benchmark"), (batch_bench, "run_batch_bench"), (tune, "run_tune")]
    saved = [(m, n, getattr(m, n)) for m, n in patched]
    for m, n in patched:
        setattr(m, n, reached)
    try:
        yield
    finally:
        for m, n, v in saved:
            setattr(m, n, v)


def cli(*argv: str, work: bool = False) -> Callable[[], tuple[int, str]]:
    """A CLI call in this process: (exit code, stderr); ``work`` lets it load and count for real."""
    def call():
        from hf_vocabspec.cli import main

        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
                (contextlib.nullcontext() if work else sentinels()):
            try:
                rc = main(list(argv))
            except SystemExit as exit_:
                rc = exit_.code
        return rc, err.getvalue()
    return call


def unwritable_dir(tmp: Path) -> Path | None:
    """A folder this process cannot create files in (read-only; /sys for root), or None."""
    folder = tmp / "read-only"
    folder.mkdir(exist_ok=True)
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys")):
        try:
            fd, probe = tempfile.mkstemp(dir=candidate)
        except OSError:
            return candidate
        os.close(fd)
        os.unlink(probe)
    return None


def tiny_pair():
    from tiny import make_pair

    import hf_vocabspec

    target, base = make_pair()
    return target, hf_vocabspec.trim_drafter(base, torch.arange(3, 40))


def gpt2_drafter(n_positions: int = 16):
    from transformers import GPT2Config, GPT2LMHeadModel

    import hf_vocabspec

    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=n_positions,
                                      bos_token_id=1, eos_token_id=2)).eval()
    return hf_vocabspec.trim_drafter(base, torch.arange(3, 30))


def generate(target, assistant, ids, **kwargs):
    return lambda: target.generate(ids, assistant_model=assistant, max_new_tokens=kwargs.pop("max_new_tokens", 3),
                                   do_sample=False, **kwargs)


def with_env(name: str, value: str, call: Callable[[], object]) -> Callable[[], object]:
    def run():
        old = os.environ.get(name)
        os.environ[name] = value
        try:
            return call()
        finally:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
    return run


# --- the cases ----------------------------------------------------------------------------------------------------
def build_cases(tmp: Path) -> list[Case]:
    import hf_vocabspec
    from hf_vocabspec import TokenCounts, TrimmedDrafter, tokenizer_sha256
    from hf_vocabspec.evaluation import offline
    from hf_vocabspec.generation.hooks import check_attention_mask, check_generate_kwargs, check_inputs

    tok = offline.load_tokenizer(SMOL)
    ro = unwritable_dir(tmp)
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": f"hello world {i}"}]}
            for i in range(20)]
    counts = hf_vocabspec.count_assistant_tokens(rows, tok, progress=False)
    counts.save(tmp / "counts.safetensors")
    special = torch.zeros(len(tok), dtype=torch.int64)
    special[sorted(set(tok.all_special_ids))] = 7
    TokenCounts(special, 5, 5, SMOL, tokenizer_sha256(tok)).save(tmp / "special.safetensors")
    empty = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": c}]}
             for c in (None, "", "  ")]
    (tmp / "empty_turns.jsonl").write_text("".join(json.dumps(r) + "\n" for r in empty))
    (tmp / "empty.jsonl").write_text("")

    target, drafter = tiny_pair()
    ids = torch.tensor([[1, 5, 6, 7]])
    batch = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])

    def saved(value: str, edit: dict | None = None) -> Path:
        _, d = tiny_pair()
        d.generation_config.batched_speculation = value
        path = tmp / f"drafter-{value}-{len(edit or {})}"
        d.save_pretrained(path)
        if edit:
            gen = path / "generation_config.json"
            gen.write_text(json.dumps(json.loads(gen.read_text()) | edit))
        return path

    def round_trip(value: str, edit: dict | None = None):
        return TrimmedDrafter.from_pretrained(saved(value, edit)).generation_config

    def maybe_at_batch_1():
        _, d = tiny_pair()
        d.generation_config.batched_speculation = "maybe"
        return target.generate(ids, assistant_model=d, max_new_tokens=3, do_sample=False)

    def save_into(folder: Path):
        return drafter.save_pretrained(folder / "drafter")

    def corrupt_cache():
        cache = tmp / "corrupt-cache"
        entry = cache / "v2" / "models" / SMOL.removeprefix("offline:")
        entry.mkdir(parents=True, exist_ok=True)
        (entry / "config.json").write_text("{broken")
        return with_env("HF_VOCABSPEC_CACHE", str(cache), lambda: offline.load_model(SMOL))()

    def full_cache():
        def full(final, build):
            raise OSError(errno.ENOSPC, "No space left on device")

        original = offline.build_once
        offline.build_once = full
        try:
            return with_env("HF_VOCABSPEC_CACHE", str(tmp / "full-cache"), lambda: offline.resolve_model_path(SMOL))()
        finally:
            offline.build_once = original

    def plain_as_drafter():
        from tiny import llama_config
        from transformers import LlamaForCausalLM

        LlamaForCausalLM(llama_config()).save_pretrained(tmp / "plain")
        return TrimmedDrafter.from_pretrained(tmp / "plain")

    def ssd(**kw):
        from hf_vocabspec.ssd import SSDConfig, SSDSession

        def run():
            cfg = SSDConfig(**kw)
            return SSDSession(drafter, cfg).close() if kw.get("mode", "sync") == "sync" else cfg
        return run

    def subprocess_cli():
        proc = subprocess.run([sys.executable, "-m", "hf_vocabspec.cli", "trim", "--min-coverage", "2"], cwd=tmp,
                              capture_output=True, text=True, check=False, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        return proc.returncode, proc.stderr

    cases = [
        # issue 29: options a command cannot honour
        Case("cli tune --mode t1 --confidence-thresholds", "--confidence-thresholds and --mode t1 contradict",
             cli("tune", "--mode", "t1", "--confidence-thresholds", "0.3", "0.5", "--output", str(tmp / "o"))),
        Case("cli tune --acceptance ideal --confidence-thresholds",
             "--confidence-thresholds and --acceptance ideal contradict",
             cli("tune", "--acceptance", "ideal", "--confidence-thresholds", "0.3", "--output", str(tmp / "o"))),
        Case("cli bench --batched-speculation without --batch-sizes", "only applies with --batch-sizes",
             cli("bench", "--batched-speculation", "off", "--output", str(tmp / "o"))),
        Case("cli bench --batch-sizes --ks", "--batch-sizes and --ks contradict",
             cli("bench", "--batch-sizes", "2", "--ks", "5000", "--output", str(tmp / "o"))),
        Case("cli bench --ks 5000 --coverages 0.9 (both trimmed)", "works",
             cli("bench", "--target", SMOL, "--ks", "5000", "--coverages", "0.9", "--output", str(tmp / "o")),
             accept=None),  # filled below: reaching run_benchmark with both in its config
        # issue 29: folders, cache, messages
        Case("cli count --output into an unwritable folder", "cannot write in",
             cli("count", "--output", str((ro or tmp) / "counts.safetensors")), fails_later=True),
        Case("cli trim --output into an unwritable folder", "cannot write in",
             cli("trim", "--k", "100", "--output", str((ro or tmp) / "drafter")), fails_later=True),
        Case("api save_pretrained into an unwritable folder", "is not writable", lambda: save_into(ro or tmp)),
        Case("api HF_VOCABSPEC_CACHE unwritable", "cannot be created",
             with_env("HF_VOCABSPEC_CACHE", str((ro or tmp) / "cache"), lambda: offline.resolve_model_path(SMOL))),
        Case("api HF_VOCABSPEC_CACHE full (ENOSPC)", "is full", full_cache),
        Case("api HF_VOCABSPEC_CACHE corrupt entry", "corrupt or incomplete", corrupt_cache),
        Case("cli select on special-token-only counts", "only special tokens",
             cli("select", "--counts", str(tmp / "special.safetensors"), "--output", str(tmp / "o"))),
        Case("cli count on empty/null assistant turns", "empty content",
             cli("count", "--tokenizer", SMOL, "--dataset", str(tmp / "empty_turns.jsonl"),
                 "--output", str(tmp / "c.safetensors"), work=True)),
        Case("cli bench --target <counts file>", "select --counts",
             cli("bench", "--target", str(tmp / "counts.safetensors"), "--output", str(tmp / "o"))),
        Case("api plain model as drafter", "trim it first", plain_as_drafter),
        Case("api SSDConfig(device='gpu')", "not a torch device name", ssd(device="gpu", mode="worker")),
        Case("api SSDConfig(device='cuda:99')", "not available on this machine", ssd(device="cuda:99", mode="worker")),
        Case("api SSDSession sync with device=", "contradict", ssd(device="cpu")),
        # issue 29: batched_speculation
        Case("api batched_speculation 'off' survives save/load", "works", lambda: round_trip("off"),
             accept=lambda gen: getattr(gen, "batched_speculation", None) == "off"),
        Case("api batched_speculation of an older save (_from_model_config)", "works",
             lambda: round_trip("on", {"_from_model_config": True}),
             accept=lambda gen: getattr(gen, "batched_speculation", None) == "on"),
        Case("api batched_speculation 'maybe' in generation_config.json", "got 'maybe'",
             lambda: round_trip("auto", {"batched_speculation": "maybe"})),
        Case("api batched_speculation 'maybe' at batch 1", "got 'maybe'", maybe_at_batch_1),
        # issue 29: positions, masks, two drafting methods
        Case("api 16-position GPT-2 drafter, 20-token prompt", "handles at most 16",
             generate(target, gpt2_drafter(), torch.randint(3, 60, (1, 20)))),
        Case("api 16-position drafter, 10-token prompt + 10 new (generate)", "handles at most 16",
             generate(target, gpt2_drafter(), torch.randint(3, 60, (1, 10)), max_new_tokens=10)),
        Case("api check_inputs(max_length=20) on a 16-position drafter", "lower max_new_tokens",
             lambda: check_inputs(target, gpt2_drafter(), torch.randint(3, 60, (1, 10)), None, max_length=20)),
        Case("api generate: all-ones mask of 3 rows at batch 2", "attention_mask has 3 rows",
             generate(target, drafter, batch, attention_mask=torch.ones(3, 4, dtype=torch.long))),
        Case("api generate: 1-D mask at batch 2", "1-D",
             generate(target, drafter, batch, attention_mask=torch.ones(4, dtype=torch.long))),
        Case("api check_attention_mask: 3 rows at batch 2", "attention_mask has 3 rows",
             lambda: check_attention_mask(batch, torch.ones(3, 4, dtype=torch.long))),
        Case("api check_attention_mask: 1-D at batch 2", "1-D",
             lambda: check_attention_mask(batch, torch.ones(4, dtype=torch.long))),
        Case("api generate: assistant_model + prompt_lookup_num_tokens", "prompt_lookup_num_tokens",
             generate(target, drafter, ids, prompt_lookup_num_tokens=3)),
        Case("api check_generate_kwargs: assistant + prompt lookup", "pass one of them",
             lambda: check_generate_kwargs(type("G", (), {"prompt_lookup_num_tokens": 3})(), assistant_model=drafter)),
        # older cases (bad-input tests in tests/test_cli.py, test_drafter.py, test_generation.py, ...)
        Case("cli trim --min-coverage 1.5", "must be in (0, 1]", cli("trim", "--min-coverage", "1.5")),
        Case("cli trim --k 100000", "beyond the vocabulary", cli("trim", "--k", "100000", "--output", str(tmp / "o"))),
        Case("cli trim --k 10 --min-coverage 0.9", "contradict",
             cli("trim", "--k", "10", "--min-coverage", "0.9", "--output", str(tmp / "o"))),
        Case("cli tune --ks 100 --coverages 0.9", "contradict",
             cli("tune", "--ks", "100", "--coverages", "0.9", "--output", str(tmp / "o"))),
        Case("cli select --counts <missing>", "No such counts file",
             cli("select", "--counts", str(tmp / "missing.safetensors"))),
        Case("cli rdk-fit ./no-such-drafter", "No such drafter directory", cli("rdk-fit", "./no-such-drafter")),
        Case("cli count on an empty dataset file", "is empty",
             cli("count", "--tokenizer", SMOL, "--dataset", str(tmp / "empty.jsonl"),
                 "--output", str(tmp / "c2.safetensors"), work=True)),
        Case("cli subprocess trim --min-coverage 2 (exit 2, one line)", "must be in (0, 1]", subprocess_cli),
        Case("api token id beyond the vocabulary", "outside the target's vocabulary",
             generate(target, drafter, torch.tensor([[1, 5, 900]]))),
        Case("api right-padded batch", "Right-padded",
             generate(target, drafter, batch, attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]))),
        Case("api num_assistant_tokens=0", "positive integer", generate(target, drafter, ids, num_assistant_tokens=0)),
    ]
    bench_both = cases[4]

    def bench_run():
        from hf_vocabspec.evaluation import benchmark

        seen = {}

        def capture(cfg, out, progress=None):
            seen["cfg"] = cfg
            raise Reached("reached run_benchmark")

        with sentinels():
            original, benchmark.run_benchmark = benchmark.run_benchmark, capture
            try:
                cli("bench", "--target", SMOL, "--ks", "5000", "--coverages", "0.9", "--output", str(tmp / "o"),
                    work=True)()
            except Reached:
                pass
            finally:
                benchmark.run_benchmark = original
        return seen.get("cfg")

    bench_both.run = bench_run
    bench_both.accept = lambda cfg: cfg is not None and cfg.ks == (5000,) and cfg.coverages == (0.9,)
    return cases


# --- classification ---------------------------------------------------------------------------------------------
def classify(case: Case) -> tuple[str, str]:
    """(outcome, the message or what happened)."""
    try:
        got = case.run()
    except Reached:
        if case.expected == "works":
            return "good", "went on to run"
        return ("late" if case.fails_later else "silent"), "went on to load/count/run"
    except Exception as err:  # noqa: BLE001 - classified
        text = str(err).strip()
        first = text.splitlines()[0] if text else type(err).__name__
        if case.expected == "works":
            return "crash" if isinstance(err, LIBRARY_ERRORS) else "unclear", f"{type(err).__name__}: {first}"
        if case.expected in text and "\n" not in text:
            return "good", first
        if isinstance(err, LIBRARY_ERRORS) and case.expected not in text:
            return "crash", f"{type(err).__name__}: {first}"
        return "unclear", f"{type(err).__name__}: {first}"
    if case.expected == "works":
        ok = case.accept(got) if case.accept else True
        return ("good", "worked") if ok else ("silent", f"ran, but lost or ignored a value ({got!r:.80})")
    if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], int):  # a CLI call: (rc, stderr)
        rc, err = got
        lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
        last = lines[-1] if lines else ""
        if rc == 0:
            return "silent", "exit 0"
        if "Traceback" in err:
            return "crash", last
        if case.expected in last and "error:" in last:
            return "good", last
        return "unclear", last or f"exit {rc}"
    return "silent", "accepted"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="run the cases whose name holds this text")
    args = parser.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="bad-inputs-") as tmp:
        cases = build_cases(Path(tmp))
        rows = []
        for case in cases:
            if args.only and args.only not in case.name:
                continue
            outcome, said = classify(case)
            rows.append((case.name, case.expected, outcome, said))
        for p in Path(tmp).rglob("*"):  # give a chmod'ed folder back so the temp folder can go
            if p.is_dir():
                p.chmod(0o755)
    width = max(len(r[0]) for r in rows)
    exp = max(len(r[1]) for r in rows)
    print(f"{'case':<{width}} | {'expected':<{exp}} | outcome | message")
    print(f"{'-' * width}-|-{'-' * exp}-|---------|--------")
    for name, expected, outcome, said in rows:
        print(f"{name:<{width}} | {expected:<{exp}} | {outcome:<7} | {said[:160]}")
    tally = {o: sum(r[2] == o for r in rows) for o in ("good", "silent", "crash", "late", "unclear")}
    print("\n" + ", ".join(f"{n} {o}" for o, n in tally.items()))
    return 0 if tally["good"] == len(rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
