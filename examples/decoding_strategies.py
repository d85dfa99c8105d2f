"""Greedy, beam search and sampling on a trained checkpoint, with the per-token trace.

    npformer toy --out runs/toy
    python examples/decoding_strategies.py runs/toy/best "他 有 两只 黑色的 猫"
"""
import sys

import numpy as np

from npformer.decoding.translator import Translator, format_trace
from npformer.training.checkpointing import load_model_checkpoint


def main(checkpoint="runs/toy/best", sentence="他 有 两只 黑色的 猫"):
    loaded = load_model_checkpoint(checkpoint)
    translator = Translator(loaded.model, loaded.vocabs)

    (greedy,) = translator.translate([sentence])
    print(format_trace(greedy))                  # every chosen token with its probability

    (beam,) = translator.translate([sentence], method="beam", beam_size=4, length_penalty=0.6)
    print(f"beam search (4 beams): {beam.text}")

    rng = np.random.default_rng(0)
    for temperature in (0.5, 1.0, 2.0):
        samples = translator.translate([sentence] * 3, method="sample", temperature=temperature,
                                       top_k=5, rng=rng)
        print(f"samples at temperature {temperature}: " + " | ".join(s.text for s in samples))


if __name__ == "__main__":
    main(*sys.argv[1:3])
