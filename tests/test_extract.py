"""Extraction and normalisation, ending with the two real releases of the Python docs:
only the five pages whose words changed may get a new text hash."""

from __future__ import annotations

import csv
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ingest.extract import decode, extract, kind_for
from ingest.normalize import detect_lang, normalize_text, parse_datetime, text_hash
from rag.config import CrawlSettings
from rag.errors import FetchError
from tests.httpserver import PYDOCS_DIR, minimal_pdf, unpack_pydocs

BOILERPLATE = CrawlSettings().boilerplate_patterns


# -- normalisation ------------------------------------------------------------------------


def test_normalize_text_canonical_form():
    raw = ("\ufeffTitle\r\nOne\xa0\xa0two\u2003three  \t \r\n\r\n\r\n\r\n"
           "ﬁne \u200bprint   \n    indented  code\nLast updated on May 12, 2026.\n\n")
    assert normalize_text(raw, BOILERPLATE) == "Title\nOne two three\n\nfine print\n    indented code"


def test_normalize_text_boilerplate_drops_whole_lines_only():
    text = "Intro\nLast modified: 2020-01-01\nThe last updated value\n最后更新：2024年1月1日\nEnd"
    assert normalize_text(text, BOILERPLATE) == "Intro\nThe last updated value\nEnd"
    assert normalize_text(text).splitlines()[:3] == text.splitlines()[:3]


def test_text_hash_covers_title_and_text():
    assert text_hash("T", "body") == text_hash("T", "body")
    assert len({text_hash("T", "body"), text_hash("U", "body"), text_hash("T", "body2")}) == 3


def test_detect_lang():
    assert detect_lang("The quick brown fox") == "en"
    assert detect_lang("检索增强生成 uses a retriever 和 一个生成模型") == "zh"
    assert detect_lang("123 -- 456") == "und"


def test_parse_datetime_is_aware_utc():
    assert parse_datetime("2024-03-01T12:00:00+02:00") == datetime(2024, 3, 1, 10, tzinfo=UTC)
    assert parse_datetime("2024-03-01") == datetime(2024, 3, 1, tzinfo=UTC)
    assert parse_datetime("Tue, 05 Mar 2024 10:00:00 GMT") == datetime(2024, 3, 5, 10, tzinfo=UTC)
    assert parse_datetime("yesterday") is None and parse_datetime(None) is None


# -- HTML ---------------------------------------------------------------------------------

PAGE = b"""<!doctype html><html lang="en"><head>
<meta charset="utf-8"><title>Guide - Example Site</title>
<meta property="article:published_time" content="2024-01-02T03:04:05Z">
<script type="application/ld+json">{"@type": "Article", "dateModified": "2024-02-03T00:00:00+01:00"}</script>
</head><body>
<nav><a href="/other/">Elsewhere</a> <a href="sibling.html#part">Sibling</a></nav>
<main><h1>The <code>guide</code><a class="headerlink" href="#g">\xc2\xb6</a></h1>
<p>First   paragraph with <b>bold</b> and a <a href="deep/page.html">link</a>.</p>
<h2>Table</h2>
<table><tr><th>Name</th><th>Value</th></tr><tr><td>alpha</td><td>1</td></tr></table>
<h2>Code</h2>
<p>An example follows, long enough to count as a real paragraph of the page.</p>
<pre><span class="k">def</span> f():
    <span class="k">return</span> 1</pre>
<ul><li>one item</li><li>two item</li></ul>
<p>Line one<br>Line two</p>
</main>
<footer>Last updated on May 12, 2026. Copyright nobody.</footer>
</body></html>"""


