"""``npformer sample``: continue a prompt with a language model: a Hugging Face folder of any
family of ``npformer.families``, or a checkpoint of ``npformer lm``.

    npformer sample --hf path/to/gpt2 --prompt "Hello, I'm a language model," --max-new-tokens 40
    npformer sample --hf path/to/SmolLM2-135M --prompt "The capital of France is" --greedy
    npformer sample --checkpoint runs/shakespeare/best --prompt "ROMEO:" --temperature 0.8
    npformer sample --hf path/to/SmolLM2-135M --adapter runs/lora/best --prompt "ROMEO:"
"""
import sys

import numpy as np

from .. import families
from ..decoding.search import greedy_search, sample_search
from ..decoding.translator import format_token_trace
from .common import (_real, non_negative_int, path_argument, positive_float, positive_int,
                     resolve_checkpoint)

TEMPERATURE = 1.0
# what an out-of-memory error suggests (npformer.cli.main)
MEMORY_HINT = "try a smaller model, or --dtype float32 (the default)"


def top_p_value(text):
    """A number in (0, 1]."""
    return _real(text, minimum=0, min_open=True, maximum=1)


def add_parser(sub, name):
    p = sub.add_parser(name, help=f"continue a prompt with a language model (npformer lm, "
                                  f"{families.spelled('or')})",
                       description="Continue a prompt with a checkpoint of npformer lm, or with "
                                   "the weights of a Hugging Face folder (config.json, "
                                   "model.safetensors or its shards, tokenizer.json; extra hf) "
                                   f"of {families.spelled()}. Samples by default; "
                                   "--greedy takes the most likely token every time.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=path_argument, metavar="CKPT",
                        help="a checkpoint of npformer lm (RUN/best), or its run folder")
    source.add_argument("--hf", type=path_argument, metavar="DIR",
                        help=f"a Hugging Face model folder of {families.spelled()} (e.g. "
                             f"the files of the hub's gpt2 or SmolLM2-135M)")
    p.add_argument("--adapter", type=path_argument, metavar="PATH",
                   help="with --hf: the LoRA adapter of a run of npformer lm --lora-rank "
                        "(RUN/best), or a PEFT folder (adapter_config.json), applied to the "
                        "model of --hf, which must be its base")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=positive_int, default=50, metavar="N",
                   help="tokens to generate at most (default %(default)s; a model also stops "
                        "at its end-of-text tokens, e.g. GPT-2's <|endoftext|>); past the "
                        "model's context each token sees the last context tokens")
    p.add_argument("--greedy", action="store_true", help="the most likely token every time")
    p.add_argument("--temperature", type=positive_float, default=None,
                   help=f"> 0 (default {TEMPERATURE})")
    p.add_argument("--top-k", type=positive_int, default=None, metavar="K",
                   help="sample among the K most likely tokens")
    p.add_argument("--top-p", type=top_p_value, default=None, metavar="P",
                   help="sample among the fewest most likely tokens whose probability reaches P, "
                        "in (0, 1]")
    p.add_argument("--seed", type=non_negative_int, default=None,
                   help="seed of the sampler (same seed, same text)")
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--trace", action="store_true",
                   help="print every generated token and its probability")
    p.set_defaults(run=run)


def check_options(args):
    """Sampling settings with --greedy would be silently ignored: refused."""
    if args.greedy:
        for option, value in (("--temperature", args.temperature), ("--top-k", args.top_k),
                              ("--top-p", args.top_p), ("--seed", args.seed)):
            if value is not None:
                raise ValueError(f"{option}: only used when sampling (it would be ignored with "
                                 f"--greedy)")


def load_language_model(args):
    """(model, tokenizer) of --checkpoint or --hf."""
    dtype = np.dtype(args.dtype)
    if args.adapter is not None and args.hf is None:
        raise ValueError("--adapter: goes with --hf DIR, its base model (a --checkpoint of a "
                         "LoRA run holds its adapters already)")
    if args.adapter is not None and dtype != np.float32:
        raise ValueError(f"--dtype {args.dtype}: an adapter is checked against its base's "
                         f"float32 weights; sample it in float32")
    if args.hf is not None:
        from ..training.language_model import load_pretrained
        model, tokenizer = load_pretrained(args.hf, dtype=dtype)
        if args.adapter is not None:
            from ..training.lora_runs import load_adapter
            model = load_adapter(model, args.adapter).eval()
        return model, tokenizer
    from ..training.checkpointing import load_model_checkpoint
    from ..training.language_model import resolve_tokenizer
    loaded = load_model_checkpoint(resolve_checkpoint(args.checkpoint))
    if loaded.model.config.capability != "causal_lm":
        raise ValueError(f"--checkpoint {args.checkpoint}: holds a {loaded.model.config.arch} "
                         f"model, not a language model (translate with npformer translate)")
    model = loaded.model
    if model.dtype != dtype and getattr(model, "lora", None) is not None:
        raise ValueError(f"--dtype {args.dtype}: --checkpoint {args.checkpoint} is a LoRA run "
                         f"over float32 weights; sample it in float32")
    if model.dtype != dtype:
        model = model.reconfigured(dtype=args.dtype)
    return model, resolve_tokenizer(loaded)


