"""The reference solutions of ``npformer exercises``: one file per exercise, the learner's file
with the backward written. ``npformer exercises start`` writes each file with the code between
the ``# --- your code ---`` and ``# --- end of your code ---`` lines replaced by
``raise NotImplementedError``. They compute what :mod:`npformer.functional` computes, operation
for operation, so that training with them gives the reference backend's very bits."""
