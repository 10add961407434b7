"""The SSD worker protocol: typed messages, a JSON header and the tensors as safetensors bytes; no pickle.

A frame is ``!II`` (header length, payload length), the UTF-8 JSON header, then the payload. The header says
``{"protocol": PROTOCOL_VERSION, "kind": <message class>, "fields": {...}}``; a message's tensor fields travel
in the payload (``safetensors.torch.save``), every other field is a JSON value in ``fields``. A header of
another protocol version is refused in one line (the worker runs another hf_vocabspec install).

Conversation (main process -> worker, worker -> main):
  <- Hello                          the worker's first frame (its version is checked before anything else)
  -> Setup -> Ready                 drafter directory (safetensors), its flags, the SSDConfig
  -> Start -> Started               per generate() call: prompt, GenerationConfig as JSON, seed, draft length
  -> Round -> RoundDrafts, TreeBuilt   per round; TreeBuilt follows once the tree for this round's outcomes is
                                    built (while the target verifies), and is read before the next request
  -> Close                          the worker exits (it also exits when the connection closes)
  <- Failed                         instead of any reply: the worker's traceback
"""

from __future__ import annotations

import dataclasses
import json
import select
import socket
import struct
import time
from dataclasses import dataclass, field

import safetensors.torch
import torch

PROTOCOL_VERSION = 1
_FRAME = struct.Struct("!II")
_MAX_HEADER = 1 << 20


class SSDWorkerError(RuntimeError):
    """The SSD drafter worker died, failed, spoke another protocol, or did not answer in time."""


class ProtocolError(SSDWorkerError):
    """A frame that is not this protocol (another version, unknown kind, wrong fields)."""


# --- messages ---------------------------------------------------------------------------------------------------
@dataclass
class Hello:
    pid: int


@dataclass
class Setup:
    drafter_path: str
    flags: dict  # the runtime switches as set at start (use_context_tokens, use_rdk; views of saved config fields)
    ssd_config: dict


@dataclass
class Ready:
    pass


@dataclass
class Start:
    input_ids: torch.Tensor  # (1, n) prompt
    generation_config: dict  # GenerationConfig public fields (the worker rebuilds the logits processors)
    prompt_length: int
    prompt_padding: list | None
    target_vocab_size: int | None
    seed: int
    draft_length: int


@dataclass
class Started:
    pass


@dataclass
class Round:
    input_ids: torch.Tensor  # (1, n) the sequence so far
    outcome: list | None  # [accepted, token, length] of the previous round
    max_new: int
    rounds: int


@dataclass
class RoundDrafts:
    new_ids: torch.Tensor  # target ids the worker's draft space grew by (context tokens)
    counters: dict
    tokens: torch.Tensor | None = None  # (n,) target ids; None: no drafts this round
    law: torch.Tensor | None = None  # (n, W) float32 (sampling)
    top: torch.Tensor | None = None  # (n, F+1) draft indices
    width: int = 0


@dataclass
class TreeBuilt:
    counters: dict = field(default_factory=dict)


@dataclass
class Failed:
    error: str


@dataclass
class Close:
    pass


MESSAGES = {cls.__name__: cls for cls in (Hello, Setup, Ready, Start, Started, Round, RoundDrafts, TreeBuilt, Failed,
                                          Close)}


def encode(msg) -> bytes:
    """One frame for ``msg`` (a message dataclass)."""
    kind = type(msg).__name__
    if MESSAGES.get(kind) is not type(msg):
        raise TypeError(f"not an SSD protocol message: {msg!r}")
    fields, tensors = {}, {}
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if isinstance(value, torch.Tensor):
            tensors[f.name] = value.detach().cpu().contiguous()
        else:
            fields[f.name] = value
    header = json.dumps({"protocol": PROTOCOL_VERSION, "kind": kind, "fields": fields}).encode()
    payload = safetensors.torch.save(tensors) if tensors else b""
    return _FRAME.pack(len(header), len(payload)) + header + payload


def decode(header: bytes, payload: bytes):
    """A message from a frame's header and payload; ProtocolError (one line) for anything else."""
    try:
        head = json.loads(header)
        version, kind, fields = head["protocol"], head["kind"], dict(head["fields"])
    except (ValueError, KeyError, TypeError) as err:
        raise ProtocolError(f"SSD worker protocol error: unreadable header ({err}).") from None
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"The SSD drafter worker speaks protocol version {version} but this process speaks {PROTOCOL_VERSION}: "
            "it runs another hf_vocabspec install; install the same hf_vocabspec for both, or use "
            "SSDConfig(mode='sync').")
    cls = MESSAGES.get(kind)
    if cls is None:
        raise ProtocolError(f"SSD worker protocol error: unknown message kind {kind!r}.")
    tensors = safetensors.torch.load(payload) if payload else {}
    names = {f.name for f in dataclasses.fields(cls)}
    given = set(fields) | set(tensors)
    required = {f.name for f in dataclasses.fields(cls)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    if not given <= names or not required <= given:
        raise ProtocolError(f"SSD worker protocol error: {kind} with fields {sorted(given)}, expected {sorted(names)}.")
    return cls(**fields, **tensors)


# --- a connection -----------------------------------------------------------------------------------------------
class Channel:
    """Frames over a connected stream socket (a socketpair shared with the worker)."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, msg, timeout_s: float | None = None) -> None:
        """Send one message (TimeoutError when the peer has not taken it within ``timeout_s``)."""
        self.sock.settimeout(timeout_s)
        try:
            self.sock.sendall(encode(msg))
        finally:
            self.sock.settimeout(None)

    def recv(self, deadline: float | None = None, alive=None, poll_s: float = 0.2):
        """The next message. With a ``deadline`` (time.monotonic) raise TimeoutError past it, checking ``alive()``
        while waiting; EOFError when the peer closed the connection."""
        if deadline is not None:
            while not select.select([self.sock], [], [], poll_s)[0]:
                if alive is not None:
                    alive()
                if time.monotonic() > deadline:
                    raise TimeoutError
            self.sock.settimeout(max(deadline - time.monotonic(), poll_s))
        try:
            n_header, n_payload = _FRAME.unpack(self._read(_FRAME.size))
            if n_header > _MAX_HEADER:
                raise ProtocolError(f"SSD worker protocol error: a {n_header}-byte header.")
            header = self._read(n_header)
            payload = self._read(n_payload)
        except socket.timeout:
            raise TimeoutError from None
        finally:
            self.sock.settimeout(None)
        return decode(header, payload)

    def _read(self, n: int) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise EOFError("the SSD worker connection closed")
            got += k
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()
