"""Token-aware chunking that follows headings and paragraphs, for English and Chinese.

A document's text (markdown-style headings, blank lines between paragraphs) is cut into
sections at headings, then each section is split at the coarsest boundary that keeps a
chunk within ``size_tokens`` (paragraph, line, sentence — including Chinese ``。！？`` —
clause, word, and finally character), with ``overlap_tokens`` carried between chunks.
Tokens are counted with the embedder's own tokenizer. The splitter measures each piece
three or four times on its way to a chunk, so the last ``COUNT_CACHE`` counts are remembered
(on 30 Python docs pages: 14,636 counts of 4,034 distinct pieces, 1.50 s against 0.59 s).

Example::

    chunker = Chunker(size_tokens=256, overlap_tokens=32, count_tokens=embedder.count_tokens)
    chunks = chunker.chunk(document)
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable

from langchain_text_splitters import MarkdownHeaderTextSplitter, RecursiveCharacterTextSplitter

from rag.text import estimate_tokens
from rag.types import Chunk, Document

__all__ = ["Chunker", "chunk_id", "chunk_hash", "approx_token_count"]

SEPARATORS = [
    "\n\n",
    "\n",
    "。", "！", "？", "；",
    ". ", "! ", "? ", "; ",
    "，", "、", ", ",
    " ",
    "",
]
HEADERS = [("#", "h1"), ("##", "h2"), ("###", "h3")]
COUNT_CACHE = 4096  # pieces whose token count is remembered (a few documents' worth)


def approx_token_count(text: str) -> int:
    """A tokenizer-free estimate (:func:`rag.text.estimate_tokens`), for a chunker without an embedder."""
    return estimate_tokens(text)


def chunk_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def chunk_id(doc_id: str, text_hash: str, occurrence: int = 0) -> str:
    """Stable for the same document and text; repeated identical passages get distinct ids."""
    raw = f"{doc_id}\x00{text_hash}\x00{occurrence}".encode()
    return hashlib.sha256(raw).hexdigest()[:32]


class Chunker:
    """Splits documents into chunks of at most ``size_tokens`` tokens."""

    def __init__(
        self,
        size_tokens: int = 256,
        overlap_tokens: int = 32,
        count_tokens: Callable[[str], int] = approx_token_count,
    ) -> None:
        if overlap_tokens >= size_tokens:
            raise ValueError("overlap_tokens must be smaller than size_tokens")
        self.size_tokens = size_tokens
        self.count_tokens = count_tokens
        self._count = functools.lru_cache(maxsize=COUNT_CACHE)(count_tokens)
        self._headers = MarkdownHeaderTextSplitter(HEADERS, strip_headers=True)
        self._splitter = RecursiveCharacterTextSplitter(
            chunk_size=size_tokens,
            chunk_overlap=overlap_tokens,
            length_function=self._count,
            separators=SEPARATORS,
            keep_separator="end",
            strip_whitespace=True,
        )

    def split(self, text: str) -> list[tuple[str, str]]:
        """Return ``(heading, passage)`` pairs in document order."""
        out: list[tuple[str, str]] = []
        for section in self._headers.split_text(text):
            meta = section.metadata
            names = [meta[k] for _, k in HEADERS if meta.get(k)]
            heading = " > ".join(names)
            body = section.page_content.strip()
            if not body:
                continue
            # The section's own heading leads its first passage, so it is searchable.
            if names:
                body = f"{names[-1]} {body}"
            for piece in self._splitter.split_text(body):
                if piece.strip():
                    out.append((heading, piece.strip()))
        if not out and text.strip():  # headings only: the headings are the content
            out = [("", piece.strip()) for piece in self._splitter.split_text(text.strip()) if piece.strip()]
        return out

    def chunk(self, doc: Document) -> list[Chunk]:
        chunks: list[Chunk] = []
        seen: dict[str, int] = {}
        for ordinal, (heading, text) in enumerate(self.split(doc.text)):
            h = chunk_hash(text)
            occurrence = seen.get(h, 0)
            seen[h] = occurrence + 1
            chunks.append(
                Chunk(
                    id=chunk_id(doc.id, h, occurrence),
                    doc_id=doc.id,
                    source=doc.source,
                    text=text,
                    hash=h,
                    ordinal=ordinal,
                    title=doc.title,
                    url=doc.url,
                    heading=heading,
                    lang=doc.lang,
                    published=doc.published,
                    modified=doc.modified,
                    trust=doc.trust,
                    tags=doc.tags,
                    tenant=doc.tenant,
                )
            )
        return chunks
