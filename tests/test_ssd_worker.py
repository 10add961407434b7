"""SSD's worker mode (hf_vocabspec.ssd.worker, .protocol, .processors): the drafter in its own process.

Same output as inline SSD (greedy identity with the same hits; chi-square marginals), a typed pickle-free
protocol whose version is checked, processors rebuilt from the GenerationConfig (a custom one makes the call
run inline with one warning), and a worker killed or hung mid-generation: generation goes on in-process with
the same output, one warning, and no process left behind. Every worker here is a real process.
"""

from __future__ import annotations

import ast
import signal
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from marginals import SSD_PROMPT as PROMPT
from marginals import check_ssd_lossless
from tiny import VOCAB, context_pair, make_pair
from transformers import LogitsProcessor, StoppingCriteria, StoppingCriteriaList

import hf_vocabspec
from hf_vocabspec.ssd import PROTOCOL_VERSION, SSDConfig, SSDSession, SSDWorkerError
from hf_vocabspec.ssd import protocol as p
from hf_vocabspec.ssd.worker import DraftWorker

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair(ssd_pair):
    return ssd_pair


def greedy_pair():
    target, base = make_pair("llama", seed=3, head_scale=8.0)
    return target, hf_vocabspec.trim_drafter(base, list(range(0, VOCAB, 2)) + [3, 5])


def ssd_warnings(caught) -> list[str]:
    """The SSD session's warning lines (not ordinary drafting's notes, e.g. a processor over the full vocabulary)."""
    return [str(w.message) for w in caught if "SSD" in str(w.message)]


# --- same output as inline SSD ----------------------------------------------------------------------------------
def test_worker_greedy_identical_with_the_same_hits_as_sync():
    target, drafter = greedy_pair()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (1, int(torch.randint(1, 12, (1,), generator=g))), generator=g) for _ in range(4)]
    hits = {}
    for mode in ("sync", "worker"):
        with SSDSession(drafter, SSDConfig(fan_out=3, fallback=False, mode=mode)) as ssd:
            hits[mode] = []
            for prompt in prompts:
                out = target.generate(prompt, do_sample=False, max_new_tokens=40, assistant_model=ssd)
                assert torch.equal(out, target.generate(prompt, do_sample=False, max_new_tokens=40)), (mode, prompt)
                hits[mode].append(ssd.last_stats.hits)
            assert ssd.last_stats.mode == mode
            proc = ssd.worker.proc if mode == "worker" else None
        if proc is not None:
            assert proc.poll() is not None  # leaving the block stopped the worker
    assert hits["worker"] == hits["sync"] and sum(hits["sync"]) > 0


def test_worker_sampling_with_saguaro_is_lossless(pair):  # noqa: F811
    target, drafter = pair
    with SSDSession(drafter, SSDConfig(fan_out=2, saguaro_scale=0.5, fallback=False, mode="worker")) as ssd:
        result = check_ssd_lossless(target, ssd, {"temperature": 0.8, "top_k": 20, "repetition_penalty": 1.3})
        assert ssd.last_stats.mode == "worker"  # the processors were rebuilt in the worker, not run inline
    assert result["hit_rate"] > 0.1


def test_worker_sampling_with_context_tokens_is_lossless():
    """Context tokens in the worker: the main process mirrors the worker's draft space to scatter its law."""

    target, drafter, prompt, _ = context_pair()
    with SSDSession(drafter, SSDConfig(fan_out=2, fallback=False, mode="worker")) as ssd:
        result = check_ssd_lossless(target, ssd, {"temperature": 0.9}, prompt=prompt, min_hits=5)
        assert ssd.last_stats.mode == "worker"
    assert result["context_proposed"] > 0  # pruned tokens from the prompt were drafted


