"""Fixtures shared by several test modules (test modules never import each other: tests/test_layout.py)."""

from __future__ import annotations

import os

import pytest
import torch
from tiny import VOCAB, make_pair

import hf_vocabspec

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs the suite on every core (pytest-xdist, one worker a core): one torch thread a worker, or two
    # workers' thread pools fight over the same cores (tiny models are dispatch-bound anyway).
    torch.set_num_threads(1)


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
