"""Documents a person sends as files, as every channel turns them into a turn.

What a file is, is told by its bytes, not its name: a PDF by its `%PDF-` magic (its text extracted with pypdf),
text by having no NUL bytes and decoding as UTF-8 (or, failing that, as GB18030, which covers Chinese GBK,
or else as UTF-8 with the bad bytes replaced, said to the model), and being mostly printable. So a `.txt` that is
really binary is refused, and a text file with no or an unknown extension is read. Images sent as files are
not documents (`ImageDocument`); anything else (archives, programs, audio …) is refused in one line naming what
is read (`ACCEPTED`).

`read_document` gives the text or raises `MediaRefused`; the channel keeps the file in the scope's media/
folder (`save_document`, only once it is accepted) and the turn's text is `document_turn`: a header naming the
file and where it was saved, the text (cut at `media.document_chars`, with where to read the rest), the caption.
"""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from picoclaw.channels.voice_notes import MediaRefused
from picoclaw.memory import image_type

if TYPE_CHECKING:
    from picoclaw.memory import MediaFolder

__all__ = ["ACCEPTED", "KILOBYTE", "DocumentText", "ImageDocument", "check_document_size", "document_turn",
           "read_document", "save_document"]

log = logging.getLogger(__name__)

ACCEPTED = "text files (.txt, .md, .csv, .json, source code …) and PDFs"
KILOBYTE = 1024  # media.document_kilobytes counts these (its bound, 20,480, is Telegram's 20 MB)
MAX_PDF_PAGES = 1_000
BAD_SHARE = 0.10  # more control characters or replaced bytes than this: not text

