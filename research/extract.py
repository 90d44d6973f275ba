"""Main text from fetched bytes: HTML through trafilatura (with a plain fallback), PDF, plain text, snippets.

Every function here is top-level and takes and returns plain picklable data, so the caller can run
it in a process pool (see `research.cpu`).
"""

from __future__ import annotations

import codecs
import copy
import io
import logging
import re
import threading
import unicodedata
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

import lxml.etree
import lxml.html
import trafilatura
from charset_normalizer import from_bytes
from htmldate import find_date
from trafilatura.metadata import examine_meta, extract_meta_json, extract_title
from trafilatura.settings import Document as TrafilaturaDocument
from trafilatura.settings import Extractor as TrafilaturaOptions
from trafilatura.utils import is_dubious_html, repair_faulty_html

from research.models import Document, SearchResult

if TYPE_CHECKING:
    from pypdf.generic import StreamObject

DEFAULT_MAX_PDF_PAGES = 50
DEFAULT_MAX_TEXT_CHARACTERS = 300_000
# Markup past this many decoded characters is cut before parsing: a 20 MiB table costs GiBs and minutes to parse.
DEFAULT_MAX_HTML_CHARACTERS = 2_000_000
# trafilatura takes seconds per 100,000 elements; a page with more is read by the linear fallback extractor.
DEFAULT_MAX_HTML_ELEMENTS = 50_000
# A page's content streams inflated past this are refused before pdfium, which needs ~12 times as much memory.
DEFAULT_MAX_PDF_PAGE_CONTENT_BYTES = 16 * 1024 * 1024
_INFLATE_CHUNK_BYTES = 1024 * 1024

BodyKind = Literal["html", "pdf", "text"]
# Why `read_pdf_pages` read no pages: a page that inflates past the cap, a password, or no reader managing.
PdfProblem = Literal["oversized", "encrypted", "unreadable"]

_HTML_CONTENT_TYPES = frozenset({"text/html", "application/xhtml+xml", "application/xml", "text/xml"})
_TEXT_CONTENT_TYPES = frozenset({"text/plain", "text/markdown", "text/x-markdown", "text/csv"})
_PDF_CONTENT_TYPES = frozenset({"application/pdf", "application/x-pdf"})

_CHARSET_PARAMETER = re.compile(r"""charset\s*=\s*["']?([\w.:-]+)""", re.IGNORECASE)
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([\w.:-]+)""", re.IGNORECASE)
_XML_ENCODING = re.compile(rb"""^\s*<\?xml[^>]+encoding\s*=\s*["']([\w.:-]+)["']""", re.IGNORECASE)
_HTML_SIGNATURE = re.compile(rb"<(?:!doctype\s+html|html|head|body|title|meta|div|p)[\s>]", re.IGNORECASE)
_LATIN_ENCODINGS = frozenset({"iso-8859-1", "iso8859-1", "latin-1", "latin1", "l1", "us-ascii", "ascii", "windows-1252", "cp1252"})
_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)

# Elements whose text is never the page's main content.
_BOILERPLATE_TAGS = (
    "script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "embed",
    "nav", "header", "footer", "aside", "form", "button", "select", "textarea", "menu", "dialog",
)
_BOILERPLATE_ROLES = frozenset({"navigation", "banner", "contentinfo", "complementary", "search", "menu", "menubar", "dialog"})
_BLOCK_TAGS = ("p", "h1", "h2", "h3", "h4", "h5", "h6", "li", "pre", "blockquote", "dt", "dd", "td", "th", "figcaption")
_PREFORMATTED_TAGS = ("pre", "textarea", "listing", "plaintext", "xmp")
_RAW_TEXT_TAGS = ("script", "style")
_MAIN_CONTAINER_XPATH = "//main | //article | //*[@role='main'] | //*[@id='content'] | //*[@id='main']"
_NODE_COUNT = lxml.etree.XPath("count(descendant-or-self::*) + count(descendant::comment()) + count(descendant::processing-instruction())")

