"""Translation metrics: exact match, BLEU via sacrebleu (ours on detokenised text, and the
papers' on lowercased, Moses-tokenised text)."""


def _check_pair(hypotheses, references):
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise ValueError("hypotheses, references: expected lists of strings, got a str")
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(f"hypotheses and references: expected the same number of sentences, "
                         f"got {len(hypotheses)} and {len(references)}")
    return hypotheses, references


def exact_match(hypotheses, references):
    """Fraction of sentences whose tokens equal the reference (whitespace-insensitive)."""
    hypotheses, references = _check_pair(hypotheses, references)
    if not references:
        raise ValueError("references: expected at least one sentence, got none")
    hits = sum(h.split() == r.split() for h, r in zip(hypotheses, references))
    return hits / len(references)


def corpus_bleu(hypotheses, references, tokenize="none"):
    """Corpus BLEU (0..100) by sacrebleu; ``tokenize="none"`` for already tokenised text (so
    sacrebleu's warning about tokenised input is not printed), "13a" (sacrebleu's default) for
    raw text."""
    import sacrebleu

    hypotheses, references = _check_pair(hypotheses, references)
    if not references:
        raise ValueError("references: expected at least one sentence, got none")
    return float(sacrebleu.corpus_bleu(hypotheses, [references], tokenize=tokenize,
                                       force=tokenize == "none").score)


def sacrebleu_scores(hypotheses, references):
    """Corpus BLEU of detokenised ``hypotheses`` against RAW ``references`` (sacrebleu's own
    13a tokenisation), the standard way to report MT scores.

    Returns ``{"bleu": lowercased BLEU, "bleu_cased": cased BLEU, "signature": ...,
    "signature_cased": ...}``; the signature (e.g. ``nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|
    version:2.6.0``) says exactly how the number was computed.
    """
    from sacrebleu.metrics import BLEU

    hypotheses, references = _check_pair(hypotheses, references)
    if not references:
        raise ValueError("references: expected at least one sentence, got none")
    out = {}
    for key, lowercase in (("", True), ("_cased", False)):
        metric = BLEU(lowercase=lowercase)
        out["bleu" + key] = float(metric.corpus_score(hypotheses, [references]).score)
        out["signature" + key] = str(metric.get_signature())
    return out


def papers_bleu(hypotheses, references, lang, tokenised=False):
    """The BLEU the Multi30k papers report: hypotheses and RAW references both preprocessed as
    those papers do (``npformer.data.moses.papers_tokenize``: Moses punctuation normalisation,
    lowercasing, the Moses tokenizer with its default escaping), then corpus BLEU with no
    further tokenisation (``sacrebleu --tokenize none``). Needs sacremoses. ``tokenised=True``:
    the hypotheses are so preprocessed already (the output of a model trained on such text,
    ``--preprocess moses``) and are scored as they are, as the papers score theirs.

    Returns ``{"bleu_papers": ..., "signature_papers": ...}``; the signature is sacrebleu's with
    ``+moses-lc-esc`` appended, naming the preprocessing."""
    from sacrebleu.metrics import BLEU

    from ..data.moses import papers_tokenize

    hypotheses, references = _check_pair(hypotheses, references)
    if not references:
        raise ValueError("references: expected at least one sentence, got none")
    metric = BLEU(tokenize="none", force=True)      # tokenised on purpose: no warning
    hypotheses = hypotheses if tokenised else papers_tokenize(hypotheses, lang)
    score = metric.corpus_score(hypotheses, [papers_tokenize(references, lang)])
    return {"bleu_papers": float(score.score),
            "signature_papers": f"{metric.get_signature()}+moses-lc-esc"}
