"""The encoder-decoder Transformer of "Attention Is All You Need", laid out as torch.nn.Transformer
plus source/target embeddings and a generator (the output projection to the target vocabulary).
"""
import dataclasses
import math

import numpy as np

from .. import functional as F
from ..configs import TransformerConfig
from ..validation import check_array, check_same_batch, check_token_ids
from .decoder import Decoder
from .dropout import Dropout
from .embedding import Embedding
from .encoder import Encoder
from .linear import Linear
from .module import Module


class Transformer(Module):
    """Sequence-to-sequence Transformer with hand-written backward.

    forward(src, tgt_in) -> logits; backward(dlogits) fills every ``Parameter.grad``.

    Shape:
        src (B, S) int, tgt_in (B, T) int -> logits (B, T, tgt_vocab_size).

    Masks are derived from ``pad_id``: encoder self-attention and cross-attention ignore padded
    source keys; decoder self-attention is causal and ignores padded target keys.

    Parameters are named as in the reference PyTorch module (``npformer.interop``):
    src_embed, tgt_embed, encoder.layers.N.{self_attn, ffn.linear1, ffn.linear2, norm1, norm2},
    encoder.norm, decoder.layers.N.{self_attn, multihead_attn, ffn.*, norm1..3}, decoder.norm,
    generator.
    """

    def __init__(self, src_vocab_size, tgt_vocab_size, d_model=512, n_heads=8, d_ff=2048,
                 n_encoder_layers=6, n_decoder_layers=6, dropout=0.1, max_len=256, pad_id=0,
                 norm_first=False, activation="relu", layer_norm_eps=1e-5, qk_dim=None,
                 tie_embeddings=False, dtype=np.float32, seed=0):
        super().__init__()
        # every value is checked here (ValueError naming the argument); ``config`` is what
        # checkpoints store and ``from_config`` / ``nf.build_model`` build from
        self.config = cfg = TransformerConfig(
            src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, d_model=d_model,
            n_heads=n_heads, d_ff=d_ff, n_encoder_layers=n_encoder_layers,
            n_decoder_layers=n_decoder_layers, dropout=dropout, max_len=max_len, pad_id=pad_id,
            norm_first=norm_first, activation=activation, layer_norm_eps=layer_norm_eps,
            qk_dim=qk_dim, tie_embeddings=tie_embeddings, dtype=dtype, seed=seed)
        dtype = np.dtype(cfg.dtype)
        self.dtype, self.pad_id, self.max_len, self.d_model = dtype, cfg.pad_id, cfg.max_len, cfg.d_model
        # one rng: it draws the initial weights, then every dropout mask
        # (checkpoints save its state, so a resumed run draws the same masks)
        self.rng = init_rng = np.random.default_rng(cfg.seed)

        d_model = cfg.d_model
        scale = math.sqrt(d_model)
        self.src_embed = Embedding(cfg.src_vocab_size, d_model, cfg.pad_id, scale, rng=init_rng,
                                   dtype=dtype)
        self.tgt_embed = Embedding(cfg.tgt_vocab_size, d_model, cfg.pad_id, scale, rng=init_rng,
                                   dtype=dtype)
        self.src_dropout = Dropout(cfg.dropout, rng=self.rng)
        self.tgt_dropout = Dropout(cfg.dropout, rng=self.rng)
        layer_kwargs = dict(n_heads=cfg.n_heads, d_ff=cfg.d_ff, dropout=cfg.dropout,
                            activation=cfg.activation, norm_first=cfg.norm_first, qk_dim=cfg.qk_dim)
        self.encoder = Encoder(cfg.n_encoder_layers, d_model, cfg.layer_norm_eps, rng=init_rng,
                               dtype=dtype, **layer_kwargs)
        self.decoder = Decoder(cfg.n_decoder_layers, d_model, cfg.layer_norm_eps, rng=init_rng,
                               dtype=dtype, **layer_kwargs)
        self.generator = Linear(d_model, cfg.tgt_vocab_size, rng=init_rng, dtype=dtype)
        if cfg.tie_embeddings:
            self.generator.weight = self.tgt_embed.weight      # one Parameter, two users
        self.positions = F.sinusoidal_positions(cfg.max_len, d_model, dtype)   # (max_len, D)
        self.flatten_parameters()
        self._logits_shape = None
        self._backward_done = False

    @classmethod
    def from_config(cls, config):
        """A new model of a :class:`~npformer.configs.TransformerConfig`."""
        if not isinstance(config, TransformerConfig):
            raise ValueError(f"config: expected a TransformerConfig, got {type(config).__name__}")
        return cls(**dataclasses.asdict(config))

    # -- pieces usable on their own (decoding uses them) --------------------------------------
    def embed(self, embedding, dropout, ids):
        """scale * E[ids] + PE[:T], then dropout. (B, T) -> (B, T, D)."""
        x = embedding.forward(ids)
        x += self.positions[:ids.shape[1]]
        return dropout.forward(x)

    def encode(self, src):
        """src (B, S) -> memory (B, S, D), src_mask (B, 1, 1, S)."""
        return self._encode(check_token_ids("src", src, self.config.src_vocab_size, self.max_len))

    def _encode(self, src):
        src_mask = F.padding_mask(src, self.pad_id)
        x = self.embed(self.src_embed, self.src_dropout, src)
        return self.encoder.forward(x, src_mask), src_mask

    def decode(self, tgt_in, memory, src_mask):
        """tgt_in (B, T), memory (B, S, D), src_mask (B, 1, 1, S) -> logits (B, T, V_tgt)."""
        tgt_in = check_token_ids("tgt_in", tgt_in, self.config.tgt_vocab_size, self.max_len)
        check_array("memory", memory, (tgt_in.shape[0], None, self.d_model))
        check_array("src_mask", src_mask, (tgt_in.shape[0], 1, 1, memory.shape[1]), bool)
        return self._decode(tgt_in, memory, src_mask)

    def _decode(self, tgt_in, memory, src_mask):
        tgt_mask = F.decoder_self_mask(tgt_in, self.pad_id)
        y = self.embed(self.tgt_embed, self.tgt_dropout, tgt_in)
        h = self.decoder.forward(y, memory, tgt_mask, src_mask)
        logits = self.generator.forward(h)                      # (B, T, V_tgt)
        self._logits_shape = logits.shape
        self._backward_done = False      # these activations may now serve one backward
        return logits

    # -- training ----------------------------------------------------------------------------
    def forward(self, src, tgt_in):
        """src (B, S), tgt_in (B, T) int -> logits (B, T, V_tgt). Keeps caches for backward."""
        src = check_token_ids("src", src, self.config.src_vocab_size, self.max_len)
        tgt_in = check_token_ids("tgt_in", tgt_in, self.config.tgt_vocab_size, self.max_len)
        check_same_batch("src", src, "tgt_in", tgt_in)
        memory, src_mask = self._encode(src)
        return self._decode(tgt_in, memory, src_mask)

    def __call__(self, src, tgt_in):
        return self.forward(src, tgt_in)

    def backward(self, dlogits):
        """Accumulate d(loss)/d(parameter) into every ``.grad`` given dlogits (B, T, V_tgt).

        One backward per forward: the activations a forward keeps are used up by it.
        """
        if getattr(self, "_logits_shape", None) is None:
            raise ValueError("backward: call forward first (there are no saved activations)")
        if self._backward_done:
            raise ValueError("backward: already called since the last forward; each forward's "
                             "activations serve one backward (a second one would add the same "
                             "gradients again), so call forward again")
        check_array("dlogits", dlogits, self._logits_shape)
        self._backward_done = True
        dh = self.generator.backward(dlogits)                  # (B, T, D)
        dy, dmemory = self.decoder.backward(dh)                # (B, T, D), (B, S, D)
        self.tgt_embed.backward(self.tgt_dropout.backward(dy))
        dx = self.encoder.backward(dmemory)
        self.src_embed.backward(self.src_dropout.backward(dx))
