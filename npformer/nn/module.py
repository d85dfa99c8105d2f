"""Parameters and the Module base class: thin owners of arrays on top of the functional core.

A module's ``forward`` keeps what its ``backward`` needs in ``self._cache``; ``backward``
*accumulates* into each ``Parameter.grad`` (``+=``), so tied weights and gradient accumulation
just work, and ``zero_grad()`` resets them.

All parameters of a model live in one contiguous buffer (``flat_params``), each Parameter's
``data`` a view into it, and likewise for gradients (``flat_grads``). The optimizer, the
gradient-norm clipping and ``zero_grad`` then each touch one array instead of hundreds.

A frozen parameter (``Parameter.freeze``, ``Module.freeze``: LoRA's base weights) has no
gradient (``grad`` is None): ``flatten_parameters`` leaves it out of both buffers, so the
optimizer, the clipping and a data-parallel reduction never see it, and the modules' backward
passes skip its gradient (a frozen Linear weight costs no dW product).
"""
import contextlib
from collections import OrderedDict

import numpy as np

from ..aligned import zeros_aligned, empty_aligned
from .init import building_shapes, drawing_nothing, shapes_only


def config_of(config_class, args, kwargs):
    """The configuration a model was called with: ``Model(config)``, or the configuration's
    fields positionally and by name (``nf.GPT(65, d_model=64)``), whose defaults are the
    dataclass's alone."""
    if len(args) == 1 and not kwargs and isinstance(args[0], config_class):
        return args[0]
    if any(isinstance(a, config_class) for a in (*args, *kwargs.values())):
        raise ValueError(f"config: pass a {config_class.__name__} alone, or its fields, not both")
    return config_class(*args, **kwargs)


def model_config(config_class, args, kwargs):
    """:func:`config_of`'s configuration, a size this machine cannot hold refused now (unless
    only the shapes are being built)."""
    cfg = config_of(config_class, args, kwargs)
    if not building_shapes():
        cfg.check_memory()
    return cfg


class Parameter:
    """A trainable array and its gradient (same shape and dtype); ``grad`` is None once frozen."""

    __slots__ = ("data", "grad")

    def __init__(self, data):
        if drawing_nothing():             # a placeholder (nn.init.shapes_only, uninitialised):
            self.data = self.grad = data  # allocate nothing (flatten_parameters may, later)
            return
        self.data = np.ascontiguousarray(data)
        self.grad = np.zeros_like(self.data)

    @property
    def shape(self):
        return self.data.shape

    @property
    def frozen(self):
        """Whether the parameter is frozen: no gradient, left out of the training buffers."""
        return self.grad is None

    def freeze(self):
        """No gradient from now on (the model's buffers change at its next
        ``flatten_parameters``, which ``Module.freeze`` calls)."""
        self.grad = None

    def __repr__(self):
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype})"


