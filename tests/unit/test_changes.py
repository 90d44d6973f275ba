"""What changed between two runs of a watch (research.changes): sources new and gone, figures that moved, texts that
changed, and the section that opens the watch run's report."""

from __future__ import annotations

import datetime as dt

from research.audit.citations import normalise_citations
from research.audit.sentences import parse_segments
from research.changes import (
    source_key,
    CONTEXT_MAX_CHARS,
    Change,
    PassageSnapshot,
    SourceSnapshot,
    changes_markdown,
    compute_changes,
    text_checksum,
)
from research.markdown import PARSERS, links, read
from research.report_html import markdown_to_html

PRICING = "https://shop.example/pricing"
SINCE = dt.datetime(2026, 11, 27, 9, 30, tzinfo=dt.timezone.utc)


def page(url: str, *texts: str, title: str = "Pricing", first: int = 1, checksum: str | None = "") -> SourceSnapshot:
    """A source read from its text: one passage a text, numbered from `first`; its checksum that of its texts
    unless given (None: only its snippet was seen)."""
    passages = tuple(PassageSnapshot(f"p{first + index}", text) for index, text in enumerate(texts))
    return SourceSnapshot(url=url, title=title, checksum=text_checksum("\n".join(texts)) if checksum == "" else checksum,
                          passages=passages)


def test_one_moved_figure_and_one_new_page_give_exactly_those_two_changes() -> None:
    previous = [page(PRICING, "Pricing\nThe Pro plan costs $29 a month. Teams get five seats.")]
    current = [page(PRICING, "Pricing\nThe Pro plan costs $35 a month. Teams get five seats.", first=3),
               page("https://news.example/launch", "Launch\nThe company launched a cheaper plan.", title="Launch news",
                    first=7)]

    assert compute_changes(previous, current) == [
        Change(kind="new", url="https://news.example/launch", title="Launch news", passage_id="p7"),
        Change(kind="figure", url=PRICING, title="Pricing", passage_id="p3", before="$29", after="$35",
               context="The Pro plan costs $35 a month."),
    ]


def test_urls_match_whatever_the_case_of_scheme_and_host_the_fragment_or_a_trailing_slash() -> None:
    previous = [page("https://Shop.Example/pricing/#plans", "The Pro plan costs $29.")]
    current = [page("HTTPS://shop.example/pricing", "The Pro plan costs $35.")]

    changes = compute_changes(previous, current)

    assert [(change.kind, change.before, change.after) for change in changes] == [("figure", "$29", "$35")]


def test_a_different_query_or_path_case_is_another_source() -> None:
    previous = [page("https://shop.example/list?page=2", "Ten items."), page("https://shop.example/About", "About us.")]
    current = [page("https://shop.example/list?page=3", "Ten items."), page("https://shop.example/about", "About us.")]

    assert [(change.kind, change.url) for change in compute_changes(previous, current)] == [
        ("new", "https://shop.example/list?page=3"), ("new", "https://shop.example/about"),
        ("gone", "https://shop.example/list?page=2"), ("gone", "https://shop.example/About")]


def test_the_first_of_duplicate_urls_in_a_run_is_the_one_compared() -> None:
    previous = [page(PRICING, "The Pro plan costs $29.")]
    current = [page(PRICING + "/", "The Pro plan costs $35.", first=1),
               page(PRICING, "The Pro plan costs $29.", first=2)]

    assert [(change.kind, change.passage_id) for change in compute_changes(previous, current)] == [("figure", "p1")]


def test_an_unchanged_checksum_gives_no_change_however_different_the_passages_shown() -> None:
    previous = [page(PRICING, "The Pro plan costs $29.", checksum="a" * 64)]
    current = [page(PRICING, "Teams get 5 seats.", "The Pro plan costs $35.", checksum="a" * 64)]

    assert compute_changes(previous, current) == []


