"""``npformer download multi30k``: fetch the Multi30k files and check their sha256."""
from ..data.download import DEFAULT_BASE_URL, download_multi30k
from ..data.multi30k import resolve_data_dir
from .common import path_argument


def add_parser(sub, name):
    p = sub.add_parser(name, help="download a data set (multi30k)",
                       description="Download a data set and verify every file's sha256.")
    p.add_argument("dataset", choices=["multi30k"])
    p.add_argument("--dest", type=path_argument, default=None,
                   help="folder (default: $NPFORMER_DATA or ~/.cache/npformer/multi30k)")
    p.add_argument("--base-url", default=DEFAULT_BASE_URL)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(run=run)


def run(args):
    paths = download_multi30k(resolve_data_dir(args.dest), base_url=args.base_url,
                              progress=not args.quiet)
    for path in paths:
        print(path)
    return 0
