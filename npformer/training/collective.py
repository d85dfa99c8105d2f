"""Where data parallelism plugs into the training loop: the collective operations of a run.

A run of one process is ``SingleProcess`` (every operation is the identity). A data-parallel run
(several processes, each with its share of the batches) replaces it with ``MPICollective``,
which talks to the others, so that every process takes the same update and stops at the same
step:

* ``total_tokens(n)``, before the backward of an update: the tokens of the update's batches on
  every process together (the loss is normalised by it, see ``npformer.training.task``);
* ``reduce(model, loss)``, after the backward: the gradient buffer and the update's loss summed
  over the processes (the buffer in place), and the gradient norm: ``(loss, norm)``; the loop
  then clips by that norm and steps. Every process gets the same bits of the loss and the norm;
  with ``--reduce ordered`` also of the buffer, so the same update follows on every one,
  whatever CPU it runs on (clipping and Adam are element by element, correctly rounded: the
  norm, a sum, is the one place a CPU's kernels could differ). MPI's own sum (``--reduce
  mpi``) may give the ranks buffers that differ in their last bits;
* ``agree(reason, check)``: every stop decision of the loop (a non-finite loss, max steps, the
  time budget, the target, early stopping) goes through here once; every process gets the
  first process's answer. ``check`` (``weights_check``: a sample of the weights' bits) must be
  the same everywhere: a process whose weights drifted from the others' is caught;
* ``shard(group)``: every process reads the same batches; each trains on its own share;
* ``share(record)``: the first process's validation record, for every process (they take the
  same early-stopping and schedule decisions from it);
* ``start(trainer)``: before the first update: the same options, model, vocabularies and data
  on every process (a mismatch is refused, naming it), then the first process's weights and
  optimizer state for everyone;
* ``dropout_seed(seed, step)``: the seed of this process's dropout masks at an update;
* ``fail(error)``: an exception that only this process met (a failed save, a bug) ends every
  process of the run, which would otherwise wait for this one in their next exchange.

A collective of one's own (another transport) subclasses ``SingleProcess`` and overrides what
it exchanges (``MPICollective`` is one).
"""
import contextlib
import hashlib
import json
import math
import sys
import time
import traceback
import zlib

import numpy as np

from ..lora import base_identity
from ..optim.clip import grad_norm, sum_of_squares

REDUCE_MODES = ("ordered", "mpi")
# the stop reasons agree() carries, as small integers (index 0: go on)
REASONS = (None, "non_finite", "max_steps", "time_budget", "target", "early_stopping", "epochs")


class SingleProcess:
    """The collective operations of a run of one process: nothing to exchange. A collective of
    one's own subclasses it; ``reduce`` returns ``(loss, gradient norm)``."""

    rank, size, is_root = 0, 1, True

    def total_tokens(self, n_tokens):
        return n_tokens

    def reduce(self, model, loss):
        return loss, grad_norm(model)

    def agree(self, reason, check=None):
        return reason

    def shard(self, group):
        return group

    def share(self, record):
        if isinstance(record, BaseException):
            raise record
        return record

    def alone(self):
        """A context for work the first process does while the others wait (validation)."""
        return contextlib.nullcontext()

    def start(self, trainer):
        pass

    def dropout_seed(self, seed, step):
        return dropout_seed(seed, self.rank, step)

    def fail(self, error):
        """Called with an exception that leaves ``Trainer.fit``: one process has nothing to
        tell (the exception propagates)."""


class EveryRankError(ValueError):
    """An error every process of a data-parallel run raises together (they took the same
    decision from the same exchanged values): it propagates on each, nothing is aborted."""


def dropout_seed(seed, rank, step):
    """The seed sequence of rank ``rank``'s dropout masks at update ``step`` of a data-parallel
    run: a pure function of the three, so nothing per rank needs saving, and a resume on the same
    number of ranks draws the same masks."""
    return np.random.SeedSequence([int(seed), int(rank), int(step)])