# Both match only whitespace that replacing with one space changes: a lone space, most of a text's whitespace, is skipped.
_SOURCE_WHITESPACE = re.compile(r"\s{2,}|[^\S ]")
_SPACES = re.compile(r"[ \t\f\v\u00a0\u2000-\u200a\u202f\u205f\u3000]{2,}|[\t\f\v\u00a0\u2000-\u200a\u202f\u205f\u3000]")
_HORIZONTAL_WHITESPACE_BUT_SPACE = re.compile(r"[\t\f\v\u00a0\u2000-\u200a\u202f\u205f\u3000]")
_MANY_BLANK_LINES = re.compile(r"\n{3,}")
_LINE_ENDS_SENTENCE = re.compile(r"[.!?:;…。！？][\"'”’)\]]*$")
_LINE_ENDS_IN_URL_SCHEME = re.compile(r"\bhttps?:$")
# Table-of-contents dot leaders: ". . . . ." or "......".
_DOT_LEADERS = re.compile(r"(?:[ \t]?\.){4,}")
_LINE_STARTS_BLOCK = re.compile(r"^(?:[•◦▪●·*\-–—#>]|\d+[.)]\s|[A-Za-z][.)]\s)")

# pdfium is not thread-safe; a process-wide lock keeps threaded callers correct.
_PDFIUM_LOCK = threading.Lock()
_PARSERS = threading.local()
# What `trafilatura.bare_extraction(tree, include_comments=False)` builds on each call.
_TRAFILATURA_OPTIONS = TrafilaturaOptions(output_format="python", comments=False)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PdfPages:
    """A PDF's first pages read: each page's text cleaned ("" for a page without text), and its title and author."""

    texts: list[str]
    title: str | None
    author: str | None


def page_host(url: str) -> str:
    """What a log line says of a page: its host, since a full URL may be one a person pasted into a question."""
    return urlsplit(url).hostname or "a page"


def extract_document(
    url: str,
    body: bytes,
    content_type: str | None,
    *,
    max_pdf_pages: int = DEFAULT_MAX_PDF_PAGES,
    max_text_characters: int = DEFAULT_MAX_TEXT_CHARACTERS,
    max_html_characters: int = DEFAULT_MAX_HTML_CHARACTERS,
    max_html_elements: int = DEFAULT_MAX_HTML_ELEMENTS,
    max_pdf_page_content_bytes: int | None = DEFAULT_MAX_PDF_PAGE_CONTENT_BYTES,
) -> Document | None:
    """The main text of a fetched HTML, XHTML, PDF or plain-text body, or None when it holds nothing readable."""
    kind = detect_body_kind(body, content_type)
    if kind == "html":
        return extract_html(url, body, content_type, max_text_characters=max_text_characters,
                            max_html_characters=max_html_characters, max_html_elements=max_html_elements)
    if kind == "pdf":
        return extract_pdf(url, body, max_pages=max_pdf_pages, max_text_characters=max_text_characters,
                           max_page_content_bytes=max_pdf_page_content_bytes)
    if kind == "text":
        return extract_plain_text(url, body, content_type, max_text_characters=max_text_characters)
    return None


def detect_body_kind(body: bytes, content_type: str | None) -> BodyKind | None:
    """What a body is, from its leading bytes first and its declared media type second; None for other binaries."""
    head = body[:2048].lstrip()
    if head.startswith(b"%PDF-"):
        return "pdf"
    media_type = _media_type(content_type)
    if media_type in _PDF_CONTENT_TYPES:
        return None  # declared a PDF but has no PDF signature
    if media_type in _HTML_CONTENT_TYPES:
        return "html"
    if media_type in _TEXT_CONTENT_TYPES:
        return "text"
    if _HTML_SIGNATURE.search(head):
        return "html"
    if media_type is None and looks_like_text(head):
        return "text"
    return None


