"""A report's Markdown as a safe HTML fragment, by markdown-it-py's HTML renderer (loaded by the first HTML export)."""

from __future__ import annotations

import html
from collections.abc import Sequence

from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict

from research.markdown import PARSERS, inline_text, read
from research.report import safe_http_url, text_html

_IN_LINK = "in_link"


def _text_token(content: str) -> Token:
    return Token("text", "", 0, content=content)


def _with_http_links_only(children: list[Token]) -> list[Token]:
    """Inline tokens where a link to anything but http(s) is its label and its address as text, and an image is its
    description linked to its picture (the export loads nothing); text in a link is marked so it links nothing."""
    kept: list[Token] = []
    unsafe_target: str | None = None
    in_link = False
    for child in children:
        if child.type == "image":
            source = str(child.attrs.get("src", ""))
            url = safe_http_url(source)
            description = _text_token(inline_text(child.children or []))
            description.meta[_IN_LINK] = True
            if in_link or unsafe_target is not None:  # a link's label: what it shows, no link of its own
                kept.append(description)
            elif url is None:
                kept.extend([description, _text_token(f" ({source})")])
            else:
                kept.extend([Token("link_open", "a", 1, attrs={"href": url}), description, Token("link_close", "a", -1)])
        elif child.type == "link_open":
            target = str(child.attrs.get("href", ""))
            url = safe_http_url(target)
            if url is None:
                unsafe_target = target
            else:
                child.attrs = {"href": url}
                in_link = True
                kept.append(child)
        elif child.type == "link_close":
            if unsafe_target is not None and child.markup != "autolink":
                kept.append(_text_token(f" ({unsafe_target})"))
            elif unsafe_target is None:
                kept.append(child)
            unsafe_target, in_link = None, False
        else:
            if in_link:
                child.meta[_IN_LINK] = True
            kept.append(child)
    return kept


class _ReportHtml(RendererHTML):
    """markdown-it-py's HTML renderer with the report's rules: links open with no referrer and are not followed,
    text links its bare URLs and `[n]` citations, code blocks name no language, and no white space is left between
    tags but after each top-level block."""

    def renderToken(self, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
        token = tokens[idx]
        rendered = super().renderToken(tokens, idx, options, env).strip("\n")
        return rendered + "\n" if rendered and token.block and token.level == 0 and token.nesting != 1 else rendered

    def link_open(self, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
        return f'<a href="{html.escape(str(tokens[idx].attrs["href"]))}" rel="noopener noreferrer nofollow">'

    def text(self, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
        token = tokens[idx]
        return html.escape(token.content) if token.meta.get(_IN_LINK) else text_html(token.content)

    def fence(self, tokens: Sequence[Token], idx: int, options: OptionsDict, env: EnvType) -> str:
        token = tokens[idx]
        code = f"<pre><code>{html.escape(token.content.removesuffix(chr(10)))}</code></pre>"
        return code + "\n" if token.level == 0 else code


_REPORT_HTML = _ReportHtml()


def markdown_to_html(markdown: str) -> str:
    """A safe HTML fragment of a report's Markdown (CommonMark with tables and strikethrough, by markdown-it-py): raw
    HTML is shown as text, only http(s) links are links, and no image is loaded."""
    tokens = read(markdown).tokens
    for token in tokens:
        if token.type == "inline" and token.children is not None:
            token.children = _with_http_links_only(token.children)
    return _REPORT_HTML.render(tokens, PARSERS.markdown.options, {}).rstrip("\n")
