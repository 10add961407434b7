"""hf_vocabspec._io and the Python API's file writers: byte offsets of undecodable text, a folder where a file is
expected."""

from __future__ import annotations

import pytest

from hf_vocabspec import TokenCounts


def test_check_utf8_offsets_across_chunks(tmp_path):
    """The offset is the file's, also past the 1 MiB read chunks and with a character split between two of them."""
    from hf_vocabspec._io import check_utf8

    head = b"x" * ((1 << 20) - 1) + "\u00e9\n".encode()  # a 2-byte character across the chunk boundary: valid
    ok = tmp_path / "ok.jsonl"
    ok.write_bytes(head + "\u20ac\n".encode())
    check_utf8(ok)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(head + b"ab\xe9cd\n")
    with pytest.raises(ValueError, match=rf"byte 0xe9 at offset {len(head) + 2}, line 2\)"):
        check_utf8(bad)
    cut = tmp_path / "cut.jsonl"
    cut.write_bytes(b"abc" + "\u20ac".encode()[:2])  # ends in the middle of a character
    with pytest.raises(ValueError, match="byte 0xe2 at offset 3, line 1"):
        check_utf8(cut)


def test_python_api_file_writers_refuse_a_folder(tmp_path, counts_file, saved):
    from hf_vocabspec.export import to_sglang_token_map

    drafter, _ = saved
    with pytest.raises(IsADirectoryError, match="is a folder: pass a file name"):
        TokenCounts.load(counts_file).save(tmp_path)
    with pytest.raises(IsADirectoryError, match="is a folder: pass a file name"):
        to_sglang_token_map(drafter, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