def test_a_source_seen_only_as_a_snippet_on_either_side_is_not_compared() -> None:
    read = page(PRICING, "The Pro plan costs $29.")
    snippet_only = page(PRICING, "The Pro plan costs $35.", checksum=None)

    assert compute_changes([read], [snippet_only]) == []
    assert compute_changes([snippet_only], [read]) == []


def test_a_text_changed_without_a_moved_figure_gives_one_changed_entry_citing_its_first_passage_read() -> None:
    previous = [page(PRICING, "The Pro plan costs $29. Support is by email.")]
    snippet = PassageSnapshot("p4", "Pro plan from $29", is_snippet=True)
    current_page = page(PRICING, "The Pro plan costs $29. Support is by phone.", "Teams get five seats.", first=5)
    current = [current_page._replace(passages=(snippet, *current_page.passages))]

    assert compute_changes(previous, current) == [Change(kind="changed", url=PRICING, title="Pricing", passage_id="p5")]


def test_figures_written_differently_but_equal_are_not_a_figure_change() -> None:
    previous = [page(PRICING, "We have 1200 users and 15 percent grew. Revenue is $4.50.")]
    current = [page(PRICING, "We have 1,200 users and 15% grew. Revenue is $4.5.")]

    assert [change.kind for change in compute_changes(previous, current)] == ["changed"]


def test_each_figure_that_moved_in_a_sentence_is_one_change_in_sentence_order() -> None:
    previous = [page(PRICING, "Revenue rose 15% to €4.5m in 2025 across 3 regions. Staff grew to 1,200.")]
    current = [page(PRICING, "Revenue rose 18% to €5.1m in 2025 across 3 regions. Staff grew to 1,350.")]

    assert [(change.before, change.after, change.context) for change in compute_changes(previous, current)] == [
        ("15%", "18%", "Revenue rose 18% to €5.1m in 2025 across 3 regions."),
        ("€4.5m", "€5.1m", "Revenue rose 18% to €5.1m in 2025 across 3 regions."),
        ("1,200", "1,350", "Staff grew to 1,350."),
    ]


def test_percent_currency_thousands_and_scale_words_are_figures() -> None:
    previous = [page(PRICING, "Users: 1,200\nShare: 15 per cent\nPrice: £9.99\nVisitors: 3 million\nBudget: $2bn")]
    current = [page(PRICING, "Users: 12,500\nShare: 17%\nPrice: £10.49\nVisitors: 4 million\nBudget: $2.5bn")]

    assert [(change.before, change.after) for change in compute_changes(previous, current)] == [
        ("1,200", "12,500"), ("15 per cent", "17%"), ("£9.99", "£10.49"), ("3 million", "4 million"),
        ("$2bn", "$2.5bn")]


def test_sentences_of_one_shape_pair_in_order_when_both_runs_have_as_many() -> None:
    previous = [page(PRICING, "Price: $10\nPrice: $20\nPrice: $30")]
    current = [page(PRICING, "Price: $10\nPrice: $25\nPrice: $35")]

    assert [(change.before, change.after) for change in compute_changes(previous, current)] == [
        ("$20", "$25"), ("$30", "$35")]


def test_sentences_that_only_moved_are_not_figure_changes() -> None:
    previous = [page(PRICING, "Price: $10\nPrice: $20")]
    current = [page(PRICING, "Price: $20\nPrice: $10")]

    assert [change.kind for change in compute_changes(previous, current)] == ["changed"]


def test_a_shape_left_a_different_number_of_times_is_ambiguous_and_pairs_nothing() -> None:
    previous = [page(PRICING, "Price: $10\nPrice: $20")]
    current = [page(PRICING, "Price: $15\nPrice: $20\nPrice: $30")]

    assert [change.kind for change in compute_changes(previous, current)] == ["changed"]


def test_the_same_sentence_twice_on_a_page_is_one_figure_change() -> None:
    previous = [page(PRICING, "The Pro plan costs $29.", "The Pro plan costs $29.")]
    current = [page(PRICING, "The Pro plan costs $35.", "The Pro plan costs $35.")]

    assert [(change.before, change.after) for change in compute_changes(previous, current)] == [("$29", "$35")]


