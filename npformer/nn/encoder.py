"""Encoder layer and encoder stack (names as torch.nn.TransformerEncoderLayer)."""
import numpy as np

from .attention import MultiHeadAttention
from ..dropout_rates import inner_dropout_rates
from .dropout import Dropout
from .feedforward import FeedForward
from .layernorm import LayerNorm
from .module import Module, ModuleList
from .residual import residual_backward, residual_forward


class SelfAttentionBlock(Module):
    """What a block of self-attention then feed-forward does with its parts, each wrapped in a
    residual connection: a subclass builds ``self_attn``, ``ffn``, ``norm1``, ``norm2``,
    ``dropout1``, ``dropout2`` and sets ``norm_first`` (``EncoderLayer`` from sizes, a
    decoder-only model's ``Block`` from its configuration), and may build ``post_norm1`` and
    ``post_norm2``: a norm of each sub-layer's output before its residual add (Gemma 2's).

    Shape: x (B, S, D), mask bool (B, 1, 1, S) -> (B, S, D).
    """

    post_norm1 = post_norm2 = None

    def _sublayers(self, x, self_attention):
        """The residual order, the same for forward and step."""
        x = residual_forward(x, then(self_attention, self.post_norm1), self.norm1, self.dropout1,
                             self.norm_first)
        return residual_forward(x, then(self.ffn.forward, self.post_norm2), self.norm2,
                                self.dropout2, self.norm_first)

    def forward(self, x, mask=None):
        return self._sublayers(x, lambda h: self.self_attn.forward(h, mask=mask))

    def new_cache(self, batch_size, capacity, dtype):
        """An empty cache of this block's self-attention keys and values, for ``step``."""
        return self.self_attn.new_cache(batch_size, capacity, dtype)

    def step(self, x, cache):
        """The newest positions x (R, t, D) -> (R, t, D) of a causal stack (a language model's
        blocks), in eval mode: their self-attention keys and values join ``cache``
        (``MultiHeadAttention.step``)."""
        return self._sublayers(x, lambda h: self.self_attn.step(h, cache))

    def backward(self, dy):
        dx = residual_backward(dy, first(self.post_norm2, self.ffn.backward), self.norm2,
                               self.dropout2, self.norm_first)
        return residual_backward(dx, first(self.post_norm1, self.self_attn.backward), self.norm1,
                                 self.dropout1, self.norm_first)


def then(sublayer, norm):
    """``sublayer`` followed by ``norm`` (a sub-layer's post-norm; None: ``sublayer`` itself)."""
    return sublayer if norm is None else lambda h: norm.forward(sublayer(h))


def first(norm, sublayer_backward):
    """The backward of :func:`then`: ``norm``'s backward, then the sub-layer's."""
    return sublayer_backward if norm is None else lambda d: sublayer_backward(norm.backward(d))


class EncoderLayer(SelfAttentionBlock):
    """Self-attention then feed-forward, each wrapped in a residual connection (as
    torch.nn.TransformerEncoderLayer).

    Shape: x (B, S, D), mask bool (B, 1, 1, S) -> (B, S, D).
    """

    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, activation="relu", norm_first=False,
                 layer_norm_eps=1e-5, qk_dim=None, attention_dropout=None, activation_dropout=None,
                 rotary=None, *, rng, dtype=np.float32):
        """``dropout``: on the sublayers' outputs; ``attention_dropout`` (on the attention
        weights) and ``activation_dropout`` (after the feed-forward activation) default to it.
        ``rotary``: the self-attention's rotary tables (``MultiHeadAttention``), or None."""
        super().__init__()
        self.norm_first = norm_first
        attention_dropout, activation_dropout = inner_dropout_rates(dropout, attention_dropout,
                                                                    activation_dropout)
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, qk_dim, rotary,
                                            rng=rng, dtype=dtype)
        self.ffn = FeedForward(d_model, d_ff, activation_dropout, activation, rng=rng, dtype=dtype)
        self.norm1 = LayerNorm(d_model, layer_norm_eps, dtype=dtype)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, dtype=dtype)
        self.dropout1 = Dropout(dropout, rng=rng)
        self.dropout2 = Dropout(dropout, rng=rng)


class Encoder(Module):
    """A stack of encoder layers followed by a final LayerNorm (as torch.nn.Transformer)."""

    def __init__(self, n_layers, d_model, layer_norm_eps=1e-5, *, rng, dtype=np.float32,
                 **layer_kwargs):
        """``layer_kwargs`` (n_heads, d_ff, dropout, attention_dropout,
        activation_dropout, activation, norm_first, qk_dim, rotary) go to each layer."""
        super().__init__()
        self.layers = ModuleList([
            EncoderLayer(d_model, layer_norm_eps=layer_norm_eps, rng=rng, dtype=dtype,
                         **layer_kwargs) for _ in range(n_layers)])
        self.norm = LayerNorm(d_model, layer_norm_eps, dtype=dtype)

    def forward(self, x, mask=None):
        for layer in self.layers:
            x = layer.forward(x, mask)
        return self.norm.forward(x)

    def step(self, x, caches):
        """The newest positions through every layer of a causal stack (one cache per layer)."""
        for layer, cache in zip(self.layers, caches):
            x = layer.step(x, cache)
        return self.norm.forward(x)

    def backward(self, dy):
        dx = self.norm.backward(dy)
        for layer in reversed(self.layers):
            dx = layer.backward(dx)
        return dx
