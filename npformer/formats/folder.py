"""A Hugging Face model folder: ``config.json`` beside the weights and the tokenizer. A pickle
(``pytorch_model.bin``) is never loaded: loading a pickle runs whatever code it holds."""
from pathlib import Path

from .json import read_json, read_json_object, short
from .safetensors import read_header

SAFETENSORS, INDEX, PICKLE = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"


def model_folder(path):
    """``path`` as the Path of a Hugging Face model folder; ValueError saying a folder was
    expected for a file or nothing (a pickle is named as one)."""
    folder = Path(path)
    if folder.is_file() and folder.name == PICKLE:
        raise ValueError(f"{folder}: a pickle (pytorch_model.bin), which npformer never loads; "
                         f"give the folder of a model.safetensors")
    if not folder.is_dir():
        raise ValueError(f"{path}: expected a Hugging Face model folder (config.json, "
                         f"model.safetensors, tokenizer.json), got "
                         f"{'a file' if folder.exists() else 'no such folder'}")
    return folder


def config_json(path):
    """(the Path of a folder's config.json, the JSON object it holds)."""
    return read_json_object(model_folder(path), "config.json",
                            "expected a Hugging Face model folder")


def require(package):
    """The module of ``package``, which reading a part of the Hugging Face format needs;
    ValueError saying how to install it where it is missing."""
    try:
        return __import__(package)
    except ImportError:
        raise ValueError(f"reading the Hugging Face format needs the package {package!r}: "
                         f"pip install \"npformer[hf]\"") from None


def tensor_files(folder):
    """{tensor name: safetensors file} of the folder (one file, or shards with an index)."""
    single, index = folder / SAFETENSORS, folder / INDEX
    if single.is_file():
        return None, single
    if index.is_file():
        return shard_map(folder, index), index
    if (folder / PICKLE).is_file():
        raise ValueError(f"{folder}: holds only pytorch_model.bin, a pickle, which npformer never "
                         f"loads (it can run any code); use the model's model.safetensors "
                         f"(the Hugging Face hub offers it for gpt2)")
    raise ValueError(f"{folder}: no {SAFETENSORS} (expected a Hugging Face model folder)")


def shard_map(folder, index):
    """{tensor name: shard file} of an index's ``weight_map`` (at least one): every shard a
    relative file name inside the model folder (no absolute path, no ``..``). A shard that is a symbolic link is
    followed, as the folder's other files are: the Hugging Face cache's snapshot folders link
    every file to its blob outside them."""
    raw = read_json(index)
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict):
        got = (f"a JSON {type(raw).__name__}" if not isinstance(raw, dict) else
               "no weight_map" if "weight_map" not in raw else
               f"a weight_map of type {type(weight_map).__name__}")
        raise ValueError(f"{index}: expected a JSON object whose weight_map maps tensor names "
                         f"to shard files, got {got}")
    if not weight_map:
        raise ValueError(f"{index}: its weight_map maps no tensor to a shard file (it is {{}}); "
                         f"expected the model's tensor names")
    shards, files = {}, {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise ValueError(f"{index}: weight_map[{short(name)}]: expected a shard file "
                             f"name, got {short(shard)}")
        if shard not in files:
            path = Path(shard)
            if path.is_absolute() or ".." in path.parts:
                raise ValueError(f"{index}: weight_map[{short(name)}]: {short(shard)} leads "
                                 f"out of the model folder {folder}; expected a file inside it")
            files[shard] = folder / path
            if not files[shard].is_file():
                raise ValueError(f"{index}: weight_map[{short(name)}]: names {short(shard)}, "
                                 f"which is not a file of {folder}")
        shards[name] = files[shard]
    return shards


def stored_tensors(folder):
    """({tensor name: StoredTensor} of the folder's safetensors files, what to name in an
    error: model.safetensors or the index), the headers alone read. A sharded folder's index
    and shards must agree: every tensor in exactly one shard, the one the index names."""
    shard_map, where = tensor_files(folder)
    files = list(dict.fromkeys(shard_map.values())) if shard_map else [where]
    found = {}
    for file in files:
        for name, tensor in read_header(file).items():
            if name in found:
                raise ValueError(f"{file}: holds {short(name)}, which {found[name].file.name} "
                                 f"holds too; which is meant?")
            if shard_map is not None and shard_map.get(name) != file:
                raise ValueError(f"{where}: weight_map[{short(name)}]: expected {file.name}, "
                                 f"which holds it, got {short(shard_map.get(name))}")
            found[name] = tensor
    if shard_map is not None:
        for name, file in shard_map.items():
            if name not in found:
                raise ValueError(f"{where}: weight_map[{short(name)}]: {file.name} does not "
                                 f"hold it")
    return found, where
