"""How often the fast path of decoding needed the exact one (``TranslationState(exact=False)``).

    from npformer.decoding import FAST_PATH
    FAST_PATH.reset(); translator.translate(lines, method="beam"); print(FAST_PATH)
"""


class FastPathStats:
    """Counts since the last ``reset``: ``searches`` run on the fast path, ``fallbacks`` (those
    a decision the bounds could not settle sent back to the start on the exact path) and
    ``exact_rows`` (rows of a step the fast path could not rank, taken from the exact path on
    the spot)."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.searches = self.fallbacks = self.exact_rows = 0

    def __repr__(self):
        return (f"{self.searches} fast searches, {self.fallbacks} redone exactly, "
                f"{self.exact_rows} rows taken exactly")


FAST_PATH = FastPathStats()
