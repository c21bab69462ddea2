"""Text normalization shared by data preparation, rewards, entity matching and metrics.

``normalize`` is ``norm_v1`` (docs/data.md, "norm_v1"). It is the single normalization
of this project: dataset answers, model predictions and retrieved passage text all go through it,
so a match in training reward and a match in evaluation mean the same thing.

``normalize_spader_compat`` reproduces the authors' published ``normalize_answer`` (no Unicode
folding); it exists only to reproduce the paper's numbers and is never used by default.

``strip_invisible`` is this project's one definition of characters that render as nothing
(zero-width spaces and joiners, bidi marks, soft hyphens, ...). norm_v1 keeps them (it is fixed by
its specification); where two texts must compare as a reader sees them, the invisible characters
are removed first, a separate step (``question_key``: the training mix's overlap with the
evaluation questions).
"""

from __future__ import annotations

import re
import string
import unicodedata

__all__ = [
    "INVISIBLE",
    "NORMALIZATION_VERSION",
    "clean_text",
    "normalize",
    "normalize_spader_compat",
    "question_key",
    "strip_invisible",
]

NORMALIZATION_VERSION = "norm_v1"

_ASCII_PUNCT = frozenset(string.punctuation)

#: Code points that render as nothing: Unicode's default-ignorable code points (zero-width spaces and
#: joiners, bidi marks, embeddings and isolates, soft hyphen, combining grapheme joiner, variation
#: selectors, Hangul fillers, tag characters, invisible operators; DerivedCoreProperties.txt) and
#: the braille blank.
INVISIBLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u2800\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]"
)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _is_punct(ch: str) -> bool:
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


class _DeleteTable(dict):
    """``str.translate`` table deleting combining marks (step 4) and punctuation (step 5).

    Both steps only delete characters, so one pass deleting either kind gives the same result as
    the two steps in order. Each code point is classified once, on first sight (passages are long
    and reuse a small alphabet)."""

    def __missing__(self, cp: int) -> int | None:
        ch = chr(cp)
        value = None if unicodedata.combining(ch) or _is_punct(ch) else cp
        self[cp] = value
        return value


_DELETE = _DeleteTable()


def normalize(s: object) -> str:
    """Normalize an answer, prediction or passage with ``norm_v1``.

    Steps (docs/data.md, "norm_v1", in order): ``None`` -> ``""``; NFKC; ``str.lower``; NFKD and
    drop combining marks; delete ASCII and Unicode ``P*`` punctuation (no space inserted); replace
    the whole words a/an/the by a space; collapse whitespace and strip; NFC.

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
    text = unicodedata.normalize("NFKD", text).translate(_DELETE)
    text = _ARTICLES.sub(" ", text)
    # str.split() and the re module's \s agree on what whitespace is (Py_UNICODE_ISSPACE); split/join
    # collapses and strips in one go, several times faster than a second regex pass.
    return unicodedata.normalize("NFC", " ".join(text.split()))


def clean_text(s: object) -> str:
    """Display form of questions and raw answers: NFC, collapsed whitespace; ``None`` -> ``""``."""
    if s is None:
        return ""
    return " ".join(unicodedata.normalize("NFC", str(s)).split())


_COMPAT_EXTRA_PUNCT = frozenset("\u2014\u2013\u2010")  # em dash, en dash, hyphen
_COMPAT_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"'})


def normalize_spader_compat(s: object) -> str:
    """The authors' ``normalize_answer`` (docs/data.md, "The authors' normalisation"): lower-case, straighten quotes, delete
    ASCII punctuation and three dashes, drop articles, collapse whitespace. No accent folding.
    For reproducing published numbers only."""
    if s is None:
        return ""
    text = str(s).lower().replace("''", '"').replace("``", '"').translate(_COMPAT_QUOTES)
    text = "".join(ch for ch in text if ch not in _ASCII_PUNCT and ch not in _COMPAT_EXTRA_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def strip_invisible(s: str) -> str:
    """``s`` without the characters that render as nothing (:data:`INVISIBLE`).

    >>> strip_invisible("Win\u00adter\u200b Quay\u2066")
    'Winter Quay'
    """
    return INVISIBLE.sub("", s)


def question_key(question: object) -> str:
    """What two questions are compared by when one must not stand in for the other (the training
    mix against the evaluation questions): norm_v1 of the question without invisible characters,
    so that a zero-width space or a soft hyphen does not make a test question new.

    >>> question_key("Which films did Ilse\u200b Varga di\u00adrect?") == question_key("which films did ilse varga direct")
    True
    """
    return normalize(strip_invisible(clean_text(question)))
