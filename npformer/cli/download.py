"""``npformer download NAME``: fetch a data set (``multi30k``, ``tinyshakespeare``) into the data
folder and check every file's sha256."""
from ..data.download import DATASETS, download
from .common import path_argument, positive_float


def add_parser(sub, name):
    known = "; ".join(f"{key}: {entry.about}" for key, entry in DATASETS.items())
    p = sub.add_parser(name, help=f"download a data set ({', '.join(DATASETS)})",
                       description=f"Download a data set and verify every file's sha256. "
                                   f"Known data sets: {known}.")
    p.add_argument("dataset", choices=list(DATASETS), metavar="NAME",
                   help=f"one of {', '.join(DATASETS)}")
    p.add_argument("--dest", type=path_argument, default=None,
                   help="folder (default: $NPFORMER_DATA or ~/.cache/npformer/multi30k, the "
                        "same for every data set)")
    p.add_argument("--base-url", default=None,
                   help="where the files are (default: the data set's source)")
    p.add_argument("--timeout", type=positive_float, default=60, metavar="SECONDS",
                   help="give up on a server that sends nothing for this long (default "
                        "%(default)g)")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(run=run)


def run(args):
    paths = download(args.dataset, args.dest, base_url=args.base_url, timeout=args.timeout,
                     progress=not args.quiet)
    for path in paths:
        print(path)
    return 0