def decode_body(body: bytes, content_type: str | None = None) -> str:
    """Text of a body, decoded by its byte-order mark, declared charset, in-document declaration, UTF-8, or a guess, in that order."""
    for bom, encoding in _BOMS:
        if body.startswith(bom):
            return body.decode(encoding, errors="replace")
    for encoding in _declared_encodings(body, content_type):
        try:
            return body.decode(encoding)
        except (LookupError, UnicodeDecodeError):
            continue
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    best_guess = from_bytes(body[:65536]).best()
    if best_guess is not None:
        return body.decode(best_guess.encoding, errors="replace")
    return body.decode("utf-8", errors="replace")


def extract_html(
    url: str,
    body: bytes,
    content_type: str | None = None,
    *,
    max_text_characters: int = DEFAULT_MAX_TEXT_CHARACTERS,
    max_html_characters: int = DEFAULT_MAX_HTML_CHARACTERS,
    max_html_elements: int = DEFAULT_MAX_HTML_ELEMENTS,
) -> Document | None:
    """The article text, title, author and date of an HTML page; the plain fallback extractor when trafilatura finds nothing.

    Only the first `max_html_characters` of the decoded markup are parsed, and a page of more than
    `max_html_elements` elements goes to the fallback extractor alone.
    """
    html = decode_body(body, content_type)
    if len(html) > max_html_characters:
        logger.info("%s has %d characters of markup; parsing the first %d", page_host(url), len(html), max_html_characters)
        html = html[:max_html_characters]
    tree = parse_html(html)
    if tree is None:
        return None
    element_count = _count_up_to(tree, max_html_elements + 1)
    if element_count > max_html_elements:
        logger.info("%s has over %d elements; reading it with the fallback extractor only", page_host(url), max_html_elements)
        extracted = None
    else:
        extracted = _trafilatura_extraction(tree, url)
    text = clean_text(extracted.text) if extracted is not None and extracted.text else ""
    if not text:
        text = _fallback_text_of_tree(tree)
    if not text:
        return None
    metadata = _page_metadata(tree, url) if extracted is not None else None
    return Document(
        url=url,
        kind="html",
        text=capped_text(text, max_text_characters),
        title=_clean_title(metadata.title if metadata is not None else None) or _title_of_tree(tree),
        author=metadata.author if metadata is not None else None,
        published=metadata.date if metadata is not None else None,
    )


def parse_html(html: str) -> lxml.html.HtmlElement | None:
    """A page's lxml tree, parsed as trafilatura parses it, with source line breaks inside text collapsed; None when it is not HTML."""
    tree = _parse_as_trafilatura(html)
    if tree is None:
        tree = _parse_leniently(html)
    if tree is None:
        return None
    _collapse_source_whitespace(tree)
    return tree


def fallback_html_text(html: str) -> str:
    """The block text of a page's main container (or body), without navigation, headers, footers, scripts or forms."""
    tree = parse_html(html)
    return _fallback_text_of_tree(tree) if tree is not None else ""


def extract_pdf(
    url: str,
    body: bytes,
    *,
    max_pages: int = DEFAULT_MAX_PDF_PAGES,
    max_text_characters: int = DEFAULT_MAX_TEXT_CHARACTERS,
    max_page_content_bytes: int | None = DEFAULT_MAX_PDF_PAGE_CONTENT_BYTES,
) -> Document | None:
    """The text of a PDF's first `max_pages` pages with its title and author, or None when it is unreadable, has no text,
    or has a page whose content streams inflate past `max_page_content_bytes` (checked before any page is parsed).
    """
    pages = read_pdf_pages(body, max_pages=max_pages, max_text_characters=max_text_characters,
                           max_page_content_bytes=max_page_content_bytes, described_as=page_host(url))
    if isinstance(pages, str):
        return None
    text = "\n\n".join(page for page in pages.texts if page)
    if not text:
        return None
    return Document(url=url, kind="pdf", text=capped_text(text, max_text_characters), title=pages.title,
                    author=pages.author)


