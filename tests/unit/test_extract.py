"""Extraction from real pages and a real PDF (tests/data), fallbacks, charsets, caps and snippets."""

from __future__ import annotations

import json
import pickle
import re
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import lxml.html
import pytest
import trafilatura

from research.cpu import run_cpu
from trafilatura.utils import load_html

from research.extract import (
    decode_body,
    detect_body_kind,
    extract_document,
    extract_html,
    fallback_html_text,
    parse_html,
    snippet_documents,
    unwrap_lines,
)
from research.models import Document, SearchResult
from research.passages import assign_passage_ids
from tests.fakes.bombs import PAGE_TEXT, flate_pdf

DATA = Path(__file__).resolve().parent.parent / "data"
PAGES = DATA / "pages"
FAQ_PDF = DATA / "pdf" / "debian-faq.pdf"
EXPECTED: dict[str, dict[str, Any]] = json.loads((PAGES / "expected.json").read_text(encoding="utf-8"))
PAGE_NAMES = sorted(EXPECTED)


def _one_line(text: str) -> str:
    # "¶" is a heading's anchor link, which we drop and plain trafilatura keeps.
    return re.sub(r"\s+", " ", text.replace("¶", " ")).strip()


@cache
def _our_text(page: str) -> str:
    document = extract_document(EXPECTED[page]["url"], (PAGES / page).read_bytes(), "text/html; charset=utf-8")
    assert document is not None
    return _one_line(document.text)


@cache
def _plain_trafilatura_text(page: str) -> str:
    return _one_line(trafilatura.extract((PAGES / page).read_bytes()) or "")


def test_there_are_at_least_ten_real_pages_from_distinct_sites() -> None:
    sites = {re.sub(r"^https?://(www\.)?", "", EXPECTED[page]["url"]).split("/")[0] for page in PAGE_NAMES}
    assert len(PAGE_NAMES) >= 10
    assert len(sites) >= 10
    assert all((PAGES / page).is_file() for page in PAGE_NAMES)


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_real_page_yields_its_key_sentences(page: str) -> None:
    text = _our_text(page)
    missing = [sentence for sentence in EXPECTED[page]["key_sentences"] if sentence not in text]
    assert missing == []


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_real_page_text_leaves_out_its_navigation_boilerplate(page: str) -> None:
    page_text = _one_line(lxml.html.document_fromstring((PAGES / page).read_bytes()).text_content())
    text = _our_text(page)
    for boilerplate in EXPECTED[page]["boilerplate"]:
        assert boilerplate in page_text, f"expected.json lists {boilerplate!r}, which the page does not show"
        assert boilerplate not in text


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_extraction_finds_every_key_sentence_plain_trafilatura_finds(page: str) -> None:
    plain, ours = _plain_trafilatura_text(page), _our_text(page)
    found_by_plain = [sentence for sentence in EXPECTED[page]["key_sentences"] if sentence in plain]
    assert [sentence for sentence in found_by_plain if sentence not in ours] == []


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_extraction_keeps_at_least_as_much_article_text_as_plain_trafilatura(page: str) -> None:
    plain, ours = _plain_trafilatura_text(page), _our_text(page)
    plain_sentences = [sentence for sentence in re.split(r"(?<=[.!?])\s+", plain) if len(sentence) > 60]
    kept = sum(1 for sentence in plain_sentences if sentence in ours)
    assert kept >= 0.95 * len(plain_sentences)


def _word_f1(text: str, reference: str) -> float:
    words, reference_words = Counter(re.findall(r"\w+", text)), Counter(re.findall(r"\w+", reference))
    common = sum((words & reference_words).values())
    return 2 * common / (sum(words.values()) + sum(reference_words.values())) if common else 0.0


@pytest.mark.parametrize("page", PAGE_NAMES)
def test_extracted_words_match_plain_trafilatura_on_every_page(page: str) -> None:
    assert _word_f1(_our_text(page), _plain_trafilatura_text(page)) >= 0.98


