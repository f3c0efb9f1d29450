"""The README's runnable examples: every fenced ``sh``/``bash``/``shell`` and ``python``
block, in order, with the line its fence opens on (failures name it).

A block is run unless an HTML comment on the last non-blank line before its fence says
otherwise (the comment does not show on a rendered page):

- ``<!-- readme-test: skip: <why> -->``: never run (an install step, production servers,
  a destination outside this machine); the reason is required.
- ``<!-- readme-test: follow <seconds> -->``: a block that runs until stopped (a stream): it
  passes when, after that many seconds, it is still running, or has exited 0; either way
  without a traceback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
LANGUAGES = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python", "py": "python"}
_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)")
_MARKER = re.compile(r"^<!--\s*readme-test:\s*(skip|follow)\b:?\s*(.*?)\s*-->\s*$")


class MarkerError(ValueError):
    """A readme-test comment that says nothing usable."""


@dataclass(frozen=True)
class Block:
    line: int  # 1-based line of the opening fence
    language: str  # "sh" or "python"
    code: str
    skip: str | None = None  # why it is never run
    follow: float | None = None  # seconds a never-ending block is followed

    def name(self) -> str:
        return f"README.md line {self.line} ({self.language} block)"


def _marker(previous: str, line: int) -> tuple[str | None, float | None]:
    found = _MARKER.match(previous.strip())
    if not found:
        if "readme-test" in previous:
            raise MarkerError(f"README.md line {line - 1}: unreadable marker {previous!r}")
        return None, None
    kind, rest = found.groups()
    if kind == "skip":
        if not rest:
            raise MarkerError(f"README.md line {line - 1}: a skip marker needs its reason")
        return rest, None
    try:
        return None, float(rest.split()[0])
    except (IndexError, ValueError):
        raise MarkerError(f"README.md line {line - 1}: follow needs seconds") from None


def blocks(text: str) -> list[Block]:
    """The runnable blocks of ``text`` (a README), in order."""
    lines = text.splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, language = opened.groups()
        end = i + 1
        while end < len(lines) and not lines[end].startswith(fence):
            end += 1
        kind = LANGUAGES.get(language.lower())
        if kind is not None:
            before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            skip, follow = _marker(before, i + 1)
            found.append(Block(i + 1, kind, "\n".join(lines[i + 1:end]) + "\n", skip, follow))
        i = end + 1
    return found


def readme_blocks() -> list[Block]:
    return blocks(README.read_text())
