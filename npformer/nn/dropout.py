"""Dropout module: active in train mode, identity in eval mode."""
from ..backend import ops
from ..validation import check_real
from .module import Module


def check_probability(p):
    """p as a float if it is a dropout probability (a finite number in [0, 1)), else ValueError."""
    return check_real("dropout", p, minimum=0, maximum=1, max_open=True)


class Dropout(Module):
    """Inverted dropout with probability ``p``, drawing from the model's shared ``rng``."""

    def __init__(self, p, *, rng):
        super().__init__()
        self.p, self.rng = check_probability(p), rng
        self._cache = None
        self._ops = None          # the backend that ran forward: only its backward fits the cache

    def forward(self, x):
        self._ops = ops()
        out, self._cache = self._ops.dropout_forward(x, self.p, self.rng, self.training)
        return out

    def backward(self, dout):
        return self._ops.dropout_backward(dout, self._cache)

    def add_forward(self, x, y):
        """x + dropout(y), as a residual connection sums (one pass in the Numba backend)."""
        self._ops = ops()
        out, self._cache = self._ops.dropout_add_forward(x, y, self.p, self.rng, self.training)
        return out

    def add_norm_forward(self, x, y, norm):
        """norm(x + dropout(y)), a post-norm residual connection's sum and norm: with dropout off
        (eval mode), in one pass where ``norm`` can sum and normalise together
        (``LayerNorm.add_forward`` on the kernels), the same bits and caches as
        ``norm.forward(self.add_forward(x, y))``, which it is otherwise."""
        fuses = getattr(norm, "fuses_add", None)
        if self.training or fuses is None or not fuses(x, y):
            return norm.forward(self.add_forward(x, y))
        out = norm.add_forward(x, y)
        self._ops, self._cache = ops(), None          # add_forward's in eval: dx = dy = dout
        return out

    def add_backward(self, dout):
        """(dx, dy) of :meth:`add_forward`: dx is dout itself, dy its dropout'."""
        return self._ops.dropout_add_backward(dout, self._cache)