def test_snippet_passages_are_not_compared_for_figures() -> None:
    previous = [page(PRICING, "The Pro plan costs $29.")]
    read = page(PRICING, "Plans changed this week.", first=2)
    current = [read._replace(passages=(PassageSnapshot("p1", "The Pro plan costs $35.", is_snippet=True),
                                       *read.passages))]

    assert compute_changes(previous, current) == [Change(kind="changed", url=PRICING, title="Pricing", passage_id="p2")]


def test_gone_sources_come_last_in_the_previous_run_s_order() -> None:
    previous = [page("https://b.example/", "B.", title="B"), page(PRICING, "The Pro plan costs $29."),
                page("https://a.example/", "A.", title="A")]
    current = [page("https://c.example/", "C.", title="C"), page(PRICING, "The Pro plan costs $35.")]

    assert [(change.kind, change.title) for change in compute_changes(previous, current)] == [
        ("new", "C"), ("figure", "Pricing"), ("gone", "B"), ("gone", "A")]


def test_a_source_without_a_title_is_named_by_its_url_and_one_without_passages_cites_none() -> None:
    current = [SourceSnapshot(url="https://c.example/", title=" ", checksum="c" * 64, passages=())]

    assert compute_changes([], current) == [Change(kind="new", url="https://c.example/", title="https://c.example/")]


def test_a_search_result_only_listed_is_neither_new_nor_gone() -> None:
    listed = SourceSnapshot(url="https://listed.example/", title="Listed", checksum=None,
                            passages=(PassageSnapshot("p1", "A snippet.", is_snippet=True),))
    read = page("https://read.example/", "Read.", title="Read")

    assert compute_changes([], [listed]) == []
    assert compute_changes([listed], []) == []
    unfetched = listed._replace(url="https://read.example/")  # listed again, not fetched this time: not gone
    assert compute_changes([read], [unfetched]) == []
    assert [change.kind for change in compute_changes([], [read])] == ["new"]


def test_a_long_sentence_s_context_is_one_line_around_its_figure() -> None:
    filler = "word " * 80
    previous = [page(PRICING, f"Before the figure {filler}the Pro plan now costs $29 and {filler}ends here.")]
    current = [page(PRICING, f"Before the figure {filler}the Pro plan now costs $35 and {filler}ends here.")]

    [change] = compute_changes(previous, current)

    assert change.context is not None and len(change.context) <= CONTEXT_MAX_CHARS
    assert "costs $35 and" in change.context and change.context.startswith("…") and change.context.endswith("…")


# --- the section ---------------------------------------------------------------------------------

def cited_ids(line: str) -> list[str]:
    """The passage ids the citation audit reads in a line (research.audit.sentences)."""
    return [passage_id for segment in parse_segments(line) for passage_id in segment.cited_ids]


def test_the_section_names_the_date_and_cites_each_change_as_the_draft_cites_passages() -> None:
    changes = [
        Change(kind="new", url="https://news.example/launch", title="Launch news", passage_id="p4"),
        Change(kind="figure", url=PRICING, title="Pricing", passage_id="p7", before="$29", after="$35",
               context="The Pro plan costs $35 a month."),
        Change(kind="changed", url="https://docs.example/", title="Docs", passage_id="p2"),
        Change(kind="gone", url="https://old.example/page", title="Old page"),
    ]

    section = changes_markdown(changes, since=SINCE)

    heading, blank, *items = section.splitlines()
    assert (heading, blank) == ("**What changed since 27 Nov 2026**", "")
    assert items == [
        "- New source: Launch news [p4]",
        '- Pricing: $29 → $35 ("The Pro plan costs $35 a month.") [p7]',
        "- Changed: Docs [p2]",
        "- No longer found: [Old page](https://old.example/page)",
    ]
    assert [cited_ids(item) for item in items] == [["p4"], ["p7"], ["p2"], []]
    # The audit's reading of every citation spelling leaves the section as it is: no other marker hides in it.
    assert normalise_citations(section, ["p2", "p4", "p7"]) == section


