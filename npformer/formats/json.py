"""Small JSON files (config.json, an index, adapter_config.json) read within bounds, and their
fields read by name: every error names the file (and the key)."""
import json
from pathlib import Path

MAX_JSON_BYTES = 16 << 20   # config.json and the index: a few KB in practice, refused past this


def short(value):
    """repr of a value from a file, cut to a readable length."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class DuplicateKey(ValueError):
    pass


def unique_keys(pairs):
    """A JSON object as a dict, refusing a key given twice (Python's json keeps the last
    silently: an index naming one tensor in two shards would load either)."""
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise DuplicateKey(f"{short(key)} appears twice in one JSON object (which one "
                               f"is meant?)")
        obj[key] = value
    return obj


def read_json(file):
    """The JSON value a small file holds (config.json, an index); ValueError naming the file for
    anything else: too large, not UTF-8, not JSON, nested too deeply for Python to read, a
    number it cannot hold (an integer of thousands of digits), or an object giving one key
    twice."""
    try:
        size = file.stat().st_size
        if size > MAX_JSON_BYTES:
            raise ValueError(f"{file}: {size:,} bytes, more than the {MAX_JSON_BYTES:,} a "
                             f"Hugging Face JSON file needs; not a model's file")
        return json.loads(file.read_bytes().decode("utf-8"), object_pairs_hook=unique_keys)
    except RecursionError:
        raise ValueError(f"{file}: not a JSON file npformer can read (nested too deeply)") from None
    except DuplicateKey as e:
        raise ValueError(f"{file}: {e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{file}: not a JSON file ({e})") from None
    except ValueError as e:
        if str(e).startswith(f"{file}:"):
            raise
        raise ValueError(f"{file}: not a JSON file npformer can read ({e})") from None


def read_json_object(folder, name, missing):
    """(the Path of ``folder / name``, the JSON object it holds). ValueError naming the folder
    where the file is absent (``missing`` says what the folder was expected to be), or the file
    where it holds no JSON object."""
    file = Path(folder) / name
    if not file.is_file():
        raise ValueError(f"{folder}: no {name} ({missing})")
    raw = read_json(file)
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: expected a JSON object, got {type(raw).__name__}")
    return file, raw


def field_reader(file, raw):
    """``field(name, check, default=None, **bounds)``: the JSON object ``raw``'s ``name``
    through ``check`` (a missing key takes ``default``; without one it is refused); the error
    names the file and the key."""
    def field(name, check, default=None, **bounds):
        if name not in raw and default is None:
            raise ValueError(f"{file}: {name}: missing")
        try:
            return check(name, raw.get(name, default), **bounds)
        except ValueError as e:
            raise ValueError(f"{file}: {e}") from None
    return field
