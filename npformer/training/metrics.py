"""Translation metrics (exact match, BLEU via sacrebleu) and a JSON-lines metrics log."""
import json
import math
import os
import time


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
    """Corpus BLEU (0..100) by sacrebleu; ``tokenize="none"`` for already tokenised text,
    "13a" (sacrebleu's default) for raw text."""
    import sacrebleu

    hypotheses, references = _check_pair(hypotheses, references)
    if not references:
        raise ValueError("references: expected at least one sentence, got none")
    return float(sacrebleu.corpus_bleu(hypotheses, [references], tokenize=tokenize).score)


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


class MetricsLog:
    """Appends one JSON object per line: ``{"time": ..., "event": "train", "step": 10, ...}``.

    Read it back with ``read_metrics_log(path)``; ``npformer plot`` draws the loss curves.
    """

    def __init__(self, path, append=False):
        self.path = os.fspath(path)
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._f = open(self.path, "a" if append else "w", encoding="utf-8")

    def log(self, event, **values):
        record = {"time": round(time.time(), 3), "event": event}
        for k, v in values.items():
            if isinstance(v, float) and not math.isfinite(v):
                v = str(v)                       # JSON has no NaN/inf
            record[k] = v
        try:
            self._f.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._f.flush()
        except OSError as e:                     # e.g. a full disk: name the log, not just errno
            raise OSError(e.errno, e.strerror, self.path) from e

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_metrics_log(path):
    """List of records of a metrics log; ValueError naming the file and line if one is broken."""
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{os.fspath(path)}:{n}: expected one JSON object per line ({e})") from None
            if not isinstance(rec, dict) or "event" not in rec:
                raise ValueError(f"{os.fspath(path)}:{n}: expected an object with an 'event' key, "
                                 f"got {line.strip()[:60]!r}")
            records.append(rec)
    return records
