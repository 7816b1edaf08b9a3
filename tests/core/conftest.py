"""Fixtures shared by the core tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.checkpoint_helpers import make_tokenizer, one_thread


@pytest.fixture
def single_thread():
    """One torch thread: micro models gain nothing from more, and on a busy machine they only contend."""
    with one_thread():
        yield


@pytest.fixture(scope="session")
def tok():
    """A small byte-level BPE tokenizer (300 tokens) trained once per session."""
    return make_tokenizer()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache folder of this test alone: stores and tokenizers start empty."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(folder))
    return folder
