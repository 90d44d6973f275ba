"""The one Markdown parser (research.markdown): its tokens, and where in the source the things it reads are written."""

from __future__ import annotations

import pytest

from research.markdown import (
    bold_line_text,
    code_ranges,
    definitions,
    fenced_block,
    inline_lines,
    is_code_block,
    links,
    markdown_paragraphs,
    read,
    replaced,
)


@pytest.mark.parametrize(("markdown", "written", "label"), [
    ("See [the report](https://a.example/x_(y)) now.", "[the report](https://a.example/x_(y))", "the report"),
    ("See [a [nested] label](https://a.example).", "[a [nested] label](https://a.example)", "a [nested] label"),
    ("See [an \\] escaped](https://a.example).", "[an \\] escaped](https://a.example)", "an \\] escaped"),
    ("- See [two\n  lines](https://a.example 'title').", "[two\n  lines](https://a.example 'title')", "two\n  lines"),
    ("> See [it][ref].\n\n[ref]: https://a.example", "[it][ref]", "it"),
    ("1. 1 ![chart](https://a.example/c.png)", "![chart](https://a.example/c.png)", "chart"),
    ("| a \\| b | [cell](https://a.example) |\n|---|---|", "[cell](https://a.example)", "cell"),
    ("- a\n\t[after a tab](https://a.example)", "[after a tab](https://a.example)", "after a tab"),
])
def test_a_link_is_found_where_it_is_written(markdown: str, written: str, label: str) -> None:
    document = read(markdown)
    [link] = links(document)
    assert link.span is not None and link.label is not None
    assert document.source[link.span[0]:link.span[1]] == written
    assert document.source[link.label[0]:link.label[1]] == label
    assert link.target.startswith("https://a.example")


def test_code_holds_no_link_and_its_place_is_known() -> None:
    document = read("`[a](https://a.example)` and\n\n```\n[b](https://b.example)\n```\n")
    assert links(document) == []
    assert [document.source[start:end] for start, end in code_ranges(document)] == [
        "`[a](https://a.example)`", "```\n[b](https://b.example)\n```"]


def test_a_reference_definition_is_known_with_its_line() -> None:
    [definition] = definitions(read("Text [x].\n\n[x]: https://a.example"))
    assert (definition.target, definition.lines) == ("https://a.example", (2, 3))


def test_paragraphs_split_at_blank_lines_but_never_inside_a_fence() -> None:
    assert markdown_paragraphs("One\ntwo\n\n```\na\n\nb\n```\n\n\nThree") == ["One\ntwo", "```\na\n\nb\n```", "Three"]


def test_text_indented_four_spaces_is_prose_not_code() -> None:
    assert [token.type for token in read("    indented text").tokens] == ["paragraph_open", "inline", "paragraph_close"]


def test_a_fenced_block_keeps_text_after_its_fence_that_names_no_language() -> None:
    assert fenced_block("```python\nx = 1\n```") == ("```", "python", ["x = 1"])
    assert fenced_block("~~~~ print('hi')\nx = 1") == ("~~~~", "", ["print('hi')", "x = 1"])
    assert is_code_block("```\nx\n```") and not is_code_block("```\nx\n```\ntext after")


@pytest.mark.parametrize(("line", "title"), [("**Key findings**", "Key findings"), ("**Sources:**", "Sources:"),
                                             ("__Sources__ :", "Sources"), ("**Bold** and more", None),
                                             ("Plain", None)])
def test_a_line_in_bold_alone_reads_as_a_title(line: str, title: str | None) -> None:
    [inline] = [token for token in read(line).tokens if token.type == "inline"]
    assert bold_line_text(inline_lines(inline.children or [])[0]) == title


def test_edits_are_made_and_the_text_between_them_passes_through() -> None:
    assert replaced("abcdef", [(1, 2, "X"), (1, 3, "overlaps"), (4, 6, "")], str.upper) == "AoverlapsD"
