"""The photos and files people sent, kept in the scope's `media/` folder: a session names an image by
its place there instead of holding its bytes, and the file tools can read a document again.

A file is stored once per content (`YYYYMM/<sha256 prefix>-<name>`), written atomically, and the folder is pruned
to `media.keep_days` and `media.keep_megabytes`, oldest first, whenever something is saved.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from pathlib import Path

from picoclaw import clock
from picoclaw.disk.atomic import atomic_write

log = logging.getLogger(__name__)

__all__ = ["MediaFolder", "image_type", "safe_name"]

NAME_BYTES = 120  # UTF-8 bytes of a kept name: with the digest and a temporary file's affixes, far under 255
_UNSAFE = re.compile(r"[^\w.\-]+", re.UNICODE)


def safe_name(name: str, default: str = "file") -> str:
    """`name` as one harmless file name: no folders, no leading dots, only word characters, dots and dashes."""
    base = _UNSAFE.sub("_", name.replace("\\", "/").rsplit("/", 1)[-1]).strip("._") or default
    if len(base.encode("utf-8")) > NAME_BYTES:
        stem, dot, suffix = base.rpartition(".")
        keep = dot + suffix if dot and len(suffix) <= 10 else ""
        stem = stem if keep else base
        while len((stem + keep).encode("utf-8")) > NAME_BYTES:  # whole characters (a CJK one is three bytes)
            stem = stem[:-1]
        base = stem + keep
    return base


class MediaFolder:
    """One scope's media/ folder; paths are given relative to `root` (the file tools' root), "media/…"."""

    def __init__(self, folder: Path, root: Path, *, keep_days: int, keep_bytes: int):
        self.folder = folder
        self.root = root
        self.keep_seconds = keep_days * 86_400
        self.keep_bytes = keep_bytes

    def save(self, data: bytes, name: str) -> str:
        """Keep `data` as `name` (made safe); its path relative to the root. The same bytes are kept once."""
        digest = hashlib.sha256(data).hexdigest()[:12]
        path = self.folder / clock.now().strftime("%Y%m") / f"{digest}-{safe_name(name)}"
        if not path.is_file() or path.stat().st_size != len(data):
            atomic_write(path, data)
        else:
            os.utime(path)  # sent again now: the prune below must not take it as old
        self.prune(keep=path)
        return path.relative_to(self.root).as_posix()

    def read(self, relative: str) -> bytes:
        """The bytes of a file saved here (`relative` as `save` gave it); OSError when it is gone, ValueError when
        the path leads out of the folder."""
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.folder.resolve()):
            raise ValueError(f"{relative!r} is not in {self.folder.name}/")
        return path.read_bytes()

    def prune(self, keep: Path | None = None) -> None:
        """Remove files older than keep_days, then the oldest until the folder is within keep_bytes."""
        if not self.folder.is_dir():
            return
        files = []
        for path in self.folder.rglob("*"):
            try:
                if path.is_file() and not path.is_symlink():
                    info = path.stat()
                    files.append((info.st_mtime, info.st_size, path))
            except OSError:
                continue
        files.sort()
        cutoff = time.time() - self.keep_seconds
        total = sum(size for _, size, _ in files)
        for mtime, size, path in files:
            if path == keep or (mtime >= cutoff and total <= self.keep_bytes):
                continue
            try:
                path.unlink()
                total -= size
            except OSError as exc:
                log.warning("media: could not remove %s: %s", path, exc)


# What an image's first bytes say it is: the formats vision endpoints take.
_IMAGE_MAGIC = ((b"\xff\xd8\xff", "image/jpeg"), (b"\x89PNG\r\n\x1a\n", "image/png"), (b"GIF87a", "image/gif"),
                (b"GIF89a", "image/gif"))


def image_type(data: bytes) -> str | None:
    """The MIME type of an image in a format a vision model takes (JPEG, PNG, GIF, WebP), by its bytes; None for
    anything else, a damaged header included."""
    for magic, mime in _IMAGE_MAGIC:
        if data.startswith(magic):
            return mime
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None