def _collapsed_as_a_browser_shows_it(tree: lxml.html.HtmlElement) -> lxml.html.HtmlElement:
    """Whitespace runs holding a line break turned into one space, except inside preformatted blocks and script or style bodies."""
    preformatted = {element for block in tree.iter("pre", "textarea", "listing", "plaintext", "xmp") for element in block.iter()}
    for element in tree.iter():
        if element.text and "\n" in element.text and element not in preformatted and element.tag not in ("script", "style"):
            element.text = re.sub(r"\s+", " ", element.text)
        if element.tail and "\n" in element.tail and element.getparent() not in preformatted:
            element.tail = re.sub(r"\s+", " ", element.tail)
    return tree


@pytest.mark.parametrize(
    "html",
    [
        *[decode_body((PAGES / page).read_bytes()) for page in PAGE_NAMES],
        "<?xml version='1.0' encoding='utf-8'?>\n<html><head><title>Declared</title></head><body><p>An XHTML page\nin two lines.</p></body></html>",
        "<!DOCTYPE html/>\n<html><body><p>Control\x0b characters\x00 and a\nbreak.</p><p>Second paragraph.</p></body></html>",
        "<html/>\n<body><p>A self-closing root.</p><p>Another paragraph.</p></body>",
    ],
    ids=[*PAGE_NAMES, "xml-declaration", "control-characters", "self-closing-root"],
)
def test_page_is_parsed_into_the_tree_trafilatura_builds_with_source_line_breaks_collapsed(html: str) -> None:
    ours, trafilaturas = parse_html(html), load_html(html)
    assert ours is not None and trafilaturas is not None
    assert lxml.html.tostring(ours) == lxml.html.tostring(_collapsed_as_a_browser_shows_it(trafilaturas))


def test_line_breaks_inside_preformatted_blocks_are_kept_and_elsewhere_become_spaces() -> None:
    tree = parse_html(
        "<html><body><p>Wrapped\n   paragraph <b>bold\ntext</b>\nend.</p>"
        "<pre>def f():\n    <b>return</b>\n        1</pre>\n<p>After</p>"
        "<textarea>first\nsecond</textarea></body></html>"
    )
    assert tree is not None
    paragraph, pre, _, textarea = tree.find("body")
    assert lxml.html.tostring(paragraph, encoding="unicode") == "<p>Wrapped paragraph <b>bold text</b> end.</p>"
    assert pre.text_content() == "def f():\n    return\n        1"
    assert pre.tail == " "
    assert textarea.text == "first\nsecond"


def test_title_author_and_date_come_from_meta_tags_and_json_ld_anywhere_in_the_page() -> None:
    paragraph = "The council approved the new bridge after a long debate about its cost and its design. " * 4
    html = (
        "<html><head><meta property='og:title' content='Bridge approved'><title>Bridge approved | Example News</title></head>"
        f"<body><article><h1>Bridge approved</h1><p>{paragraph}</p><p>{paragraph}</p></article>"
        '<script type="application/ld+json">{"@context": "https://schema.org", "@type": "NewsArticle", "author": {"@type": "Person", "name": "Jane Doe"},'
        ' "datePublished": "2024-03-05T10:00:00Z"}</script></body></html>'
    )
    document = extract_document("https://news.example/bridge", html.encode(), "text/html")
    assert document is not None
    assert (document.title, document.author, document.published) == ("Bridge approved", "Jane Doe", "2024-03-05")


def test_a_date_written_only_in_the_text_is_not_searched_for() -> None:
    paragraph = "The council approved the new bridge after a long debate about its cost and its design. " * 4
    html = f"<html><head><title>Bridge</title></head><body><article><p class='date'>Posted on 2024-03-05</p><p>{paragraph}</p></article></body></html>"
    document = extract_document("https://news.example/bridge", html.encode(), "text/html")
    assert document is not None and "Posted on 2024-03-05" in document.text
    assert document.published is None


def test_page_metadata_title_author_and_date_are_kept() -> None:
    page = "time-hansen-climate.html"
    document = extract_document(EXPECTED[page]["url"], (PAGES / page).read_bytes(), "text/html")
    assert document is not None
    assert document.kind == "html"
    assert document.title is not None and "Geoengineering" in document.title
    assert document.author == "Alejandro de la Garza"
    assert document.published == "2023-11-02"


