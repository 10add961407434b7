"""SSD's drafter worker: the drafter in its own process, pre-drafting while the target verifies.

Why a process: on CPU an eager forward of a small model is dominated by Python dispatch, so two Python
threads serialise on the GIL, and ``torch.set_num_threads`` is process-global (ssd-design.md). The worker
holds its own drafter copy (loaded from a temporary ``save_pretrained`` directory: safetensors), its own
KV cache, torch threads (``SSDConfig.draft_threads``) and RNG (seeded per generate call from the main RNG).

The worker is a fresh interpreter (``python -m hf_vocabspec.ssd.worker <fd>``) holding one end of a private
socketpair: unlike multiprocessing's "spawn" it does not re-import the user's main script, so scripts without
an ``if __name__ == "__main__"`` guard and notebooks work. It speaks hf_vocabspec.ssd.protocol (JSON headers +
safetensors bytes, versioned) and drives the same drafting API as the inline path
(:meth:`SSDCandidateGenerator.next_drafts` / :meth:`~SSDCandidateGenerator.predraft`).

Failure: a dead worker, a reply missing past ``SSDConfig.worker_timeout_s`` or a protocol error makes the main
process kill the worker and draft ordinarily in-process from that round on (still lossless; one warning); the
session keeps drafting in-process afterwards. The worker exits when its connection closes.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import torch

from .._io import first_line
from ..generation import TrimmedCandidateGenerator
from . import protocol as p
from .cache import Drafts, full_log_q
from .config import SSDConfig, SSDStats, fix_draft_length
from .outcomes import Outcome, observe_outcome
from .processors import PromptFacts, config_from_dict, config_to_dict, processors_from_config
from .fallback import worker_fallback_reason
from .protocol import SSDWorkerError

_STARTUP_S = 120.0  # a fresh interpreter imports torch + transformers and loads the drafter
# SSDStats counters the worker keeps (its totals for this generate call come back with every reply)
WORKER_COUNTERS = ("lookups", "hits", "trees", "tree_branches", "tree_steps", "inline_draft_s",
                   "inline_draft_steps", "predraft_s", "draft_steps", "pruned_proposed", "context_proposed")


def _counters(gen) -> dict:
    return {n: getattr(gen.stats, n) for n in WORKER_COUNTERS}


# --- the worker process -----------------------------------------------------------------------------------------
def serve(channel: p.Channel) -> None:
    """The worker's loop: one reply per request (Failed with the traceback on an error) until Close or EOF."""
    from .generator import SSDCandidateGenerator

    channel.send(p.Hello(pid=os.getpid()))
    try:
        setup = channel.recv()
        if not isinstance(setup, p.Setup):
            raise p.ProtocolError(f"expected Setup, got {type(setup).__name__}")
        cfg = SSDConfig.from_dict(setup.ssd_config)
        torch.set_num_threads(cfg.draft_threads)
        from hf_vocabspec.modeling import TrimmedDrafter

        drafter = TrimmedDrafter.from_pretrained(setup.drafter_path)
        if cfg.device is not None:
            drafter = drafter.to(cfg.device)
        drafter.eval()
        for name, value in setup.flags.items():
            setattr(drafter, name, value)
        channel.send(p.Ready())
    except EOFError:
        return
    except BaseException:  # noqa: BLE001 - report, then exit
        channel.send(p.Failed(traceback.format_exc()))
        return
    gen = None
    sent_ids = 0
    while True:
        try:
            msg = channel.recv()
        except EOFError:
            return
        try:
            if isinstance(msg, p.Close):
                return
            if isinstance(msg, p.Start):
                torch.manual_seed(msg.seed)
                gc = config_from_dict(msg.generation_config)
                facts = PromptFacts(msg.prompt_length, None if msg.prompt_padding is None else tuple(msg.prompt_padding))
                procs = processors_from_config(gc, facts, device=drafter.device)
                sync_cfg = dataclasses.replace(cfg, mode="sync", fallback=False, num_draft_tokens=msg.draft_length)
                gen = SSDCandidateGenerator(msg.input_ids.to(drafter.device), drafter, gc, {}, None, procs,
                                            msg.target_vocab_size, ssd_config=sync_cfg)
                sent_ids = gen.vocab.k
                channel.send(p.Started())
            elif isinstance(msg, p.Round):
                input_ids = msg.input_ids.to(drafter.device)
                gen.observe(None if msg.outcome is None else Outcome(*msg.outcome), msg.rounds)
                drafts = gen.next_drafts(input_ids, msg.max_new)
                new_ids = gen.vocab.ids[sent_ids:]
                sent_ids = gen.vocab.ids.numel()
                reply = p.RoundDrafts(new_ids=new_ids, counters=_counters(gen))
                if drafts is not None:
                    reply = dataclasses.replace(reply, tokens=drafts.tokens, law=drafts.law, top=drafts.top,
                                                width=drafts.width)
                channel.send(reply)
                gen.predraft(input_ids, drafts)  # overlaps the target's verification of these drafts
                channel.send(p.TreeBuilt(_counters(gen)))
            else:
                raise p.ProtocolError(f"unexpected request {type(msg).__name__}")
        except BaseException:  # noqa: BLE001 - the main process decides
            channel.send(p.Failed(traceback.format_exc()))