def read_pdf_pages(
    body: bytes,
    *,
    max_pages: int,
    max_text_characters: int,
    max_page_content_bytes: int | None,
    described_as: str = "a PDF",
) -> PdfPages | PdfProblem:
    """The cleaned text of each of a PDF's first `max_pages` pages (pdfium first, pypdf when pdfium cannot read it), or
    what stopped it: a page whose content streams inflate past `max_page_content_bytes` (checked before any page is
    parsed), a password, or neither reader managing. Pages joined by a blank line make `extract_pdf`'s text.

    `described_as` is what the log lines call the PDF (a page's host; never a person's file name or a full URL).
    """
    if max_page_content_bytes is not None and _has_oversized_page_content(body, max_pages, max_page_content_bytes):
        logger.warning("%s has a page whose content inflates past %d bytes; not reading it", described_as, max_page_content_bytes)
        return "oversized"
    try:
        page_texts, metadata = _pdfium_pages(body, max_pages, max_text_characters)
    except Exception as error:  # pdfium raises its own error types and ctypes errors on broken files
        if _is_password_error(error):
            logger.info("%s needs a password", described_as)
            return "encrypted"
        logger.info("pdfium could not read %s (%s); trying pypdf", described_as, type(error).__name__)
        try:
            page_texts, metadata = _pypdf_pages(body, max_pages)
        except Exception as second_error:  # pypdf raises many error types on broken files
            logger.info("pypdf could not read %s either (%s)", described_as, type(second_error).__name__)
            return "unreadable"
    return PdfPages(
        texts=[clean_text(unwrap_lines(page)) for page in page_texts],
        title=metadata.get("title") or None,
        author=metadata.get("author") or None,
    )


def unwrap_lines(text: str) -> str:
    """Hard-wrapped text (a PDF page, a plain-text file) with hyphenated line ends rejoined and wrapped lines joined.

    A line break stays where a line ends a sentence, falls well short of the usual line width (a
    heading or a paragraph's last line), or comes before a list item or Markdown heading.
    """
    normalized = text.replace("\r\n", "\n").replace("\r", "\n")
    normalized = normalized.replace("\x02\n", "").replace("\x02", "").replace("\u00ad\n", "")
    normalized = _DOT_LEADERS.sub(" … ", normalized)
    lines = [_SPACES.sub(" ", line).strip() for line in normalized.split("\n")]
    short_line = 0.6 * _usual_line_length(lines)
    merged: list[str] = []
    previous_line = ""
    for line in lines:
        if not line:
            if merged and merged[-1]:
                merged.append("")
            previous_line = ""
            continue
        if merged and merged[-1] and _continues_previous_line(previous_line, line, short_line):
            merged[-1] = f"{merged[-1]} {line}"
        else:
            merged.append(line)
        previous_line = line
    return "\n".join(merged)


def _usual_line_length(lines: list[str]) -> float:
    """The length of a long-ish line of a page (its 80th percentile), the width wrapped lines reach."""
    lengths = sorted(len(line) for line in lines if line)
    if not lengths:
        return 0.0
    return float(lengths[int(0.8 * (len(lengths) - 1))])


def _continues_previous_line(previous_line: str, line: str, short_line: float) -> bool:
    """Whether a line is the wrapped continuation of the one before it."""
    if previous_line.startswith("#") or _LINE_STARTS_BLOCK.match(line):
        return False
    if _LINE_ENDS_SENTENCE.search(previous_line) and not _LINE_ENDS_IN_URL_SCHEME.search(previous_line):
        return False
    return len(previous_line) >= short_line


def extract_plain_text(
    url: str,
    body: bytes,
    content_type: str | None = None,
    *,
    max_text_characters: int = DEFAULT_MAX_TEXT_CHARACTERS,
) -> Document | None:
    """A plain-text body as a document, or None when it is empty."""
    text = clean_text(unwrap_lines(decode_body(body, content_type)))
    if not text:
        return None
    return Document(url=url, kind="text", text=capped_text(text, max_text_characters))


def snippet_documents(results: Sequence[SearchResult]) -> list[tuple[str, Document]]:
    """Search results' snippets as stand-in documents keyed by source id, for when every fetch failed; empty snippets are left out."""
    documents: list[tuple[str, Document]] = []
    for result in results:
        pieces = [_SPACES.sub(" ", piece).strip() for piece in (result.snippet, *result.extra_snippets)]
        text = "\n".join(dict.fromkeys(piece for piece in pieces if piece))
        if text:
            documents.append((result.id, Document(url=result.url, kind="snippet", text=text, title=result.title or None)))
    return documents


