"""Run the tutorials as notebooks: each ``NN_*.py`` here (a Jupyter notebook kept as text by
jupytext, "percent" format) top to bottom in a fresh Jupyter kernel, in this folder. With
``--store`` each is kept with its outputs as ``NN_*.ipynb`` beside it: the documentation site
shows those and never runs a tutorial itself.

    pip install -e ".[docs]"
    python docs/tutorials/run_tutorials.py                 # run every chapter, print its time
    python docs/tutorials/run_tutorials.py --store 03      # run chapter 3, keep its outputs

A chapter that stops itself (``raise SystemExit(message)``: chapter 4 where tiny Shakespeare is
neither downloaded nor fetchable) is reported as skipped, with its message, and the run goes on
to the next chapter; nothing is stored for it. tests/test_tutorials.py runs every chapter the
same way.
"""
import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNEL = "python3"
INLINE = "module://matplotlib_inline.backend_inline"


def chapters(names=()):
    """The tutorial files, in order; ``names`` picks those whose file name starts with one."""
    found = sorted(HERE.glob("[0-9][0-9]_*.py"))
    if not names:
        return found
    picked = [p for p in found if any(p.name.startswith(n) for n in names)]
    unknown = [n for n in names if not any(p.name.startswith(n) for p in found)]
    if unknown:
        raise ValueError(f"no tutorial named {', '.join(unknown)}; there are "
                         f"{', '.join(p.stem for p in found)}")
    return picked


def read(path):
    """The notebook of a tutorial file (``nbformat.NotebookNode``), without outputs."""
    import jupytext
    return jupytext.read(path)


def execute(path, timeout=300):
    """Run tutorial ``path`` in a fresh kernel in this folder; ``(notebook with outputs,
    seconds)``. A cell that raises ends it with ``nbclient``'s CellExecutionError, which names
    the cell and shows its traceback."""
    from nbclient import NotebookClient
    nb = read(path)
    client = NotebookClient(nb, timeout=timeout, kernel_name=KERNEL, record_timing=False,
                            resources={"metadata": {"path": str(HERE)}})
    start = time.perf_counter()
    client.execute(env={**os.environ, "MPLBACKEND": INLINE})   # figures become outputs
    return nb, time.perf_counter() - start


def skipped(error):
    """The message of a chapter that stopped itself (its ``SystemExit``), else None: ``error`` is
    what ``execute`` raised."""
    if getattr(error, "ename", None) == "SystemExit":
        return error.evalue
    return None


def store(nb, path):
    """Write ``nb`` (with its outputs) as the ``.ipynb`` beside tutorial ``path``."""
    import nbformat

    from npformer.data.textfile import write_text_atomic
    target = Path(path).with_suffix(".ipynb")
    text = nbformat.writes(nb)
    write_text_atomic(target, text if text.endswith("\n") else text + "\n")   # as nbformat.write
    return target


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="chapters to run (e.g. 01 03); default: all")
    parser.add_argument("--store", action="store_true",
                        help="keep each chapter with its outputs as NN_*.ipynb for the site")
    args = parser.parse_args(argv)
    try:
        paths = chapters(args.names)
    except ValueError as e:
        print(f"run_tutorials.py: error: {e}", file=sys.stderr)
        return 1
    from nbclient.exceptions import CellExecutionError
    for path in paths:
        try:
            nb, seconds = execute(path)
        except CellExecutionError as error:
            if skipped(error) is None:
                raise
            print(f"{path.name}: skipped: {skipped(error)}", flush=True)
            continue
        line = f"{path.name}: {seconds:.1f} s"
        if args.store:
            line += f", stored in {store(nb, path).name}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
