"""A SWORD zText Bible module (Debian `sword-text-kjv`) as plain text, one document per book, with the standard
library.

A zText module holds each testament in three files: `ot.bzz` (or `nt.bzz`) is a run of zlib-compressed blocks,
one block per book here (`BlockType=BOOK`); `ot.bzs` lists each block as three little-endian uint32 (offset and
size in .bzz, size once decompressed); `ot.bzv` lists each entry of the versification in order (module and
testament headings, then per book its heading, per chapter its heading, then its verses) as uint32 block,
uint32 byte offset in the decompressed block, uint16 byte size. Each entry is an OSIS XML fragment in UTF-8.

The rule: the old testament, then the new; in each, every block that opens a book (a `<div ... type="book">`
with an `osisID`) is one document, `NN-OSISID.txt` (NN: the book's place, 01 to 66 in the KJV, e.g.
`01-Gen.txt`, `66-Rev.txt`). Its text is one line per entry of that block, in the .bzv's order: the fragment
with its notes (`<note>...</note>`, translators' footnotes) removed with their content, then every other tag
removed (keeping the text inside), XML character references resolved, and whitespace runs made one space, then
trimmed; empty lines are left out, and the document ends in a newline. So the first line is the book's title
("The First Book of Moses, called Genesis"), and each further line is one verse (a chapter heading has no
text).
"""

from __future__ import annotations

import html
import re
import struct
import zlib

from longrope.search.downloads.model_wheels import DownloadError

TESTAMENTS = ("ot", "nt")
NOTE = re.compile(r"<note\b.*?</note>", re.DOTALL)
TAG = re.compile(r"<[^>]*>")
BOOK = re.compile(r"<div\b[^>]*\btype=\"book\"[^>]*>")
OSIS_ID = re.compile(r"\bosisID=\"([^\"]+)\"")
SPACE = re.compile(r"\s+")


def verse_text(fragment: str) -> str:
    """One entry's OSIS fragment as one line of plain text (see the module's rule)."""
    return SPACE.sub(" ", html.unescape(TAG.sub("", NOTE.sub("", fragment)))).strip()


def sword_books(files: dict[str, bytes]) -> dict[str, bytes]:
    """{`NN-OSISID.txt`: the book's text} from a zText module's files ({`ot.bzs`: bytes, ...})."""
    books: dict[str, bytes] = {}
    for testament in TESTAMENTS:
        names = [f"{testament}.{kind}" for kind in ("bzs", "bzv", "bzz")]
        if any(name not in files for name in names):
            raise DownloadError(f"sword module: {', '.join(n for n in names if n not in files)} missing")
        index, verses, data = (files[name] for name in names)
        try:
            blocks = [
                zlib.decompress(data[offset : offset + size])
                for offset, size, _ in struct.iter_unpack("<III", index[: len(index) - len(index) % 12])
            ]
            entries: dict[int, list[str]] = {}
            for block, offset, size in struct.iter_unpack("<IIH", verses[: len(verses) - len(verses) % 10]):
                if size:
                    entries.setdefault(block, []).append(blocks[block][offset : offset + size].decode())
            for number, block in enumerate(blocks):
                opening = BOOK.search(block.decode())
                book = OSIS_ID.search(opening.group()) if opening else None
                if book is None:
                    continue  # the module's own heading
                lines = [line for line in map(verse_text, entries.get(number, [])) if line]
                books[f"{len(books) + 1:02d}-{book.group(1)}.txt"] = "".join(f"{line}\n" for line in lines).encode()
        except (zlib.error, IndexError, UnicodeDecodeError) as exc:
            raise DownloadError(f"sword module: {testament} cannot be read ({exc})") from exc
    return books
