"""Fixtures shared by several test modules (test modules never import each other: tests/test_layout.py)."""

from __future__ import annotations

import pytest
import torch
from tiny import VOCAB, make_pair

import hf_vocabspec


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
