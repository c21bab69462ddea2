"""``corpus``: the Wikipedia chunk dump the search index is built from."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictInt, StringConstraints

from spader.config.sections.base import MAX_BYTES, MAX_COUNT, Section

__all__ = [
    "CorpusConfig",
]


class CorpusConfig(Section):
    """The QAMPARI Wikipedia 2021 chunk dump (docs/data.md, "The chunked Wikipedia corpus")."""

    url: str = Field(
        "https://aggreg-qa.s3.amazonaws.com/chunked_wikipedia.tar.gz",
        description="where chunked_wikipedia.tar.gz is downloaded from (http(s), file: or path; "
        "relative paths resolve against the repository root)",
    )
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")] | None = Field(
        None, description="expected sha256 of the archive"
    )
    size_bytes: StrictInt | None = Field(
        None, ge=1, le=MAX_BYTES, description="expected size of the archive in bytes"
    )
    archive: str | None = Field(
        None,
        description="an already downloaded archive (skips download_dump; a relative path is relative "
        "to the working directory)",
    )
    prebuilt_index: str | None = Field(
        None,
        description="a prebuilt Lucene index with stored raw documents (skips download and build; a "
        "relative path is relative to the working directory)",
    )
    expected_documents: StrictInt | None = Field(
        None, ge=1, le=MAX_COUNT, description="verified number of indexed passages"
    )
