"""``npformer calibrate``: time the matrix-product variants for a model's shapes on this machine
and write the dispatch table that later runs use (``npformer.runtime``).

Runs never time anything themselves: without a table the built-in rules choose each product's
variant. Calibrating trades that for the fastest variant per product here. The table names this
machine's CPU and BLAS; elsewhere it is ignored with a warning. Checkpoints record the choices
they were trained with, so a resume computes as before whatever table is in force.
"""
import importlib

import numpy as np

from .. import backend, runtime
from ..loss import cross_entropy
from ..configs import TransformerConfig
from ..registry import build_model
from ..training.multi30k import MULTI30K_MODEL
from .common import add_model_args, command_parser, model_kwargs, path_argument, positive_int


def add_parser(sub, name):
    p = command_parser(sub, name, __doc__, "time the matrix-product variants for a model's "
                                           "shapes and write this machine's dispatch table")
    add_model_args(p, MULTI30K_MODEL)
    g = p.add_argument_group("batches")
    g.add_argument("--src-vocab", type=positive_int, default=8000)
    g.add_argument("--tgt-vocab", type=positive_int, default=8000)
    g.add_argument("--batch-size", type=positive_int, default=128, help="sentences per batch")
    g.add_argument("--min-len", type=positive_int, default=8,
                   help="shortest batch length timed, in tokens (default %(default)s)")
    g.add_argument("--max-len-timed", type=positive_int, default=32, metavar="N",
                   help="longest batch length timed (default %(default)s): each length from "
                        "--min-len to N takes one training step")
    p.add_argument("--out", type=path_argument, default=None,
                   help=f"where to write the table (default {runtime.default_table_path()}, "
                        f"or ${runtime.ENV_TABLE})")
    p.set_defaults(run=run)


def run(args):
    if args.min_len > args.max_len_timed:
        raise ValueError(f"--min-len {args.min_len}: expected at most --max-len-timed "
                         f"{args.max_len_timed}")
    if args.max_len_timed > args.max_len:
        raise ValueError(f"--max-len-timed {args.max_len_timed}: expected at most --max-len "
                         f"{args.max_len}")
    backend.set_backend("numba")                 # the products being timed are the kernels'
    dispatcher = importlib.import_module("npformer.kernels.matmul")
    out = args.out or runtime.default_table_path()
    runtime.use_table(None)                      # time every variant, whatever a table said
    runtime.forget_choices()
    runtime.set_deterministic(False)
    model = build_model(TransformerConfig(src_vocab_size=args.src_vocab,
                                          tgt_vocab_size=args.tgt_vocab, **model_kwargs(args)))
    model.train()
    rng = np.random.default_rng(0)
    for length in range(args.min_len, args.max_len_timed + 1):
        src = rng.integers(3, args.src_vocab, size=(args.batch_size, length))
        tgt = rng.integers(3, args.tgt_vocab, size=(args.batch_size, length + 1))
        logits = model.forward(src, tgt[:, :-1])
        _, dlogits = cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt[:, 1:].reshape(-1),
                                   ignore_index=0)
        model.zero_grad()
        model.backward(dlogits.reshape(logits.shape))
        print(f"length {length}: {len(runtime.choices())} product shapes timed so far", flush=True)
    choices, timings = runtime.choices(), dispatcher.timings()
    runtime.write_table(out, choices, timings)
    rules = dispatcher.rule_choices()
    ruled = {k: v for k, v in choices.items() if rules.get(k, v) != v}
    print(f"wrote {out}: {len(choices)} product shapes, {len(ruled)} of them computed by another "
          f"variant than the built-in rules would choose")
    return 0