# --- the protocol -----------------------------------------------------------------------------------------------
def test_protocol_round_trips_typed_messages_and_refuses_another_version():
    msg = p.RoundDrafts(new_ids=torch.tensor([7, 9]), counters={"hits": 3, "predraft_s": 0.5},
                        tokens=torch.tensor([1, 2, 3]), law=torch.rand(3, 5), top=torch.zeros(3, 4, dtype=torch.long),
                        width=5)
    frame = p.encode(msg)
    n_header, n_payload = p._FRAME.unpack(frame[: p._FRAME.size])
    header = frame[p._FRAME.size : p._FRAME.size + n_header]
    back = p.decode(header, frame[p._FRAME.size + n_header :])
    assert isinstance(back, p.RoundDrafts) and back.counters == msg.counters and back.width == 5
    for name in ("new_ids", "tokens", "law", "top"):
        assert torch.equal(getattr(back, name), getattr(msg, name)) and getattr(back, name).dtype == getattr(msg, name).dtype
    assert p.decode(*_split(p.encode(p.RoundDrafts(new_ids=torch.tensor([]), counters={})))).tokens is None
    other = header.replace(f'"protocol": {PROTOCOL_VERSION}'.encode(), b'"protocol": 99')
    with pytest.raises(p.ProtocolError, match="protocol version 99 but this process speaks") as err:
        p.decode(other, frame[p._FRAME.size + n_header :])
    assert "\n" not in str(err.value)
    with pytest.raises(p.ProtocolError, match="unknown message kind"):
        p.decode(b'{"protocol": %d, "kind": "Exec", "fields": {}}' % PROTOCOL_VERSION, b"")


def _split(frame: bytes):
    n_header, _ = p._FRAME.unpack(frame[: p._FRAME.size])
    return frame[p._FRAME.size : p._FRAME.size + n_header], frame[p._FRAME.size + n_header :]


def _worker_argv(preamble: str) -> tuple[str, ...]:
    """A real worker process that runs ``preamble`` first (patching itself), then the ordinary worker loop."""
    return (sys.executable, "-c", f"{preamble}\nfrom hf_vocabspec.ssd.worker import main\nmain()")


def test_a_worker_speaking_another_protocol_version_is_refused_in_one_line(monkeypatch):
    _, drafter = greedy_pair()
    monkeypatch.setattr(DraftWorker, "argv", _worker_argv("import hf_vocabspec.ssd.protocol as p; p.PROTOCOL_VERSION = 99"))
    with pytest.raises(SSDWorkerError, match="speaks protocol version 99") as err:
        SSDSession(drafter, SSDConfig(mode="worker", worker_timeout_s=30.0))
    assert "\n" not in str(err.value)


def test_the_ssd_package_has_no_pickle():
    """No module of hf_vocabspec.ssd imports pickle or multiprocessing (whose connections pickle objects)."""
    banned = {"pickle", "cloudpickle", "dill", "multiprocessing", "torch.multiprocessing"}
    for path in (Path(hf_vocabspec.__file__).parent / "ssd").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] in banned or n in banned for n in names), (path, names)


# --- processors: rebuilt in the worker from the GenerationConfig ------------------------------------------------
def test_a_processor_with_state_is_refused_with_ssd_and_the_next_call_uses_the_worker():
    """SSD drafts inside transformers' loop, which calls processors on drafted positions: a processor not known to
    be stateless (one the worker could not rebuild either) is refused in one line (it ran inline before the exact
    processor contract, issue #35); the session goes on serving calls without it."""
    class BanToken(LogitsProcessor):  # defined here: no worker could import it by name
        def __call__(self, input_ids, scores):
            scores[:, 11] = float("-inf")
            return scores

    target, drafter = greedy_pair()
    kwargs = {"do_sample": False, "max_new_tokens": 30, "logits_processor": [BanToken()]}
    with SSDSession(drafter, SSDConfig(fan_out=2, fallback=False, mode="worker")) as ssd:
        with pytest.raises(ValueError, match="BanToken keep") as err:
            target.generate(PROMPT, assistant_model=ssd, **kwargs)
        assert "\n" not in str(err.value) and "session.drafter" in str(err.value)
        # the next call without it uses the worker
        target.generate(PROMPT, assistant_model=ssd, do_sample=False, max_new_tokens=30)
        assert ssd.last_stats.mode == "worker" and ssd.worker.proc.poll() is None


