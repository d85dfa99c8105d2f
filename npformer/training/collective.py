"""Where data parallelism plugs into the training loop: the collective operations of a run.

A run of one process is ``SingleProcess`` (every operation is the identity). A data-parallel run
(several processes, each with its share of the batches) replaces it with one that talks to the
others, so that every process takes the same update and stops at the same step:

* ``total_tokens(n)``, before the backward of an update: the tokens of the update's batches on
  every process together (the loss is normalised by it, see ``npformer.training.task``);
* ``reduce(model, loss)``, after the backward: the gradient buffer and the update's loss summed
  over the processes (in place, then returned); the loop then clips and steps;
* ``agree(reason)``: every stop decision of the loop (a non-finite loss, max steps, the time
  budget, the target, early stopping) goes through here once; every process must get the same
  answer.
"""


class SingleProcess:
    """The collective operations of a run of one process: nothing to exchange."""

    def total_tokens(self, n_tokens):
        return n_tokens

    def reduce(self, model, loss):
        return loss

    def agree(self, reason):
        return reason
