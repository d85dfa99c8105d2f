"""Where data parallelism plugs into the training loop: the collective operations of a run.

A run of one process is ``SingleProcess`` (every operation is the identity). A data-parallel run
(several processes, each with its share of the batches) replaces it with ``MPICollective``,
which talks to the others, so that every process takes the same update and stops at the same
step:

* ``total_tokens(n)``, before the backward of an update: the tokens of the update's batches on
  every process together (the loss is normalised by it, see ``npformer.training.task``);
* ``reduce(model, loss)``, after the backward: the gradient buffer and the update's loss summed
  over the processes (in place, then returned); the loop then clips and steps;
* ``agree(reason, check)``: every stop decision of the loop (a non-finite loss, max steps, the
  time budget, the target, early stopping) goes through here once; every process gets the
  first process's answer. ``check`` (the gradient norm) must have the same bits everywhere: a
  process whose weights drifted from the others' is caught at the step it happens;
* ``shard(group)``: every process reads the same batches; each trains on its own share;
* ``share(record)``: the first process's validation record, for every process (they take the
  same early-stopping and schedule decisions from it);
* ``start(trainer)``: before the first update: the same options, model, vocabularies and data
  on every process (a mismatch is refused, naming it), then the first process's weights and
  optimizer state for everyone;
* ``dropout_seed(seed, step)``: the seed of this process's dropout masks at an update.
"""
import hashlib
import json

import numpy as np

REDUCE_MODES = ("ordered", "mpi")
# the stop reasons agree() carries, as small integers (index 0: go on)
REASONS = (None, "non_finite", "max_steps", "time_budget", "target", "early_stopping", "epochs")


class SingleProcess:
    """The collective operations of a run of one process: nothing to exchange."""

    rank, size, is_root = 0, 1, True

    def total_tokens(self, n_tokens):
        return n_tokens

    def reduce(self, model, loss):
        return loss

    def agree(self, reason, check=None):
        return reason

    def shard(self, group):
        return group

    def share(self, record):
        return record

    def start(self, trainer):
        pass


def dropout_seed(seed, rank, step):
    """The seed sequence of rank ``rank``'s dropout masks at update ``step`` of a data-parallel
    run: a pure function of the three, so nothing per rank needs saving, and a resume on the same
    number of ranks draws the same masks."""
    return np.random.SeedSequence([int(seed), int(rank), int(step)])


def _hash(value):
    """64 bits of SHA-256 of a JSON value (as an int64, for an MPI buffer)."""
    text = json.dumps(value, sort_keys=True, default=str).encode()
    return np.frombuffer(hashlib.sha256(text).digest()[:8], dtype=np.int64)[0]


class MPICollective:
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

    def __init__(self, world, reduce="ordered"):
        if reduce not in REDUCE_MODES:
            raise ValueError(f"reduce: expected one of {REDUCE_MODES}, got {reduce!r}")
        from ..distributed import import_mpi
        self.MPI = import_mpi("a data-parallel run needs MPI")
        self.world, self.comm, self.mode = world, world.comm, reduce
        self.rank, self.size = world.rank, world.size
        self.is_root = self.rank == 0
        self._slices = None                      # (counts, displs, received) of ordered sums

    # -- the exchange of an update ---------------------------------------------------------------
    def total_tokens(self, n_tokens):
        total = np.zeros(1, dtype=np.int64)
        self.comm.Allreduce(np.array([n_tokens], dtype=np.int64), total)   # integers: exact
        return int(total[0])

    def reduce(self, model, loss):
        grads = model.flat_grads
        if self.mode == "ordered":
            self._ordered_sum(grads)
        else:
            self.comm.Allreduce(self.MPI.IN_PLACE, grads, op=self.MPI.SUM)
        losses = np.zeros(self.size, dtype=np.float64)
        self.comm.Allgather(np.array([loss], dtype=np.float64), losses)
        total = 0.0
        for value in losses:                     # rank order
            total += float(value)
        return total

    def _ordered_sum(self, buf):
        """``buf`` <- the sum of every rank's ``buf``, added in rank order (see the class)."""
        n, size = buf.size, self.size
        if self._slices is None or self._slices[0].sum() != n or self._slices[2].dtype != buf.dtype:
            bounds = np.linspace(0, n, size + 1).astype(np.int64)      # rank r owns a slice
            counts = np.diff(bounds)
            self._slices = (counts, bounds[:-1], np.empty((size, counts[self.rank]), buf.dtype))
        counts, displs, received = self._slices
        mine = int(counts[self.rank])
        dtype = self._datatype(buf)
        # every rank sends its slice r to rank r; rank r receives the N copies of its slice
        self.comm.Alltoallv([buf, (counts, displs), dtype],
                            [received, ([mine] * size, [mine * j for j in range(size)]), dtype])
        total = received[0].copy()
        for j in range(1, size):                 # rank order, whatever order they arrived in
            total += received[j]
        self.comm.Allgatherv([total, dtype], [buf, (counts, displs), dtype])

    def _datatype(self, array):
        from mpi4py.util.dtlib import from_numpy_dtype
        return from_numpy_dtype(array.dtype)

    # -- decisions ---------------------------------------------------------------------------------
    def agree(self, reason, check=None):
        mine = np.array([REASONS.index(reason),
                         np.nan if check is None else float(check)], dtype=np.float64)
        every = np.zeros((self.size, 2), dtype=np.float64)
        self.comm.Allgather(mine, every)
        if check is not None:
            bits = every[:, 1].view(np.int64)
            differ = [r for r in range(self.size) if bits[r] != bits[0]]
            if differ:
                raise ValueError(
                    f"data-parallel ranks diverged: the gradient norm is {every[0, 1]!r} on rank "
                    f"0 but {every[differ[0], 1]!r} on rank {differ[0]}; their weights are no "
                    f"longer the same (a fault, or an MPI that gives its ranks different sums "
                    f"with --reduce mpi). Resume from the last checkpoint (--reduce ordered)")
        return REASONS[int(every[0, 0])]        # the first rank's clock and validation decide

    def shard(self, group):
        """This rank's batches of an update's ``group``: every size-th one from its rank on. A
        rank with none left in an epoch's last group gets an empty list: zero tokens and zero
        gradient, never a batch twice."""
        return group[self.rank::self.size]

    def share(self, record):
        """The first rank's ``record`` (a JSON-able dict) on every rank."""
        data = json.dumps(record).encode() if self.is_root else b""
        length = np.array([len(data)], dtype=np.int64)
        self.comm.Bcast(length, root=0)
        buf = np.frombuffer(data, dtype=np.uint8).copy() if self.is_root else \
            np.empty(int(length[0]), dtype=np.uint8)
        self.comm.Bcast(buf, root=0)
        return json.loads(buf.tobytes().decode())

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
                  ("number of ranks", self.size), ("option reduce", self.mode)]
        mine = np.array([_hash(v) for _, v in items], dtype=np.int64)
        every = np.zeros((self.size, len(items)), dtype=np.int64)
        self.comm.Allgather(mine, every)
        for r in range(1, self.size):
            differ = [items[i][0] for i in np.flatnonzero(every[r] != every[0])]
            if differ:
                raise ValueError(f"rank {r} of the data-parallel run was started with other "
                                 f"{', '.join(differ)} than rank 0: every rank must run the same "
                                 f"command on the same data (and resume the same checkpoint)")

    def dropout_seed(self, seed, step):
        return dropout_seed(seed, self.rank, step)

    def __repr__(self):
        return f"MPICollective(rank {self.rank} of {self.size}, reduce={self.mode!r})"

