"""The JSON-lines metrics log every training run writes (``metrics.jsonl``)."""
import json
import math
import os
import time


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


def json_lines(path, keys):
    """The objects of a JSON-lines file (blank lines skipped), each holding ``keys``; a
    ValueError naming the file and line where one is not so."""
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{os.fspath(path)}:{n}: expected one JSON object per line ({e})") from None
            if not isinstance(rec, dict) or any(k not in rec for k in keys):
                raise ValueError(f"{os.fspath(path)}:{n}: expected an object with the keys "
                                 f"{', '.join(keys)}, got {line.strip()[:60]!r}")
            records.append(rec)
    return records


def read_metrics_log(path):
    """List of records of a metrics log; ValueError naming the file and line if one is broken."""
    return json_lines(path, ("event",))
