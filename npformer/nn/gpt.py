"""The decoder-only Transformer language model (GPT; GPT-2's architecture by default): token
embeddings and positions, a list of ``Block`` s chosen by the configuration (causal
self-attention + feed-forward, pre-norm by default), a final norm and the output projection.

Parameter names: ``tok_embed.weight``, ``pos_embed.weight`` (learned positions only),
``blocks.N.*`` (``nn/block.py``), ``norm.*`` and ``generator.weight`` (untied only). Each model
family's Hugging Face names for them are its tensor map in ``npformer.families`` (GPT-2's in
``families/gpt2.py``).

(Until the blocks were their own they were ``transformer.layers.N`` and ``transformer.norm``;
checkpoints written then are renamed on load: ``GPTConfig.RENAMED``.)
"""
import math

import numpy as np

from .. import functional as F
from .. import runtime
from ..configs import GPTConfig
from ..validation import check_array, check_int, check_token_ids
from ..parts import POSITIONS
from .block import Block, build, build_norm, starting_values
from .dropout import Dropout
from .embedding import Embedding
from .finite import check_logits
from .init import building_shapes, drawing_nothing, placeholder, table
from .linear import Linear
from .module import Module, ModuleList, model_config
from .state import CachedState

INIT_STD = 0.02          # GPT-2's initializer_range


