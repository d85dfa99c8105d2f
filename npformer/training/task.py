"""What the training loop needs from the thing it trains: the ``Task`` protocol.

The loop (``npformer.training.trainer.Trainer``) knows updates, schedules, clipping, stopping,
logging and checkpoints; a task knows its data, its loss and how to score a model::

    class Task:
        name, metrics, minimize, batch_type, vocabs, has_validation
        check_model(model)                       # refuse a model that cannot serve the task
        batches_per_epoch()                      # for the schedule and the progress bar
        batches(epoch)                           # the rest of that epoch's batches (resumable)
        batches_done()                           # how many of the epoch's are behind (progress)
        state_dict() / load_state_dict(state)    # the position inside the epoch
        tokens(batch), padded_tokens(batch)      # what the loss averages over; cells computed
        loss_and_backward(model, batch, weight)  # -> the batch's SUMMED loss
        evaluate(model)                          # -> {metric: value}, on the validation data
        examples(n)                              # a few lines for the log, from the last evaluate
        fingerprint()                            # CRC of the data: a resume must see the same

**The loss of an update.** The batches of one update (``accum_steps`` of them, on every process)
hold N tokens in all. ``loss_and_backward(model, b, weight)`` back-propagates ``weight`` times
the gradient of batch b's mean loss, with ``weight = n_b / N`` (b's share of the tokens), and
returns b's summed loss. The gradients then add up to the gradient of

    (sum over every token of the update of its loss) / N,

the token-weighted mean: the same update whether the N tokens came in one batch, in several
accumulated ones, or spread over several processes (fairseq's normalisation). The division by
N is applied to each batch's gradient before its backward, where the loop knows N beforehand
(``Collective.total_tokens``); that keeps the bits of the loop before the task protocol.

Tasks: ``npformer.training.translation.TranslationTask``,
``npformer.training.language_model.LanguageModelTask``; tests/test_task.py holds a task with no
vocabulary at all (a regression on random vectors) to prove the loop needs none.
"""


class Task:
    """The protocol, with the defaults a task may keep. Subclasses set the class attributes."""

    name = "task"                # named in errors: "task 'translation', step 3: ..."
    metrics = ("loss",)          # what evaluate() returns; the stop metric is one of them
    minimize = ("loss",)         # metrics where lower is better (the others: higher)
    batch_type = object          # what batches() yields; anything else is refused
    vocabs = None                # saved in every checkpoint (a Vocabularies), or None
    has_validation = False       # whether evaluate() has data to score

    def check_model(self, model):
        """Raise ``ValueError`` if ``model`` cannot serve this task (sizes, lengths)."""

    def batches_per_epoch(self):
        raise NotImplementedError

    def batches(self, epoch):
        """The batches of ``epoch`` not yet trained on (all of them unless resumed half way),
        in a seeded order; advancing the position ``state_dict`` reports."""
        raise NotImplementedError

    def batches_done(self):
        """How many batches of the current epoch are already trained on (a progress bar's
        start after a resume)."""
        return 0

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass

    def tokens(self, batch):
        """How many tokens (or examples) the batch's mean loss averages over."""
        raise NotImplementedError

    def padded_tokens(self, batch):
        """Cells of the batch's arrays (padding included), for the throughput log."""
        return self.tokens(batch)

    def loss_and_backward(self, model, batch, weight):
        """Forward ``batch``, back-propagate ``weight`` x the gradient of its mean loss into the
        model's gradients (adding to them), return its summed loss (a float)."""
        raise NotImplementedError

    def evaluate(self, model):
        """``{metric: value}`` for every name in ``metrics`` (the model is in eval mode)."""
        raise NotImplementedError

    def examples(self, n=3):
        """Up to ``n`` short lines showing what the model did in the latest ``evaluate``."""
        return []

    def fingerprint(self):
        """An integer that changes when the training or validation data change."""
        return 0