def _trafilatura_extraction(tree: lxml.html.HtmlElement, url: str) -> TrafilaturaDocument | None:
    """trafilatura's extraction of a parsed page's text, without comments or metadata; None when it finds nothing."""
    options = copy.copy(_TRAFILATURA_OPTIONS)  # building one reads trafilatura's configuration: a tenth of a millisecond
    options.url = options.source = url or None
    try:
        extracted = trafilatura.bare_extraction(tree, options=options)
    except (ValueError, TypeError, lxml.etree.LxmlError) as error:
        logger.info("trafilatura failed on %s (%s)", page_host(url), type(error).__name__)
        return None
    return extracted if isinstance(extracted, TrafilaturaDocument) else None


def _page_metadata(tree: lxml.html.HtmlElement, url: str) -> TrafilaturaDocument:
    """A page's title and author from trafilatura's meta-tag, JSON-LD and title passes, and its date as htmldate reads it in the page's metadata.

    trafilatura's full metadata pass also searches the whole page for a byline, categories, tags, a licence
    and dates in its text: a third of our extraction time, for fields that nothing downstream reads.
    """
    metadata_elements = _metadata_elements(tree)
    metadata = examine_meta(metadata_elements)
    if metadata.author and " " not in metadata.author:
        metadata.author = None  # trafilatura's rule: a one-word author tag is a handle, not a name
    try:
        metadata = extract_meta_json(metadata_elements, metadata)
    except Exception as error:  # trafilatura guards its JSON-LD parser the same way
        logger.info("JSON-LD metadata of %s unreadable (%s)", page_host(url), type(error).__name__)
    metadata.title = metadata.title or extract_title(tree)
    try:
        metadata.date = find_date(metadata_elements, extensive_search=False, original_date=True, url=metadata.url or url or None)
    except (ValueError, TypeError, lxml.etree.LxmlError) as error:
        logger.info("htmldate failed on %s (%s)", page_host(url), type(error).__name__)
    metadata.clean_and_trim()
    return metadata


def _metadata_elements(tree: lxml.html.HtmlElement) -> lxml.html.HtmlElement:
    """A small document of copies of a page's <head> and of its body's <meta> and <time> elements, with its JSON scripts but no code or styles."""
    metadata_elements = _fast_html_parser().makeelement("html")
    head, body = tree.find("head"), tree.find("body")
    if head is not None:
        metadata_elements.append(copy.copy(head))
    if body is not None:
        metadata_elements.extend(copy.copy(element) for element in body.iter("meta", "time", "script") if not _is_code_or_style(element))
    # Code and styles hold no metadata, and htmldate would copy them and run its patterns over them.
    for element in [element for element in metadata_elements.iter(*_RAW_TEXT_TAGS) if _is_code_or_style(element)]:
        element.drop_tree()
    return metadata_elements


def _is_code_or_style(element: lxml.html.HtmlElement) -> bool:
    """Whether an element is a script other than JSON data, or a style sheet."""
    return element.tag == "style" or (element.tag == "script" and "json" not in (element.get("type") or ""))


def _fallback_text_of_tree(tree: lxml.html.HtmlElement) -> str:
    """The block text of a tree's main container (or body), after removing boilerplate from a copy of it."""
    root = copy.deepcopy(tree)
    _remove_boilerplate(root)
    containers = root.xpath(_MAIN_CONTAINER_XPATH)
    container = max(containers, key=_text_length) if containers else root.find(".//body")
    if container is None:
        container = root
    blocks = [_element_text(element) for element in container.iter(*_BLOCK_TAGS) if not _has_block_ancestor_within(element, container)]
    blocks = [block for block in blocks if block]
    if not blocks:
        blocks = [line for line in (_SPACES.sub(" ", line).strip() for line in container.text_content().splitlines()) if line]
    return clean_text("\n".join(blocks))


