"""A private copy of a Hugging Face fast tokenizer's Rust backend, for settings the shared one must
never take.

A backend setting (truncation, padding, reading special tokens as text) changed on a tokenizer that
other threads use fails with "Already borrowed" while another thread encodes, or changes that
thread's ids. Code that needs such a setting configures its own copy once and encodes with it.
"""

from __future__ import annotations

__all__ = ["backend_copy"]


def backend_copy(tokenizer):
    """A copy of ``tokenizer``'s Rust backend with no truncation and no padding, for its caller
    alone to configure; None for a tokenizer without one (a slow, Python tokenizer)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    copy = type(backend).from_str(backend.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy
