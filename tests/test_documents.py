"""Documents read for a turn (picoclaw/channels/documents.py): what a file is, by its bytes; text in
UTF-8, GBK or with bad bytes; a PDF's text (English and Chinese, several pages), a scan or a broken one; what is
refused, in one line naming what is read; the turn's text, cut at media.document_chars with where the rest is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from picoclaw.channels import (
    ACCEPTED,
    DocumentText,
    ImageDocument,
    MediaRefused,
    document_turn,
    read_document,
    save_document,
)
from picoclaw.memory import MediaFolder

MAX = 1024 * 1024

EN = "Meeting notes\n- the launch moves to Friday\n- Anna owns the budget\n"
ZH = "会议记录\n- 发布改到周五\n- 安娜负责预算\n"


# -- PDFs written by hand: pypdf's writer cannot put text on a page -----------------------------------------------


def text_page(text: str, codes: dict[str, int] | None = None) -> bytes:
    """A page's content stream showing `text` in the one font; with `codes`, each character by its code in the
    font's ToUnicode map (how a PDF carries Chinese)."""
    if codes is None:
        shown = "(" + text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ")"
    else:
        shown = "<" + "".join(f"{codes[ch]:02X}" for ch in text) + ">"
    return f"BT /F1 12 Tf 72 720 Td {shown} Tj ET".encode("ascii")


def make_pdf(*pages: bytes, codes: dict[str, int] | None = None) -> bytes:
    """A PDF whose pages have these content streams (`text_page`), its font mapping `codes` back to Unicode."""
    objects: list[bytes] = [b"<< /Type /Catalog /Pages 2 0 R >>", b""]
    font = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica"
    if codes is None:
        objects.append(font + b" >>")
    else:
        pairs = "".join(f"<{code:02X}> <{ord(ch):04X}>\n" for ch, code in codes.items())
        cmap = ("/CIDInit /ProcSet findresource begin\n12 dict begin\nbegincmap\n/CMapName /Test def\n"
                "/CMapType 2 def\n1 begincodespacerange\n<00> <FF>\nendcodespacerange\n"
                f"{len(codes)} beginbfchar\n{pairs}endbfchar\nendcmap\n"
                "CMapName currentdict /CMap defineresource pop\nend\nend\n").encode("ascii")
        objects.append(font + b" /ToUnicode 4 0 R >>")
        objects.append(b"<< /Length %d >>\nstream\n" % len(cmap) + cmap + b"\nendstream")
    kids = []
    for content in pages:
        number = len(objects) + 1
        kids.append(b"%d 0 R" % number)
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
                       b"/Contents %d 0 R >>" % (number + 1))
        objects.append(b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream")
    objects[1] = b"<< /Type /Pages /Kids [" + b" ".join(kids) + b"] /Count %d >>" % len(pages)
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


ZH_CODES = {ch: code for code, ch in enumerate("你好世界季度报告", start=1)}


def kept(tmp_path: Path) -> MediaFolder:
    return MediaFolder(tmp_path / "media", tmp_path, keep_days=30, keep_bytes=100_000_000)


# -- text, told by its bytes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "text"), [
    ("notes.txt", EN), ("会议.md", ZH), ("README", EN), ("data.weird", ZH), ("photo.jpg", EN),
    ("main.py", "def main() -> None:\n    print('你好')\n"),
], ids=["english txt", "chinese md", "no extension", "unknown extension", "text named jpg", "code"])
def test_text_is_read_by_its_bytes_whatever_its_name(name: str, text: str) -> None:
    doc = read_document(name, text.encode("utf-8"), max_bytes=MAX)
    assert doc == DocumentText(name, "text", text)
    assert doc.utf8


def test_json_and_csv_are_text() -> None:
    data = json.dumps({"city": "Lyon", "城市": "里昂"}, ensure_ascii=False).encode("utf-8")
    assert read_document("data.json", data, max_bytes=MAX).text == '{"city": "Lyon", "城市": "里昂"}'
    assert read_document("t.csv", b"name,age\r\nAnna,31\r\n", max_bytes=MAX).text == "name,age\nAnna,31\n"


def test_gbk_chinese_is_read_as_gb18030_and_the_model_is_told() -> None:
    doc = read_document("旧笔记.txt", ZH.encode("gbk"), max_bytes=MAX)
    assert doc.text == ZH
    assert doc.note is not None and "GBK" in doc.note and not doc.utf8


def test_bytes_that_are_not_utf8_are_replaced_and_the_model_is_told() -> None:
    doc = read_document("old.txt", "Caf\xe9 au lait, 3 \xa3 each.\n".encode("latin-1"), max_bytes=MAX)
    assert doc.text == "Caf� au lait, 3 � each.\n"
    assert doc.note is not None and "not UTF-8" in doc.note


def test_utf8_with_a_byte_order_mark_and_utf16_are_read() -> None:
    assert read_document("bom.txt", b"\xef\xbb\xbf" + ZH.encode("utf-8"), max_bytes=MAX).text == ZH
    doc = read_document("win.txt", ZH.encode("utf-16"), max_bytes=MAX)  # with its byte order mark
    assert doc.text == ZH and doc.note is not None and "UTF-16" in doc.note


@pytest.mark.parametrize(("name", "data", "said"), [
    ("notes.txt", bytes(range(256)) * 4, "binary data, not text"),
    ("notes.txt", b"\x01\x02\x03\x04 mostly control characters \x05\x06\x07\x08" * 3, "binary data, not text"),
    ("report.docx", b"PK\x03\x04" + bytes(100), "a zip archive (so are .docx, .xlsx and .pptx)"),
    ("setup.exe", b"MZ\x90\x00" + bytes(100), "a Windows program"),
    ("song.mp3", b"ID3\x04\x00" + bytes(100), "audio"),
], ids=["binary named txt", "control characters", "zip", "exe", "audio"])
def test_what_is_not_text_is_refused_in_one_line_naming_what_is_read(name: str, data: bytes, said: str) -> None:
    with pytest.raises(MediaRefused) as refused:
        read_document(name, data, max_bytes=MAX)
    line = str(refused.value)
    assert line == f"I cannot read {name}: it is {said}. I read {ACCEPTED}."
    assert not isinstance(refused.value, ImageDocument)


@pytest.mark.parametrize("data", [b"\x89PNG\r\n\x1a\n" + bytes(50), b"\xff\xd8\xff\xe0" + bytes(50),
                                  b"GIF89a" + bytes(50), b"RIFF\x00\x00\x00\x00WEBPVP8 " + bytes(50)],
                         ids=["png", "jpeg", "gif", "webp"])
def test_an_image_sent_as_a_file_is_not_a_document(data: bytes) -> None:
    with pytest.raises(ImageDocument):
        read_document("notes.txt", data, max_bytes=MAX)


@pytest.mark.parametrize("data", [b"", b"  \n\n ", "\ufeff".encode()], ids=["empty", "blank", "only a BOM"])
def test_an_empty_file_is_refused(data: bytes) -> None:
    with pytest.raises(MediaRefused, match=r"^empty\.txt is empty, so there is nothing to read\.$"):
        read_document("empty.txt", data, max_bytes=MAX)


def test_a_file_over_the_limit_is_refused_with_the_setting_named() -> None:
    with pytest.raises(MediaRefused) as refused:
        read_document("big.txt", b"a" * 2049, max_bytes=2048)
    assert str(refused.value) == "That file is 3 KB; I read documents of up to 2 KB (media.document_kilobytes)."
    assert read_document("ok.txt", b"a" * 2048, max_bytes=2048).text == "a" * 2048


# -- PDFs --------------------------------------------------------------------------------------------------------


def test_a_pdf_gives_its_text() -> None:
    doc = read_document("report.pdf", make_pdf(text_page("Revenue grew 12% in Q3.")), max_bytes=MAX)
    assert doc == DocumentText("report.pdf", "pdf", "Revenue grew 12% in Q3.", pages=1)


def test_a_chinese_pdf_of_several_pages_gives_each_page_text() -> None:
    data = make_pdf(text_page("季度报告", ZH_CODES), text_page("你好世界", ZH_CODES), codes=ZH_CODES)
    doc = read_document("报告.pdf", data, max_bytes=MAX)
    assert doc.text == "[page 1]\n季度报告\n\n[page 2]\n你好世界"
    assert doc.pages == 2 and not doc.utf8


def test_a_pdf_by_its_magic_whatever_its_name() -> None:
    assert read_document("scan.bin", make_pdf(text_page("Hello")), max_bytes=MAX).kind == "pdf"


def test_a_scanned_pdf_without_text_is_one_line() -> None:
    with pytest.raises(MediaRefused) as refused:
        read_document("scan.pdf", make_pdf(b"", b"0 0 m 10 10 l S"), max_bytes=MAX)
    assert str(refused.value).startswith("scan.pdf has no text I can read (a scanned PDF")