def _title_of_tree(tree: lxml.html.HtmlElement) -> str | None:
    """The text of a tree's <title> element, or None."""
    return _clean_title(tree.findtext(".//title"))


def _clean_title(title: str | None) -> str | None:
    """A title on one line without a trailing heading anchor (Sphinx's ¶), or None when empty."""
    cleaned = _SPACES.sub(" ", " ".join((title or "").split())).rstrip("¶ ")
    return cleaned or None


def _collapse_source_whitespace(tree: lxml.html.HtmlElement) -> None:
    """Turn runs of whitespace holding a line break into one space outside preformatted elements, as a browser renders them."""
    preformatted: set[lxml.html.HtmlElement] = set()
    for block in tree.iter(*_PREFORMATTED_TAGS):
        preformatted.update(block.iter())
    # Scripts and styles are never read as text, and their bodies are the largest strings of a page.
    text_left_alone = preformatted.union(tree.iter(*_RAW_TEXT_TAGS))
    for element in tree.iter():
        if element not in text_left_alone:
            text = element.text
            if text and "\n" in text and isinstance(element.tag, str):
                element.text = _collapsed_whitespace(text)
        tail = element.tail
        if tail and "\n" in tail and (not preformatted or element.getparent() not in preformatted):
            element.tail = _collapsed_whitespace(tail)


def _collapsed_whitespace(text: str) -> str:
    """Text with each run of whitespace turned into one space."""
    # Most such text is the source's indentation between tags, which needs no regular expression.
    return " " if text.isspace() else _SOURCE_WHITESPACE.sub(" ", text)


def _count_up_to(tree: lxml.html.HtmlElement, limit: int) -> int:
    """How many elements, comments and processing instructions a tree has, or `limit` when it has more."""
    return min(int(_NODE_COUNT(tree)), limit)  # counted in C, twice as fast as a walk from Python


def _has_oversized_page_content(body: bytes, max_pages: int, max_content_bytes: int) -> bool:
    """Whether one of the first pages has Flate content streams that inflate past `max_content_bytes`, inflated in chunks to know."""
    import pypdf
    from pypdf.generic import ArrayObject, StreamObject

    try:
        reader = pypdf.PdfReader(io.BytesIO(body))
        pages = [reader.pages[index] for index in range(min(len(reader.pages), max_pages))]
        for page in pages:
            contents = page.get("/Contents")
            contents = contents.get_object() if contents is not None else None
            streams = list(contents) if isinstance(contents, ArrayObject) else [contents]
            inflated = 0
            for reference in streams:
                stream = reference.get_object() if reference is not None else None
                if isinstance(stream, StreamObject):
                    inflated += _inflated_size(stream, max_content_bytes - inflated + 1)
                if inflated > max_content_bytes:
                    return True
    except Exception as error:  # pypdf raises many error types on broken files; pdfium may still read them
        logger.info("pypdf could not check the page contents (%s)", type(error).__name__)
    return False


def _inflated_size(stream: StreamObject, limit: int) -> int:
    """The size of a content stream once inflated, counting no further than `limit`; other filters count their raw size."""
    filters = stream.get("/Filter")
    raw: bytes = stream._data  # the encoded bytes: pypdf has no public reader that leaves them undecoded
    if filters not in ("/FlateDecode", ["/FlateDecode"]):
        return len(raw)
    inflater = zlib.decompressobj()
    size = len(inflater.decompress(raw, _INFLATE_CHUNK_BYTES))
    while inflater.unconsumed_tail and size < limit:
        size += len(inflater.decompress(inflater.unconsumed_tail, _INFLATE_CHUNK_BYTES))
    return size


