"""The encoder-decoder Transformer of "Attention Is All You Need", laid out as torch.nn.Transformer
plus source/target embeddings and a generator (the output projection to the target vocabulary).
"""
import inspect
import math

import numpy as np

from .. import functional as F
from ..functional.activation_dropout import check_activation
from ..validation import check_array, check_int, check_real, check_same_batch, check_token_ids
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
        self.config = _checked_config(
            src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, d_model=d_model,
            n_heads=n_heads, d_ff=d_ff, n_encoder_layers=n_encoder_layers,
            n_decoder_layers=n_decoder_layers, dropout=dropout, max_len=max_len, pad_id=pad_id,
            norm_first=norm_first, activation=activation, layer_norm_eps=layer_norm_eps,
            qk_dim=qk_dim, tie_embeddings=tie_embeddings, dtype=dtype, seed=seed)
        dtype = np.dtype(dtype)
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
        self._backward_done = False

    @staticmethod
    def parameter_shapes(**config):
        """``{name: shape}`` of the parameters ``Transformer(**config)`` would have, in the order
        of ``named_parameters()``, computed without allocating anything.

        A checkpoint loader compares these with the stored arrays before building a model, so
        a config claiming huge sizes is refused instead of exhausting memory. Raises TypeError
        for unknown or missing arguments and ValueError for bad values, as the constructor does.
        """
        cfg = check_config(**config)
        d, ff, qk = cfg["d_model"], cfg["d_ff"], cfg["qk_dim"] or cfg["d_model"]

        def linear(prefix, n_in, n_out):
            return {f"{prefix}.weight": (n_out, n_in), f"{prefix}.bias": (n_out,)}

        def attention(prefix):
            return {f"{prefix}.in_proj_weight": (2 * qk + d, d), f"{prefix}.in_proj_bias": (2 * qk + d,),
                    **linear(f"{prefix}.out_proj", d, d)}

        def norm(prefix):
            return {f"{prefix}.weight": (d,), f"{prefix}.bias": (d,)}

        def ffn(prefix):
            return {**linear(f"{prefix}.linear1", d, ff), **linear(f"{prefix}.linear2", ff, d)}

        shapes = {"src_embed.weight": (cfg["src_vocab_size"], d),
                  "tgt_embed.weight": (cfg["tgt_vocab_size"], d)}
        for i in range(cfg["n_encoder_layers"]):
            layer = f"encoder.layers.{i}"
            shapes.update({**attention(f"{layer}.self_attn"), **ffn(f"{layer}.ffn"),
                           **norm(f"{layer}.norm1"), **norm(f"{layer}.norm2")})
        shapes.update(norm("encoder.norm"))
        for i in range(cfg["n_decoder_layers"]):
            layer = f"decoder.layers.{i}"
            shapes.update({**attention(f"{layer}.self_attn"), **attention(f"{layer}.multihead_attn"),
                           **ffn(f"{layer}.ffn"), **norm(f"{layer}.norm1"), **norm(f"{layer}.norm2"),
                           **norm(f"{layer}.norm3")})
        shapes.update(norm("decoder.norm"))
        shapes.update(linear("generator", d, cfg["tgt_vocab_size"]))
        if cfg["tie_embeddings"]:
            del shapes["generator.weight"]      # the same Parameter as tgt_embed.weight
        return shapes

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
        self._backward_done = False      # these activations may now serve one backward
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


def check_config(**config):
    """Validate the arguments of ``Transformer(**config)`` without building (or allocating)
    anything; return the full configuration, defaults filled in, as ``Transformer.config``
    would hold it. TypeError for unknown or missing arguments, ValueError for bad values."""
    bound = inspect.signature(Transformer).bind(**config)
    bound.apply_defaults()
    return _checked_config(**bound.arguments)


def _checked_config(*, src_vocab_size, tgt_vocab_size, d_model, n_heads, d_ff, n_encoder_layers,
                 n_decoder_layers, dropout, max_len, pad_id, norm_first, activation,
                 layer_norm_eps, qk_dim, tie_embeddings, dtype, seed):
    """Validate every argument of the constructor; return them as the plain dict stored in
    ``Transformer.config`` (and in checkpoints). ValueError names the first bad argument, what
    was expected and what came."""
    sizes = dict(src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size, d_model=d_model,
                 n_heads=n_heads, d_ff=d_ff, n_encoder_layers=n_encoder_layers,
                 n_decoder_layers=n_decoder_layers, max_len=max_len)
    if qk_dim is not None:
        sizes["qk_dim"] = qk_dim
    sizes = {name: check_int(name, value) for name, value in sizes.items()}
    d_model, n_heads = sizes["d_model"], sizes["n_heads"]
    if d_model % n_heads:
        raise ValueError(f"d_model: expected a multiple of n_heads={n_heads}, got {d_model}")
    if qk_dim is not None and sizes["qk_dim"] % n_heads:
        raise ValueError(f"n_heads: expected a divisor of d_model={d_model} and qk_dim={qk_dim}, "
                         f"got {n_heads}")
    n_ids = min(sizes["src_vocab_size"], sizes["tgt_vocab_size"])
    pad_id = check_int("pad_id", pad_id, minimum=0)
    if pad_id >= n_ids:
        raise ValueError(f"pad_id: expected an id in [0, {n_ids}), got {pad_id!r}")
    dropout = check_real("dropout", dropout, minimum=0, maximum=1, max_open=True)
    layer_norm_eps = check_real("layer_norm_eps", layer_norm_eps, minimum=0, min_open=True)
    if not isinstance(activation, str):
        raise ValueError(f"activation: expected a str such as 'relu', got {activation!r}")
    check_activation(activation)
    for name, flag in (("norm_first", norm_first), ("tie_embeddings", tie_embeddings)):
        if not isinstance(flag, (bool, np.bool_)):
            raise ValueError(f"{name}: expected True or False, got {flag!r}")
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise ValueError(f"dtype: expected float32 or float64, got {dtype!r}") from None
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype: expected float32 or float64, got {dtype}")
    seed = check_int("seed", seed, minimum=0)
    return dict(
        src_vocab_size=sizes["src_vocab_size"], tgt_vocab_size=sizes["tgt_vocab_size"],
        d_model=d_model, n_heads=n_heads, d_ff=sizes["d_ff"],
        n_encoder_layers=sizes["n_encoder_layers"], n_decoder_layers=sizes["n_decoder_layers"],
        dropout=dropout, max_len=sizes["max_len"], pad_id=pad_id,
        norm_first=bool(norm_first), activation=activation, layer_norm_eps=layer_norm_eps,
        qk_dim=sizes.get("qk_dim"), tie_embeddings=bool(tie_embeddings), dtype=dtype.name,
        seed=seed)
