"""Output locations checked before any work: a command refuses a folder or file it could not write at the end
(an empty path, an existing file where a folder is wanted, a parent that is a file, a folder this user cannot
write or a read-only file system) with one line, before it samples, loads or trains anything and before it writes
anything (docs/bad_input.md)."""

from __future__ import annotations

import os
from pathlib import Path


def output_folder(path: str | Path, flag: str = "--out") -> Path:
    """``path`` as a folder a command may create or write into; otherwise ``ValueError`` naming ``flag``."""
    if str(path).strip() == "":
        raise ValueError(f"{flag} '' is invalid; valid: a folder path (it is created if missing)")
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{flag} {folder} is an existing file; valid: a folder (new, or one this command wrote)")
    check_writable(folder, flag)
    return folder


def output_file(path: str | Path, flag: str = "--out", example: str = "profile.json") -> Path:
    """``path`` as a file a command may create or replace; otherwise ``ValueError`` naming ``flag``."""
    if str(path).strip() == "" or Path(path).is_dir():
        raise ValueError(f"{flag} {str(path)!r} is a directory; valid: a file path such as {example}")
    file = Path(path)
    check_writable(file.parent, flag, shown=file)  # written as a temporary file renamed into place
    return file


def check_writable(path: Path, flag: str, shown: Path | None = None) -> None:
    """``ValueError`` unless the folder ``path`` exists and can be written into, or can be created: it, or else its
    nearest existing ancestor, must be a folder this process may write into on a writable file system (root passes
    any permission test, so a read-only mount is checked by its flags).  ``shown`` is the path the message names."""
    shown = shown or path
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag} {shown} cannot be created: {existing} is a file; valid: a path under a folder")
    if not os.access(existing, os.W_OK | os.X_OK) or _read_only(existing):
        raise ValueError(f"{flag} {shown} cannot be written: {existing} is not writable (permissions or a "
                         "read-only file system); valid: a location this user can write")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def physical_memory() -> int:
    """Bytes of physical memory on this machine (what the memory guards compare a lower bound of the need with)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine: it exists (``kill(pid, 0)``; one of another user counts) and
    is not a zombie (ended but not yet reaped, state ``Z`` in ``/proc/PID/stat``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]