_CONTROLS = re.compile(r"[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f\ufffd]")  # tab, newlines, form feed and ESC are text
# What a refused file is, for the line that refuses it (only for files that are not text).
_KINDS = ((b"PK\x03\x04", "a zip archive (so are .docx, .xlsx and .pptx)"), (b"PK\x05\x06", "a zip archive"),
          (b"\x1f\x8b", "a gzip archive"), (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"), (b"Rar!", "a RAR archive"),
          (b"\xd0\xcf\x11\xe0", "an old Office document (.doc, .xls, .ppt)"), (b"MZ", "a Windows program"),
          (b"\x7fELF", "a program"), (b"ID3", "audio"), (b"OggS", "audio"), (b"fLaC", "audio"),
          (b"SQLite format 3\x00", "a SQLite database"))


class ImageDocument(MediaRefused):
    """An image sent as a file: not a document (images are read, if at all, as photos)."""


@dataclass(frozen=True)
class DocumentText:
    """The text of one document: its file name, "text" or "pdf", the text, the PDF's page count, and a note for
    the model when the text may not be exactly what the file holds (not UTF-8)."""

    name: str
    kind: str
    text: str
    pages: int | None = None
    note: str | None = None

    @property
    def utf8(self) -> bool:
        """Whether the file itself is this text in UTF-8, so read_file reads it as it is."""
        return self.kind == "text" and self.note is None


def check_document_size(size: int | None, max_bytes: int) -> None:
    """Refuse a document over `max_bytes` (media.document_kilobytes), before it is fetched when its size is known."""
    if size is not None and size > max_bytes:
        raise MediaRefused(f"That file is {-(-size // KILOBYTE):,} KB; I read documents of up to "
                           f"{max_bytes // KILOBYTE:,} KB (media.document_kilobytes).")


def read_document(name: str, data: bytes, *, max_bytes: int, max_pages: int = MAX_PDF_PAGES) -> DocumentText:
    """The text of the file `name` holding `data`; MediaRefused (one line for the person) when it is too large,
    empty, not text or a PDF, a PDF without text or a broken one; ImageDocument (a MediaRefused) for an image."""
    check_document_size(len(data), max_bytes)
    if data.startswith(b"%PDF-"):
        return _pdf(name, data, max_pages)
    image = image_type(data)
    if image is not None:
        raise ImageDocument(f"That is a {image.removeprefix('image/').upper()} image sent as a file, not a "
                            "document: send it as a photo, or as an image file, and I will look at it.")
    if not data.strip():
        raise MediaRefused(f"{name} is empty, so there is nothing to read.")
    decoded = _decode(data)
    if decoded is None:
        kind = next((kind for magic, kind in _KINDS if data.startswith(magic)), None)
        if kind is None and data[4:8] == b"ftyp":
            kind = "a video or audio file (MP4)"
        if kind is None and data[:4] == b"RIFF" and data[8:12] in (b"WAVE", b"AVI "):
            kind = "audio or video"
        what = kind or "binary data, not text"
        raise MediaRefused(f"I cannot read {name}: it is {what}. I read {ACCEPTED}.")
    text, note = decoded
    if not text.strip():
        raise MediaRefused(f"{name} is empty, so there is nothing to read.")
    return DocumentText(name, "text", text, note=note)


def _decode(data: bytes) -> tuple[str, str | None] | None:
    """The text of `data` and a note when it was not plain UTF-8; None when it is not text."""
    note: str | None = None
    if data.startswith(b"\xef\xbb\xbf"):
        text = data[3:].decode("utf-8", errors="replace")
    elif data.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16 with its byte order mark (Windows' "Unicode")
        text, note = data.decode("utf-16", errors="replace"), "the file is UTF-16; it was read as such"
    elif b"\x00" in data:
        return None
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            try:  # Chinese text from Windows is often GBK; GB18030 reads all of GBK and GB2312
                text = data.decode("gb18030")
                note = "the file is not UTF-8; it was read as Chinese GB18030/GBK, which may be wrong"
            except UnicodeDecodeError:
                text = data.decode("utf-8", errors="replace")
                note = "some bytes of the file are not UTF-8; they are shown as �"
    if len(_CONTROLS.findall(text)) > BAD_SHARE * len(text):
        return None
    return text.replace("\r\n", "\n"), note


def _pdf(name: str, data: bytes, max_pages: int) -> DocumentText:
    """The text of a PDF's pages, each after a `[page N]` line when there are several."""
    from pypdf import PdfReader  # here: only a PDF needs it

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise MediaRefused(f"{name} is a password-protected PDF; I cannot open it.")
        if len(reader.pages) > max_pages:  # a hostile or huge PDF would keep a thread busy for minutes
            raise MediaRefused(f"{name} has {len(reader.pages):,} pages; I read PDFs of up to {max_pages:,}.")
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    except MediaRefused:
        raise
    except Exception as exc:  # pypdf raises many kinds on a damaged file; none of them is the bot's fault
        log.info("documents: %s: pypdf gave up on it: %s: %s", name, type(exc).__name__, exc)
        raise MediaRefused(f"I could not read {name}: the PDF is damaged or not a real PDF.") from None
    if not any(pages):
        raise MediaRefused(f"{name} has no text I can read (a scanned PDF, or only images): I cannot read "
                           "scans yet.")
    if len(pages) == 1:
        text = pages[0]
    else:
        text = "\n\n".join(f"[page {number}]\n{page}" for number, page in enumerate(pages, start=1))
    return DocumentText(name, "pdf", text, pages=len(pages))


def save_document(folder: MediaFolder, doc: DocumentText, data: bytes, *, max_chars: int) -> tuple[str, str | None]:
    """Keep the accepted document in the scope's media/ folder: where the file went and, when the model gets its
    text cut and the file itself is not that text in UTF-8 (a PDF, GBK), where the whole text went as UTF-8;
    MediaRefused when it cannot be written."""
    try:
        saved_as = folder.save(data, doc.name)
        if len(doc.text) <= max_chars or doc.utf8:
            return saved_as, None
        return saved_as, folder.save(doc.text.encode("utf-8"), f"{doc.name}.txt")
    except OSError as exc:  # a full disk, a folder not writable: the person is told, the bot serves on
        log.warning("documents: could not keep %s in %s: %s", doc.name, folder.folder, exc)
        raise MediaRefused(f"I could not keep {doc.name} in my workspace ({exc.strerror or exc}).") from None


def document_turn(doc: DocumentText, saved_as: str, caption: str | None, max_chars: int, *,
                  text_saved_as: str | None = None) -> str:
    """A turn's text for a document: a header naming it and where it was saved, its text (cut at `max_chars`,
    saying where the rest is), an end line, then the caption, if any."""
    what = f"PDF, {doc.pages} page{'s' if doc.pages != 1 else ''}, its text" if doc.kind == "pdf" else None
    header = f"[document: {doc.name}{f' ({what})' if what else ''}, saved as {saved_as}]"
    lines = [header] + ([f"[note: {doc.note}]"] if doc.note else [])
    if len(doc.text) <= max_chars:
        lines += [doc.text.rstrip("\n"), f"[end of {doc.name}]"]
    else:
        shown = doc.text[:max_chars]
        readable = text_saved_as or saved_as
        line = shown.count("\n") + 1  # the line the cut falls in, read again whole
        lines += [shown, f"[cut at {max_chars:,} of {len(doc.text):,} characters: the rest is in {readable}; "
                         f"read it with read_file, offset={line}]"]
    if caption and caption.strip():
        lines.append(caption.strip())
    return "\n".join(lines)
