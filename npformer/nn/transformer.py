"""The encoder-decoder Transformer of "Attention Is All You Need", laid out as torch.nn.Transformer
plus source/target embeddings and a generator (the output projection to the target vocabulary).
"""
import math

import numpy as np

from .. import functional as F
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
        for name, value in [("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size),
                            ("d_model", d_model), ("n_heads", n_heads), ("d_ff", d_ff),
                            ("max_len", max_len)]:
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model: expected a multiple of n_heads={n_heads}, got {d_model}")
        if not 0 <= pad_id < min(src_vocab_size, tgt_vocab_size):
            raise ValueError(f"pad_id: expected an id in [0, {min(src_vocab_size, tgt_vocab_size)}),"
                             f" got {pad_id}")
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype: expected float32 or float64, got {dtype}")
        self.config = dict(
            src_vocab_size=int(src_vocab_size), tgt_vocab_size=int(tgt_vocab_size),
            d_model=int(d_model), n_heads=int(n_heads), d_ff=int(d_ff),
            n_encoder_layers=int(n_encoder_layers), n_decoder_layers=int(n_decoder_layers),
            dropout=float(dropout), max_len=int(max_len), pad_id=int(pad_id),
            norm_first=bool(norm_first), activation=activation, layer_norm_eps=float(layer_norm_eps),
            qk_dim=None if qk_dim is None else int(qk_dim), tie_embeddings=bool(tie_embeddings),
            dtype=dtype.name, seed=int(seed))
        self.dtype, self.pad_id, self.max_len, self.d_model = dtype, pad_id, max_len, d_model
        # one generator: it draws the initial weights, then every dropout mask (checkpoints save
        # its state, so a resumed run draws the same masks)
        self.rng = init_rng = np.random.default_rng(seed)

        scale = math.sqrt(d_model)
        self.src_embed = Embedding(src_vocab_size, d_model, pad_id, scale, rng=init_rng, dtype=dtype)
        self.tgt_embed = Embedding(tgt_vocab_size, d_model, pad_id, scale, rng=init_rng, dtype=dtype)
        self.src_dropout = Dropout(dropout, rng=self.rng)
        self.tgt_dropout = Dropout(dropout, rng=self.rng)
        layer_kwargs = dict(n_heads=n_heads, d_ff=d_ff, dropout=dropout, activation=activation,
                            norm_first=norm_first, qk_dim=qk_dim)
        self.encoder = Encoder(n_encoder_layers, d_model, layer_norm_eps, rng=init_rng, dtype=dtype,
                               **layer_kwargs)
        self.decoder = Decoder(n_decoder_layers, d_model, layer_norm_eps, rng=init_rng, dtype=dtype,
                               **layer_kwargs)
        self.generator = Linear(d_model, tgt_vocab_size, rng=init_rng, dtype=dtype)
        if tie_embeddings:
            self.generator.weight = self.tgt_embed.weight      # one Parameter, two users
        self.positions = F.sinusoidal_positions(max_len, d_model, dtype)   # (max_len, D)
        self.flatten_parameters()
        self._logits_shape = None

    # -- pieces usable on their own (decoding uses them) --------------------------------------
    def embed(self, embedding, dropout, ids, offset=0):
        """scale * E[ids] + PE[offset:offset+T], then dropout. (B, T) -> (B, T, D)."""
        x = embedding.forward(ids)
        x += self.positions[offset:offset + ids.shape[1]]
        return dropout.forward(x)

    def encode(self, src):
        """src (B, S) -> memory (B, S, D), src_mask (B, 1, 1, S)."""
        return self._encode(check_token_ids("src", src, self.config["src_vocab_size"], self.max_len))

    def _encode(self, src):
        src_mask = F.padding_mask(src, self.pad_id)
        x = self.embed(self.src_embed, self.src_dropout, src)
        return self.encoder.forward(x, src_mask), src_mask

    def decode(self, tgt_in, memory, src_mask):
        """tgt_in (B, T), memory (B, S, D), src_mask (B, 1, 1, S) -> logits (B, T, V_tgt)."""
        tgt_in = check_token_ids("tgt_in", tgt_in, self.config["tgt_vocab_size"], self.max_len)
        check_array("memory", memory, (tgt_in.shape[0], None, self.d_model))
        check_array("src_mask", src_mask, (tgt_in.shape[0], 1, 1, memory.shape[1]), bool)
        return self._decode(tgt_in, memory, src_mask)

    def _decode(self, tgt_in, memory, src_mask):
        tgt_mask = F.decoder_self_mask(tgt_in, self.pad_id)
        y = self.embed(self.tgt_embed, self.tgt_dropout, tgt_in)
        h = self.decoder.forward(y, memory, tgt_mask, src_mask)
        logits = self.generator.forward(h)                      # (B, T, V_tgt)
        self._logits_shape = logits.shape
        return logits

    # -- training ----------------------------------------------------------------------------
    def forward(self, src, tgt_in):
        """src (B, S), tgt_in (B, T) int -> logits (B, T, V_tgt). Keeps caches for backward."""
        src = check_token_ids("src", src, self.config["src_vocab_size"], self.max_len)
        tgt_in = check_token_ids("tgt_in", tgt_in, self.config["tgt_vocab_size"], self.max_len)
        check_same_batch("src", src, "tgt_in", tgt_in)
        memory, src_mask = self._encode(src)
        return self._decode(tgt_in, memory, src_mask)

    def __call__(self, src, tgt_in):
        return self.forward(src, tgt_in)

    def backward(self, dlogits):
        """Accumulate d(loss)/d(parameter) into every ``.grad`` given dlogits (B, T, V_tgt)."""
        if getattr(self, "_logits_shape", None) is None:
            raise ValueError("backward: call forward first (there are no saved activations)")
        check_array("dlogits", dlogits, self._logits_shape)
        dh = self.generator.backward(dlogits)                  # (B, T, D)
        dy, dmemory = self.decoder.backward(dh)                # (B, T, D), (B, S, D)
        self.tgt_embed.backward(self.tgt_dropout.backward(dy))
        dx = self.encoder.backward(dmemory)
        self.src_embed.backward(self.src_dropout.backward(dx))