def weights_check(flat, step, sample=4096):
    """A check of the weights' bits that costs microseconds: the CRC-32 of about ``sample``
    elements of the flat buffer ``flat``, evenly spaced from an offset that moves with ``step``
    (every element is looked at within ``len(flat) // sample`` updates). Equal on every process
    of a run whose weights are the same."""
    stride = max(1, flat.size // sample)
    return zlib.crc32(np.ascontiguousarray(flat[step % stride::stride]).tobytes())


def slice_bounds(n, size):
    """The ``size + 1`` bounds of the equal slices of a buffer of ``n`` elements: rank r owns
    ``[bounds[r], bounds[r + 1])`` of the gradient buffer in the exchange and its norm."""
    return np.linspace(0, n, size + 1).astype(np.int64)


def _plain(value):
    """``json.dumps``' fallback for a record's numpy numbers."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"a validation record holds a {type(value).__name__} ({value!r}), which "
                    f"the data-parallel run cannot send to its other processes")


def _hash(value):
    """64 bits of SHA-256 of a JSON value (as an int64, for an MPI buffer)."""
    text = json.dumps(value, sort_keys=True, default=str).encode()
    return np.frombuffer(hashlib.sha256(text).digest()[:8], dtype=np.int64)[0]


class MPICollective(SingleProcess):
    """The collective operations of a data-parallel run over an MPI communicator (``world``: a
    ``npformer.distributed.World``).

    ``reduce="ordered"`` (the default) sums the gradients in rank order, independently of the
    MPI library's reduction tree, so the result has the bits of one process adding the ranks'
    buffers 0 + 1 + ... + (N-1): rank r receives the r-th slice of every rank's buffer
    (``Alltoallv``), adds them in rank order, and every rank gathers the summed slices
    (``Allgatherv``). That moves the same bytes as a ring allreduce: 2 (N-1)/N of the buffer
    per rank. ``reduce="mpi"`` is one ``Allreduce``: the MPI's own order, which may differ from
    run to run with the tree the library picks (same result within float32 round-off).
    """

    def __init__(self, world, reduce="ordered", abort_on_error=True):
        """``abort_on_error``: ``fail`` ends the job (a library's caller); the command line
        passes False, as it ends the job itself after printing the error its own way."""
        if reduce not in REDUCE_MODES:
            raise ValueError(f"reduce: expected one of {REDUCE_MODES}, got {reduce!r}")
        from ..distributed import import_mpi
        self.MPI = import_mpi("a data-parallel run needs MPI")
        self.world, self.comm, self.mode = world, world.comm, reduce
        self.abort_on_error = abort_on_error
        self.rank, self.size = world.rank, world.size
        self.is_root = self.rank == 0
        self._bounds = None                      # the slices of the gradient buffer (slice_bounds)
        self._received = None                    # the N copies of this rank's slice

    # -- the exchange of an update ---------------------------------------------------------------
    def total_tokens(self, n_tokens):
        total = np.zeros(1, dtype=np.int64)
        self.comm.Allreduce(np.array([n_tokens], dtype=np.int64), total)   # integers: exact
        return int(total[0])

    def reduce(self, model, loss):
        """The update's gradients summed over the ranks (into ``model.flat_grads``), with its
        loss and gradient norm: ``(loss, norm)``.

        The norm of a data-parallel run is the square root of the sums of squares of the
        buffer's slices (``slice_bounds``), added in rank order. Rank r computes its slice's sum
        alone; one ``Allgather`` carries every rank's (loss, sum of squares), and every rank adds
        the same numbers in the same order: the same bits everywhere, even on machines whose
        CPUs' dot products differ in the last bit."""
        grads = model.flat_grads
        if self._bounds is None or self._bounds[-1] != grads.size:
            self._bounds, self._received = slice_bounds(grads.size, self.size), None
        bounds = self._bounds
        mine = slice(int(bounds[self.rank]), int(bounds[self.rank + 1]))
        if self.mode == "ordered":
            self._ordered_sum(grads, bounds)
        else:
            self.comm.Allreduce(self.MPI.IN_PLACE, grads, op=self.MPI.SUM)
        every = np.zeros((self.size, 2), dtype=np.float64)
        self.comm.Allgather(np.array([loss, float(sum_of_squares(grads[mine]))],
                                     dtype=np.float64), every)
        total, squares = 0.0, 0.0
        for value, sq in every:                  # rank order
            total += float(value)
            squares += float(sq)
        return total, math.sqrt(squares)

    def _ordered_sum(self, buf, bounds):
        """``buf`` <- the sum of every rank's ``buf``, added in rank order (see the class)."""
        size = self.size
        counts, displs = np.diff(bounds), bounds[:-1]
        mine = int(counts[self.rank])
        if self._received is None or self._received.dtype != buf.dtype:
            self._received = np.empty((size, mine), dtype=buf.dtype)
        received = self._received
        dtype = self._datatype(buf)
        # every rank sends its slice r to rank r; rank r receives the N copies of its slice
        self.comm.Alltoallv([buf, (counts, displs), dtype],
                            [received, ([mine] * size, [mine * j for j in range(size)]), dtype])
        total = received[0]                      # the sum builds up in place (scratch)
        for j in range(1, size):                 # rank order, whatever order they arrived in
            total += received[j]
        self.comm.Allgatherv([total, dtype], [buf, (counts, displs), dtype])

    def _datatype(self, array):
        from mpi4py.util.dtlib import from_numpy_dtype
        return from_numpy_dtype(array.dtype)

    # -- decisions ---------------------------------------------------------------------------------
    def agree(self, reason, check=None):
        """Rank 0's ``reason`` on every rank; ``check`` (``weights_check``) must be the same on
        every rank, else every rank raises the same ``EveryRankError``."""
        mine = np.array([REASONS.index(reason), -1 if check is None else int(check)],
                        dtype=np.int64)
        every = np.zeros((self.size, 2), dtype=np.int64)
        self.comm.Allgather(mine, every)
        differ = [r for r in range(self.size) if every[r, 1] != every[0, 1]]
        if differ:
            raise EveryRankError(
                f"data-parallel ranks diverged: the weights of rank {differ[0]} differ from rank "
                f"0's (a fault of memory or of a process, or an MPI that gave its ranks "
                f"different sums with --reduce mpi); resume from the last checkpoint "
                f"(--reduce ordered)")
        return REASONS[int(every[0, 0])]        # the first rank's clock and validation decide

    def shard(self, group):
        """This rank's batches of an update's ``group``: every size-th one from its rank on. A
        rank with none left in an epoch's last group gets an empty list: zero tokens and zero
        gradient, never a batch twice."""
        return group[self.rank::self.size]

    def share(self, record):
        """The first rank's ``record`` (a dict of JSON values and numpy numbers) on every rank.
        ``record`` may be an exception rank 0 met making it: every rank then raises the same
        ``EveryRankError`` naming it (rank 0 from its own, whose traceback it prints first
        where it is not a ValueError), none waits for the others."""
        if self.is_root:
            if isinstance(record, BaseException):
                data = json.dumps({"error": f"{type(record).__name__}: {record}"})
            else:
                try:
                    data = json.dumps({"record": record}, default=_plain)
                except (TypeError, ValueError) as e:
                    record = e
                    data = json.dumps({"error": f"{type(e).__name__}: {e}"})
            data = data.encode()
        else:
            data = b""
        length = np.array([len(data)], dtype=np.int64)
        # (non-blocking on every rank: a blocking and a non-blocking collective never match)
        request = self.comm.Ibcast(length, root=0)
        while not request.Test():                # the others wait asleep: rank 0 may be
            time.sleep(0.002)                    # validating on their cores
        buf = np.frombuffer(data, dtype=np.uint8).copy() if self.is_root else \
            np.empty(int(length[0]), dtype=np.uint8)
        self.comm.Bcast(buf, root=0)
        message = json.loads(buf.tobytes().decode())
        if "error" in message:
            failed = EveryRankError(f"rank 0 of the data-parallel run failed in validation "
                                    f"({message['error']})")
            if isinstance(record, BaseException):
                if not isinstance(record, ValueError):
                    traceback.print_exception(type(record), record, record.__traceback__,
                                              file=sys.stderr)
                raise failed from record
            raise failed
        return message["record"]

    def alone(self):
        """Rank 0's validation runs on every core of its machine (the other ranks wait for its
        record in ``share``, asleep)."""
        from ..distributed import whole_machine
        return whole_machine(self.world) if self.is_root else contextlib.nullcontext()

    def broadcast(self, array):
        """Rank 0's ``array`` into every rank's (in place)."""
        self.comm.Bcast(array, root=0)

    # -- the start of a run ------------------------------------------------------------------------
    def start(self, trainer):
        """Refuse ranks started differently, then give every rank rank 0's weights and optimizer
        state (one call per flat buffer)."""
        self.check_same(trainer)
        for array in (trainer.model.flat_params, trainer.optimizer.exp_avg,
                      trainer.optimizer.exp_avg_sq):
            self.broadcast(array)

    def check_same(self, trainer):
        """Every rank must train the same thing: compare hashes of each option, the model's
        configuration, the vocabularies, the data and the position in them; every rank raises
        the same ValueError naming what differs."""
        config = trainer.config.to_dict()
        items = [(f"option {k}", config[k]) for k in sorted(config) if k not in ("out_dir", "quiet")]
        vocabs = trainer.task.vocabs
        items += [("model configuration", trainer.model.config.to_dict()),
                  ("vocabularies", vocabs.to_dict() if vocabs is not None else None),
                  ("training or validation data", trainer.data_fingerprint()),
                  ("position in the run (step, epoch, batches)",
                   [trainer.step, trainer.epoch, trainer.task.state_dict()]),
                  ("number of ranks", self.size), ("option reduce", self.mode),
                  ("LoRA adapters or base weights", _lora_identity(trainer.model))]
        mine = np.array([_hash(v) for _, v in items], dtype=np.int64)
        every = np.zeros((self.size, len(items)), dtype=np.int64)
        self.comm.Allgather(mine, every)
        for r in range(1, self.size):
            differ = [items[i][0] for i in np.flatnonzero(every[r] != every[0])]
            if differ:
                raise EveryRankError(f"rank {r} of the data-parallel run was started with other "
                                 f"{', '.join(differ)} than rank 0: every rank must run the same "
                                 f"command on the same data (and resume the same checkpoint)")

    def fail(self, error):
        """``error`` left ``Trainer.fit`` on this rank. An ``EveryRankError`` was raised by every
        rank together and propagates; any other may be this rank's alone (a failed save or log
        write on rank 0, a bug) while the others wait for it in their next exchange, so it ends
        the whole job: this rank's message (and, for what is not a ValueError, its traceback)
        on standard error, then ``MPI.Abort``."""
        if isinstance(error, EveryRankError) or not self.abort_on_error:
            return
        from ..distributed import abort
        where = f"rank {self.rank} of {self.size}"
        try:
            if isinstance(error, ValueError):
                print(f"npformer ({where}): error: {error}", file=sys.stderr)
            else:
                print(f"npformer ({where}): {type(error).__name__} in training; ending every "
                      f"rank", file=sys.stderr)
                traceback.print_exception(type(error), error, error.__traceback__,
                                          file=sys.stderr)
        finally:
            abort(1, self.comm)

    def __repr__(self):
        return f"MPICollective(rank {self.rank} of {self.size}, reduce={self.mode!r})"


def _lora_identity(model):
    """A LoRA run's settings with the sha256 of its frozen base (every rank must adapt the same
    weights: they are read from a folder, not broadcast), or None for a run without adapters."""
    settings = base_identity(model)
    return None if settings is None else settings.to_dict()