def _pdfium_pages(body: bytes, max_pages: int, max_characters: int) -> tuple[list[str], dict[str, str]]:
    """Text of each of the first pages, up to the page holding the `max_characters`th character, and the title/author metadata, read with pdfium."""
    import pypdfium2  # imported here so HTML-only workers never load the native library

    with _PDFIUM_LOCK:
        document = pypdfium2.PdfDocument(body)
        try:
            metadata = document.get_metadata_dict(skip_empty=True)
            texts: list[str] = []
            characters = 0
            for index in range(min(len(document), max_pages)):
                if characters >= max_characters:
                    break
                page = document[index]
                textpage = page.get_textpage()
                texts.append(textpage.get_text_bounded())
                characters += len(texts[-1])
                textpage.close()
                page.close()
        finally:
            document.close()
    return texts, {"title": metadata.get("Title", ""), "author": metadata.get("Author", "")}


def _is_password_error(error: Exception) -> bool:
    """Whether pdfium refused a PDF because it needs a password (pypdf would refuse it too, less plainly)."""
    import pypdfium2.raw

    return getattr(error, "err_code", None) == pypdfium2.raw.FPDF_ERR_PASSWORD


def _pypdf_pages(body: bytes, max_pages: int) -> tuple[list[str], dict[str, str]]:
    """Text of each of the first pages and the title/author metadata, read with pypdf."""
    import io

    import pypdf

    reader = pypdf.PdfReader(io.BytesIO(body))
    texts = [reader.pages[index].extract_text() or "" for index in range(min(len(reader.pages), max_pages))]
    info = reader.metadata
    title = str(info.title) if info is not None and info.title else ""
    author = str(info.author) if info is not None and info.author else ""
    return texts, {"title": title, "author": author}


def _media_type(content_type: str | None) -> str | None:
    """The bare lower-case media type of a Content-Type header value."""
    if not content_type:
        return None
    return content_type.split(";", 1)[0].strip().lower() or None


def _declared_encodings(body: bytes, content_type: str | None) -> list[str]:
    """Encodings named by the Content-Type header, then by an XML declaration or <meta> tag near the start."""
    encodings: list[str] = []
    if content_type and (header_match := _CHARSET_PARAMETER.search(content_type)):
        encodings.append(header_match.group(1))
    head = body[:4096]
    for pattern in (_XML_ENCODING, _META_CHARSET):
        if in_document_match := pattern.search(head):
            encodings.append(in_document_match.group(1).decode("ascii", errors="ignore"))
    resolved: list[str] = []
    for encoding in encodings:
        if encoding.lower() in _LATIN_ENCODINGS:
            # Servers often declare latin-1 for UTF-8 pages; a body that is valid UTF-8 is read as UTF-8.
            resolved.append("utf-8")
            # Browsers read a declared latin-1 as windows-1252, which is a superset of it.
            encoding = "cp1252"
        resolved.append(encoding)
    return resolved


def looks_like_text(head: bytes) -> bool:
    """Whether leading bytes look like text rather than a binary format."""
    if not head:
        return False
    if b"\x00" in head:
        return False
    control_bytes = sum(1 for byte in head if byte < 9 or 13 < byte < 32)
    return control_bytes / len(head) < 0.01


def _parse_as_trafilatura(html: str) -> lxml.html.HtmlElement | None:
    """A document's tree as `trafilatura.utils.load_html` parses a string, built with this thread's fast HTML parser; None for a fragment or non-HTML."""
    beginning = html[:50].lower()
    source = repair_faulty_html(html, beginning)
    parser = _fast_html_parser()
    try:
        tree = lxml.html.fromstring(source, parser=parser)
    except (ValueError, lxml.etree.LxmlError):  # lxml refuses str input that carries an XML encoding declaration
        tree = None
    if tree is None or len(tree) < 1:
        tree = _parse_utf8(source, parser)
    if tree is not None and is_dubious_html(beginning) and len(tree) < 2:
        return None  # trafilatura's rule: no <html> near the start and under two children is not a document
    return tree


def _parse_utf8(source: str, parser: lxml.html.HTMLParser) -> lxml.html.HtmlElement | None:
    """A document's tree parsed from its UTF-8 bytes, or None when lxml cannot parse it."""
    try:
        return lxml.html.fromstring(source.encode("utf-8", "surrogatepass"), parser=parser)
    except (ValueError, lxml.etree.LxmlError):
        return None