def test_a_section_with_no_change_says_so() -> None:
    assert changes_markdown([], since=SINCE).splitlines()[2:] == ["- Nothing new, changed or gone among the sources read."]


def test_a_page_s_title_and_sentence_forge_no_link_no_citation_and_no_second_line() -> None:
    forged = "Deals [p1](http://evil.example) 【p2】 (p3) [4] &#91;5&#93; <b>**x**</b> `code`\nsecond line"
    changes = [
        Change(kind="figure", url=PRICING, title=forged, passage_id="p7", before="$29", after="$35", context=forged),
        Change(kind="gone", url="https://old.example/a_(b)", title=forged),
    ]

    section = changes_markdown(changes, since=SINCE)

    figure_item, gone_item = section.splitlines()[2:]
    assert cited_ids(figure_item) == ["p7"] and cited_ids(gone_item) == []
    assert normalise_citations(section, ["p1", "p2", "p3", "p4", "p5", "p7"]) == section
    # The one link is the gone source's; an address a page wrote stays in sight, linked to nothing it hides.
    found = links(read(section, PARSERS.every_link))
    assert [(link.kind, link.target) for link in found] == [("link", "https://old.example/a_%28b%29")]
    html = markdown_to_html(section)
    assert "<b>" not in html and "<code>" not in html and "[5]" not in html
    assert html.count('href="http://evil.example"') == html.count('>http://evil.example</a>') == 2


def test_a_gone_source_whose_address_is_not_http_is_named_not_linked() -> None:
    section = changes_markdown([Change(kind="gone", url="javascript:alert(1)", title="Old")], since=SINCE)

    assert section.splitlines()[2] == "- No longer found: Old"


def test_a_file_read_from_the_disk_is_matched_by_its_name_across_runs() -> None:
    before = page(source_key("", "notes.md"), "The array delivered 41 megawatt hours.", title="notes.md")
    after = page(source_key("", "notes.md"), "The array delivered 47 megawatt hours.", title="notes.md")

    [change] = compute_changes([before], [after])

    assert (change.kind, change.title, change.before, change.after) == ("figure", "notes.md", "41", "47")
    assert source_key("https://a.example/x", "x.pdf") == "https://a.example/x" and source_key("", None) == ""


def test_a_list_renumbered_between_runs_changes_no_figure_but_the_one_that_moved() -> None:
    previous = [page(PRICING, "Plans\n1. The Pro plan costs $29 a month.\n2. The Team plan costs $99 a month.\n"
                              "- Seats: 5 included.")]
    current = [page(PRICING, "Plans\n1. The Team plan costs $99 a month.\n2. The Pro plan costs $35 a month.\n"
                             "* Seats: 5 included.", first=3)]

    assert compute_changes(previous, current) == [
        Change(kind="figure", url=PRICING, title="Pricing", passage_id="p3", before="$29", after="$35",
               context="The Pro plan costs $35 a month."),
    ]


def test_a_quoted_sentence_loses_its_list_marker_but_never_a_figure_s_sign() -> None:
    def quoted(context: str) -> str:
        change = Change(kind="figure", url=PRICING, title="Pricing", passage_id="p7", before="2%", after="3%",
                        context=context)
        return changes_markdown([change], since=SINCE).splitlines()[-1]

    assert quoted("- Growth was 3% this year.") == '- Pricing: 2% → 3% ("Growth was 3% this year.") [p7]'
    assert quoted("2. Growth was 3% this year.") == '- Pricing: 2% → 3% ("Growth was 3% this year.") [p7]'
    assert quoted("-3% was the change in margin.") == '- Pricing: 2% → 3% ("-3% was the change in margin.") [p7]'
    assert quoted("+12% more visitors came.") == '- Pricing: 2% → 3% ("+12% more visitors came.") [p7]'
