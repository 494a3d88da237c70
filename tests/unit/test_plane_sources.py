"""What the plane says of a source citation: borne out, or refused with a reason an agent can act on."""

from __future__ import annotations

from swarmyard.plane.sources import SourceFiles

FILES = SourceFiles.from_texts({
    "keys.md": "A worker never holds a provider API key.\nThe broker swaps the token for the `provider key`.\n\n",
    "notes/budget.md": "A call the envelopes cannot afford is refused with HTTP 402.\n",
})


def test_a_quote_on_its_line_is_borne_out_whatever_the_prefix_spacing_and_marks() -> None:
    assert FILES.problem("keys.md:1", "A worker never holds a provider API key.") is None
    assert FILES.problem("task/keys.md:1", '"never holds a  provider API key"') is None
    assert FILES.problem("./keys.md:2", "swaps the token for the provider key") is None  # code marks dropped
    assert FILES.problem("notes/budget.md:1", "cannot afford is refused") is None


def test_each_way_a_citation_fails_says_why() -> None:
    made_up = FILES.problem("keys.md:1", "A worker keeps the provider key")
    assert made_up is not None and "does not hold the quoted words" in made_up
    assert "A worker never holds a provider API key." in made_up  # the line as it reads, to copy when asked again
    moved = FILES.problem("keys.md:1", "swaps the token for the provider key")
    assert moved == "the quoted words are on line 2 of keys.md, not line 1"
    assert FILES.problem("keys.md:9", "A worker never holds") == "keys.md has 3 lines, no line 9"
    blank = FILES.problem("keys.md:3", "")  # an empty quote of an empty line quotes nothing
    assert blank is not None and "too short" in blank
    missing = FILES.problem("secrets.md:1", "A worker never holds")
    assert missing is not None and "no source file is named 'secrets.md'" in missing and "keys.md" in missing
    short = FILES.problem("keys.md:1", "key")
    assert short is not None and "too short" in short
    assert FILES.problem("keys.md", "A worker never holds") is not None  # no line number


def test_lines_are_numbered_as_the_workers_tools_number_them_by_newline_alone() -> None:
    # A form feed, a lone carriage return, U+2028 or U+0085 ends a line for str.splitlines, not for textsearch,
    # grep or sed: numbered by splitlines, the honest citation of line 2 was refused and a quote from line 1
    # cited as line 2 was stored.
    for odd in ("\f", "\r", "\u2028", "\x85", "\x1c"):
        files = SourceFiles.from_texts({"notes.md": f"Intro text.{odd}The provider key is copied into every sandbox."
                                                    "\nThe broker keeps the key; agents never see it.\n"})
        assert files.problem("notes.md:2", "The broker keeps the key; agents never see it.") is None, repr(odd)
        made_up = files.problem("notes.md:2", "The provider key is copied into every sandbox.")
        assert made_up == "the quoted words are on line 1 of notes.md, not line 2", repr(odd)
        assert files.problem("notes.md:3", "The broker keeps the key") == "notes.md has 2 lines, no line 3"
    crlf = SourceFiles.from_texts({"w.md": "First line here, ended by CRLF.\r\nSecond line here.\r\n"})
    assert crlf.problem("w.md:2", "Second line here.") is None


def test_a_line_number_is_ascii_digits() -> None:
    refused = FILES.problem("keys.md:\u0661", "A worker never holds a provider API key.")  # ARABIC-INDIC ONE
    assert refused is not None and "is not path:line" in refused


def test_a_quote_starting_or_ending_inside_a_word_is_refused() -> None:
    # "ever holds a provider API key." is in "A worker never holds ...", and says the opposite (found by an attack)
    cut = FILES.problem("keys.md:1", "ever holds a provider API key.")
    assert cut is not None and "inside a word" in cut and "A worker never holds a provider API key." in cut
    assert FILES.problem("keys.md:1", "A worker never holds a provider API") is None  # whole words: borne out
    assert FILES.problem("keys.md:1", "A worker never holds a provider AP") is not None  # ends inside "API"
    assert FILES.problem("notes/budget.md:1", "is refused with HTTP 402.") is None  # punctuation is no word


def test_a_quote_holding_a_line_break_is_refused() -> None:
    # its words pass once the break is a space, but a reader of the stored quote sees only its first line
    for brk in ("\n", "\r", "\u2028"):
        broken = FILES.problem("keys.md:1", f"A worker never holds{brk}a provider API key.")
        assert broken is not None and "line break" in broken
