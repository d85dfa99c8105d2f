"""safetensors files without the safetensors package: read through the header (every claim
checked against the file before a byte of data is read), tensor by tensor in chunks, float32,
float16, bfloat16 (float32's upper 16 bits, widened exactly) and float64; and written
atomically, float32, float64 or bfloat16 (rounded to nearest even)."""
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..checkpoint import write_file_atomic
from .json import short, unique_keys

# safetensors' dtype names -> the NumPy dtype their bytes are read as (bfloat16: as uint16, then
# widened: a bfloat16 is the upper 16 bits of a float32)
FLOAT_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16}
ITEMSIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
             "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
MAX_HEADER_BYTES = 100 << 20           # the format's own limit
CHUNK = 1 << 20                        # elements converted at a time


class StoredTensor(NamedTuple):
    file: Path
    dtype: str                         # safetensors' name: "F32", "BF16", ...
    shape: tuple
    start: int                         # byte offset of its data in the file


def _counts(value, length=None):
    """Whether a header's value is a list of non-negative ints (of ``length`` items)."""
    return (isinstance(value, list) and (length is None or len(value) == length) and
            all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value))


def read_header(file):
    """{tensor name: StoredTensor} of a safetensors file, from its header alone (8 bytes of
    length, then JSON). Every entry is checked against the file: a known dtype, a shape of
    non-negative ints, data offsets inside the file that span exactly shape x itemsize bytes.
    ValueError naming the file (and the tensor) otherwise."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else None
            if n is None or n > min(MAX_HEADER_BYTES, size - 8):
                raise ValueError(f"{file}: not a safetensors file (its first 8 bytes give a "
                                 f"header of {n} bytes; the file has {size})")
            text = f.read(n)
    except OSError as e:
        raise ValueError(f"{file}: cannot be read ({e.strerror or e})") from None
    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=unique_keys)
    except (RecursionError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{file}: not a safetensors file (its header is not a JSON object "
                         f"npformer can read: {str(e) or 'nested too deeply'})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file}: not a safetensors file (its header is a JSON "
                         f"{type(header).__name__}, not an object)")
    base, data_bytes = 8 + n, size - 8 - n
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not isinstance(dtype, str) or dtype not in ITEMSIZES or not _counts(shape) or \
                not _counts(offsets, 2):
            raise ValueError(f"{file}: {short(name)}: expected a dtype, a shape and two data "
                             f"offsets, got {short(entry)}")
        begin, end = offsets
        need = int(np.prod(shape, dtype=object)) * ITEMSIZES[dtype]
        if not begin <= end <= data_bytes or end - begin != need:
            raise ValueError(f"{file}: {short(name)}: its data offsets {offsets} do not hold "
                             f"a {dtype} tensor of shape {tuple(shape)} ({need} bytes) inside "
                             f"the file's {data_bytes} bytes of data")
        tensors[name] = StoredTensor(file, dtype, tuple(shape), base + begin)
    return tensors


def chunks(tensor, name):
    """(offset, float array) chunks of a stored tensor's values, flat, read from its file a
    chunk at a time (``CHUNK`` elements into one reused buffer: each chunk is valid until the
    next is read) and widened to float32 where stored as bfloat16; ValueError for a dtype that
    is not floating point. Read, not memory-mapped: a mapped file's pages stay in the process's
    memory as long as the map, read ones are the page cache's."""
    if tensor.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{tensor.file}: {name}: expected floating-point weights (F32, F16, "
                         f"BF16, F64), got {tensor.dtype}")
    count = int(np.prod(tensor.shape))
    if count == 0:
        return
    buffer = np.empty(min(count, CHUNK), dtype=FLOAT_DTYPES[tensor.dtype])
    with open(tensor.file, "rb") as f:
        f.seek(tensor.start)
        for i in range(0, count, CHUNK):
            part = buffer[:min(CHUNK, count - i)]
            if f.readinto(memoryview(part).cast("B")) != part.nbytes:   # the header said so
                raise ValueError(f"{tensor.file}: {name}: the file ends inside the tensor")
            if tensor.dtype == "BF16":
                part = (part.astype(np.uint32) << 16).view(np.float32)      # exact
            yield i, part


def copy_into(tensor, name, dest):
    """A stored tensor's values into ``dest`` (a contiguous view of a parameter), a chunk at a
    time; ValueError naming the file and the tensor for a value that is not finite in dest's
    dtype."""
    flat = dest.reshape(-1)
    assert np.shares_memory(flat, dest), "a parameter's rows must be one contiguous block"
    for i, part in chunks(tensor, name):
        out = flat[i:i + len(part)]
        with np.errstate(over="ignore", invalid="ignore"):    # refused just below
            out[...] = part
        if not np.isfinite(out).all():
            bad = int(np.flatnonzero(~np.isfinite(out))[0])
            raise ValueError(f"{tensor.file}: {name}: expected finite weights (in "
                             f"{flat.dtype}), got {float(part[bad])} at flat index {i + bad}")


def read_tensor(tensor, name, dtype):
    """A stored tensor (:func:`read_header`'s) as a new array of ``dtype`` and its shape, read a
    chunk at a time as the model's weights are (:func:`copy_into`: bfloat16 and float16
    widened exactly); ValueError naming the file and ``name`` for a dtype that is not floating
    point or a value that is not finite in ``dtype``."""
    out = np.empty(tensor.shape, dtype)
    copy_into(tensor, name, out)
    return out


SAFETENSORS_DTYPES = {"float32": "F32", "float64": "F64", "bfloat16": "BF16"}


def to_bfloat16(x):
    """float32 -> bfloat16 bits (uint16), rounded to nearest even (NaN stays NaN)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = np.uint16(0x7FC0)
    return rounded


def write_safetensors(path, tensors, dtype=None):
    """One safetensors file of ``tensors`` ({name: array}), atomically: F32 or F64 as they are,
    or all as ``dtype`` ("float32", "bfloat16"). Header metadata {"format": "pt"}, as
    transformers writes it."""
    entries, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        if dtype == "bfloat16":
            data, code = to_bfloat16(value), "BF16"
        else:
            arr = np.asarray(value, dtype=np.float32 if dtype == "float32" else None)
            code = SAFETENSORS_DTYPES.get(arr.dtype.name)
            if code is None:
                raise ValueError(f"{name}: cannot store a {arr.dtype} tensor")
            data = np.ascontiguousarray(arr)
        raw = data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes()
        entries[name] = {"dtype": code, "shape": list(np.shape(value)),
                         "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header = json.dumps({"__metadata__": {"format": "pt"}, **entries},
                        separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)

    def write(f):
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for raw in blobs:
            f.write(raw)
    write_file_atomic(Path(path), write)
