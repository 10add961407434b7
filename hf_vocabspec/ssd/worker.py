"""SSD's drafter worker: the drafter in its own spawned process, pre-drafting while the target verifies.

Why a process: on CPU an eager forward of a small model is dominated by Python dispatch, so two Python
threads serialise on the GIL, and ``torch.set_num_threads`` is process-global (ssd-design.md). The worker
holds its own drafter copy (loaded from a temporary ``save_pretrained`` directory: safetensors), its own
KV cache, torch threads (``SSDConfig.draft_threads``) and RNG (seeded per generate call from the main RNG).

The worker is a fresh interpreter (``python -m hf_vocabspec.ssd.worker``) that connects back over an
authenticated local socket: unlike multiprocessing's "spawn" it does not re-import the user's main script,
so scripts without an ``if __name__ == "__main__"`` guard and notebooks work.

Protocol (one request, one reply over that connection; token ids and the draft-space law are pickled, a few
hundred KB a round at most, never the full vocabulary):
  start(input_ids, generation_config, logits_processor, seed) -> ok
  round(input_ids, outcome, max_new) -> drafts(tokens, draft-space law, width, new context ids, stats)
     ... then the worker builds the speculation tree for the outcomes of THIS round while the main process
     runs the target; the next request is read once the tree is done.
  close -> the worker exits.
The main process scatters the (n, K + C) law to the full vocabulary once per round. A dead worker or no
reply within ``SSDConfig.worker_timeout_s`` raises :class:`SSDWorkerError`; nothing waits forever.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from multiprocessing.connection import Client, Listener

import torch

from ..generation import TrimmedCandidateGenerator
from .core import (
    SSDCandidateGenerator,
    SSDConfig,
    SSDStats,
    _Drafts,
    full_log_q,
    record_outcome,
    should_fall_back,
)

_POLL_S = 0.2
_STARTUP_S = 120.0  # a fresh interpreter imports torch + transformers and loads the drafter
# SSDStats counters the worker keeps (its totals for this generate call come back with every reply)
_WORKER_COUNTERS = ("lookups", "hits", "trees", "tree_branches", "tree_steps", "inline_draft_s",
                    "inline_draft_steps", "predraft_s", "draft_steps", "pruned_proposed", "context_proposed")


def _send(conn, obj) -> None:
    """Plain pickle over the authenticated socket between our own two processes (the connection's default
    pickler would try to pass torch storages as file descriptors, which needs multiprocessing's own authkey)."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn):
    return pickle.loads(conn.recv_bytes())  # our own worker, over an authenticated local socket


class SSDWorkerError(RuntimeError):
    """The SSD drafter worker died, failed, or did not answer in time."""


def _totals(gen) -> dict:
    return {n: getattr(gen.stats, n) for n in _WORKER_COUNTERS}


def _worker_main(conn) -> None:  # runs in the worker process
    try:
        path, flags, cfg = _recv(conn)
        torch.set_num_threads(cfg.draft_threads)
        from hf_vocabspec.drafter import TrimmedDrafter

        drafter = TrimmedDrafter.from_pretrained(path)
        if cfg.device is not None:
            drafter = drafter.to(cfg.device)
        drafter.eval()
        for name, value in flags.items():
            setattr(drafter, name, value)
        _send(conn, ("ready", None))
    except BaseException:  # noqa: BLE001 - report, then exit
        _send(conn, ("error", traceback.format_exc()))
        return
    gen = None
    sent_ids = 0
    while True:
        try:
            msg = _recv(conn)
        except EOFError:
            return
        kind = msg[0]
        try:
            if kind == "close":
                return
            if kind == "start":
                _, input_ids, generation_config, processors, target_vocab_size, seed = msg
                torch.manual_seed(seed)
                sync_cfg = dataclasses.replace(cfg, mode="sync", fallback=False)
                gen = SSDCandidateGenerator(input_ids.to(drafter.device), drafter, generation_config, {}, None,
                                            processors, target_vocab_size, ssd_config=sync_cfg)
                sent_ids = gen.vocab.k
                _send(conn, ("ok", None))
            elif kind == "round":
                _, input_ids, outcome, max_new, rounds = msg
                input_ids = input_ids.to(drafter.device)
                gen.outcome = outcome
                gen.stats.rounds = rounds
                gen.vocab.update(input_ids)
                drafts = gen._next_drafts(input_ids, max_new)
                new_ids = gen.vocab.ids[sent_ids:].cpu()
                sent_ids = gen.vocab.ids.numel()
                _send(conn, ("drafts", (None if drafts is None else dataclasses.replace(
                    drafts, tokens=drafts.tokens.cpu(), law=None if drafts.law is None else drafts.law.cpu(),
                    top=drafts.top.cpu()), new_ids, _totals(gen))))
                gen._predraft(input_ids, drafts)  # overlaps the target's verification of these drafts
                _send(conn, ("tree", _totals(gen)))
            else:
                raise ValueError(f"unknown SSD worker request {kind!r}")
        except BaseException:  # noqa: BLE001 - the main process raises it
            _send(conn, ("error", traceback.format_exc()))


class DraftWorker:
    """Owns the worker process; every receive is bounded by a timeout and an is_alive check."""

    def __init__(self, drafter, cfg: SSDConfig):
        self.cfg = cfg
        self.tmp = tempfile.mkdtemp(prefix="hf_vocabspec_ssd_")
        self.proc = None
        self.conn = None
        self.tree_pending = False  # a tree reply is still due (read before the next request)
        try:
            drafter.save_pretrained(self.tmp)
            flags = {name: getattr(drafter, name) for name in ("use_context_tokens", "use_rdk") if hasattr(drafter, name)}
            authkey = secrets.token_bytes(32)
            listener = Listener(family="AF_UNIX", authkey=authkey)
            env = dict(os.environ, HF_VOCABSPEC_SSD_AUTHKEY=authkey.hex())
            self.proc = subprocess.Popen([sys.executable, "-m", "hf_vocabspec.ssd.worker", listener.address], env=env)
            self.conn = self._accept(listener)
            _send(self.conn, (self.tmp, flags, cfg))
            self.expect("ready")
        except BaseException:
            self.close()
            raise

    def _accept(self, listener):
        """Wait for the worker to connect (bounded: a worker that dies on start-up is an error, not a hang)."""
        import threading

        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("conn", listener.accept()), daemon=True)
        thread.start()
        limit = max(self.cfg.worker_timeout_s, _STARTUP_S)
        deadline = time.monotonic() + limit
        while thread.is_alive():
            thread.join(_POLL_S)
            if self.proc.poll() is not None or time.monotonic() > deadline:
                listener.close()
                raise self._dead_error() if self.proc.poll() is not None else SSDWorkerError(
                    f"The SSD drafter worker did not start within {limit:.0f} s (importing torch and loading "
                    "the drafter): check the machine's load, or use SSDConfig(mode='sync').")
        listener.close()
        return box["conn"]

    def collect_tree(self) -> dict:
        """Read the pending 'tree built' reply, if any: the worker's counters after it."""
        if not self.tree_pending:
            return {}
        self.tree_pending = False
        return self.expect("tree")

    def send(self, msg) -> None:
        self._check_alive()
        try:
            _send(self.conn, msg)
        except (BrokenPipeError, ConnectionResetError, EOFError) as err:
            raise self._dead_error() from err

    def expect(self, kind: str):
        """Receive one reply of this kind (raise the worker's own traceback on 'error')."""
        deadline = time.monotonic() + self.cfg.worker_timeout_s
        while not self.conn.poll(_POLL_S):
            self._check_alive()
            if time.monotonic() > deadline:
                raise SSDWorkerError(
                    f"The SSD drafter worker did not answer within {self.cfg.worker_timeout_s:.0f} s: raise "
                    "SSDConfig(worker_timeout_s=...) for a slow drafter, or use mode='sync'.")
        try:
            got, payload = _recv(self.conn)
        except (EOFError, ConnectionResetError) as err:
            raise self._dead_error() from err
        if got == "error":
            raise SSDWorkerError(f"The SSD drafter worker failed:\n{payload}")
        if got != kind:
            raise SSDWorkerError(f"SSD worker protocol error: expected {kind!r}, got {got!r}.")
        return payload

    def _check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise self._dead_error()

    def _dead_error(self) -> SSDWorkerError:
        code = None if self.proc is None else self.proc.poll()
        return SSDWorkerError(f"The SSD drafter worker is not running (exit code {code}): it crashed or was killed; "
                              "leave the `with drafter.with_ssd(...)` block and open a new session.")

    def close(self) -> None:
        """Ask the worker to exit, then make sure it has (idempotent)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                try:
                    _send(self.conn, ("close",))
                except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                    pass
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
            if self.conn is not None:
                self.conn.close()
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


class WorkerCandidateGenerator(TrimmedCandidateGenerator):
    """Main-process side of worker-mode SSD: hands out the worker's drafts, scatters their law, learns outcomes.

    Inherits the ordinary trimmed drafting (used after a fallback, with the main process's drafter).
    """

    def __init__(self, input_ids, assistant_model, generation_config, model_kwargs, inputs_tensor=None,
                 logits_processor=None, target_vocab_size=None, *, ssd_config: SSDConfig, worker: DraftWorker):
        super().__init__(input_ids, assistant_model, generation_config, model_kwargs, inputs_tensor,
                         logits_processor, target_vocab_size)
        self.ssd_config = ssd_config
        if ssd_config.num_assistant_tokens is not None:
            self.num_assistant_tokens = ssd_config.num_assistant_tokens
        self.num_assistant_tokens = int(self.num_assistant_tokens)
        self.assistant_generation_config.num_assistant_tokens_schedule = "constant"
        self.assistant_confidence_threshold = 0.0
        self.worker = worker
        self.stats = SSDStats(mode="worker")
        self.drafter.last_speculation_stats = self.stats
        self.ids = self.drafter.d2t.clone()  # the worker's draft space (kept rows + context tokens it added)
        self.outcome = None
        self.active = True
        self._t_returned = None
        worker.collect_tree()  # the previous generate call's last tree
        worker.send(("start", input_ids.cpu(), generation_config, list(logits_processor or []),
                     target_vocab_size, int(torch.randint(0, 2**62, (1,)))))
        worker.expect("ok")

    def _collect_tree(self) -> None:
        self._take(self.worker.collect_tree())

    def _take(self, totals: dict) -> None:
        for name, value in totals.items():
            setattr(self.stats, name, value)

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs):
        if not self.active:
            return super().get_candidates(input_ids, *args, **kwargs)
        max_new = min(self.num_assistant_tokens, self.main_model_max_length - input_ids.shape[1] - 1)
        if max_new <= 0:
            return input_ids.to(self.drafter.device), None
        t0 = time.perf_counter()
        self._collect_tree()
        self.worker.send(("round", input_ids.cpu(), self.outcome, max_new, self.stats.rounds))
        drafts, new_ids, totals = self.worker.expect("drafts")
        self.stats.wait_s += time.perf_counter() - t0
        self.worker.tree_pending = True
        self._take(totals)
        if new_ids.numel():
            self.ids = torch.cat([self.ids, new_ids.to(self.ids.device)])
        input_ids = input_ids.to(self.drafter.device)
        if drafts is None or drafts.tokens.numel() == 0:
            result = input_ids, None
        else:
            d = self.drafter.device
            drafts = _Drafts(drafts.tokens.to(d), None if drafts.law is None else drafts.law.to(d), drafts.top,
                             drafts.width)
            seq = torch.cat([input_ids, drafts.tokens[None]], dim=1)
            result = seq, (full_log_q(drafts, self.ids, self.drafter.d2t.numel(), self.rdk,
                                      self.drafter.config.vocab_size) if self.do_sample else None)
        self._t_returned = time.perf_counter()
        return result

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        record_outcome(self, input_ids, num_matches)
        super().update_candidate_strategy(input_ids, scores, num_matches)
        cfg = self.ssd_config
        if self.active and cfg.fallback and self.stats.rounds == cfg.probe_rounds:
            reason = worker_fallback_reason(self.stats, self.num_assistant_tokens)
            if reason is not None:
                self._collect_tree()
                self.active = False
                self.stats.fell_back = True
                self.stats.fallback_reason = reason
                warnings.warn(f"hf_vocabspec: {reason}.", stacklevel=2)


def worker_fallback_reason(stats: SSDStats, num_draft_tokens: int) -> str | None:
    """Measured, not modelled: per round SSD costs t_v' + wait (time blocked on the worker), ordinary SD
    L t_d + t_v. t_v is not measured in an SSD run, so t_v' (verification next to the busy worker) stands
    in for it; where contention slows the target, that favours SSD, so a bench run should still compare
    against ordinary SD (README)."""
    if stats.rounds == 0 or stats.inline_draft_steps == 0:
        return should_fall_back(stats, num_draft_tokens, "neural", "dedicated")
    wait = stats.wait_s / stats.rounds
    jit = num_draft_tokens * stats.draft_step_s
    if wait <= jit:
        return None
    return (f"SSD cannot pay here (waited {1e3 * wait:.1f} ms a round for the drafter worker vs "
            f"{1e3 * jit:.1f} ms to draft {num_draft_tokens} tokens inline, hit rate {stats.hit_rate:.2f}): "
            "falling back to ordinary speculative decoding")


if __name__ == "__main__":
    _worker_main(Client(sys.argv[1], family="AF_UNIX", authkey=bytes.fromhex(os.environ["HF_VOCABSPEC_SSD_AUTHKEY"])))
