"""Adam and AdamW, bias-corrected, step for step as torch.optim.Adam / AdamW (single-tensor path).

The update runs over the model's one flat parameter buffer (``Module.flat_params``), so a step is
a handful of vectorised operations, whatever the number of layers. Frozen parameters (whose
``.grad`` is None, as ``npformer.lora`` leaves the base weights) are not in it: they get no
moments and no update.

Derivation: docs/backprop.md#adam.
"""
import math

import numpy as np

from .. import backend
from ..validation import check_real


class Adam:
    """Adam (Kingma & Ba). ``weight_decay`` here is L2 regularisation: it adds wd * p to the
    gradient (as torch.optim.Adam). For decoupled decay use :class:`AdamW`.

    Attributes ``lr`` (settable, e.g. by a schedule; checked on every assignment, so a schedule
    that goes negative or NaN stops the run before it writes into the weights), ``step_count``,
    ``exp_avg``, ``exp_avg_sq``.
    """

    decoupled = False

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 decay=None):
        """``decay(name, parameter) -> bool`` chooses the parameters weight decay applies to
        (None: all of them, as torch's optimizers over ``model.parameters()``); e.g.
        :func:`matrices_only`, GPT-2's practice, is torch's two parameter groups, one with
        ``weight_decay`` and one with 0."""
        self.lr = lr                                     # checked by the setter below
        beta1, beta2 = check_betas(betas)
        eps = check_real("eps", eps, minimum=0)
        weight_decay = check_real("weight_decay", weight_decay, minimum=0)
        if decay is not None and not callable(decay):
            raise ValueError(f"decay: expected None or a function (name, parameter) -> bool, "
                             f"got {decay!r:.60}")
        check_model(model)
        if model.flat_params is None:
            model.flatten_parameters()
        self.model = model
        self.params, self.grads = model.flat_params, model.flat_grads     # (P,) views of the model
        self.betas, self.eps, self.weight_decay = (beta1, beta2), eps, weight_decay
        # [(start, stop, decays)] covering the flat buffer: runs of parameters decayed or not
        self.segments = _segments(model, decay)
        self.step_count = 0
        self.exp_avg = np.zeros_like(self.params)
        self.exp_avg_sq = np.zeros_like(self.params)

    @property
    def lr(self):
        return self._lr

    @lr.setter
    def lr(self, value):
        self._lr = check_real("lr", value, minimum=0)

    def step(self):
        """One update of every parameter from its current gradient: the flat buffer's segments
        (one, unless ``decay`` chose some parameters) each with its own weight decay."""
        self.step_count += 1
        # the active backend's own update where it has one (the Numba backend's fused twin, or
        # the Adam exercise's, which the exercises' finales put in their namespace)
        update = getattr(backend.ops(), "adam_step", None) or _adam_update
        for start, stop, decays in self.segments:
            part = slice(start, stop)
            args = (self.params[part], self.grads[part], self.exp_avg[part],
                    self.exp_avg_sq[part], self.step_count, self.lr, *self.betas, self.eps,
                    self.weight_decay if decays else 0.0, self.decoupled)
            update(*args)

    def state_dict(self):
        return {"step_count": np.array(self.step_count, dtype=np.int64),
                "exp_avg": self.exp_avg.copy(), "exp_avg_sq": self.exp_avg_sq.copy()}

    def load_state_dict(self, state):
        for key in ("step_count", "exp_avg", "exp_avg_sq"):
            if key not in state:
                raise ValueError(f"optimizer state_dict: missing entry {key!r}")
        for key in ("exp_avg", "exp_avg_sq"):
            if np.shape(state[key]) != self.params.shape:
                raise ValueError(f"optimizer state_dict: entry {key!r} expected shape "
                                 f"{self.params.shape}, got {np.shape(state[key])}")
        step_count = np.asarray(state["step_count"])
        if step_count.shape != () or step_count.dtype.kind not in "iu" or step_count < 0:
            raise ValueError(f"optimizer state_dict: entry 'step_count' expected a non-negative "
                             f"integer scalar, got {step_count.dtype} {step_count.shape} {step_count!r:.40}")
        self.step_count = int(step_count)
        self.exp_avg[...] = state["exp_avg"]
        self.exp_avg_sq[...] = state["exp_avg_sq"]


def matrices_only(name, parameter):
    """Weight decay on the weight matrices and embeddings only, not on biases and LayerNorm
    parameters (GPT-2's practice; ``Adam(..., decay=matrices_only)``)."""
    return parameter.data.ndim >= 2


def _segments(model, decay):
    """The flat buffer as runs of consecutive parameters that ``decay`` chooses or not:
    [(start, stop, decays)]; one run, decayed, for ``decay=None``."""
    flat = model.flat_params
    if decay is None:
        return [(0, flat.size, True)]
    base = flat.__array_interface__["data"][0]
    segments = []
    for name, p in model.named_parameters():
        if p.grad is None:                  # frozen (npformer.lora): not in the flat buffer
            continue
        start = (p.data.__array_interface__["data"][0] - base) // flat.itemsize
        decays = bool(decay(name, p))
        if segments and segments[-1][2] == decays and segments[-1][1] == start:
            segments[-1] = (segments[-1][0], start + p.data.size, decays)
        else:
            segments.append((start, start + p.data.size, decays))
    return segments


def _adam_update(p, g, m, v, t, lr, beta1, beta2, eps, wd, decoupled):
    """The NumPy reference of one update of ``p`` (in place) at step ``t`` (1-based); the Numba
    backend's ``adam_step`` is its fused twin."""
    if wd != 0:
        if decoupled:
            p *= 1.0 - lr * wd                           # AdamW: shrink the weights directly
        else:
            g = g + wd * p                               # Adam: L2 term in the gradient
    m += (1.0 - beta1) * (g - m)                         # m <- beta1 m + (1 - beta1) g
    v *= beta2
    v += (1.0 - beta2) * g * g                           # v <- beta2 v + (1 - beta2) g^2
    step_size = lr / (1.0 - beta1 ** t)
    denom = np.sqrt(v)
    denom /= math.sqrt(1.0 - beta2 ** t)
    denom += eps
    p -= step_size * (m / denom)


def check_model(model, what="optimise"):
    """``model`` as the optimizers and clipping take it: an npformer ``Module`` (they work on
    its one flat buffer of parameters, not on a list of parameters as torch's do) with at least
    one parameter. ValueError naming ``model`` otherwise (``what``: what was to be done)."""
    from ..nn.module import Module
    if not isinstance(model, Module):
        got = f"a {type(model).__name__}"
        if isinstance(model, (list, tuple)) and not model:
            got = f"an empty {type(model).__name__}: no parameters to {what}"
        raise ValueError(f"model: expected an npformer model (a Module, whose one flat buffer of "
                         f"parameters is updated), got {got}")
    if not model.parameters():
        raise ValueError(f"model: the {type(model).__name__} has no parameters: no parameters to "
                         f"{what}")


def check_betas(betas, name="betas"):
    """``(beta1, beta2)`` as floats: two finite numbers in [0, 1). One message for any other
    shape or value, since a pair is what the reader has to fix."""
    try:
        beta1, beta2 = betas
        return tuple(check_real(name, b, minimum=0, maximum=1, max_open=True) for b in (beta1, beta2))
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected two numbers in [0, 1), got {betas!r}") from None


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p <- p (1 - lr wd) before the
    Adam step. Default weight_decay 0.01, as torch.optim.AdamW."""

    decoupled = True

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 decay=None):
        super().__init__(model, lr, betas, eps, weight_decay, decay)