def test_html_structure_title_dates_links():
    page = extract(PAGE, "html", url="http://h/docs/guide.html", boilerplate=BOILERPLATE)
    assert page.title == "The guide"
    assert page.text.startswith("# The guide\n\nFirst paragraph with bold and a link.\n\n## Table")
    assert "| Name | Value |\n| alpha | 1 |" in page.text
    assert "```\ndef f():\n    return 1\n```" in page.text
    assert "- one item\n\n- two item" in page.text
    assert "Line one\nLine two" in page.text
    assert "Copyright" not in page.text and "Elsewhere" not in page.text and "¶" not in page.text
    assert page.lang == "en"
    assert page.published == datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert page.modified == datetime(2024, 2, 2, 23, tzinfo=UTC)
    assert page.links == ("http://h/other/", "http://h/docs/sibling.html",
                          "http://h/docs/deep/page.html")
    assert not page.noindex


def test_html_links_name_each_page_once_without_its_fragment():
    html = (b"<html><body><p>See <a href='a.html#one'>one</a>, <a href='a.html#two'>two</a>, "
            b"<a href='#top'>top</a>, <a href='b.html?x=1#y'>b</a> and <a href='a.html'>a</a>.</p>"
            b"</body></html>")
    page = extract(html, "html", url="http://h/docs/", boilerplate=())
    assert page.links == ("http://h/docs/a.html", "http://h/docs/b.html?x=1")


def test_html_inline_code_markup_is_kept_as_its_text():
    plain = PAGE.replace(b"<code>guide</code>", b"<code>the_guide()</code>")
    styled = PAGE.replace(b"<code>guide</code>",
                          b'<code class="x"><span class="n">the_guide</span><span class="p">()</span></code>')
    a = extract(plain, "html", url="http://h/a", boilerplate=BOILERPLATE)
    b = extract(styled, "html", url="http://h/a", boilerplate=BOILERPLATE)
    assert a.title == b.title == "The the_guide()"
    assert a.text == b.text and a.text.startswith("# The the_guide()\n\nFirst paragraph")


def test_html_table_cells_keep_their_items_and_paragraphs_apart():
    html = (b"<html><body><h1>Codecs</h1><p>The table below lists each codec with its aliases and "
            b"the languages it covers, one row a codec.</p><table><tr><th>Codec</th><th>Aliases</th>"
            b"<th>Notes</th></tr><tr><td>cp273</td><td><ul><li>273</li><li>IBM273</li></ul></td>"
            b"<td><p>German</p><p>New in version 3.4.</p></td></tr><tr><td>koi8_t</td><td></td>"
            b"<td>Tajik<br>New in version 3.5.</td></tr></table></body></html>")
    page = extract(html, "html", url="http://h/codecs.html", boilerplate=())
    assert "| cp273 | 273; IBM273 | German New in version 3.4. |" in page.text
    assert "| koi8_t | | Tajik New in version 3.5. |" in page.text


def test_html_markup_changes_do_not_change_text():
    other = (PAGE.replace(b"First   paragraph", b"First\n  paragraph")
             .replace(b"<b>bold</b>", b"<strong class='x'>bold</strong>")
             .replace(b"May 12, 2026", b"June 1, 2027"))
    a = extract(PAGE, "html", url="http://h/a", boilerplate=BOILERPLATE)
    b = extract(other, "html", url="http://h/a", boilerplate=BOILERPLATE)
    assert text_hash(a.title, a.text) == text_hash(b.title, b.text)


def test_html_robots_meta_and_base_href():
    html = (b'<html><head><meta name="robots" content="NOINDEX, nofollow"><base href="http://x/y/">'
            b"</head><body><p>Secret text</p><a href='z.html'>z</a></body></html>")
    page = extract(html, "html", url="http://h/", boilerplate=())
    assert page.noindex and page.links == ()
    page = extract(html.replace(b"NOINDEX, nofollow", b"noindex"), "html", url="http://h/")
    assert page.noindex and page.links == ("http://x/y/z.html",)


def test_html_falls_back_to_body_text():
    page = extract(b"<html><body><aside>Only an aside here</aside></body></html>", "html",
                   url="http://h/", fallback_title="stem")
    assert page.text == "Only an aside here" and page.title == "stem"