def test_wrapped_source_lines_inside_a_paragraph_are_joined() -> None:
    text = extract_document(EXPECTED["python-howto-sockets.html"]["url"], (PAGES / "python-howto-sockets.html").read_bytes(), None)
    assert text is not None
    assert "Also note that in C, many of the more advanced socket options are done differently on Windows." in text.text


def test_real_pdf_yields_its_text_and_title() -> None:
    document = extract_document("https://www.debian.org/doc/manuals/debian-faq/debian-faq.en.pdf", FAQ_PDF.read_bytes(), "application/pdf")
    assert document is not None
    assert document.kind == "pdf"
    assert document.title == "The Debian GNU/Linux FAQ"
    for sentence in (
        "Debian GNU/Linux is a particular distribution of the Linux operating system, and numerous packages that run on it.",
        "No new functionality is added to the stable release.",
        "Security updates serve one purpose: to supply a fix for a security vulnerability.",
    ):
        assert sentence in document.text


def test_pdf_text_stops_at_the_page_cap() -> None:
    late_sentence = "The first edition of this FAQ was made and maintained by J.H.M. Dassen (Ray) and Chuck Stickelman."
    capped = extract_document("https://example.org/faq.pdf", FAQ_PDF.read_bytes(), "application/pdf")
    uncapped = extract_document("https://example.org/faq.pdf", FAQ_PDF.read_bytes(), "application/pdf", max_pdf_pages=100)
    first_pages = extract_document("https://example.org/faq.pdf", FAQ_PDF.read_bytes(), "application/pdf", max_pdf_pages=10)
    assert capped is not None and uncapped is not None and first_pages is not None
    assert late_sentence in uncapped.text
    assert late_sentence not in capped.text
    assert "No new functionality is added to the stable release." not in first_pages.text


def test_pdf_is_recognised_by_its_signature_whatever_the_declared_type() -> None:
    document = extract_document("https://example.org/download", FAQ_PDF.read_bytes(), "application/octet-stream")
    assert document is not None and document.kind == "pdf"


def test_broken_pdf_yields_none() -> None:
    assert extract_document("https://example.org/broken.pdf", b"%PDF-1.4\n% not really a pdf\n", "application/pdf") is None


def test_text_is_capped_at_the_character_limit_on_a_word_boundary() -> None:
    document = extract_document("https://example.org/faq.pdf", FAQ_PDF.read_bytes(), "application/pdf", max_text_characters=1000)
    assert document is not None
    assert len(document.text) <= 1000
    assert document.text == document.text.strip()
    full = extract_document("https://example.org/faq.pdf", FAQ_PDF.read_bytes(), "application/pdf")
    assert full is not None
    assert full.text.startswith(document.text)
    assert full.text[len(document.text)].isspace()


def test_fallback_extractor_reads_the_page_when_trafilatura_finds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    html = (
        "<html><head><title>Tiny page</title></head><body>"
        "<nav><a href='/'>Home</a> <a href='/about'>About us</a></nav>"
        "<main><p>Short fact: the bridge opened in 1932.</p></main>"
        "<footer>Copyright Example Corp</footer></body></html>"
    )
    # trafilatura almost always finds something; this stands in for the pages where it does not.
    monkeypatch.setattr(trafilatura, "bare_extraction", lambda *args, **kwargs: None)
    document = extract_html("https://example.org/tiny", html.encode())
    assert document is not None
    assert document.text == "Short fact: the bridge opened in 1932."
    assert document.title == "Tiny page"


def test_documentation_heading_anchors_are_dropped_from_title_and_text() -> None:
    document = extract_document(EXPECTED["python-howto-sockets.html"]["url"], (PAGES / "python-howto-sockets.html").read_bytes(), "text/html")
    assert document is not None
    assert document.title == "Socket Programming HOWTO"
    assert "¶" not in document.text


def test_html_fragment_without_document_structure_is_still_read() -> None:
    fragment = "<div><p>Short fact: the bridge opened in 1932.</p></div>"
    assert trafilatura.extract(fragment) is None
    document = extract_document("https://example.org/fragment", fragment.encode(), "text/html")
    assert document is not None
    assert document.text == "Short fact: the bridge opened in 1932."


