"""Atomic writes: the one place files and directories are replaced, so an interrupted run loses nothing.

A file is written to a temp sibling and renamed (``os.replace`` is atomic on POSIX); a directory is built
in a temp sibling and swapped in, the old one renamed aside first and deleted last, so at every instant
either the old or the new directory is complete (:func:`recover_directory` finishes a swap a kill cut).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_directory", "atomic_write", "build_once", "check_utf8", "first_line", "read_safetensors",
           "recover_directory", "tensors_checksum"]


def atomic_write(path: str | os.PathLike, write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp)`` on a temp sibling of ``path``, then rename it over ``path``."""
    path = Path(path)
    if path.is_dir():  # os.replace would fail after the write with "[Errno 21] Is a directory"
        raise IsADirectoryError(f"{path} is a folder: pass a file name (e.g. {path / 'out.safetensors'}).")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def atomic_directory(final: str | os.PathLike, build: Callable[[Path], object], *, shared: bool = True) -> Path:
    """Build a directory with ``build(tmp)`` beside ``final`` and swap it in; the old one (if any) goes last.

    ``shared``: make the result world-readable (mkdtemp and safetensors create owner-only entries).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        build(tmp)
        if shared:
            os.chmod(tmp, 0o755)
            for f in tmp.rglob("*"):
                os.chmod(f, 0o755 if f.is_dir() else 0o644)
        old = None
        if final.exists():
            old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def recover_directory(final: str | os.PathLike, complete: Callable[[Path], bool]) -> None:
    """Finish a swap that a kill interrupted (only the old directory was renamed aside), drop stale temps.

    ``complete(dir)`` says whether a renamed-aside directory is whole enough to restore.
    """
    final = Path(final)
    parent = final.parent
    if not parent.is_dir():
        return
    olds = sorted(parent.glob(f".{final.name}.old-*"), key=lambda p: p.stat().st_mtime)
    if not final.exists() and olds and complete(olds[-1]):
        os.replace(olds.pop(), final)
    for stale in olds + list(parent.glob(f".{final.name}.tmp-*")):
        shutil.rmtree(stale, ignore_errors=True)


def build_once(final: str | os.PathLike, build: Callable[[Path], object]) -> Path:
    """Build a cache directory once across processes (file lock), atomically; return it if it exists."""
    final = Path(final)
    if final.exists():
        return final
    from filelock import FileLock

    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final.parent / f".{final.name}.lock")):
        if final.exists():  # another process finished while we waited
            return final
        return atomic_directory(final, build)


# --- reading the user's text files ------------------------------------------------------------------------------
_COMPRESSED = (".gz", ".bz2", ".xz")


def check_utf8(path: str | os.PathLike, what: str = "File") -> None:
    """Refuse a text file (.json/.jsonl/.csv, maybe .gz/.bz2/.xz-compressed) that is not UTF-8, in one line naming
    the file, the first bad byte (its offset and line) and the fix, before a reader fails on it with a bare "'utf-8'
    codec can't decode byte 0xe9 in position 3" (or, for datasets' JSON reader, only once the row is used)."""
    import codecs

    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in _COMPRESSED:
        import bz2
        import gzip
        import lzma

        opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}[suffix]
    else:
        opener = open
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, lines = 0, 1  # bytes and line breaks (decompressed) before the current chunk
    with opener(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            pending = decoder.getstate()[0]  # an incomplete character carried over from the previous chunk
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as err:
                data = pending + chunk
                where = offset - len(pending) + err.start
                line = lines + data[:err.start].count(b"\n")
                plain = path.with_suffix("") if suffix in _COMPRESSED else path
                fixed = plain.with_name(f"{plain.stem}.utf8{plain.suffix}")
                cat = {".gz": "zcat", ".bz2": "bzcat", ".xz": "xzcat"}.get(suffix)
                source = f"<({cat} {path})" if cat else str(path)
                after = " of the decompressed text" if suffix in _COMPRESSED else ""
                raise ValueError(f"{what} {str(path)!r} is not UTF-8 (byte 0x{data[err.start]:02x} at offset {where}"
                                 f"{after}, line {line}): convert it to UTF-8, e.g. iconv -f latin1 -t utf-8 {source} "
                                 f"> {fixed} (latin1 if that is its encoding), and pass that file.") from None
            if not chunk:
                return
            offset += len(chunk)
            lines += chunk.count(b"\n")


# --- reading our safetensors files: one-line errors, checksums ------------------------------------------------------
def first_line(err: BaseException, limit: int = 200, *, with_type: bool = False) -> str:
    """An exception's first non-empty line (its type's name when it has no message), shortened to ``limit``
    characters (library messages can span pages); ``with_type``: prefixed with the type's name. The one home of this
    helper (modeling.py inlines it: it ships alone with checkpoints)."""
    text = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), None)
    if text is None:
        text = "" if with_type else type(err).__name__
    if with_type:
        text = f"{type(err).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_safetensors(path: str | os.PathLike, what: str, fix: str,
                     check: Callable[[dict, list[str]], None] | None = None) -> tuple[dict, dict]:
    """(tensors, metadata) of a safetensors file; a missing, cut or corrupt file is one error naming ``fix``.

    ``check(metadata, tensor names)``, run before any tensor is read, may refuse a file that is not the kind
    expected (its ValueError passes through), so a foreign file (model weights, say) is never loaded."""
    from safetensors import safe_open

    if not os.path.isfile(path):
        raise FileNotFoundError(f"No such {what}: {os.fspath(path)!r} ({fix}).")
    try:
        with safe_open(os.fspath(path), framework="pt") as f:
            meta, names = dict(f.metadata() or {}), list(f.keys())
            if check is not None:
                try:
                    check(meta, names)
                except ValueError as refused:
                    raise _Refused(refused) from None
            return {k: f.get_tensor(k) for k in names}, meta
    except _Refused as refused:
        raise refused.error from None
    except Exception as err:  # SafetensorError (not an OSError), truncated data, bad dtype names, ...
        raise ValueError(f"{os.fspath(path)} is not a readable {what} ({first_line(err)}): {fix}.") from err


class _Refused(Exception):
    """Carries a ``check``'s refusal out of read_safetensors' catch-all."""

    def __init__(self, error: ValueError):
        super().__init__(str(error))
        self.error = error


def tensors_checksum(tensors: dict, meta: dict, *, skip: str = "sha256", described: bool = True) -> str:
    """SHA-256 over tensors (by name: with ``described`` each one's name, dtype and shape, then its bytes;
    without, the bytes alone, the layout of counts files, which hold one int64 vector) and metadata (but
    ``skip``): edits and bit flips show. The one checksum of the package's safetensors files."""
    import hashlib
    import json

    import torch

    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        if described:
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    h.update(json.dumps({k: v for k, v in sorted(meta.items()) if k != skip}).encode())
    return h.hexdigest()
