"""Shared settings of the omnicore-audio-codec tests."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Run these tiny models on one intra-op thread (restored afterwards): on a shared 2-core
    machine two OpenMP threads that compete with another busy process are many times slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
