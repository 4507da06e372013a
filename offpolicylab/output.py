"""The one output writer of ``analyze``, ``replay`` and ``plot``: a folder of results that is checked before any
work, written whole into a temporary folder beside it and swapped in at the end (docs/bad_input.md).

* **checked first** (:meth:`OutputWriter.__init__`): the location must be creatable and writable
  (:func:`offpolicylab.locations.output_folder`), must not be or lie inside a run directory, and an existing
  folder may hold only the files this command writes (a folder it wrote before) — anything else would be lost by
  the swap, so it is refused with one line naming what is there;
* **written whole** (:meth:`OutputWriter.staging`): the command writes into ``.NAME.tmp-PID`` beside ``NAME``; at
  the end that folder is fsynced and exchanged with ``NAME`` in one ``renameat2(RENAME_EXCHANGE)`` (or two renames
  where the kernel lacks it), and the old output is removed.  A reader sees the old output or the new one, never a
  mix of both, never a torn figure; a full disk or an error leaves the old output as it was and no temporary
  folder;
* **nothing left after a kill**: a temporary folder whose process is gone is removed by the next writer of the
  same location (and an output folder moved aside by a kill between the two renames is put back first).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from offpolicylab.locations import output_folder, process_alive

_PARTS = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")
_TEMP_FILE = re.compile(r"^\.(?P<name>.+)\.tmp-\d+$")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class OutputWriter:
    """The output folder ``out`` of ``command``; ``owns(name)`` says whether a file name is one the command writes.

    The constructor only checks (it writes nothing); :meth:`staging` yields the temporary folder to write into and
    swaps it in when the block ends without an exception."""

    def __init__(self, out: str | Path, command: str, owns: Callable[[str], bool], what: str) -> None:
        self.command, self.owns, self.what = command, owns, what
        self.shown = Path(out)
        folder = output_folder(out)
        try:
            self.folder = folder.resolve()
        except (OSError, RuntimeError) as exc:  # a symlink loop on the way
            raise ValueError(f"--out {out} cannot be resolved ({exc.__class__.__name__}: a symlink loop?); valid: "
                             "a folder path") from None
        for place in (self.folder, *self.folder.parents):
            if (place / "config.json").is_file() and (place / "metrics.csv").is_file():
                if place == self.folder:
                    raise ValueError(f"--out {out} is a run directory {command} did not create; valid: a folder "
                                     f"outside any run directory ({command} writes {what})")
                raise ValueError(f"--out {out} lies inside the run directory {place}; valid: a folder outside any "
                                 f"run directory, e.g. beside it ({command} writes {what})")
        if self.folder.is_dir():
            foreign = sorted(p.name for p in self.folder.iterdir() if not self._owned(p.name))
            if foreign:
                listed = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
                raise ValueError(f"--out {out} holds files {command} does not write ({listed}); valid: a new or "
                                 f"empty folder, or one {command} wrote ({what})")

    def _owned(self, name: str) -> bool:
        """A file the command writes, or the temp file ``.NAME.tmp-PID`` a killed write of one left (the swap
        removes it with the rest of the old output)."""
        match = _TEMP_FILE.match(name)
        return self.owns(match["name"] if match else name)

    @contextlib.contextmanager
    def staging(self) -> Iterator[Path]:
        """The temporary folder to write the whole output into; swapped in at the end, removed on any error."""
        parent = self.folder.parent
        parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(parent, self.folder.name)
        temp = parent / f".{self.folder.name}.tmp-{os.getpid()}"
        shutil.rmtree(temp, ignore_errors=True)
        temp.mkdir()
        try:
            yield temp
            _fsync_tree(temp)
            swap_in(temp, self.folder)
        except OSError as exc:  # name the file as the user knows it, not its staging copy
            if isinstance(exc.filename, str) and exc.filename.startswith(str(temp)):
                exc.filename = str(self.shown) + exc.filename[len(str(temp)):]
            raise
        finally:
            shutil.rmtree(temp, ignore_errors=True)

    def final(self, staged: Path) -> Path:
        """Where ``staged`` (a path inside the staging folder) lies once swapped in, as the user named it."""
        return self.shown / staged.name


def swap_in(temp: Path, folder: Path) -> None:
    """Make ``temp`` the folder ``folder``: renamed into place when there is none, else exchanged with it in one
    step (the old output ends up in ``temp``, which the caller removes)."""
    try:
        os.rename(temp, folder)  # no folder yet, or an empty one
        _fsync_dir(folder.parent)
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if not _exchange(temp, folder):
        aside = folder.parent / f".{folder.name}.old-{os.getpid()}"
        os.rename(folder, aside)
        os.rename(temp, folder)
        os.rename(aside, temp)
    _fsync_dir(folder.parent)


def clean_leftovers(parent: Path, name: str) -> None:
    """Remove the temporary folders of ``name`` left by writers that were killed; an output moved aside by a kill
    between the two renames of :func:`swap_in` is moved back first."""
    for entry in parent.glob(f".{glob_escape(name)}.*-*"):
        match = _PARTS.match(entry.name)
        if not match or match["name"] != name or _alive(int(match["pid"])):
            continue
        if match["kind"] == "old" and not (parent / name).exists():
            os.rename(entry, parent / name)
        else:
            shutil.rmtree(entry, ignore_errors=True)


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs; this process never writes two outputs to one place at once."""
    return pid != os.getpid() and process_alive(pid)


def _exchange(a: Path, b: Path) -> bool:
    """``renameat2(a, b, RENAME_EXCHANGE)``; False where the C library or the file system lacks it."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2  # the C library this interpreter runs on
    except (OSError, AttributeError, TypeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