class Module:
    """Base class: registers child modules and parameters in assignment order, like torch.nn."""

    def __init__(self):
        object.__setattr__(self, "_params", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "flat_params", None)
        object.__setattr__(self, "flat_grads", None)

    def __setattr__(self, name, value):
        if isinstance(value, Parameter):
            self._params[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    @classmethod
    def shapes_of(cls, config):
        """``{name: shape}`` of the parameters of ``cls(config)``, in ``named_parameters()``
        order, from a build that allocates and draws nothing (``nn.init.shapes_only``)."""
        with shapes_only():
            model = cls(config)
        return {name: tuple(p.data.shape) for name, p in model.named_parameters()}

    # -- traversal ---------------------------------------------------------------------------
    def named_parameters(self, prefix=""):
        """Yield (dotted name, Parameter), each parameter once (a tied one under its first name)."""
        seen = set()
        for name, p in self._named_parameters_all(prefix):
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def _named_parameters_all(self, prefix):
        for name, p in self._params.items():
            yield prefix + name, p
        for name, m in self._modules.items():
            yield from m._named_parameters_all(prefix + name + ".")

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def modules(self):
        yield self
        for m in self._modules.values():
            yield from m.modules()

    def num_parameters(self):
        return sum(p.data.size for p in self.parameters())

    def trainable_parameters(self):
        """(dotted name, Parameter) of the parameters that are not frozen."""
        return [(name, p) for name, p in self.named_parameters() if p.grad is not None]

    def freeze(self):
        """Freeze every parameter of this module and its children, and rebuild the flat
        buffers of what still trains (none: empty). Returns the module."""
        for p in self.parameters():
            p.freeze()
        return self.flatten_parameters()

    # -- modes and gradients -----------------------------------------------------------------
    def train(self, mode=True):
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self):
        return self.train(False)

    @contextlib.contextmanager
    def evaluating(self):
        """``with model.evaluating():`` eval mode inside (no dropout), the mode before restored
        after, even on an error."""
        was_training = self.training
        if was_training:
            self.eval()
        try:
            yield self
        finally:
            if was_training:
                self.train()

    def zero_grad(self):
        if self.flat_grads is not None:
            self.flat_grads.fill(0)
        else:
            for p in self.parameters():
                if p.grad is not None:
                    p.grad.fill(0)

    def flatten_parameters(self):
        """Move every parameter (and gradient) into one contiguous buffer; each becomes a view.
        Frozen parameters stay where they are (in the buffer of an earlier call: LoRA's base
        keeps its weights in place, and a new, small buffer holds the adapters)."""
        if building_shapes():
            return self
        every = self.parameters()
        params = [p for p in every if p.grad is not None]
        dtypes = {p.data.dtype for p in params} or {p.data.dtype for p in every}
        if len(dtypes) != 1:
            raise ValueError(f"flatten_parameters: expected one dtype for all parameters, got {dtypes}")
        total = sum(p.data.size for p in params)
        dtype = dtypes.pop()
        flat_params = empty_aligned(total, dtype)    # weights start on cache lines where their
        flat_grads = zeros_aligned(total, dtype)    # offsets allow: fast rows for the products
        copy = not drawing_nothing()                 # (uninitialised: the caller writes them)
        offset = 0
        for p in params:
            n = p.data.size
            if copy:
                flat_params[offset:offset + n] = p.data.reshape(-1)
            p.data = flat_params[offset:offset + n].reshape(p.data.shape)
            p.grad = flat_grads[offset:offset + n].reshape(p.data.shape)
            offset += n
        object.__setattr__(self, "flat_params", flat_params)
        object.__setattr__(self, "flat_grads", flat_grads)
        return self

    # -- state -------------------------------------------------------------------------------
    def state_dict(self):
        """{name: copy of the parameter array}, in registration order."""
        return OrderedDict((name, p.data.copy()) for name, p in self.named_parameters())

    def load_state_dict(self, state_dict):
        """Copy arrays into the parameters (in place, so flat buffers stay shared).

        Raises ValueError naming every missing, unexpected or mis-shaped entry.
        """
        own = OrderedDict(self.named_parameters())
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        wrong = []
        for k, p in own.items():
            if k in state_dict:
                shape = np.shape(state_dict[k])
                if tuple(shape) != p.data.shape:
                    wrong.append(f"{k}: expected shape {p.data.shape}, got {tuple(shape)}")
        if missing or unexpected or wrong:
            parts = []
            if missing:
                parts.append(f"missing entries {missing}")
            if unexpected:
                parts.append(f"unexpected entries {unexpected}")
            if wrong:
                parts.append("mis-shaped entries [" + "; ".join(wrong) + "]")
            raise ValueError("load_state_dict(state_dict): " + ", ".join(parts))
        for k, p in own.items():
            value = np.asarray(state_dict[k])
            if not np.issubdtype(value.dtype, np.number):
                raise ValueError(f"load_state_dict(state_dict): entry {k!r} expected a numeric "
                                 f"array, got dtype {value.dtype}")
            p.data[...] = value
        return self


class ModuleList(Module):
    """A list of modules named "0", "1", ... (as torch.nn.ModuleList)."""

    def __init__(self, modules):
        super().__init__()
        self._list = []
        for i, m in enumerate(modules):
            setattr(self, str(i), m)
            self._list.append(m)

    def __iter__(self):
        return iter(self._list)

    def __len__(self):
        return len(self._list)

    def __getitem__(self, i):
        return self._list[i]
