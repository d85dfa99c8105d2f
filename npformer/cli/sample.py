"""``npformer sample``: continue a prompt with a language model (GPT-2 from a Hugging Face folder).

    npformer sample --hf path/to/gpt2 --prompt "Hello, I'm a language model," --max-new-tokens 40
"""
import sys

import numpy as np

from ..decoding.search import greedy_search, sample_search
from ..decoding.translator import format_token_trace
from .common import _real, non_negative_int, positive_float, positive_int

TEMPERATURE = 1.0


def top_p_value(text):
    """A number in (0, 1]."""
    return _real(text, minimum=0, min_open=True, maximum=1)


def add_parser(sub, name):
    p = sub.add_parser(name, help="continue a prompt with a language model (GPT-2)",
                       description="Continue a prompt with GPT-2 weights from a Hugging Face "
                                   "folder (config.json, model.safetensors, tokenizer.json; "
                                   "extra hf). Samples by default; --greedy takes the most "
                                   "likely token every time.")
    p.add_argument("--hf", required=True, metavar="DIR",
                   help="a Hugging Face GPT-2 folder (e.g. the files of the hub's gpt2)")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=positive_int, default=50, metavar="N",
                   help="tokens to generate at most (default %(default)s; generation also "
                        "stops at <|endoftext|>)")
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


def run(args):
    from ..hf import load_tokenizer
    from ..nn.gpt import GPT
    check_options(args)
    tokenizer = load_tokenizer(args.hf)
    model = GPT.from_pretrained(args.hf, dtype=np.dtype(args.dtype))
    ids = tokenizer.encode(args.prompt).ids
    if not ids:
        raise ValueError("--prompt: expected text that gives at least one token, got an empty "
                         "prompt")
    context = model.max_len
    if len(ids) - 1 + args.max_new_tokens > context:    # the last new token is never fed back
        raise ValueError(f"--prompt / --max-new-tokens: the prompt's {len(ids)} tokens and "
                         f"{args.max_new_tokens} new ones need {len(ids) - 1 + args.max_new_tokens} "
                         f"positions, more than the model's context of {context}; shorten the "
                         f"prompt or ask for fewer tokens")
    state = model.decoder_state(np.array([ids]), eos_id=model.eos_id)
    if args.greedy:
        hyp, = greedy_search(state, max_new_tokens=args.max_new_tokens)
    else:
        hyp, = sample_search(state, temperature=(TEMPERATURE if args.temperature is None
                                                 else args.temperature),
                             top_k=args.top_k, top_p=args.top_p,
                             rng=np.random.default_rng(args.seed),
                             max_new_tokens=args.max_new_tokens)
    text = tokenizer.decode(ids + hyp.ids)
    if args.trace:
        tokens = [repr(tokenizer.decode([i])) for i in hyp.ids]
        eos = repr(tokenizer.id_to_token(model.eos_id)) if hyp.finished else None
        text = format_token_trace("prompt", args.prompt, tokens, hyp.probs, eos, text)
    sys.stdout.write(text + "\n")
    return 0
