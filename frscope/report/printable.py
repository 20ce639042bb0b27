"""The one filter every string from a dump, bundle, exit, stack or snapshot goes through before the text
and Markdown renderers print it: what reaches a terminal (or a ticket) is what the bytes say, never what
they would make the terminal do.

A dump is written by whoever ran the job, a bundle by whoever sent it: a function name, a file name, an
exit's reason or termination message can hold ESC sequences (OSC 0 sets the window title, OSC 52 writes
the clipboard, CSI 2J clears the screen), other C0/C1 control characters (a bare CR overwrites a line),
line and paragraph separators, or Unicode bidi overrides that make `evil.py` read as `yp.live`.
`printable` shows each such character as an escape (`\\x1b`, `\\u202e`), so nothing is lost and nothing
acts; `md_text` / `md_code` / `md_fence` also keep it from changing the Markdown around it.
"""

from __future__ import annotations

import re

# Not printable (str.isprintable): Cc (C0, DEL, C1), Cf (bidi embeddings, overrides and isolates, zero-width
# joiners, the BOM), Zl, Zp, Cs, Co, Cn and every space but ' '. The fast check is `isprintable()`; only a
# string that fails it is rebuilt.


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    """`text` with every character a terminal would act on shown as an escape: control characters (C0, DEL,
    C1: ESC and with it every CSI/OSC sequence, CR, newlines), format characters (bidi overrides and
    isolates, zero-width characters), line/paragraph separators and unassigned or private code points.
    Other spaces (no-break, em space) become ' '. A backslash stays a backslash: `\\x1b` printed here is
    either this filter's escape or the four characters the dump holds; neither does anything."""
    if text.isprintable():
        return text
    out = []
    for char in text:
        if char.isprintable():
            out.append(char)
        elif char.isspace() and char not in "\t\n\v\f\r\x1c\x1d\x1e\x1f\x85\u2028\u2029":
            out.append(" ")
        else:
            out.append(_escape(char))
    return "".join(out)


# Characters that Markdown (CommonMark, GitHub) reads as syntax inside a line: emphasis, code spans, links and
# images, raw HTML and autolinks, entities, strikethrough, table pipes. Each is escaped with a backslash. (The
# renderers never start a line with a dump's string, so '#', '-', '+' and '1.' need nothing.)
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&])")


def md_text(text: str) -> str:
    """A dump's string as Markdown text: printable, and every character Markdown would read as syntax
    (emphasis, links, HTML, headings, table pipes, code spans) escaped, so it shows as itself."""
    return _MD_SPECIAL.sub(r"\\\1", printable(text))


def md_code(text: str) -> str:
    """A dump's string as an inline code span: printable, and fenced with more backticks than it holds (a
    code span cannot be escaped from inside). In a table cell '|' still ends the cell, so it is shown as
    `\\x7c`."""
    shown = printable(text).replace("|", "\\x7c")
    longest = max((len(run) for run in re.findall(r"`+", shown)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if shown.startswith("`") or shown.endswith("`") or not shown.strip() else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def md_fence(lines: list[str]) -> list[str]:
    """Lines (each already `printable`) as a fenced code block whose fence no line can close."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *lines, fence]