def main(argv: list[str] | None = None) -> None:
    """Entry point of the worker interpreter: the last argument is the inherited socket's file descriptor."""
    argv = sys.argv[1:] if argv is None else argv
    serve(p.Channel(socket.socket(fileno=int(argv[-1]))))


# --- the main process's handle on it ---------------------------------------------------------------------------
class DraftWorker:
    """Owns the worker process; every receive is bounded by a timeout and a liveness check.

    ``argv`` is the worker's command line (the socket's descriptor is appended).
    """

    argv: tuple[str, ...] = (sys.executable, "-m", "hf_vocabspec.ssd.worker")

    def __init__(self, drafter, ssd_config: SSDConfig):
        self.ssd_config = ssd_config
        self.tmp = tempfile.mkdtemp(prefix="hf_vocabspec_ssd_")
        self.proc = None
        self.channel = None
        self.failure: str | None = None  # why the worker was given up (the session drafts in-process after it)
        self.tree_pending = False  # a TreeBuilt reply is still due (read before the next request)
        try:
            drafter.save_pretrained(self.tmp)
            flags = {n: getattr(drafter, n) for n in ("use_context_tokens", "use_rdk") if hasattr(drafter, n)}
            mine, theirs = socket.socketpair()
            try:
                self.proc = subprocess.Popen([*self.argv, str(theirs.fileno())], pass_fds=(theirs.fileno(),))
            finally:
                theirs.close()
            self.channel = p.Channel(mine)
            self.expect(p.Hello, timeout_s=max(ssd_config.worker_timeout_s, _STARTUP_S),
                        what="start (importing torch and loading the drafter)")
            self.send(p.Setup(self.tmp, flags, ssd_config.to_dict()))
            self.expect(p.Ready, timeout_s=max(ssd_config.worker_timeout_s, _STARTUP_S), what="load the drafter")
        except BaseException:
            self.close()
            raise

    def send(self, msg) -> None:
        self._check_alive()
        limit = self.ssd_config.worker_timeout_s
        try:
            self.channel.send(msg, timeout_s=limit)
        except TimeoutError:
            raise SSDWorkerError(f"The SSD drafter worker did not read a request within {limit:.0f} s: raise "
                                 "SSDConfig(worker_timeout_s=...) for a slow drafter, or use mode='sync'.") from None
        except OSError as err:
            raise self._dead_error() from err

    def expect(self, kind: type, timeout_s: float | None = None, what: str = "answer"):
        """Receive one reply of this type (raise the worker's own traceback on Failed)."""
        limit = self.ssd_config.worker_timeout_s if timeout_s is None else timeout_s
        try:
            got = self.channel.recv(deadline=time.monotonic() + limit, alive=self._check_alive)
        except TimeoutError:
            raise SSDWorkerError(f"The SSD drafter worker did not {what} within {limit:.0f} s: raise "
                                 "SSDConfig(worker_timeout_s=...) for a slow drafter, or use mode='sync'.") from None
        except (EOFError, OSError) as err:
            raise self._dead_error() from err
        if isinstance(got, p.Failed):
            last = got.error.strip().splitlines()[-1] if got.error.strip() else "no traceback"
            raise SSDWorkerError(f"The SSD drafter worker failed ({last}); its traceback:\n{got.error}")
        if not isinstance(got, kind):
            raise p.ProtocolError(f"SSD worker protocol error: expected {kind.__name__}, got {type(got).__name__}.")
        return got

    def collect_tree(self) -> dict:
        """Read the pending TreeBuilt reply, if any: the worker's counters after it."""
        if not self.tree_pending:
            return {}
        self.tree_pending = False
        return self.expect(p.TreeBuilt).counters

    def _check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise self._dead_error()

    def _dead_error(self) -> SSDWorkerError:
        code = None if self.proc is None else self.proc.poll()
        return SSDWorkerError(f"The SSD drafter worker is not running (exit code {code}): it crashed or was killed.")

    def give_up(self, reason: str) -> None:
        """Record why the worker is no longer used and stop it now (killed: it may be hung)."""
        self.failure = self.failure or reason
        self.close(kill=True)

    def close(self, kill: bool = False) -> None:
        """Ask the worker to exit (or kill it), make sure it has, remove its drafter copy (idempotent)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None and not kill:
                try:
                    self.channel.send(p.Close())
                    proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


class WorkerCandidateGenerator(TrimmedCandidateGenerator):
    """Main-process side of worker-mode SSD: hands out the worker's drafts, scatters their law, learns outcomes.

    Inherits ordinary trimmed drafting, used with the main process's drafter after a fallback or when the
    worker fails (then with one warning, and the worker is stopped).
    """

    def __init__(self, input_ids, assistant_model, generation_config, model_kwargs, inputs_tensor=None,
                 logits_processor=None, target_vocab_size=None, *, ssd_config: SSDConfig, worker: DraftWorker):
        super().__init__(input_ids, assistant_model, generation_config, model_kwargs, inputs_tensor,
                         logits_processor, target_vocab_size)
        self.ssd_config = ssd_config
        fix_draft_length(self, ssd_config)
        self.worker = worker
        self.stats = SSDStats(mode="worker")
        self.drafter.last_speculation_stats = self.stats
        self.ids = self.drafter.d2t.clone()  # the worker's draft space (kept rows + context tokens it added)
        self.outcome: Outcome | None = None
        self.active = True
        self.returned_at: float | None = None
        facts = PromptFacts.of(input_ids, model_kwargs)
        start = p.Start(input_ids.cpu(), config_to_dict(generation_config), facts.length,
                        None if facts.padding is None else list(facts.padding), target_vocab_size,
                        int(torch.randint(0, 2**62, (1,))), self.num_assistant_tokens)
        self._on_worker(lambda: (worker.collect_tree(), worker.send(start), worker.expect(p.Started)))

    def _on_worker(self, call):
        """Run ``call``; on a worker failure stop the worker, warn once and draft in-process (returns None)."""
        try:
            return call()
        except SSDWorkerError as err:
            reason = first_line(err)
            self.worker.give_up(reason)
            self.active = False
            self.stats.fell_back = True
            self.stats.fallback_reason = f"the SSD drafter worker stopped ({reason})"
            warnings.warn(f"hf_vocabspec: {self.stats.fallback_reason}; drafting in this process from here on "
                          "(still lossless).", stacklevel=4)
            return None

    def _take(self, counters: dict) -> None:
        for name in WORKER_COUNTERS:
            if name in counters:
                setattr(self.stats, name, counters[name])

    def _round(self, input_ids: torch.LongTensor, max_new: int) -> p.RoundDrafts:
        self._take(self.worker.collect_tree())
        outcome = None if self.outcome is None else [self.outcome.accepted, self.outcome.token, self.outcome.length]
        self.worker.send(p.Round(input_ids.cpu(), outcome, max_new, self.stats.rounds))
        reply = self.worker.expect(p.RoundDrafts)
        self.worker.tree_pending = True
        return reply

    @torch.no_grad()
    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs):
        if self.active:
            max_new = min(self.num_assistant_tokens, self.main_model_max_length - input_ids.shape[1] - 1)
            if max_new <= 0:
                return input_ids.to(self.drafter.device), None
            t0 = time.perf_counter()
            reply = self._on_worker(lambda: self._round(input_ids, max_new))
            if reply is not None:
                self.stats.wait_s += time.perf_counter() - t0
                self._take(reply.counters)
                result = self._candidates(input_ids.to(self.drafter.device), reply)
                self.returned_at = time.perf_counter()
                return result
        return super().get_candidates(input_ids, *args, **kwargs)

    def _candidates(self, input_ids: torch.LongTensor, reply: p.RoundDrafts):
        if reply.new_ids.numel():
            self.ids = torch.cat([self.ids, reply.new_ids.to(self.ids.device)])
        if reply.tokens is None or reply.tokens.numel() == 0:
            return input_ids, None
        d = self.drafter.device
        drafts = Drafts(reply.tokens.to(d), None if reply.law is None else reply.law.to(d), reply.top, reply.width)
        seq = torch.cat([input_ids, drafts.tokens[None]], dim=1)
        if not self.do_sample:
            return seq, None
        return seq, full_log_q(drafts, self.ids, self.drafter.d2t.numel(), self.rdk, self.target_vocab_size)

    def update_candidate_strategy(self, input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: int):
        observe_outcome(self, input_ids, num_matches)
        super().update_candidate_strategy(input_ids, scores, num_matches)
        cfg = self.ssd_config
        if self.active and cfg.fallback and self.stats.rounds == cfg.probe_rounds:
            reason = worker_fallback_reason(self.stats, self.num_assistant_tokens)
            if reason is not None:
                self._on_worker(lambda: self._take(self.worker.collect_tree()))
                if self.active:
                    self.active = False
                    self.stats.fell_back = True
                    self.stats.fallback_reason = reason
                    warnings.warn(f"hf_vocabspec: {reason}.", stacklevel=2)


if __name__ == "__main__":
    main()
