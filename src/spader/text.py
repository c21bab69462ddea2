"""Text normalization shared by data preparation, rewards, entity matching and metrics.

``normalize`` is ``norm_v1`` (shared/spec/data.md section 7.2). It is the single normalization
of this project: dataset answers, model predictions and retrieved passage text all go through it,
so a match in training reward and a match in evaluation mean the same thing.

``normalize_spader_compat`` reproduces the authors' published ``normalize_answer`` (no Unicode
folding); it exists only to reproduce the paper's numbers and is never used by default.
"""

from __future__ import annotations

import re
import string
import unicodedata

__all__ = ["clean_text", "normalize", "normalize_spader_compat", "NORMALIZATION_VERSION"]

NORMALIZATION_VERSION = "norm_v1"

_ASCII_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_WHITESPACE = re.compile(r"\s+")


def _is_punct(ch: str) -> bool:
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


# Characters are classified once and cached; passages are long and repeat the same alphabet.
_PUNCT_CACHE: dict[str, bool] = {}


def _strip_punct(s: str) -> str:
    cache = _PUNCT_CACHE
    out = []
    for ch in s:
        p = cache.get(ch)
        if p is None:
            p = cache[ch] = _is_punct(ch)
        if not p:
            out.append(ch)
    return "".join(out)


def normalize(s: object) -> str:
    """Normalize an answer, prediction or passage with ``norm_v1``.

    Steps (data.md 7.2, in order): ``None`` -> ``""``; NFKC; ``str.lower``; NFKD and drop combining
    marks; delete ASCII and Unicode ``P*`` punctuation (no space inserted); replace the whole words
    a/an/the by a space; collapse whitespace and strip; NFC.

    >>> normalize("A sós gyümölcsös")
    'sos gyumolcsos'
    >>> normalize("Saint-Malo Express")
    'saintmalo express'
    >>> normalize("Port\\u00a0Hollin")
    'port hollin'
    """
    if s is None:
        return ""
    text = unicodedata.normalize("NFKC", str(s))
    text = text.lower()
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    text = _strip_punct(text)
    text = _ARTICLES.sub(" ", text)
    text = _WHITESPACE.sub(" ", text).strip()
    return unicodedata.normalize("NFC", text)


def clean_text(s: object) -> str:
    """Display form of questions and raw answers: NFC, collapsed whitespace; ``None`` -> ``""``."""
    if s is None:
        return ""
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFC", str(s))).strip()


_COMPAT_EXTRA_PUNCT = frozenset("\u2014\u2013\u2010")  # em dash, en dash, hyphen
_COMPAT_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def normalize_spader_compat(s: object) -> str:
    """The authors' ``normalize_answer`` (data.md section 6): lower-case, straighten quotes, delete
    ASCII punctuation and three dashes, drop articles, collapse whitespace. No accent folding.
    For reproducing published numbers only."""
    if s is None:
        return ""
    text = str(s).lower().replace("''", '"').replace("``", '"').translate(_COMPAT_QUOTES)
    text = "".join(ch for ch in text if ch not in _ASCII_PUNCT and ch not in _COMPAT_EXTRA_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())
