"""Turn fetched bytes (HTML, Markdown, plain text, PDF) into a title and normalised text.

HTML is read by :mod:`ingest.htmlpage`; every kind ends in
:func:`ingest.normalize.normalize_text`, so what is hashed never depends on markup.

Example::

    from ingest.extract import extract
    page = extract(body, "html", url="https://example.org/docs/", boilerplate=patterns)
    print(page.title, page.lang, len(page.links))
"""

from __future__ import annotations

import codecs
import io
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import charset_normalizer
import lxml.etree
import pypdf
from pypdf.errors import PyPdfError

from ingest.htmlpage import parse_html
from ingest.normalize import collapse_spaces, detect_lang, normalize_text, parse_datetime
from rag.config import DEFAULT_BOILERPLATE
from rag.errors import FetchError

__all__ = ["Extracted", "Kind", "extract", "kind_for", "decode"]

Kind = Literal["html", "markdown", "text", "pdf"]

_EXTENSIONS: dict[str, Kind] = {
    ".html": "html", ".htm": "html", ".xhtml": "html", ".md": "markdown",
    ".markdown": "markdown", ".txt": "text", ".pdf": "pdf",
}
_CONTENT_TYPES: dict[str, Kind] = {
    "text/html": "html", "application/xhtml+xml": "html", "application/pdf": "pdf",
    "text/markdown": "markdown", "text/x-markdown": "markdown", "text/plain": "text",
}
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)
_ATX = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)(?:\s+#+)?\s*$", re.M)
_NEAR_TIE = 0.05  # charset_normalizer's "chaos" (share of odd characters)
_FRONT_MATTER = re.compile(r"\A---\n(.*?)\n(?:---|\.\.\.)\n", re.S)


@dataclass(frozen=True)
class Extracted:
    """What one document yields: normalised ``text``, its ``title``, and for HTML the
    absolute ``links`` to follow (empty under ``nofollow``) and the ``noindex`` flag.

    Example::

        page = extract(b"<title>Hi</title><p>Hello</p>", "html", url="http://h/")
        assert page.title == "Hi" and page.text == "Hello"
    """

    title: str
    text: str
    lang: str
    published: datetime | None = None
    modified: datetime | None = None
    links: tuple[str, ...] = ()
    noindex: bool = False


def kind_for(name: str, content_type: str | None = None) -> Kind | None:
    """The kind of a file or URL path from its Content-Type, else its extension."""
    ext = posixpath.splitext(name.rsplit("/", 1)[-1])[1].lower()
    mime = (content_type or "").split(";")[0].strip().lower()
    if mime == "text/plain" and _EXTENSIONS.get(ext) == "markdown":
        return "markdown"
    if mime and mime != "application/octet-stream":
        return _CONTENT_TYPES.get(mime)
    return _EXTENSIONS.get(ext)


def decode(data: bytes, charset: str | None = None, *, html: bool = False) -> str:
    """Decode with the BOM, the declared charset, a ``<meta charset>``, UTF-8, then a guess.

    Raises ``ValueError`` for binary data or bytes that fit no encoding.
    """
    for bom, codec in ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"),
                       (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            return data.decode(codec, errors="replace")
    if b"\x00" in data[:4096]:
        raise ValueError("binary content")
    meta = _META_CHARSET.search(data[:4096]) if html else None
    for candidate in (charset, meta.group(1).decode("ascii") if meta else None, "utf-8"):
        if not candidate:
            continue
        try:
            return data.decode(candidate)
        except (LookupError, UnicodeDecodeError):
            continue
    matches = charset_normalizer.from_bytes(data)
    best = matches.best()
    if best is None:
        raise ValueError("bytes in no known text encoding")
    # Short Latin text fits several single-byte code pages about equally well (Latin-1 sent as
    # UTF-8 reads as Baltic cp1257 first: "crčme"). The web's own fallback is windows-1252
    # (the WHATWG encoding standard maps latin1 and ascii labels to it), so it wins a near tie.
    for match in matches:
        if match.encoding == "cp1252" and match.chaos <= best.chaos + _NEAR_TIE:
            return str(match)
    return str(best)


def extract(data: bytes, kind: Kind, *, url: str, charset: str | None = None,
            fallback_title: str = "", boilerplate: Sequence[str] = DEFAULT_BOILERPLATE) -> Extracted:
    """Extract one document. Raises ``FetchError(url, ...)`` when it cannot be read."""
    try:
        if kind == "pdf":
            return _pdf(data, fallback_title, boilerplate)
        text = decode(data, charset, html=kind == "html")
        if kind == "html":
            return _html(text, url, fallback_title, boilerplate)
        if kind == "markdown":
            return _markdown(text, fallback_title, boilerplate)
        body = normalize_text(text, boilerplate)
        return Extracted(title=fallback_title, text=body, lang=detect_lang(body))
    except (ValueError, PyPdfError, lxml.etree.LxmlError) as exc:
        raise FetchError(url, f"cannot extract {kind}: {exc}") from exc


def _html(text: str, url: str, fallback_title: str, boilerplate: Sequence[str]) -> Extracted:
    page = parse_html(text, url)
    body = normalize_text(page.text, boilerplate)
    return Extracted(title=page.title or fallback_title, text=body, lang=detect_lang(body),
                     published=page.published, modified=page.modified, links=page.links,
                     noindex=page.noindex)


def _markdown(text: str, fallback_title: str, boilerplate: Sequence[str]) -> Extracted:
    text = text.replace("\r\n", "\n")
    meta: dict[str, str] = {}
    if match := _FRONT_MATTER.match(text):
        for line in match.group(1).splitlines():
            key, sep, value = line.partition(":")
            if sep and value.strip():
                meta[key.strip().lower()] = value.strip().strip("'\"")
        text = text[match.end():]
    body = normalize_text(text, boilerplate)
    heading = _ATX.search(body)
    title = meta.get("title") or (heading.group(1) if heading else "") or fallback_title
    return Extracted(
        title=normalize_text(title), text=body, lang=detect_lang(body),
        published=parse_datetime(meta.get("date") or meta.get("published")),
        modified=parse_datetime(meta.get("updated") or meta.get("lastmod") or meta.get("modified")),
    )


def _pdf(data: bytes, fallback_title: str, boilerplate: Sequence[str]) -> Extracted:
    try:
        reader = pypdf.PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ValueError("the PDF is encrypted")
        pages = [page.extract_text() or "" for page in reader.pages]
        info = reader.metadata
    except (ValueError, PyPdfError):
        raise
    except Exception as exc:  # pypdf meets malformed files with many kinds of errors
        raise ValueError(f"unreadable PDF ({type(exc).__name__}: {exc})") from exc
    body = normalize_text("\n\n".join(pages), boilerplate)
    title = published = modified = None
    if info is not None:
        title = info.title
        published, modified = _pdf_date(info, "creation_date"), _pdf_date(info, "modification_date")
    return Extracted(title=normalize_text(collapse_spaces(title or "")) or fallback_title, text=body,
                     lang=detect_lang(body), published=published, modified=modified)


def _pdf_date(info: Any, attr: str) -> datetime | None:
    try:
        value = getattr(info, attr)
    except ValueError:  # a malformed date string in the document info
        return None
    return parse_datetime(value.isoformat()) if value is not None else None
