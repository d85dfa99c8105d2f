"""The encoder-decoder Transformer of "Attention Is All You Need", laid out as torch.nn.Transformer
plus source/target embeddings and a generator (the output projection to the target vocabulary).
"""
import math

import numpy as np

from .. import functional as F
from .. import runtime
from ..backend import ops
from ..configs import TransformerConfig
from ..validation import check_array, check_int, check_same_batch, check_token_ids
from .decoder import Decoder
from .dropout import Dropout
from .embedding import Embedding
from .encoder import Encoder
from .init import table
from .linear import Linear
from .module import Module, model_config
from .state import CachedState


class Transformer(Module):
    """Sequence-to-sequence Transformer with hand-written backward.

    forward(src, tgt_in) -> logits; backward(dlogits) fills every ``Parameter.grad``.

    Shape:
        src (B, S) int, tgt_in (B, T) int -> logits (B, T, tgt_vocab_size);
        with ``logits_mask`` (B, T) bool -> logits (N, tgt_vocab_size), N = logits_mask.sum().

    Masks are derived from ``pad_id``: encoder self-attention and cross-attention ignore padded
    source keys; decoder self-attention is causal and ignores padded target keys.

    Parameters are named as in the reference PyTorch module (``npformer.interop``):
    src_embed, tgt_embed, encoder.layers.N.{self_attn, ffn.linear1, ffn.linear2, norm1, norm2},
    encoder.norm, decoder.layers.N.{self_attn, multihead_attn, ffn.*, norm1..3}, decoder.norm,
    generator.
    """

    def __init__(self, *args, **kwargs):
        super().__init__()
        # ``Transformer(config)`` or the fields of TransformerConfig (``Transformer(7, 6,
        # d_model=64)``), every value checked there (ValueError naming it); ``config`` is what
        # checkpoints store and ``nf.build_model`` builds from
        self.config = cfg = model_config(TransformerConfig, args, kwargs)
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
                            attention_dropout=cfg.attention_dropout,
                            activation_dropout=cfg.activation_dropout, activation=cfg.activation,
                            norm_first=cfg.norm_first, qk_dim=cfg.qk_dim)
        self.encoder = Encoder(cfg.n_encoder_layers, d_model, cfg.layer_norm_eps, rng=init_rng,
                               dtype=dtype, **layer_kwargs)
        self.decoder = Decoder(cfg.n_decoder_layers, d_model, cfg.layer_norm_eps, rng=init_rng,
                               dtype=dtype, **layer_kwargs)
        self.generator = Linear(d_model, cfg.tgt_vocab_size, bias=cfg.generator_bias,
                                rng=init_rng, dtype=dtype)
        if cfg.share_all_embeddings:
            self.tgt_embed.weight = self.src_embed.weight      # one Parameter, three users
        if cfg.tie_embeddings:
            self.generator.weight = self.tgt_embed.weight      # one Parameter, two users
        self.positions = table(lambda: F.sinusoidal_positions(cfg.max_len, d_model, dtype),
                               (cfg.max_len, d_model), dtype)                   # (max_len, D)
        self.flatten_parameters()
        self._logits_shape = self._logits_mask = None
        self._backward_done = False

    @classmethod
    def from_config(cls, config):
        """A new model of a :class:`~npformer.configs.TransformerConfig` (as ``Transformer(config)``)."""
        if not isinstance(config, TransformerConfig):
            raise ValueError(f"config: expected a TransformerConfig, got {type(config).__name__}")
        return cls(config)

    # -- pieces usable on their own (decoding uses them) --------------------------------------
    def embed(self, embedding, dropout, ids, start=0):
        """scale * E[ids] + PE[start:start + T], then dropout. (B, T) -> (B, T, D)."""
        x = embedding.forward(ids)
        x += F.position_rows(self.positions, start, ids.shape[1])
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

    def _decode(self, tgt_in, memory, src_mask, logits_mask=None):
        tgt_mask = F.decoder_self_mask(tgt_in, self.pad_id)
        y = self.embed(self.tgt_embed, self.tgt_dropout, tgt_in)
        h = self.decoder.forward(y, memory, tgt_mask, src_mask)     # (B, T, D)
        self._logits_mask = logits_mask
        if logits_mask is not None:
            h = h[logits_mask]                                      # (N, D): the rows scored
        logits = self.generator.forward(h)                          # (B, T, V_tgt) or (N, V_tgt)
        self._logits_shape = logits.shape
        self._backward_done = False      # these activations may now serve one backward
        return logits

    def decoder_state(self, src, bos_id, eos_id, beams=1, capacity=None, exact=None):
        """A ``TranslationState`` of the sources ``src`` (B, S): what ``npformer.decoding``'s
        searches run over. ``bos_id``/``eos_id`` come from the target vocabulary; ``exact``:
        see ``TranslationState``."""
        return TranslationState(self, src, bos_id, eos_id, beams, capacity, exact)

    # -- training ----------------------------------------------------------------------------
    def forward(self, src, tgt_in, logits_mask=None):
        """src (B, S), tgt_in (B, T) int -> logits (B, T, V_tgt). Keeps caches for backward.

        ``logits_mask`` (B, T) bool: compute the logits of those positions only, returned as
        (N, V_tgt) in row-major order (``logits_mask.sum()`` rows), and ``backward`` then takes
        dlogits of that shape. A training loss that ignores padded targets passes
        ``tgt_out != pad_id``: the generator (the largest product of a small model) and the loss
        skip the padding. The gradients are those of the full logits with the other positions
        ignored (their dlogits rows are zero, so they add nothing); the bits may differ, since
        the products' shapes do."""
        src = check_token_ids("src", src, self.config.src_vocab_size, self.max_len)
        tgt_in = check_token_ids("tgt_in", tgt_in, self.config.tgt_vocab_size, self.max_len)
        check_same_batch("src", src, "tgt_in", tgt_in)
        if logits_mask is not None:
            logits_mask = check_array("logits_mask", logits_mask, tgt_in.shape, bool)
        memory, src_mask = self._encode(src)
        return self._decode(tgt_in, memory, src_mask, logits_mask)

    def __call__(self, src, tgt_in, logits_mask=None):
        return self.forward(src, tgt_in, logits_mask)

    def backward(self, dlogits):
        """Accumulate d(loss)/d(parameter) into every ``.grad`` given dlogits (B, T, V_tgt), or
        (N, V_tgt) after a forward with ``logits_mask``.

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
        dh = self.generator.backward(dlogits)                  # (B, T, D) or (N, D)
        if self._logits_mask is not None:
            # positions without logits do not reach the loss: their dh is zero
            scattered = np.zeros(self._logits_mask.shape + dh.shape[-1:], dtype=dh.dtype)
            scattered[self._logits_mask] = dh
            dh = scattered
        dy, dmemory = self.decoder.backward(dh)                # (B, T, D), (B, S, D)
        self.tgt_embed.backward(self.tgt_dropout.backward(dy))
        dx = self.encoder.backward(dmemory)
        self.src_embed.backward(self.src_dropout.backward(dx))


class TranslationState(CachedState):
    """A batch of sources being translated one position at a time: the decoder state that
    ``npformer.decoding``'s searches (greedy, sampling, beam) run over.

        state = model.decoder_state(src, bos_id=1, eos_id=2, beams=4)   # encodes src
        logp = state.step(tokens)          # (R,) previous tokens -> (R, V) log-probabilities
        state.reorder(rows)                # keep / repeat rows, in place

    Why a cache: training runs the decoder over the whole target at once; generating, only the
    prefix is known, so the decoder runs one position at a time. Re-running it on the growing
    prefix would repeat the same work at every step (quadratic in the length); instead every
    layer keeps the keys and values of the positions decoded so far, and a step costs one
    position's projections plus attention over the cache. T steps give what one forward over
    the T positions gives (tests/test_incremental.py).

    The encoder runs once per source, sources of one length together at their own width (no
    padding in its products). Each decoder layer's cross-attention keys and values are
    computed once per source and shared by the source's ``beams`` rows (consecutive: rows
    ``i * beams ... (i + 1) * beams - 1`` belong to source i); its self-attention keys and values
    fill a preallocated cache of ``capacity`` positions (default: ``min(max_len, 2 * S + 10)``).
    Every step runs the model's own layers (``DecoderLayer.step``) in eval mode, on the active
    backend.

    ``exact``: how greedy and beam search read a step's best tokens. True: ``step_top``, the
    backend's ``top_log_softmax``, the reference's float64 log-probabilities bit for bit (a
    float64 exp of every vocabulary entry at every step). False: ``step_top_bounded``, the
    Numba backend's ``top_log_softmax_bounded`` (float32 exp for the entries far below a row's
    maximum), whose log-probabilities are the reference's within a proven bound; the searches
    check every decision against the bounds and redo a batch exactly where one is not certain,
    so the tokens are the reference's either way, and only the reported probabilities and
    scores may differ from it, within the bound. None (default): False where the backend has
    ``top_log_softmax_bounded`` (Numba: the tokens cost less and stay the same), else True
    (NumPy: the reference itself).
    """

    def __init__(self, model, src, bos_id, eos_id, beams=1, capacity=None, exact=None):
        src = check_token_ids("src", src, model.config.src_vocab_size, model.max_len)
        vocab = model.config.tgt_vocab_size
        self.bos_id = _check_id("bos_id", bos_id, vocab)
        self.eos_id = None if eos_id is None else _check_id("eos_id", eos_id, vocab)
        self.beams = check_int("beams", beams)
        if self.beams > vocab:           # more beams than tokens buys nothing but memory
            raise ValueError(f"beams: expected at most the target vocabulary size {vocab}, got "
                             f"{self.beams}")
        if capacity is None:
            capacity = default_capacity(model.max_len, src.shape[1])
        capacity = check_int("capacity", capacity)
        if capacity > model.max_len:
            raise ValueError(f"capacity: expected at most the model's max_len={model.max_len} "
                             f"positions, got {capacity}")
        has_bounded = hasattr(ops(), "top_log_softmax_bounded")
        if exact is None:
            exact = not has_bounded
        if exact not in (True, False) or (not exact and not has_bounded):
            raise ValueError(f"exact: expected True, False (on a backend with "
                             f"top_log_softmax_bounded: numba) or None, got {exact!r}")
        self.exact = bool(exact)
        self.exact_rows = 0              # rows the fast path could not rank, taken exactly
        self._sources = (src, bos_id, eos_id, self.beams, capacity)   # for exact_twin
        self.model = model
        model._logits_shape = None       # its training activations are overwritten from here on
        with model.evaluating():
            memory, self.src_mask = _encode_by_length(model, src)       # (B, S, D), (B, 1, 1, S)
            self.memory_caches = [layer.multihead_attn.memory_cache(memory)
                                  for layer in model.decoder.layers]
        rows = src.shape[0] * self.beams
        self.caches = [layer.self_attn.new_cache(rows, capacity, model.dtype)
                       for layer in model.decoder.layers]

    def first_tokens(self):
        """The tokens the first ``step`` takes: ``<bos>`` on every row."""
        return np.full(self.batch_size, self.bos_id, dtype=np.int64)

    def step(self, tokens):
        """The previous token of every row (R,) -> log-probabilities of the next one (R, V),
        float64, with ``<pad>`` and ``<bos>`` at -inf."""
        return F.log_softmax(self._logits(tokens).astype(np.float64))

    def step_top(self, tokens, n, offset=None):
        """As :meth:`step`, but only the ``n`` best next tokens of every row: ids (R, n), best
        first, and their log-probabilities (R, n), the same bits as :meth:`step`'s. Rows are
        ranked by ``offset[r] + log p`` (a beam's running scores; None: log p), ties by the
        lower id (``top_log_softmax`` of the backend: the (R, V) float64 arrays are never
        written on the Numba backend)."""
        return self._step_top(tokens, n, offset, None,
                              lambda x, n, off, _: ops().top_log_softmax(x, n, off))

    def step_top_bounded(self, tokens, n, offset=None, offset_err=None):
        """As :meth:`step_top` on the fast path (``top_log_softmax_bounded``): ids (R, n),
        logp (R, n), err (R, n) >= |logp - step_top's logp| and sure (R,): whether the row's ids
        and their order are certainly ``step_top``'s, given ``offset_err`` (R,) >= the error of
        ``offset`` (None: exact offsets). A row the fast path cannot settle is taken from the
        exact path here when its offset is exact (greedy, a beam search's first step; counted
        in ``exact_rows``); others are left not sure, for the search to redo exactly."""
        ids, logp, err, sure, redone = self._step_top(tokens, n, offset, offset_err, _bounded_top)
        self.exact_rows += int(redone.sum())
        return ids, logp, err, sure

    def exact_twin(self):
        """A new state of the same sources, at the start, on the exact path (``exact=True``):
        what a search redoes a batch on when a decision of the fast path is not certain."""
        return TranslationState(self.model, *self._sources, exact=True)

    def _step_top(self, tokens, n, offset, offset_err, top):
        """One step and ``top(logits, n, offset, offset_err)`` of its rows (a tuple of arrays of
        R rows each)."""
        logits, shared = self._logits(tokens, repeat=False)
        if not shared:
            return top(logits, n, offset, offset_err)
        # a first step of one row per source: each beam's rows ranked once over the sources'
        # logits (every row's result depends on its logits and offset alone), beams of equal
        # offsets (beam search's -inf for all but the first) ranked once between them
        beams, rows = self.beams, len(logits) * self.beams
        if offset is not None and (np.shape(offset) != (rows,) or np.any(offset_err)):
            return top(np.repeat(logits, beams, axis=0), n, offset, offset_err)   # unshared
        if offset is None:
            tops, which = [top(logits, n, None, None)], np.zeros(beams, dtype=int)
        else:                                # beam j's offsets: column j of (sources, beams)
            columns = np.asarray(offset, dtype=np.float64).reshape(len(logits), beams).T
            distinct, which = np.unique(columns, axis=0, return_inverse=True)
            tops = [top(logits, n, column, None) for column in distinct]
        out = tuple(np.empty((rows,) + a.shape[1:], dtype=a.dtype) for a in tops[0])
        for j, k in enumerate(which.reshape(-1)):
            for whole, part in zip(out, tops[k]):
                whole[j::beams] = part
        return out

    def _logits(self, tokens, repeat=True):
        """The decoder and generator one position on: (R,) tokens -> logits (R, V) in the
        model's dtype, ``<pad>`` and ``<bos>`` at -inf (never a next token).

        A first step that gives a source's ``beams`` rows one token (beam search's ``<bos>``)
        computes one row per source: its rows would be the same, so the result and its cached
        keys and values are repeated to the source's other rows (a beam search's first step
        thus costs what greedy's does). ``repeat=False``: the logits as computed, one row per
        source where the step was shared, and whether it was: ``(logits, shared)``."""
        model, beams = self.model, self.beams
        tokens = self.check_step(tokens, model.config.tgt_vocab_size)   # before any cache moves
        shared = (self.length == 0 and beams > 1
                  and bool((tokens.reshape(-1, beams) == tokens[::beams, None]).all()))
        if shared:
            tokens = tokens[::beams]                                     # (R / beams,)
            for cache in self.caches:
                cache.batch_size = len(tokens)
        try:
            with model.evaluating(), runtime.blas_scope():   # one BLAS setting for the step
                x = model.embed(model.tgt_embed, model.tgt_dropout, tokens[:, None],
                                start=self.length)                       # (R, 1, D)
                h = model.decoder.step(x, self.caches, self.memory_caches, self.src_mask)
                logits = model.generator.forward(h)[:, 0]                # (R, V)
        finally:
            if shared:                                   # the cached rows, also after a failure
                for cache in self.caches:
                    cache.repeat_rows(beams)
        logits[:, [model.pad_id, self.bos_id]] = -np.inf
        if not repeat:
            return logits, shared
        if shared:
            logits = np.repeat(logits, beams, axis=0)
        return logits

    def reorder(self, index):
        """Keep the rows ``index`` (R',) in that order; a row may repeat (beam search). Each run
        of ``beams`` consecutive entries must come from one source; sources left out are dropped
        from the cross-attention caches too (their keys and values are never copied otherwise)."""
        index, beams = self.check_rows(index), self.beams
        sources = index // beams
        if len(index) % beams or (sources.reshape(-1, beams) != sources[::beams, None]).any():
            raise ValueError(f"reorder: each run of {beams} rows (the beams of a source) must "
                             f"come from one source, got rows {index!r:.80}")
        for cache in self.caches:
            cache.reorder(index)
        kept = sources[::beams]
        if len(kept) != len(self.src_mask) or (kept != np.arange(len(kept))).any():
            for cache in self.memory_caches:
                cache.reorder(kept)
            self.src_mask = self.src_mask[kept]


def _bounded_top(logits, n, offset, offset_err):
    """The backend's ``top_log_softmax_bounded`` of logits (R, V), with the rows it cannot
    settle and whose offsets are exact (``offset_err`` 0 or None) taken from the exact
    ``top_log_softmax`` (each row's result depends on its own logits and offset alone):
    ids, logp, err, sure and which rows were so taken (R,)."""
    ids, logp, err, sure = ops().top_log_softmax_bounded(logits, n, offset, offset_err)
    redo = ~sure if offset_err is None else ~sure & (np.asarray(offset_err) == 0)
    if redo.any():
        rows = np.flatnonzero(redo)
        ids[rows], logp[rows] = ops().top_log_softmax(
            logits[rows], n, None if offset is None else np.asarray(offset)[rows])
        err[rows], sure[rows] = 0.0, True
    return ids, logp, err, sure, redo


def _encode_by_length(model, src):
    """The encoder over sources ``src`` (B, S) in groups of equal length, each at its own width
    (a group's rows hold no padding after their last token): memory (B, S, D), zero at the
    padded positions every attention masks, and the padding mask (B, 1, 1, S). A batch of
    sentences sorted by length is mostly padding at its short end; encoding it at the longest
    one's width spent a third of a greedy pass on Multi30k there. A sentence's memory may
    differ from the padded batch's in the last bits (products of other shapes)."""
    pad = model.pad_id
    real = src != pad
    lengths = np.where(real.any(axis=1), src.shape[1] - np.argmax(real[:, ::-1], axis=1), 1)
    widths = np.unique(lengths)
    if len(widths) == 1:
        return model._encode(src)
    memory = np.zeros(src.shape + (model.d_model,), dtype=model.dtype)
    for width in widths.tolist():
        rows = np.flatnonzero(lengths == width)
        memory[rows, :width] = model._encode(src[rows, :width])[0]
    return memory, F.padding_mask(src, pad)


def default_capacity(max_len, src_len):
    """Positions a translation of sources padded to ``src_len`` may take: twice the source and
    ten more, at most the model's ``max_len``."""
    return min(max_len, 2 * src_len + 10)


def _check_id(name, value, vocab):
    value = check_int(name, value, minimum=0)
    if value >= vocab:
        raise ValueError(f"{name}: expected a target token id in [0, {vocab}), got {value}")
    return value
