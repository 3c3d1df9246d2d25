"""Read an HTML page: its main text (via trafilatura), title, dates, links and robots flags.

trafilatura finds the main content and drops navigation; its content tree is then written
out as light Markdown: ``#`` headings, ``- `` list items, ``| a | b |`` table rows, fenced
multi-line code, ``<br>`` as a line break, one blank line between blocks. Inline markup
(bold, links) is dropped, so it can never change the text or its hash.

Example::

    page = parse_html("<title>Hi</title><h1>Hello</h1><p>World</p>", "http://h/")
    assert page.text == "# Hello\\n\\nWorld"
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urljoin

import lxml.etree
import lxml.html
from trafilatura import bare_extraction

from ingest.normalize import collapse_spaces, normalize_text, parse_datetime

__all__ = ["HtmlPage", "parse_html"]

# Page chrome by its standard markup (HTML5 elements, ARIA landmark roles), and the
# permalink anchors ("¶", "#") that documentation generators put into every heading.
# Removing them up front keeps them out of trafilatura's fallback for short pages.
_PRUNE = (
    "//script", "//style", "//noscript", "//template", "//nav", "//footer", "//form",
    "//*[@role='navigation' or @role='search' or @role='contentinfo' or @role='banner']",
    "//*[contains(concat(' ', normalize-space(@class), ' '), ' footer ')]",
    "//a[contains(concat(' ', normalize-space(@class), ' '), ' headerlink ')]",
)
_BLOCKS = frozenset({"head", "p", "list", "item", "quote", "table", "row", "div", "cell"})
_PUBLISHED = frozenset({"article:published_time", "datepublished", "date", "dc.date",
                        "dc.date.issued", "dcterms.issued", "dcterms.created", "pubdate"})
_MODIFIED = frozenset({"article:modified_time", "og:updated_time", "datemodified",
                       "last-modified", "dc.date.modified", "dcterms.modified"})
_SPACES = re.compile(r"\s+")
_BREAK = "\x00"  # a <br> while inline text is joined; parsed HTML never contains NUL
_XML_DECL = re.compile(r"^\s*<\?xml[^>]*\?>")


@dataclass(frozen=True)
class HtmlPage:
    """The parts of a page: ``text`` is not normalised yet; ``links`` are absolute, name
    each linked page once without its fragment, and are empty when the page says ``nofollow``.

    Example::

        page = parse_html(html, "https://example.org/docs/")
        follow = [] if page.noindex else page.links
    """

    title: str
    text: str
    published: datetime | None = None
    modified: datetime | None = None
    links: tuple[str, ...] = ()
    noindex: bool = False


def parse_html(text: str, url: str) -> HtmlPage:
    """Parse one page. Raises ``lxml.etree.LxmlError`` or ``ValueError`` for unreadable input."""
    text = _XML_DECL.sub("", text, count=1)
    if not text.strip():
        return HtmlPage(title="", text="")
    tree = lxml.html.fromstring(text)
    published, modified = _meta_dates(tree)
    robots = {token.strip() for m in tree.xpath("//meta[@name][@content]")
              if m.get("name", "").lower() == "robots"
              for token in m.get("content", "").lower().replace(",", " ").split()}
    nofollow, noindex = bool(robots & {"nofollow", "none"}), bool(robots & {"noindex", "none"})
    links = () if nofollow else tuple(_links(tree, url))
    for xpath in _PRUNE:
        for node in tree.xpath(xpath):
            node.drop_tree()
    for pre in tree.iter("pre"):
        # One plain span marks a <pre> as code for trafilatura, which keeps its line breaks;
        # syntax-highlighting spans would otherwise make it a quote with collapsed lines.
        code, tail = pre.text_content(), pre.tail
        pre.clear()
        pre.tail = tail
        lxml.etree.SubElement(pre, "span").text = code
    for code in tree.iter("code"):
        # Inline code's markup is only styling (a documentation page has thousands of such
        # spans), and every element costs trafilatura's pattern tests: keep the text alone.
        if len(code):
            _flatten(code)
    # "txt" leaves the content tree unserialised (we write it ourselves), saving a pass.
    doc = bare_extraction(tree, url=url, output_format="txt", include_comments=False,
                          include_tables=True, favor_recall=True, include_formatting=False,
                          with_metadata=False)
    root = getattr(doc, "body", None)  # a trafilatura Document (or None): its body, an lxml element
    body = _render(root) if root is not None else ""
    if not body.strip():
        body = _body_text(tree)
    return HtmlPage(title=_title(tree), text=body, published=published, modified=modified,
                    links=links, noindex=noindex)


def _flatten(node: Any) -> None:
    """Replace ``node``'s children by their text (its attributes and tail stay)."""
    text = node.text_content()
    del node[:]
    node.text = text


def _links(tree: Any, url: str) -> Iterator[str]:
    """Each linked page once, in order, absolute and without its fragment."""
    bases = tree.xpath("//base/@href")
    base = urljoin(url, bases[0].strip()) if bases else url
    # A page links to the same few pages many times (anchors within them): join each once.
    hrefs = dict.fromkeys(href.strip().partition("#")[0] for href in tree.xpath("//a/@href"))
    for href in hrefs:
        if href and not href.startswith(("javascript:", "mailto:", "tel:", "data:")):
            yield urljoin(base, href)


