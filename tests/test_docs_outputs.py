"""Every block of the manual and the README that shows output is what its command prints now.

Each such block carries a marker (tests/support/docs_blocks.py says the words): ``docs:run``
runs its command and compares what it prints with the block, masking only the figures the
marker names; ``docs:skip`` says why it cannot run here. A block that shows output and has
neither fails the inventory, so a new one cannot go unchecked.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.support.docs_blocks import Block, Spec, Workspace, compare, output_blocks

BLOCKS = output_blocks()


@pytest.fixture(scope="module")
def workspace() -> Iterator[Workspace]:
    space = Workspace()
    try:
        yield space
    finally:
        space.close()


# -- the comparison can fail -------------------------------------------------------------------


def test_masked_numbers_may_differ_and_words_may_not() -> None:
    spec = Spec.parse("mask=numbers")
    assert compare("read: 3,186 ns (self 1.5 ns)", "read: 12 ns (self 7 ns)\n", spec) is None
    assert compare("fetch: raised KeyError after 10.7 ms", "fetch: returned after 1 ms", spec)
    assert compare("p50 poll", "p95 poll", spec)  # a number glued to a word is a name
    assert compare("a 1", "a 1", Spec()) is None
    assert compare("a 1", "a 2", Spec())  # unmasked, every figure counts


def test_columns_may_widen_but_rows_and_lines_may_not_change() -> None:
    spec = Spec.parse("mask=numbers")
    shown = "future  calls\nparse       4\nstore       1"
    assert compare(shown, "future    calls\nparse      400\nstore        1\n", spec) is None
    assert compare(shown, "future calls\nparse 4\nfetch 1", spec)  # a row label
    assert compare(shown, "future calls\nparse 4", spec)  # a row fewer
    assert compare(shown, "future calls\nparse 4\nstore 1\nfetch 2", spec)  # a row more
    assert compare(shown, "function calls\nparse 4\nstore 1", spec)  # a header
    assert compare(shown, "future calls\nstore 1\nparse 4", spec)  # the order
    assert compare(shown, "future calls\nstore 1\nparse 4", Spec.parse("mask=numbers sort")) is None


def test_an_ellipsis_line_stands_for_lines_and_excerpts_are_consecutive() -> None:
    shown = "head\n…\ntail"
    assert compare(shown, "head\na\nb\ntail", Spec()) is None
    assert compare(shown, "head\ntail", Spec()) is None
    assert compare(shown, "head\na\ntail\nmore", Spec())
    assert compare("b\nc", "a\nb\nc\nd", Spec.parse("excerpt")) is None
    assert compare("b\nd", "a\nb\nc\nd", Spec.parse("excerpt"))
    assert compare("b\nd", "a\nb\nc\nd", Spec.parse("lines")) is None
    assert compare("d\nb", "a\nb\nc\nd", Spec.parse("lines"))


def test_an_optional_item_may_be_missing_and_nothing_else() -> None:
    spec = Spec.parse("optional='^  INFO'")
    shown = "warnings\n  WARNING  a\n           more of a\n  INFO     b\n           more of b\nend"
    assert compare(shown, shown, spec) is None
    assert compare(shown, "warnings\n  WARNING  a\n           more of a\nend", spec) is None
    assert compare(shown, "warnings\n  INFO     b\n           more of b\nend", spec)
    assert compare(shown, "warnings\n  WARNING  a\n           more of a\n  INFO     b\nend", spec)
    assert compare(shown, "warnings\n  WARNING  a\n           more of a\nend", Spec())


def test_an_extra_item_may_be_printed_and_nothing_else() -> None:
    spec = Spec.parse("extra='^  WARNING  A poll'")
    shown = "warnings\n  ERROR  a\n         more of a\nend"
    printed = "warnings\n  ERROR  a\n         more of a\n  WARNING  A poll ran\n     long\nend"
    assert compare(shown, printed, spec) is None
    assert compare(shown, printed, Spec())
    assert compare(shown, printed.replace("A poll", "A lock"), spec)
    assert compare(shown, printed.replace("ERROR  a", "ERROR  b"), spec)


def test_reflow_compares_a_wrapped_warning_as_one_line() -> None:
    shown = "  WARNING  it grew over 1.27\n           s in all\n           → look at it\n  INFO  x"
    printed = (
        "  WARNING  it grew over\n           980 ms in all\n           → look at\n           it\n"
        "  INFO  x"
    )
    spec = Spec.parse("mask=numbers reflow")
    assert compare(shown, printed, spec) is None
    assert compare(shown, printed, Spec.parse("mask=numbers"))
    assert compare(shown, printed.replace("look at", "see"), spec)
    assert compare(shown, printed.replace("  INFO", "  WARNING"), spec)  # items stay apart


def test_json_keeps_keys_and_their_order_and_masks_what_is_named() -> None:
    spec = Spec.parse("mask=numbers keys=python lists", "json")
    shown = '{"pid":1,"python":"3.11.7","series":[{"ago_ns":5}],"ok":true}'
    printed = (
        '{"pid": 72, "python": "3.13.0", "series": [{"ago_ns": 9}, {"ago_ns": 1}], "ok": true}'
    )
    assert compare(shown, printed, spec) is None
    assert compare(shown, printed.replace('"ok": true', '"ok": false'), spec)
    assert compare(shown, printed.replace('"pid": 72, ', ""), spec)  # a key gone
    assert compare(shown, printed.replace('"ago_ns"', '"age_ns"'), spec)  # a key renamed
    swapped = '{"python": "3", "pid": 72, "series": [{"ago_ns": 9}], "ok": true}'
    assert compare(shown, swapped, spec)  # keys reordered
    two = shown + "\n" + shown
    assert compare(two, printed + printed, spec) is None  # curl's answers end with no newline
    assert compare(shown, printed, Spec.parse("mask=numbers keys=python", "json"))  # lists count


def test_the_checkout_and_the_interpreter_read_as_on_the_pages() -> None:
    import sys

    from tests.support.docs_blocks import ROOT

    printed = f"{sys.executable} {ROOT}/examples/crawler.py"
    assert compare(".venv/bin/python /work/main/examples/crawler.py", printed, Spec()) is None


def test_a_marker_with_an_unknown_word_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown word 'exerpt'"):
        Spec.parse("exerpt")
    with pytest.raises(ValueError, match="no mask 'digits'"):
        Spec.parse("mask=digits")
    with pytest.raises(ValueError, match="no live program 'crawl'"):
        Spec.parse("with=crawl")


# -- the inventory -----------------------------------------------------------------------------


def test_every_block_that_shows_output_is_run_or_says_why_not() -> None:
    unmarked = [b.where for b in BLOCKS if b.marker is None]
    assert not unmarked, f"blocks showing output with no docs:run or docs:skip marker: {unmarked}"
    silent = [b.where for b in BLOCKS if b.marker == "skip" and len(b.words) < 10]
    assert not silent, f"docs:skip markers that give no reason: {silent}"
    for block in BLOCKS:
        if block.marker == "run":
            Spec.parse(block.words, block.lang)  # every marker reads
    assert sum(b.marker == "run" for b in BLOCKS) >= 30


# -- the blocks --------------------------------------------------------------------------------


def _nothing_at_default_port() -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", 6780)) != 0


@pytest.mark.slow  # about 40 s in all: some twenty programs run, most for a second or two
@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_a_block_shows_what_its_command_prints(block: Block, workspace: Workspace) -> None:
    if block.marker == "skip":
        pytest.skip(block.words)
    spec = Spec.parse(block.words, block.lang)
    if "nothing answers at http://127.0.0.1:6780" in block.body and not _nothing_at_default_port():
        pytest.skip("something else serves 127.0.0.1:6780 on this machine now")
    printed = workspace.output(block, spec)
    difference = compare(block.body, printed, spec)
    assert difference is None, f"{block.where}: {difference}\n--- printed:\n{printed}"
