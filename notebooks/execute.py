"""Execute the notebooks in their small mode and store the outputs in the committed files, so that they show their
figures and tables when browsed:

    python notebooks/execute.py                 # every notebook
    python notebooks/execute.py 03_diagnostics_tour.ipynb

Each notebook runs top to bottom with ``OFFPOLICYLAB_SMALL=1`` (the settings the tests execute, seconds to a minute
each) in a temporary working folder, its runs written to ``runs_notebooks/`` there (so printed paths are relative);
a failing cell stops the command and leaves the file unchanged.  Warnings on stderr are not kept.  Run it after changing a notebook or what it shows.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat

FOLDER = Path(__file__).resolve().parent


def execute(path: Path, timeout: int = 1200) -> None:
    """Run ``path`` in small mode and write it back with its outputs."""
    book = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as work:
        env = {**os.environ, "OFFPOLICYLAB_SMALL": "1", "OFFPOLICYLAB_NB_RUNS": "runs_notebooks",
               "MPLBACKEND": "module://matplotlib_inline.backend_inline", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(FOLDER.parent), os.environ.get("PYTHONPATH", "")]),
               "TQDM_DISABLE": "1"}
        client = nbclient.NotebookClient(book, timeout=timeout, kernel_name="python3",
                                         resources={"metadata": {"path": work}})
        client.execute(env=env)
    without_stderr(book)
    book.metadata.pop("widgets", None)
    nbformat.write(book, path)


def without_stderr(book: nbformat.NotebookNode) -> None:
    """Drop the cells' stderr streams: library warnings of this machine (its paths and versions), not results."""
    for cell in book.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]


def main(names: list[str]) -> int:
    paths = [FOLDER / name for name in names] if names else sorted(FOLDER.glob("*.ipynb"))
    for path in paths:
        print(f"executing {path.name} (small mode) ...", flush=True)
        execute(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