class GPT(Module):
    """Decoder-only Transformer language model with hand-written backward.

        model = GPT(GPTConfig(vocab_size=65, d_model=64, ...))
        model = GPT(65, d_model=64, ...)                 # the same: the fields of GPTConfig

    forward(ids) -> logits; backward(dlogits) fills every ``Parameter.grad``.

    Shape: ids (B, T) int -> logits (B, T, vocab_size); position t sees ids[:, :t + 1] only.

    Weights start as GPT-2's: every matrix and embedding N(0, 0.02^2), the two projections that
    end a residual branch (attention ``out_proj``, ``ffn.linear2``) N(0, (0.02 / sqrt(2 *
    n_layers))^2) so the residual stream's variance does not grow with depth, biases 0,
    norms 1 and 0.
    """

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.config = cfg = model_config(GPTConfig, args, kwargs)
        dtype = np.dtype(cfg.dtype)
        self.dtype, self.max_len, self.d_model = dtype, cfg.max_len, cfg.d_model
        # one rng: it draws the initial weights, then every dropout mask
        self.rng = init_rng = np.random.default_rng(cfg.seed)
        positions = POSITIONS[cfg.positions]                     # what they do: npformer.parts
        scaled = positions.scales_embedding or cfg.scale_embedding
        scale = math.sqrt(cfg.d_model) if scaled else 1.0
        self.tok_embed = Embedding(cfg.vocab_size, cfg.d_model, None, scale, rng=init_rng,
                                   dtype=dtype)
        self.pos_embed = self.positions = rotary = None
        if positions.module:                # learned: a trained table added
            self.pos_embed = build(positions, cfg.max_len, cfg.d_model, INIT_STD, rng=init_rng,
                                   dtype=dtype)
        if positions.table:                 # a fixed table added
            self.positions = table(lambda: F.sinusoidal_positions(cfg.max_len, cfg.d_model, dtype),
                                   (cfg.max_len, cfg.d_model), dtype)
        if positions.rotates:               # the attention turns queries and keys
            half = (cfg.max_len, cfg.head_size // 2)                 # cos and sin
            rotary = (placeholder(half, dtype),) * 2 if building_shapes() else \
                F.rotary_tables(cfg.max_len, cfg.head_size, dtype, cfg.rope_theta,
                                cfg.rope_scaling)
        self.embed_dropout = Dropout(cfg.dropout, rng=self.rng)
        self.blocks = ModuleList([Block(cfg, rotary, rng=init_rng, dtype=dtype, layer=i)
                                  for i in range(cfg.n_layers)])
        self.norm = build_norm(cfg, dtype)                       # the final norm, as the blocks'
        self.generator = Linear(cfg.d_model, cfg.vocab_size, bias=False, rng=init_rng, dtype=dtype)
        if cfg.tie_embeddings:
            self.generator.weight = self.tok_embed.weight       # one Parameter, two users
        if not drawing_nothing():       # (uninitialised: the caller writes every weight)
            self._init_weights(init_rng)
        self.flatten_parameters()
        self.eos_id = None               # the end-of-text token, where the weights' files name one
        self._logits_shape = None
        self._cap_cache = None           # the logits' soft-cap, between forward and backward
        self._backward_done = False

    def _init_weights(self, rng):
        """GPT-2's initialisation (see the class docstring), drawn in parameter order. A norm's
        parameters start at the values its part declares (``npformer.parts``); which matrices
        end a residual branch, the blocks say."""
        residual_std = INIT_STD / math.sqrt(2 * self.config.n_layers)
        fixed = starting_values([norm for block in self.blocks for norm in block.norms()]
                                + [self.norm])
        residual = {id(p) for block in self.blocks for p in block.residual_projections()}
        for _, p in self.named_parameters():
            if id(p) in fixed:
                p.data[...] = fixed[id(p)]
            elif p.data.ndim == 1:
                p.data[...] = 0                                  # biases
            else:
                std = residual_std if id(p) in residual else INIT_STD
                p.data[...] = rng.standard_normal(p.data.shape) * std

    @classmethod
    def from_config(cls, config):
        """A new model of a :class:`~npformer.configs.GPTConfig` (the same as ``GPT(config)``)."""
        if not isinstance(config, GPTConfig):
            raise ValueError(f"config: expected a GPTConfig, got {type(config).__name__}")
        return cls(config)

    @classmethod
    def from_pretrained(cls, path, dtype=np.float32):
        """The model of a Hugging Face folder (any family of ``npformer.families``), read
        without PyTorch by :func:`npformer.hf.from_pretrained`
        (every tensor checked by name and shape, GPT-2's Conv1D weights transposed), in eval
        mode; the folder's end-of-text id becomes ``model.eos_id``. ``dtype``: float32, or
        float64 for checks."""
        from ..hf import from_pretrained        # (the loader sits above the layers)
        return from_pretrained(path, dtype)

    def reconfigured(self, **changes):
        """A new model of ``config.replace(**changes)`` holding these weights (cast to its
        dtype) and this ``eos_id``, in eval mode: another dropout rate to fine-tune with,
        float64 for a check. The changes may not alter a parameter's shape."""
        model = GPT.from_config(self.config.replace(**changes))
        model.load_state_dict({k: v.astype(model.dtype) for k, v in self.state_dict().items()})
        model.eos_id = self.eos_id
        return model.eval()

    # -- pieces the forward pass and decoding share -------------------------------------------
    def embed(self, ids, start=0):
        """Token plus position vectors of ids (B, T) at positions start .. start + T - 1, then
        dropout -> (B, T, D). (Rotary positions are the attention's: nothing is added.)"""
        x = self.tok_embed.forward(ids)
        if self.pos_embed is not None:
            x = self.pos_embed.forward(x, start)
        elif self.positions is not None:
            x += F.position_rows(self.positions, start, ids.shape[1])
        return self.embed_dropout.forward(x)

    def new_caches(self, rows, capacity):
        """One empty key/value cache per block, for ``rows`` sequences of up to ``capacity``
        positions: what a decoder state holds."""
        return [block.new_cache(rows, capacity, self.dtype) for block in self.blocks]

    def step(self, ids, caches, logits=True):
        """ids (R, t) at the next t positions, after those ``caches`` hold (eval mode): their
        keys and values join the caches, and the logits of the last position (R, V) come back
        (None with ``logits=False``: a prompt's prefill)."""
        x = self.embed(ids, start=caches[0].length)                   # (R, t, D)
        for block, cache in zip(self.blocks, caches):
            x = block.step(x, cache)
        return self.head(self.norm.forward(x)[:, -1]) if logits else None

    def head(self, h):
        """The logits (..., V) of the final norm's output h (..., D): the output projection,
        then the soft-cap where the configuration has one (``logit_softcap``, Gemma 2's)."""
        logits = self.generator.forward(h)
        self._cap_cache = None
        if self.config.logit_softcap is not None:
            logits, self._cap_cache = F.softcap_forward(logits, self.config.logit_softcap)
        return logits

    def decoder_state(self, prompt, eos_id=None, capacity=None, slide=False):
        """A ``LanguageModelState`` prefilled with ``prompt`` (R, P): what
        ``npformer.decoding``'s greedy and sampling searches run over (``slide``: generate
        past the context, each token from the ``capacity`` tokens before it)."""
        return LanguageModelState(self, prompt, eos_id, capacity, slide)

    # -- training -----------------------------------------------------------------------------
    def forward(self, ids):
        """ids (B, T) int -> logits (B, T, vocab_size). Keeps caches for backward."""
        ids = check_token_ids("ids", ids, self.config.vocab_size, self.max_len)
        x = self.embed(ids)                                              # (B, T, D)
        mask = F.causal_mask(ids.shape[1])
        for block in self.blocks:
            x = block.forward(x, mask)
        h = self.norm.forward(x)                                         # (B, T, D)
        logits = self.head(h)                                            # (B, T, V)
        self._logits_shape = logits.shape
        self._backward_done = False
        return logits

    def __call__(self, ids):
        return self.forward(ids)

    def backward(self, dlogits):
        """Accumulate d(loss)/d(parameter) into every ``.grad`` given dlogits (B, T, V).
        One backward per forward."""
        if self._logits_shape is None:
            raise ValueError("backward: call forward first (there are no saved activations)")
        if self._backward_done:
            raise ValueError("backward: already called since the last forward; each forward's "
                             "activations serve one backward, so call forward again")
        check_array("dlogits", dlogits, self._logits_shape)
        self._backward_done = True
        if self._cap_cache is not None:                         # the soft-cap's backward first
            dlogits = F.softcap_backward(dlogits, self._cap_cache)
        dh = self.generator.backward(dlogits)                   # (B, T, D)
        dx = self.norm.backward(dh)
        for block in reversed(self.blocks):
            dx = block.backward(dx)
        dx = self.embed_dropout.backward(dx)
        if self.pos_embed is not None:
            dx = self.pos_embed.backward(dx)                    # dx passes through unchanged
        self.tok_embed.backward(dx)                             # (tied: adds to the head's grad)


class LanguageModelState(CachedState):
    """Rows of a prompt being continued one token at a time: the decoder state that
    ``npformer.decoding``'s greedy and sampling searches run over (as ``TranslationState``).

        state = model.decoder_state(prompt)      # prompt (R, P): the first P - 1 tokens run now
        logp = state.step(tokens)                # (R,) previous tokens -> (R, V) log-probabilities
        state.reorder(rows)                      # keep rows, in place

    Every layer keeps the keys and values of the positions seen so far (``KVCache``), so a step
    costs one position; T steps give what one forward over the T positions gives. The prompt's
    first P - 1 tokens fill the caches in one pass (causal among themselves); its last token is
    ``first_tokens()``, so the first ``step`` returns the distribution of the token after the
    prompt. Every row holds the same number of positions (one prompt, or prompts of one length).
    ``capacity`` (default: the model's ``max_len``) bounds prompt plus generated tokens, unless
    ``slide``: then, once the caches are full, every step re-fills fresh caches with the last
    ``capacity - 1`` tokens before running its own, so each token is drawn from the ``capacity``
    tokens before it (nanoGPT's cropping; a full forward over the context per token).
    """

    beams = 1

    def __init__(self, model, prompt, eos_id=None, capacity=None, slide=False):
        vocab = model.config.vocab_size
        capacity = model.max_len if capacity is None else check_int("capacity", capacity)
        if capacity > model.max_len:
            raise ValueError(f"capacity: expected at most the model's max_len={model.max_len} "
                             f"positions, got {capacity}")
        prompt = np.asarray(prompt)
        if prompt.ndim == 2 and prompt.shape[1] > capacity:
            raise ValueError(f"prompt: expected at most {capacity} tokens (the context the "
                             f"model can attend to), got {prompt.shape[1]}")
        prompt = check_token_ids("prompt", prompt, vocab, model.max_len)      # (R, P)
        if eos_id is not None:                  # one id, or a tuple of them (stop at any)
            ids = [check_int("eos_id", i, minimum=0) for i in
                   (eos_id if isinstance(eos_id, (tuple, list)) else [eos_id])]
            if not ids or max(ids) >= vocab:
                raise ValueError(f"eos_id: expected a token id in [0, {vocab}) or a tuple of "
                                 f"them, got {eos_id}")
            eos_id = tuple(ids) if isinstance(eos_id, (tuple, list)) else ids[0]
        self.model, self.eos_id, self.slide = model, eos_id, bool(slide)
        model._logits_shape = None       # its training activations are overwritten from here on
        self._fill(prompt[:, :-1], capacity)
        self._first = prompt[:, -1].copy()
        self._history = prompt[:, :-1].copy()   # (R, n): the tokens fed so far (for sliding)

    def _fill(self, ids, capacity):
        """Fresh caches holding ids (R, t) at positions 0 .. t-1 (one prefill pass)."""
        self.caches = self.model.new_caches(ids.shape[0], capacity)
        if ids.shape[1] > 0:
            self._run(ids, logits=False)                     # prefill; no logits needed

    def first_tokens(self):
        """The prompt's last token on every row: the first ``step``'s input."""
        return self._first[:self.batch_size].copy()

    def _run(self, ids, logits=True):
        """ids (R, t) at the next t positions into the caches -> the logits of the last one
        (R, V), or None."""
        model = self.model
        with model.evaluating(), runtime.blas_scope():   # one BLAS setting for the whole step
            return model.step(ids, self.caches, logits)

    def step(self, tokens):
        """The previous token of every row (R,) -> log-probabilities of the next one (R, V),
        float64. ValueError naming the first layer whose output is not finite where the logits
        are not (``nn.finite.check_logits``): NaN logits are no distribution to draw from."""
        if self.slide and self.length >= self.capacity:      # the last capacity - 1 tokens
            n = self._history.shape[1]
            self._fill(self._history[:, n - (self.capacity - 1):], self.capacity)
        tokens = self.check_step(tokens, self.model.config.vocab_size)[:, None]   # (R, 1)
        self._history = np.concatenate([self._history, tokens], axis=1)
        logits = check_logits(self._run(tokens), self.model, self._history)  # never sample NaN
        return F.log_softmax(logits.astype(np.float64))

    def reorder(self, index):
        """Keep the rows ``index`` (R',) in that order; a row may repeat."""
        index = self.check_rows(index)
        for cache in self.caches:
            cache.reorder(index)
        self._first = self._first[index]
        self._history = self._history[index]
