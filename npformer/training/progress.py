"""tqdm progress bars that switch themselves off when stderr is not a terminal or when quiet."""
import sys

from tqdm import tqdm


def progress_bar(total=None, desc=None, quiet=False, initial=0, file=None):
    """A tqdm bar on stderr; a no-op bar (same methods) under ``quiet`` or without a TTY."""
    file = file or sys.stderr
    disable = quiet or not (hasattr(file, "isatty") and file.isatty())
    return tqdm(total=total, desc=desc, initial=initial, file=file, disable=disable,
                leave=False, dynamic_ncols=True)