def test_fallback_extractor_drops_navigation_scripts_and_hidden_blocks() -> None:
    html = (
        "<html><body><header>Site header</header><div role='navigation'>Menu entries</div>"
        "<script>var tracking = 1;</script><style>p { color: red }</style>"
        "<article><h1>Title</h1><p>First paragraph.</p><ul><li>An item</li></ul>"
        "<div hidden>Hidden teaser</div><p style='display: none'>Invisible</p></article>"
        "<aside>Related links</aside><footer>Footer text</footer></body></html>"
    )
    assert fallback_html_text(html) == "Title\nFirst paragraph.\nAn item"


def test_declared_charset_in_the_header_decodes_the_body() -> None:
    body = "<html><body><p>Ça coûte 5 € à Zürich.</p></body></html>".encode("cp1252")
    assert "Ça coûte 5 € à Zürich." in decode_body(body, "text/html; charset=windows-1252")


def test_meta_charset_decodes_the_body_when_the_header_has_none() -> None:
    body = '<html><head><meta charset="iso-8859-1"></head><body><p>Señor Müller</p></body></html>'.encode("latin-1")
    assert "Señor Müller" in decode_body(body, "text/html")


def test_utf8_body_without_declaration_is_decoded_as_utf8() -> None:
    assert decode_body("Ελληνικά και русский".encode()) == "Ελληνικά και русский"


def test_page_in_a_legacy_charset_yields_readable_text() -> None:
    paragraph = "Le conseil municipal a voté à l'unanimité la rénovation de l'école élémentaire, dont les travaux débuteront en été. " * 3
    html = f"<html><head><meta http-equiv='Content-Type' content='text/html; charset=iso-8859-1'></head><body><article><p>{paragraph}</p></article></body></html>"
    document = extract_document("https://example.fr/article", html.encode("latin-1"), "text/html")
    assert document is not None
    assert "la rénovation de l'école élémentaire" in document.text


def test_plain_text_body_is_unwrapped_into_sentences_per_line() -> None:
    body = (
        b"Wrapped plain text keeps going\nacross several lines of one\nparagraph until it ends.\n\n"
        b"Second paragraph.\n- a list item\n- another item\n"
    )
    document = extract_document("https://example.org/notes.txt", body, "text/plain")
    assert document is not None and document.kind == "text"
    assert document.text.split("\n") == [
        "Wrapped plain text keeps going across several lines of one paragraph until it ends.",
        "",
        "Second paragraph.",
        "- a list item",
        "- another item",
    ]


def test_pdf_soft_hyphens_at_line_ends_rejoin_the_word() -> None:
    page = "The package manage\x02\r\nment system is here and this line is long enough to count as wrapped.\r\nNext line."
    assert unwrap_lines(page) == "The package management system is here and this line is long enough to count as wrapped.\nNext line."


@pytest.mark.parametrize(
    ("body", "content_type", "kind"),
    [
        (b"%PDF-1.7\n...", None, "pdf"),
        (b"<!DOCTYPE html><html><body>x</body></html>", None, "html"),
        (b"<?xml version='1.0'?><html xmlns='http://www.w3.org/1999/xhtml'><body/></html>", "application/xhtml+xml", "html"),
        (b"just words", "text/plain; charset=utf-8", "text"),
        (b"<p>markup shown as source</p>", "text/plain", "text"),
        (b"<html><body>mislabelled</body></html>", "application/octet-stream", "html"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "image/png", None),
        (b"\x00\x01\x02binary", None, None),
        (b"<html>not really</html>", "application/pdf", None),
    ],
)
def test_body_kind_is_detected_from_bytes_and_declared_type(body: bytes, content_type: str | None, kind: str | None) -> None:
    assert detect_body_kind(body, content_type) == kind