# --- a worker killed or hung mid-generation ---------------------------------------------------------------------
class AfterTokens(StoppingCriteria):
    """Runs ``action`` once the sequence is ``n`` tokens long (the main process, between rounds)."""

    def __init__(self, n: int, action):
        self.n, self.action, self.done = n, action, False

    def __call__(self, input_ids, scores, **kwargs):
        if not self.done and input_ids.shape[1] >= self.n:
            self.done = True
            self.action()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def _continues_in_process(target, ssd, make_criteria, sample: bool = False):
    kwargs = {"do_sample": False, "max_new_tokens": 40, "min_new_tokens": 40}
    ref = target.generate(PROMPT, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        target.generate(PROMPT, assistant_model=ssd, **kwargs)  # a healthy call first
        proc = ssd.worker.proc
        out = target.generate(PROMPT, assistant_model=ssd, stopping_criteria=make_criteria(proc), **kwargs)
    assert torch.equal(out, ref)  # greedy: the same tokens
    lines = ssd_warnings(caught)
    assert len(lines) == 1 and "worker stopped" in lines[0] and "\n" not in lines[0], lines
    stats = ssd.last_stats
    assert stats.fell_back and "worker stopped" in stats.fallback_reason
    assert stats.lookups > 0 and stats.rounds > stats.lookups + 1  # SSD ran, then rounds drafted in-process
    assert proc.poll() is not None and ssd.worker.proc is None  # killed and reaped: nothing left behind
    # later calls of the session draft in-process, still exact, without a new warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(target.generate(PROMPT, assistant_model=ssd, **kwargs), ref)
    assert not ssd_warnings(caught) and "earlier call" in ssd.last_stats.fallback_reason
    return proc


def test_worker_killed_mid_generation_continues_in_process():
    target, drafter = greedy_pair()
    with SSDSession(drafter, SSDConfig(fan_out=2, fallback=False, mode="worker")) as ssd:
        proc = _continues_in_process(target, ssd, lambda proc: StoppingCriteriaList(
            [AfterTokens(PROMPT.shape[1] + 12, proc.kill)]))
    assert proc.returncode == -signal.SIGKILL


def _misbehaving_worker(action: str) -> tuple[str, ...]:
    """A real worker that runs ``action`` in the 3rd round of its 2nd generate() call (one generator per call)."""
    return _worker_argv("\n".join([
        "import time",
        "from hf_vocabspec.ssd.generator import SSDCandidateGenerator as G",
        "orig, seen = G.next_drafts, []",
        "def patched(self, *a, **k):",
        "    if not seen or seen[-1][0] is not self:",
        "        seen.append([self, 0])",
        "    seen[-1][1] += 1",
        "    if len(seen) == 2 and seen[-1][1] == 3:",
        f"        {action}",
        "    return orig(self, *a, **k)",
        "G.next_drafts = patched",
    ]))


def test_worker_hung_mid_generation_is_given_up_after_the_timeout():
    target, drafter = greedy_pair()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DraftWorker, "argv", _misbehaving_worker("time.sleep(600)"))
        ssd = SSDSession(drafter, SSDConfig(fan_out=2, fallback=False, mode="worker", worker_timeout_s=2.0))
    with ssd:
        start = time.monotonic()
        proc = _continues_in_process(target, ssd, lambda proc: None)
        assert time.monotonic() - start < 60
    assert proc.returncode == -signal.SIGKILL  # it was still sleeping: killed, not asked


def test_worker_failing_mid_generation_continues_in_process_and_says_why():
    target, drafter = greedy_pair()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DraftWorker, "argv", _misbehaving_worker("raise RuntimeError('drafter exploded')"))
        ssd = SSDSession(drafter, SSDConfig(fan_out=2, fallback=False, mode="worker"))
    with ssd:
        _continues_in_process(target, ssd, lambda proc: None)
        assert "drafter exploded" in ssd.last_stats.fallback_reason