def test_html_chinese_and_declared_charset():
    html = "<html><head><meta charset='gb18030'><title>检索</title></head><body><p>检索增强生成的中文文档。</p></body></html>"
    page = extract(html.encode("gb18030"), "html", url="http://h/")
    assert page.title == "检索" and "检索增强生成" in page.text and page.lang == "zh"


def test_decode_rejects_binary_and_extract_says_where():
    with pytest.raises(ValueError):
        decode(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    with pytest.raises(FetchError, match=r"^http://h/x.html: cannot extract html"):
        extract(b"\x00\x01\x02binary", "html", url="http://h/x.html")
    assert decode("café".encode("latin-1"), "latin-1") == "café"


def test_kind_for():
    assert kind_for("/a/b.HTML") == "html"
    assert kind_for("/a.b/readme") is None
    assert kind_for("/x", "text/html; charset=utf-8") == "html"
    assert kind_for("/notes.md", "text/plain") == "markdown"
    assert kind_for("/doc.pdf", "application/octet-stream") == "pdf"
    assert kind_for("/img.png", "image/png") is None


# -- Markdown, text, PDF ------------------------------------------------------------------


def test_markdown_front_matter_and_heading():
    md = b"---\ntitle: 'Setup guide'\ndate: 2023-05-06\nupdated: 2023-07-08T09:00:00Z\n---\n# Install\n\nRun it.\n"
    page = extract(md, "markdown", url="file:///a.md")
    assert page.title == "Setup guide" and page.text == "# Install\n\nRun it."
    assert page.published == datetime(2023, 5, 6, tzinfo=UTC)
    assert page.modified == datetime(2023, 7, 8, 9, tzinfo=UTC)
    page = extract(b"Intro\n\n## First heading ##\n\ntext", "markdown", url="file:///b.md")
    assert page.title == "First heading"
    assert extract(b"no heading", "markdown", url="file:///c.md", fallback_title="c").title == "c"


def test_text_and_pdf():
    page = extract(b"plain\r\ntext  here", "text", url="file:///n.txt", fallback_title="n")
    assert (page.title, page.text) == ("n", "plain\ntext here")
    pdf = extract(minimal_pdf(["Hello PDF world", "Second line"], title="A PDF"), "pdf",
                  url="file:///p.pdf", fallback_title="p")
    assert pdf.title == "A PDF" and pdf.text == "Hello PDF world\nSecond line"
    assert pdf.published == datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    with pytest.raises(FetchError, match="cannot extract pdf"):
        extract(b"%PDF-1.4 truncated", "pdf", url="file:///bad.pdf")


# -- the two Python docs releases ---------------------------------------------------------


def _page_hash(path: str) -> str:
    page = extract(Path(path).read_bytes(), "html", url="http://127.0.0.1/" + path,
                   boilerplate=BOILERPLATE)
    return text_hash(page.title, page.text)


@pytest.fixture(scope="session")
def pydocs_sites(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("pydocs-html")
    return {v: unpack_pydocs(v, base) for v in ("v1", "v2")}


@pytest.mark.slow
def test_pydocs_releases_change_exactly_the_changed_pages(pydocs_sites):
    with open(PYDOCS_DIR / "changes.tsv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert len(rows) == 530
    paths = [r["path"] for r in rows]
    jobs = [str(pydocs_sites[v] / p) for v in ("v1", "v2") for p in paths]
    started = time.perf_counter()
    workers = max(1, min(4, os.cpu_count() or 1))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        hashes = list(pool.map(_page_hash, jobs, chunksize=16))
    elapsed = time.perf_counter() - started
    print(f"extracted {len(jobs)} pages in {elapsed:.1f} s ({len(jobs) / elapsed:.1f} pages/s, "
          f"{workers} processes)")
    v1, v2 = hashes[: len(paths)], hashes[len(paths):]
    changed = sorted(p for p, a, b in zip(paths, v1, v2, strict=True) if a != b)
    expected = sorted(r["path"] for r in rows if r["status"] == "content_changed")
    assert changed == expected
    assert len(expected) == 5