def _fast_html_parser() -> lxml.html.HTMLParser:
    """This thread's HTML parser (lxml parsers are not thread-safe), configured as trafilatura's, whose elements are all plain `HtmlElement`s."""
    parser: lxml.html.HTMLParser | None = getattr(_PARSERS, "html", None)
    if parser is None:
        parser = lxml.html.HTMLParser(collect_ids=False, default_doctype=False, encoding="utf-8", remove_comments=True, remove_pis=True)
        # lxml.html's own class lookup is Python code run for every element proxy (forms get classes of their own): a tenth of trafilatura's time.
        parser.set_element_class_lookup(lxml.etree.ElementDefaultClassLookup(
            element=lxml.html.HtmlElement, comment=lxml.html.HtmlComment, pi=lxml.html.HtmlProcessingInstruction, entity=lxml.html.HtmlEntity,
        ))
        _PARSERS.html = parser
    return parser


def _parse_leniently(html: str) -> lxml.html.HtmlElement | None:
    """An lxml tree of any markup, fragments included, or None when there is none."""
    # lxml refuses str input that carries an XML encoding declaration.
    source = re.sub(r"^\s*<\?xml[^>]*\?>", "", html, count=1)
    if not source.strip():
        return None
    try:
        return lxml.html.document_fromstring(source)
    except (lxml.etree.ParserError, ValueError):
        return None


def _remove_boilerplate(root: lxml.html.HtmlElement) -> None:
    """Drop navigation, headers, footers, scripts, forms, hidden and comment nodes from a tree in place."""
    doomed = list(root.iter(*_BOILERPLATE_TAGS, lxml.etree.Comment, lxml.etree.ProcessingInstruction))
    for element in root.iter():
        if not isinstance(element.tag, str):
            continue
        role = (element.get("role") or "").strip().lower()
        style = (element.get("style") or "").replace(" ", "").lower()
        if role in _BOILERPLATE_ROLES or element.get("hidden") is not None or element.get("aria-hidden") == "true" or "display:none" in style:
            doomed.append(element)
    for element in doomed:
        parent = element.getparent()
        if parent is not None:
            element.drop_tree()


def _text_length(element: lxml.html.HtmlElement) -> int:
    """How much text an element holds."""
    return len(element.text_content())


def _has_block_ancestor_within(element: lxml.html.HtmlElement, container: lxml.html.HtmlElement) -> bool:
    """Whether a block element sits inside another block element below the container, whose text already includes it."""
    for ancestor in element.iterancestors():
        if ancestor is container:
            return False
        if ancestor.tag in _BLOCK_TAGS:
            return True
    return False


def _element_text(element: lxml.html.HtmlElement) -> str:
    """An element's text on one line with whitespace collapsed."""
    return _SPACES.sub(" ", " ".join(element.text_content().split())).strip()


def clean_text(text: str) -> str:
    """Text in NFC with runs of spaces collapsed, lines trimmed and at most one blank line in a row."""
    normalized = _collapse_spaces(unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\r", "\n"))
    # Documentation generators end headings with a "¶" anchor link.
    joined = "\n".join([line.strip().removesuffix("¶").rstrip() for line in normalized.split("\n")])
    return (_MANY_BLANK_LINES.sub("\n\n", joined) if "\n\n\n" in joined else joined).strip()


def _collapse_spaces(text: str) -> str:
    """Text with each run of spaces, tabs and other horizontal whitespace turned into one space."""
    # Two cheap scans find most texts clean; the substitution would try a match at every space.
    if "  " not in text and not _HORIZONTAL_WHITESPACE_BUT_SPACE.search(text):
        return text
    return _SPACES.sub(" ", text)


def capped_text(text: str, max_characters: int) -> str:
    """Text cut to at most `max_characters`, at the last whitespace before the cap when there is one."""
    if len(text) <= max_characters:
        return text
    cut = text[:max_characters]
    boundary = max(cut.rfind(" "), cut.rfind("\n"))
    return (cut[:boundary] if boundary > max_characters // 2 else cut).rstrip()
