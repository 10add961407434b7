"""Fixtures shared by several test modules (test modules never import each other: tests/test_layout.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from tiny import VOCAB, llama_config, make_pair
from transformers import LlamaForCausalLM

import hf_vocabspec
from hf_vocabspec import tokenizer_sha256, trim_drafter

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs the suite on every core (pytest-xdist, one worker a core): one torch thread a worker, or two
    # workers' thread pools fight over the same cores (tiny models are dispatch-bound anyway).
    torch.set_num_threads(1)
    # The same for the processes tests start (the README's blocks and commands, the CLI, accelerate launch): a child
    # with a thread a core beside the other worker spins on cores that are taken (the README's api chain took 230 s
    # in the suite against 38 s alone, machine D, 2026-12-02). A test that sets it itself keeps its own value.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def constant_draft_length():
    """Drafters trimmed in tests draft a constant L=5 with no confidence stop (set where generate() or a test sets
    nothing else). The library's default stop (0.4) would end nearly every round of the tiny random drafters after
    one draft, and the multi-draft checks and their power checks would test nothing; the default itself is tested
    with ``library_draft_defaults``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hf_vocabspec.trimming, "DEFAULT_NUM_ASSISTANT_TOKENS", 5)
        patch.setattr(hf_vocabspec.trimming, "DEFAULT_CONFIDENCE_THRESHOLD", 0.0)
        yield


@pytest.fixture
def library_draft_defaults(monkeypatch):
    """trim_drafter writes the library's own draft policy (undoes ``constant_draft_length`` for one test)."""
    from hf_vocabspec import configuration

    monkeypatch.setattr(hf_vocabspec.trimming, "DEFAULT_NUM_ASSISTANT_TOKENS", configuration.DEFAULT_NUM_ASSISTANT_TOKENS)
    monkeypatch.setattr(hf_vocabspec.trimming, "DEFAULT_CONFIDENCE_THRESHOLD", configuration.DEFAULT_CONFIDENCE_THRESHOLD)


@pytest.fixture
def one_thread():
    """Tiny models are dispatch-bound: one torch thread is faster and does not fight the other tests."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ssd_pair():
    """Peaked enough that SSD's outcomes are predictable (hits), ids >= 48 pruned (they come from the residual)."""
    target, base = make_pair("llama", seed=0, head_scale=25.0, noise=0.3)
    return target, hf_vocabspec.trim_drafter(base, [t for t in range(VOCAB) if t < 48])


@pytest.fixture(scope="module")
def cli_model(tmp_path_factory):
    """(model folder, chats .jsonl): a tiny Llama saved with a chat-templated tokenizer, and 30 chats over its words,
    as the CLI commands take them (--target / --drafter / --tokenizer, --dataset / --workloads)."""
    import json

    from tiny import save_tiny_cli_model, tiny_chats

    root = tmp_path_factory.mktemp("cli-model")
    save_tiny_cli_model(root / "model")
    chats = root / "chats.jsonl"
    chats.write_text("\n".join(json.dumps(c) for c in tiny_chats()) + "\n", encoding="utf-8")
    return root / "model", chats


# --- tokenizers, a counts file, a saved drafter and a folder this process cannot write (bad-input tests) ------------
@pytest.fixture(scope="session")
def tok():
    """SmolLM2's tokenizer (ChatML), from the offline cache."""
    from hf_vocabspec.evaluation.offline import load_tokenizer

    return load_tokenizer("offline:smollm2-135m-instruct")


@pytest.fixture(scope="module")
def same_size_other_tok(tok):
    """A different tokenizer with exactly as many tokens (two tokens swapped): sizes alone cannot tell."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    js = json.loads(tok.backend_tokenizer.to_str())
    vocab = js["model"]["vocab"]
    vocab["hello"], vocab["world"] = vocab["world"], vocab["hello"]
    other = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(js)), eos_token=tok.eos_token,
                                    bos_token=tok.bos_token)
    assert len(other) == len(tok) and tokenizer_sha256(other) != tokenizer_sha256(tok)
    return other


@pytest.fixture
def counts_file(tmp_path, tok):
    ds = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": f"hello world {i}"}]}
          for i in range(20)]
    counts = hf_vocabspec.count_assistant_tokens(ds, tok, progress=False)
    assert counts.tokenizer_sha256 == tokenizer_sha256(tok)
    path = tmp_path / "counts.safetensors"
    counts.save(path)
    return path


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    drafter = trim_drafter(LlamaForCausalLM(llama_config()), torch.arange(3, 30))
    drafter.save_pretrained(tmp_path / "d")
    return drafter, tmp_path / "d"


@pytest.fixture
def unwritable(tmp_path):
    """A folder this process cannot create files in: a read-only one, or /sys where that is unwritable (root)."""
    import tempfile

    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        fd, probe = tempfile.mkstemp(dir=folder)
    except OSError:
        yield folder
        folder.chmod(0o755)
        return
    os.close(fd)
    os.unlink(probe)
    folder.chmod(0o755)
    try:
        fd, probe = tempfile.mkstemp(dir="/sys")
    except OSError:
        yield Path("/sys")
        return
    os.close(fd)
    os.unlink(probe)
    pytest.skip("no folder this process cannot write")