def test_binary_body_yields_no_document() -> None:
    assert extract_document("https://example.org/image.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "image/png") is None


def test_empty_html_yields_no_document() -> None:
    assert extract_document("https://example.org/empty", b"<html><body></body></html>", "text/html") is None


def test_snippets_become_snippet_documents_keyed_by_source_id() -> None:
    results = [
        SearchResult(id="s1", provider="brave", title="One", url="https://one.example/", snippet="First  snippet.", extra_snippets=["More detail.", "First snippet."]),
        SearchResult(id="s2", provider="brave", title="Two", url="https://two.example/", snippet=""),
        SearchResult(id="s3", provider="tavily", title="Three", url="https://three.example/", snippet="Third snippet."),
    ]
    documents = snippet_documents(results)
    assert [source_id for source_id, _ in documents] == ["s1", "s3"]
    assert documents[0][1] == Document(url="https://one.example/", kind="snippet", text="First snippet.\nMore detail.", title="One")
    passages = assign_passage_ids(documents)
    assert [passage.id for passage in passages] == ["p1", "p2"]
    assert all(passage.is_snippet for passage in passages)


def test_extraction_function_arguments_and_result_survive_pickling_for_a_process_pool() -> None:
    body = (PAGES / "yonhap-north-korea.html").read_bytes()
    call = pickle.loads(pickle.dumps((extract_document, ("https://en.yna.co.kr/view/x", body, "text/html"))))
    function, arguments = call
    result = function(*arguments)
    assert pickle.loads(pickle.dumps(result)) == result


async def test_run_cpu_without_a_pool_runs_inline() -> None:
    body = (PAGES / "iana-reserved-domains.html").read_bytes()
    document = await run_cpu(extract_document, "https://www.iana.org/domains/reserved", body, "text/html", max_text_characters=200)
    assert document is not None
    assert len(document.text) <= 200
    assert document.text.startswith("IANA-managed Reserved Domains")


def test_utf8_body_wrongly_declared_as_latin1_is_still_read_as_utf8() -> None:
    body = "<html><body><p>Zürich – café</p></body></html>".encode()
    assert "Zürich – café" in decode_body(body, "text/html; charset=ISO-8859-1")


def test_markup_past_the_character_cap_is_cut_before_parsing() -> None:
    late_sentence = "This closing paragraph sits far down the page, after a great deal of filler text."
    filler = "<p>" + "Filler words that pad the page out to a good length. " * 40 + "</p>"
    html = f"<html><body><article>{filler * 20}<p>{late_sentence}</p></article></body></html>".encode()
    uncapped = extract_document("https://example.org/long", html, "text/html", max_html_characters=len(html) + 1)
    capped = extract_document("https://example.org/long", html, "text/html", max_html_characters=len(html) // 2)
    assert uncapped is not None and capped is not None
    assert late_sentence in uncapped.text
    assert late_sentence not in capped.text
    assert "Filler words" in capped.text


def test_page_with_more_elements_than_the_cap_is_read_without_trafilatura() -> None:
    html = (
        b"<html><body><article><h1>Prices</h1><p>An introduction long enough to count as the article's real content.</p>"
        b"<table><tr><td>alpha</td><td>beta</td></tr><tr><td>gamma</td><td>delta</td></tr></table></article></body></html>"
    )
    # trafilatura writes table rows as "| alpha | beta |"; the fallback extractor writes one cell a line.
    within_cap = extract_document("https://example.org/prices", html, "text/html")
    past_cap = extract_document("https://example.org/prices", html, "text/html", max_html_elements=5)
    assert within_cap is not None and past_cap is not None
    assert "| alpha | beta |" in within_cap.text
    assert "alpha\nbeta\ngamma\ndelta" in past_cap.text


def test_pdf_page_whose_content_inflates_past_the_cap_is_refused_before_parsing() -> None:
    body = flate_pdf(2 * 1024 * 1024)
    assert len(body) < 64 * 1024
    within_cap = extract_document("https://example.org/inflated.pdf", body, "application/pdf", max_pdf_page_content_bytes=4 * 1024 * 1024)
    past_cap = extract_document("https://example.org/inflated.pdf", body, "application/pdf", max_pdf_page_content_bytes=1024 * 1024)
    assert within_cap is not None and PAGE_TEXT in within_cap.text
    assert past_cap is None
