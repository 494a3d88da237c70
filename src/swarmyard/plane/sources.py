"""A run's sources: the files a task's worker reads, against which the plane checks every quoted citation.

A worker that cites a source names a file and a line (``path:line``) and copies words from that line (the
quote). The plane refuses a finding whose quote is not on the cited line of the file as the run gave it to the
worker, with a reason the agent is shown when it is asked again (the line as it really reads, or where the
words really are): a citation can be wrong, but it cannot be made up and still stored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from swarmyard.domain import Citation, CitationKind, Task
from swarmyard.errors import UnverifiedCitationError
from swarmyard.rules import no_result

#: The fewest characters a quote holds (fewer, or the whole line when it is shorter): "the" is on most lines.
MIN_QUOTE_CHARS = 12
#: Prefixes a worker's path may carry that the sources do not: its machine's task folder, a WASI tool's folder.
_PREFIXES = ("./", "task/", "/data/")
_REF = re.compile(r"(?P<path>[^\s:]+):(?P<line>[0-9]{1,9})")  # ASCII digits: \d takes any script's
#: Marks a model drops when it copies a Markdown line (emphasis and code spans): not part of what is quoted.
_MARKS = str.maketrans("", "", "*`")


def normalized(text: str) -> str:
    """Text as quotes are compared: Markdown emphasis and code marks dropped, whitespace runs made one space,
    surrounding quotation marks and spaces removed."""
    return " ".join(text.translate(_MARKS).split()).strip("\"'“”‘’ ")


def _holds(line: str, said: str) -> bool:
    """Whether ``said`` stands in ``line`` as whole words: not starting or ending inside a word of it."""
    start = line.find(said)
    while start >= 0:
        end = start + len(said)
        if ((start == 0 or not (line[start - 1].isalnum() and said[0].isalnum()))
                and (end == len(line) or not (line[end].isalnum() and said[-1].isalnum()))):
            return True
        start = line.find(said, start + 1)
    return False


@dataclass(frozen=True, slots=True)
class SourceFiles:
    """One task's sources: each file's path (as its worker sees it under ``task/``) and its lines."""

    lines: Mapping[str, tuple[str, ...]]

    @classmethod
    def from_texts(cls, texts: Mapping[str, str]) -> SourceFiles:
        """The sources of ``path -> text``, in lines as the worker's tools number them (textsearch, grep, sed):
        ended by ``\n`` alone. ``str.splitlines`` also ends a line at a form feed, ``\r``, U+2028 and others, so
        a file holding one would have had its lines numbered apart from what the worker was shown."""
        return cls({path: _lines(text) for path, text in texts.items()})

    def problem(self, ref: str, quote: str) -> str | None:
        """Why ``quote`` at ``ref`` (``path:line``) is not borne out by these files, or ``None`` when it is."""
        found = _REF.fullmatch(ref.strip())
        if found is None:
            return f"{ref!r} is not path:line (a file of the sources and a line number, like notes.md:12)"
        path, number = _path(found["path"]), int(found["line"])
        if path not in self.lines:
            names = ", ".join(sorted(self.lines)[:10])
            return f"no source file is named {path!r} (the sources: {names})"
        lines = self.lines[path]
        if not 1 <= number <= len(lines):
            return f"{path} has {len(lines)} lines, no line {number}"
        if len(quote.strip().splitlines()) > 1:  # normalized() would make the break a space, and pass it
            return "the quote holds a line break: a quote is words of the one line it cites"
        said, line = normalized(quote), normalized(lines[number - 1])
        if not said or len(said) < min(MIN_QUOTE_CHARS, len(line)):  # an empty quote is on every line
            return f"the quote {quote!r} is too short to check: copy at least {MIN_QUOTE_CHARS} characters of the line"
        if _holds(line, said):
            return None
        if said in line:
            return (f"the quote starts or ends inside a word of line {number} of {path} (part of a word can say what "
                    f"the line does not: 'ever holds' in 'never holds'): quote whole words; it reads: "
                    f"{lines[number - 1].strip()[:400]!r}")
        elsewhere = [str(i) for i, text in enumerate(lines, 1) if _holds(normalized(text), said)]
        if elsewhere:
            return f"the quoted words are on line {', '.join(elsewhere[:5])} of {path}, not line {number}"
        return f"line {number} of {path} does not hold the quoted words; it reads: {lines[number - 1].strip()[:400]!r}"


class Sources(Protocol):
    """Where the plane finds a task's sources (the run's lens files, ``swarmyard.swarm.sources``)."""

    def of(self, task: Task) -> SourceFiles | None:
        """The sources the task's worker was given, or ``None`` when its findings need not cite files."""
        ...


def check(sources: Sources | None, task: Task, citations: tuple[Citation, ...], *, body: str) -> None:
    """Raise ``UnverifiedCitationError`` for the first source citation the task's sources do not bear out, or when
    a task that has sources cites none of them (unless ``body`` is the agent's no-result placeholder).

    A placeholder is stored without a citation and its reason is repeated in the lead's synthesis, so in a task
    with sources it must be one the agent writes: the task's own title and a limit that ran out, in the agent's
    words with figures only (``no_result.is_own_placeholder``); one with words of its own is refused."""
    files = sources.of(task) if sources is not None else None
    quoted = [c for c in citations if c.kind is CitationKind.SOURCE]
    if files is None:
        if quoted:
            raise UnverifiedCitationError(task.id, quoted[0].ref, "this task has no source files to cite")
        return
    unchecked = next((c for c in citations if c.kind is not CitationKind.SOURCE and c.quote), None)
    if unchecked is not None:  # stored, it would read as words the plane found there
        raise UnverifiedCitationError(task.id, unchecked.ref, f"only a source line's quote is checked: cite the "
                                      f"{unchecked.kind.value} by its ref alone, and quote source lines")
    placeholder = no_result.is_placeholder(body)
    if placeholder and not no_result.is_own_placeholder(body, task.title):
        raise UnverifiedCitationError(task.id, "(none)", "a no-result line names this task's title and the limit "
                                      "that ran out, and says nothing else: a claim cites a source line")
    if not quoted and not placeholder:
        raise UnverifiedCitationError(task.id, "(none)", "a finding of this task cites at least one source line: "
                                                         "path:line and words copied from that line")
    for citation in quoted:
        why = files.problem(citation.ref, citation.quote)
        if why is not None:
            raise UnverifiedCitationError(task.id, citation.ref, why)


def _lines(text: str) -> tuple[str, ...]:
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line starts none
    return tuple(lines)


def _path(given: str) -> str:
    path = given.strip()
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if path.startswith(prefix):
                path, changed = path[len(prefix):], True
    return path