class TextStream:
    """Writes a growing sequence of token ids as text, a piece as each token comes, so that the
    pieces join into ``tokenizer.decode`` of the whole sequence.

    A token is not always text of its own: a byte-level BPE token may hold part of a
    character's bytes (decoded as U+FFFD until the rest comes), and a decoder may treat the
    first token apart (dropping its leading space). So each piece comes from a window of the
    last ids: its decode with the new ids, past its decode without them (the text written
    already), less any U+FFFD at the end, which waits for the rest of its character (at most
    ``HOLD`` tokens: bytes that never become a character are written then). ``finish`` writes
    what the decode of the whole sequence holds beyond the pieces, and ends the line.
    """

    HOLD = 64               # tokens the end of a piece may wait for the rest of a character
    CONTEXT = 4             # ids before the new ones that each window decodes again

    def __init__(self, tokenizer, ids, out):
        self.tokenizer, self.out, self.ids = tokenizer, out, list(ids)
        self.written = tokenizer.decode(self.ids)               # the prompt, as it decodes
        self._write(self.written)
        self._settle()

    def _write(self, text):
        if text:
            self.out.write(text)
            self.out.flush()

    def _settle(self):
        """Every id so far is written: the next window starts ``CONTEXT`` ids back."""
        self.read = len(self.ids)
        self.start = max(0, self.read - self.CONTEXT)
        self.ahead = 0              # characters written past the decode of ids[start:read]

    def add(self, token):
        self.ids.append(int(token))
        before = self.tokenizer.decode(self.ids[self.start:self.read])
        text = self.tokenizer.decode(self.ids[self.start:])
        held = len(self.ids) - self.read >= self.HOLD
        if not text.startswith(before):              # a decoder that is not local: the rest
            if held:                                 # of the text comes with finish
                self._settle()
            return
        ready = text if held else text.rstrip("\ufffd")
        piece = ready[len(before) + self.ahead:]
        self._write(piece)
        self.written += piece
        self.ahead += len(piece)
        if ready == text:
            self._settle()

    def finish(self):
        """The rest of the text, then the end of the line."""
        full = self.tokenizer.decode(self.ids)
        self._write((full[len(self.written):] if full.startswith(self.written) else "") + "\n")


def end_ids(eos_id):
    """The set of a model's end-of-text ids: ``eos_id`` is None, one id or a tuple of them."""
    if eos_id is None:
        return set()
    return set(eos_id) if isinstance(eos_id, tuple) else {eos_id}


def run(args):
    check_options(args)
    model, tokenizer = load_language_model(args)
    ids = [int(i) for i in tokenizer.encode(args.prompt, "--prompt")]
    if not ids:
        raise ValueError("--prompt: expected text that gives at least one token, got an empty "
                         "prompt")
    context = model.max_len
    if len(ids) > context:
        raise ValueError(f"--prompt: {len(ids)} tokens, longer than the model's context of "
                         f"{context}; give a shorter prompt")
    # caches for the prompt and the new tokens, not for the whole context (a Llama's
    # max_position_embeddings is 131,072); past the context, each new token sees the last
    # ``context`` tokens (the state slides)
    capacity = min(context, len(ids) + args.max_new_tokens)
    state = model.decoder_state(np.array([ids]), eos_id=model.eos_id, capacity=capacity,
                                slide=True)
    # the text is printed as the tokens come (with --trace: all of it at the end)
    stream = None if args.trace else TextStream(tokenizer, ids, sys.stdout)
    ends = end_ids(model.eos_id)
    last = []                                    # the last token chosen (an end token's name)

    def on_step(sources, tokens):
        last[:] = [int(tokens[0])]
        if stream is not None and int(tokens[0]) not in ends:    # the end token is no text
            stream.add(tokens[0])

    if args.greedy:
        hyp, = greedy_search(state, max_new_tokens=args.max_new_tokens, on_step=on_step)
    else:
        hyp, = sample_search(state, temperature=(TEMPERATURE if args.temperature is None
                                                 else args.temperature),
                             top_k=args.top_k, top_p=args.top_p,
                             rng=np.random.default_rng(args.seed),
                             max_new_tokens=args.max_new_tokens, on_step=on_step)
    if stream is not None:
        stream.finish()
        return 0
    text = tokenizer.decode(ids + hyp.ids)
    tokens = [repr(tokenizer.decode([i])) for i in hyp.ids]
    eos = repr(tokenizer.token(last[0])) if hyp.finished else None
    sys.stdout.write(format_token_trace("prompt", args.prompt, tokens, hyp.probs, eos, text)
                     + "\n")
    return 0