@pytest.mark.parametrize("data", [b"%PDF-1.7\n\x00\x01 garbage", make_pdf(text_page("Hello"))[:120], b"%PDF-"],
                         ids=["garbage", "cut short", "only the magic"])
def test_a_broken_pdf_is_one_line(data: bytes) -> None:
    with pytest.raises(MediaRefused) as refused:
        read_document("broken.pdf", data, max_bytes=MAX)
    assert str(refused.value) == "I could not read broken.pdf: the PDF is damaged or not a real PDF."


# -- the turn's text, and what is kept -------------------------------------------------------------------------


def test_the_turn_names_the_file_where_it_is_and_ends_with_the_caption() -> None:
    doc = read_document("notes.md", EN.encode(), max_bytes=MAX)
    turn = document_turn(doc, "media/202612/ab12-notes.md", " summarise it / 总结一下 ", 1_000)
    assert turn == ("[document: notes.md, saved as media/202612/ab12-notes.md]\n"
                    f"{EN.rstrip()}\n[end of notes.md]\nsummarise it / 总结一下")
    assert document_turn(doc, "media/x-notes.md", None, 1_000).endswith("[end of notes.md]")


def test_the_turn_of_a_pdf_and_of_gbk_text_says_so() -> None:
    pdf = DocumentText("r.pdf", "pdf", "Hello", pages=2)
    assert document_turn(pdf, "media/r.pdf", None, 1_000).startswith(
        "[document: r.pdf (PDF, 2 pages, its text), saved as media/r.pdf]\nHello\n")
    gbk = read_document("旧.txt", ZH.encode("gbk"), max_bytes=MAX)
    assert document_turn(gbk, "media/旧.txt", None, 1_000).splitlines()[1] == f"[note: {gbk.note}]"


@pytest.mark.parametrize("text", [EN * 100, ZH * 100], ids=["english", "chinese"])
def test_a_long_text_is_cut_and_the_model_is_told_where_the_rest_is(text: str, tmp_path: Path) -> None:
    doc = read_document("long.md", text.encode(), max_bytes=MAX)
    saved_as, text_saved_as = save_document(kept(tmp_path), doc, text.encode(), max_chars=1_000)
    assert text_saved_as is None  # the file itself is the text in UTF-8: read_file reads it
    turn = document_turn(doc, saved_as, "what is due?", 1_000)
    head, body = turn.split("\n", 1)
    assert head == f"[document: long.md, saved as {saved_as}]"
    line = text[:1_000].count("\n") + 1
    assert body == (f"{text[:1_000]}\n[cut at 1,000 of {len(text):,} characters: the rest is in {saved_as}; "
                    f"read it with read_file, offset={line}]\nwhat is due?")
    assert (tmp_path / saved_as).read_bytes() == text.encode()


def test_a_cut_pdf_or_gbk_text_is_kept_as_utf8_text_too(tmp_path: Path) -> None:
    folder = kept(tmp_path)
    data = (ZH * 100).encode("gbk")
    doc = read_document("旧笔记.txt", data, max_bytes=MAX)
    saved_as, text_saved_as = save_document(folder, doc, data, max_chars=1_000)
    assert (tmp_path / saved_as).read_bytes() == data
    assert text_saved_as is not None and text_saved_as.endswith("-旧笔记.txt.txt")
    assert (tmp_path / text_saved_as).read_text(encoding="utf-8") == ZH * 100
    assert f"the rest is in {text_saved_as};" in document_turn(doc, saved_as, None, 1_000,
                                                              text_saved_as=text_saved_as)
    pdf = DocumentText("r.pdf", "pdf", "Hello")
    assert save_document(folder, pdf, b"%PDF-1.4 ...", max_chars=1_000)[1] is None  # not cut: the file alone


def test_a_pdf_with_too_many_pages_is_refused_before_its_text_is_read() -> None:
    pdf = make_pdf(text_page("one"), text_page("two"), text_page("three"))
    with pytest.raises(MediaRefused, match="report.pdf has 3 pages; I read PDFs of up to 2"):
        read_document("report.pdf", pdf, max_bytes=1_000_000, max_pages=2)
    two_pages = make_pdf(text_page("one"), text_page("two"))
    assert read_document("report.pdf", two_pages, max_bytes=1_000_000, max_pages=2).pages == 2
