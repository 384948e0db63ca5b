"""The console's script token on disk: written when `picoclaw web` starts listening, readable by the user
alone (mode 0600, as config.json's keys deserve), removed when it stops.

A script reads it for `Authorization: Bearer …`; `picoclaw web --new-link` reads it to ask the running console
for a login link. One file per host and port, so two consoles of one home do not overwrite each other's (one
may listen on 127.0.0.1 and another on a LAN address with the same port).
"""

from __future__ import annotations

import re
from pathlib import Path

from picoclaw.errors import PicoclawError

MODE = 0o600
MOST = 1000  # bytes of a token file read: a token is 43 characters


class TokenFileError(PicoclawError):
    """The token file could not be written or read; says which file and why, in one line."""


def default_path(home: Path, host: str, port: int) -> Path:
    """`<home>/console-<host>-<port>.token` (an IPv6 address's ":" as "_", which every file system takes):
    beside config.json, whose secrets it shares the folder with."""
    return home / f"console-{re.sub(r'[^A-Za-z0-9.-]', '_', host)}-{port}.token"


def write_token(path: Path, token: str) -> None:
    """Replace `path` with `token`; the file is never readable by others, not even for a moment (mkstemp)."""
    from picoclaw.disk.atomic import atomic_write

    try:
        atomic_write(path, token + "\n", mode=MODE)
    except OSError as exc:
        raise TokenFileError(f"cannot write the console's token file {path}: {exc.strerror or exc}") from None


def read_token(path: Path) -> str:
    """The token `path` holds; TokenFileError when there is none (no console started with that file)."""
    from picoclaw.disk.bounded_read import read_bounded

    try:
        token = read_bounded(path, MOST).decode("utf-8", "replace").strip()
    except FileNotFoundError:
        raise TokenFileError(f"no console token file at {path}: is `picoclaw web` running (with this --port or "
                             "--token-file)?") from None
    except OSError as exc:
        raise TokenFileError(f"cannot read the console's token file {path}: {exc.strerror or exc}") from None
    if not token:
        raise TokenFileError(f"the console's token file {path} is empty")
    return token


def remove_token(path: Path, token: str) -> None:
    """Remove `path` if it still holds `token` (a console started since with the same file keeps its own)."""
    try:
        if path.read_text(encoding="utf-8", errors="replace").strip() == token:
            path.unlink()
    except OSError:  # gone already, or never written: nothing to remove
        pass