def _title(tree: Any) -> str:
    og = tree.xpath("//meta[@property='og:title']/@content")
    h1 = tree.xpath("//h1")
    titles = tree.xpath("//title")
    for candidate in (
        og[0] if og else "",
        h1[0].text_content() if len(h1) == 1 else "",
        titles[0].text_content() if titles else "",
        next((h.text_content() for h in tree.xpath("//h1|//h2")), ""),
    ):
        if candidate := normalize_text(collapse_spaces(candidate)):
            return candidate
    return ""


def _meta_dates(tree: Any) -> tuple[datetime | None, datetime | None]:
    # Not htmldate (installed with trafilatura): its find_date gives one date per call, falls
    # back to any date it sees (a footer's "Last updated", the URL's path, the published date
    # when asked for the modified one), where these are the page's own published and modified
    # claims, or None.
    found: dict[str, str] = {}
    for meta in tree.xpath("//meta[@content]"):
        key = (meta.get("property") or meta.get("name") or meta.get("itemprop") or "").lower()
        found.setdefault(key, meta.get("content"))
    for node in tree.xpath("//time[@itemprop][@datetime]"):
        found.setdefault(node.get("itemprop").lower(), node.get("datetime"))
    for script in tree.xpath("//script[@type='application/ld+json']/text()"):
        try:
            _json_dates(json.loads(script), found)
        except ValueError:
            continue

    def first(keys: frozenset[str]) -> datetime | None:
        return next((d for k, v in found.items() if k in keys and (d := parse_datetime(v))), None)

    return first(_PUBLISHED), first(_MODIFIED)


def _json_dates(node: Any, found: dict[str, str]) -> None:
    if isinstance(node, list):
        for item in node:
            _json_dates(item, found)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in ("datePublished", "dateModified") and isinstance(value, str):
                found.setdefault(key.lower(), value)
            elif isinstance(value, (list, dict)):
                _json_dates(value, found)


def _is_block(node: Any) -> bool:
    return node.tag in _BLOCKS or (node.tag == "code" and "\n" in (node.text or "").strip())


class _Writer:
    """Writes trafilatura's content tree (head, p, list/item, table/row/cell, code) as text."""

    def __init__(self) -> None:
        self.blocks: list[str] = []
        self.prefix = ""

    def add(self, text: str) -> None:
        if text:
            self.blocks.append(self.prefix + text)
            self.prefix = ""

    def container(self, node: Any) -> None:
        pending = [node.text or ""]
        for child in node:
            if isinstance(child.tag, str) and _is_block(child):
                self.add(_lines(pending))
                pending = []
                self.block(child)
            elif isinstance(child.tag, str):
                pending.append(_BREAK if child.tag == "lb" else "".join(child.itertext()))
            pending.append(child.tail or "")
        self.add(_lines(pending))

    def block(self, node: Any) -> None:
        if node.tag == "head":
            level = (node.get("rend") or "h2")[-1:]
            text = collapse_spaces("".join(node.itertext()))
            self.add(f"{'#' * int(level) if level.isdigit() else '##'} {text}" if text else "")
        elif node.tag == "code":
            self.add("```\n" + "".join(node.itertext()).strip("\n") + "\n```")
        elif node.tag == "table":
            rows = ["| " + " | ".join(_cell(c) for c in row) + " |" for row in node.iter("row")]
            self.add("\n".join(r for r in rows if r.strip("| ")))
        elif node.tag == "list":
            for item in node:
                if isinstance(item.tag, str):
                    self.prefix = "" if (item.get("rend") or "").startswith("dd") else "- "
                    self.container(item)
            self.prefix = ""
        else:
            self.container(node)


def _cell(node: Any) -> str:
    """A table cell on one line: its list items joined by "; ", other blocks and breaks by a space.

    Without the separators a cell listing ``a``, ``b`` and ``c`` would read ``abc``.
    """
    items: list[list[str]] = [[]]  # the cell's text, cut where a list item starts or ends

    def walk(el: Any) -> None:
        items[-1].append(el.text or "")
        for child in el:
            if isinstance(child.tag, str):
                item, block = child.tag == "item", child.tag in _BLOCKS or child.tag == "lb"
                if item:
                    items.append([])
                items[-1].append(" " if block else "")
                walk(child)
                items[-1].append(" " if block else "")
                if item:
                    items.append([])
            items[-1].append(child.tail or "")

    walk(node)
    return "; ".join(text for text in (collapse_spaces("".join(x)) for x in items) if text)


def _lines(pieces: list[str]) -> str:
    """Join inline text: source whitespace collapses, ``<br>`` (``_BREAK``) breaks lines."""
    text = "".join(_SPACES.sub(" ", p) for p in pieces)
    return "\n".join(line for line in (collapse_spaces(x) for x in text.split(_BREAK)) if line)


def _render(body: Any) -> str:
    writer = _Writer()
    writer.container(body)
    return "\n\n".join(writer.blocks)


def _body_text(tree: Any) -> str:
    body = tree.find(".//body")
    node = body if body is not None else tree
    for el in node.iter():
        if isinstance(el.tag, str) and el.tag in ("p", "div", "li", "tr", "br", "pre", "section",
                                                  "h1", "h2", "h3", "h4", "h5", "h6", "table"):
            el.tail = "\n\n" + (el.tail or "")
    return node.text_content()


