"""Decoder layer and decoder stack (names as torch.nn.TransformerDecoderLayer)."""
import numpy as np

from .attention import MultiHeadAttention
from ..dropout_rates import inner_dropout_rates
from .dropout import Dropout
from .feedforward import FeedForward
from .layernorm import LayerNorm
from .module import Module, ModuleList
from .residual import residual_backward, residual_forward


class DecoderLayer(Module):
    """Masked self-attention, cross-attention over the encoder memory, feed-forward; each in a
    residual connection.

    Shape: x (B, T, D), memory (B, S, D), self_mask (B, 1, T, T), cross_mask (B, 1, 1, S)
    -> (B, T, D).
    """

    def __init__(self, d_model, n_heads, d_ff, dropout=0.1, activation="relu", norm_first=False,
                 layer_norm_eps=1e-5, qk_dim=None, attention_dropout=None, activation_dropout=None,
                 *, rng, dtype=np.float32):
        """``dropout``: on the sublayers' outputs; ``attention_dropout`` (on the attention
        weights) and ``activation_dropout`` (after the feed-forward activation) default to it."""
        super().__init__()
        self.norm_first = norm_first
        attention_dropout, activation_dropout = inner_dropout_rates(dropout, attention_dropout,
                                                                    activation_dropout)
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, qk_dim, rng=rng,
                                            dtype=dtype)
        self.multihead_attn = MultiHeadAttention(d_model, n_heads, attention_dropout, qk_dim,
                                                 rng=rng, dtype=dtype)
        self.ffn = FeedForward(d_model, d_ff, activation_dropout, activation, rng=rng, dtype=dtype)
        self.norm1 = LayerNorm(d_model, layer_norm_eps, dtype=dtype)
        self.norm2 = LayerNorm(d_model, layer_norm_eps, dtype=dtype)
        self.norm3 = LayerNorm(d_model, layer_norm_eps, dtype=dtype)
        self.dropout1 = Dropout(dropout, rng=rng)
        self.dropout2 = Dropout(dropout, rng=rng)
        self.dropout3 = Dropout(dropout, rng=rng)
        self._dmemory = None

    def _sublayers(self, x, self_attention, cross_attention):
        """The residual order, the same for forward and step."""
        x = residual_forward(x, self_attention, self.norm1, self.dropout1, self.norm_first)
        x = residual_forward(x, cross_attention, self.norm2, self.dropout2, self.norm_first)
        return residual_forward(x, self.ffn.forward, self.norm3, self.dropout3, self.norm_first)

    def forward(self, x, memory, self_mask=None, cross_mask=None):
        return self._sublayers(x, lambda h: self.self_attn.forward(h, mask=self_mask),
                               lambda h: self.multihead_attn.forward(h, memory, cross_mask))

    def step(self, x, self_cache, memory_cache, cross_mask=None):
        """The newest position x (R, 1, D) -> (R, 1, D) in eval mode: its self-attention key and
        value join ``self_cache``; cross-attention reads ``memory_cache`` (one row per source,
        an equal group of rows of x each; ``cross_mask`` (sources, 1, 1, S))."""
        return self._sublayers(x, lambda h: self.self_attn.step(h, self_cache),
                               lambda h: self.multihead_attn.cross_step(h, memory_cache,
                                                                        cross_mask))

    def _cross_backward(self, dout):
        dx, self._dmemory = self.multihead_attn.backward(dout)
        return dx

    def backward(self, dy):
        """Returns (dx, dmemory)."""
        dx = residual_backward(dy, self.ffn.backward, self.norm3, self.dropout3, self.norm_first)
        dx = residual_backward(dx, self._cross_backward, self.norm2, self.dropout2, self.norm_first)
        dx = residual_backward(dx, self.self_attn.backward, self.norm1, self.dropout1,
                               self.norm_first)
        return dx, self._dmemory


class Decoder(Module):
    """A stack of decoder layers followed by a final LayerNorm (as torch.nn.Transformer)."""

    def __init__(self, n_layers, d_model, layer_norm_eps=1e-5, *, rng, dtype=np.float32,
                 **layer_kwargs):
        """``layer_kwargs`` (n_heads, d_ff, dropout, attention_dropout,
        activation_dropout, activation, norm_first, qk_dim) go to each layer."""
        super().__init__()
        self.layers = ModuleList([
            DecoderLayer(d_model, layer_norm_eps=layer_norm_eps, rng=rng, dtype=dtype,
                         **layer_kwargs) for _ in range(n_layers)])
        self.norm = LayerNorm(d_model, layer_norm_eps, dtype=dtype)

    def forward(self, x, memory, self_mask=None, cross_mask=None):
        for layer in self.layers:
            x = layer.forward(x, memory, self_mask, cross_mask)
        return self.norm.forward(x)

    def step(self, x, self_caches, memory_caches, cross_mask=None):
        """The newest position through every layer (one cache of each kind per layer)."""
        for layer, self_cache, memory_cache in zip(self.layers, self_caches, memory_caches):
            x = layer.step(x, self_cache, memory_cache, cross_mask)
        return self.norm.forward(x)

    def backward(self, dy):
        """Returns (dx, dmemory); the memory feeds every layer, so its gradients add up."""
        dx = self.norm.backward(dy)
        dmemory = 0.0
        for layer in reversed(self.layers):
            dx, dmem = layer.backward(dx)
            dmemory = dmemory + dmem
        return dx, dmemory
