"""A Hugging Face GPT-2 folder that lies, and the commands that read one (issue 66): a
config.json that claims a million blocks, JSON nested past Python's recursion, an index whose
weight_map is not a map or leads out of the folder, a tokenizer that is not the model's, and
``npformer sample`` printing its text as the tokens come. Every refusal is one ValueError naming
the file, in well under a second.

The folders are made here, without torch: an npformer GPT's weights written under GPT-2's names
with safetensors' NumPy API, and a small byte-level BPE tokenizer.json."""
import json
import time

import numpy as np
import pytest

import npformer as nf
from npformer.cli.main import main
from npformer.families import get as family, tensor_names

tokenizers = pytest.importorskip("tokenizers", reason="extra hf: pip install 'npformer[hf]'")
pytest.importorskip("safetensors", reason="extra hf: pip install 'npformer[hf]'")

TEXT = ["the quick brown fox jumps over the lazy dog", "hello world, hello npformer",
        "größer als 日本語 und café crème",
        "a man in an orange hat starring at something ."] * 10


def make_tokenizer(vocab_size=300):
    """A byte-level BPE with an <|endoftext|> token (GPT-2's kind), trained on TEXT."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def word_tokenizer(words):
    """A tokenizer of ``words`` alone (ids 0, 1, ...)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def gpt2_tensors(model):
    """{GPT-2 name: array} of an npformer GPT (the Conv1D weights stored transposed)."""
    state = model.state_dict()
    return {theirs: np.ascontiguousarray(state[ours].T if transposed else state[ours])
            for theirs, (ours, _, transposed) in tensor_names(family("gpt2"),
                                                              model.config).items()}


def make_folder(path, tokenizer=None, vocab_size=None, n_layer=1, d_model=8, n_head=2,
                n_positions=16, tie=True, shards=False, seed=0):
    """A GPT-2 folder: config.json, model.safetensors (or two shards and their index, with
    ``shards``) and tokenizer.json. ``vocab_size``: the model's, by default the tokenizer's."""
    from safetensors.numpy import save_file
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer() if tokenizer is None else tokenizer
    vocab = tokenizer.get_vocab_size() if vocab_size is None else vocab_size
    eos = tokenizer.token_to_id("<|endoftext|>")
    model = nf.GPT(vocab, d_model=d_model, n_heads=n_head, d_ff=4 * d_model, n_layers=n_layer,
                   max_len=n_positions, tie_embeddings=tie, seed=seed)
    config = {"model_type": "gpt2", "vocab_size": vocab, "n_embd": d_model, "n_head": n_head,
              "n_layer": n_layer, "n_positions": n_positions, "tie_word_embeddings": tie,
              "activation_function": "gelu_new", "resid_pdrop": 0.1, "embd_pdrop": 0.1,
              "attn_pdrop": 0.1, "layer_norm_epsilon": 1e-5}
    if eos is not None and eos < vocab:
        config["eos_token_id"] = eos
    (path / "config.json").write_text(json.dumps(config))
    tensors = gpt2_tensors(model)
    if shards:
        names = sorted(tensors)
        parts = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
                 "model-00002-of-00002.safetensors": names[len(names) // 2:]}
        for file, part in parts.items():
            save_file({k: tensors[k] for k in part}, str(path / file))
        (path / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {}, "weight_map": {k: f for f, part in parts.items() for k in part}}))
    else:
        save_file(tensors, str(path / "model.safetensors"))
    tokenizer.save(str(path / "tokenizer.json"))
    return model


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2") / "tiny"
    make_folder(path)
    return path


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def one_line(capsys, *parts):
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for part in parts:
        assert part in lines[0], (part, lines[0])
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


def lm_argv(tmp_path, init_from):
    data = tmp_path / "text.txt"
    data.write_text("\n".join(TEXT) + "\n", encoding="utf-8")
    return ["lm", "--data", str(data), "--init-from", str(init_from), "--out",
            str(tmp_path / "run"), "--context", "8", "--batch-size", "2", "--max-steps", "1",
            "--quiet"]


def test_the_folder_made_here_loads_and_samples(folder, capsys):
    model = nf.GPT.from_pretrained(folder)
    assert model.config.n_layers == 1 and model.eos_id is not None
    assert main(["sample", "--hf", str(folder), "--prompt", "hello", "--max-new-tokens", "3",
                 "--greedy"]) == 0
    assert capsys.readouterr().out.startswith("hello")


# -- defect 1: config.json's n_layer is counted against the headers before anything is listed --

@pytest.mark.parametrize("n_layer", [10**6, 10**9])
def test_a_lying_n_layer_is_refused_at_once(folder, tmp_path, capsys, n_layer):
    import shutil
    path = tmp_path / "liar"
    shutil.copytree(folder, path)
    edit_config(path, n_layer=n_layer)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=rf"config\.json: n_layer: {n_layer} blocks, but "
                                         rf".*model\.safetensors holds tensors of 1 "):
        nf.GPT.from_pretrained(path)
    assert main(["sample", "--hf", str(path), "--prompt", "x"]) == 1
    one_line(capsys, "config.json", "n_layer")
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("n_embd", [10**6, 10**9])
def test_a_lying_width_is_refused_naming_the_file(folder, tmp_path, capsys, n_embd):
    """A width no machine holds is refused by the size check, naming config.json, before the
    parameters' shapes are listed (10**9 made NumPy itself refuse them: "array is too big")."""
    import shutil
    path = tmp_path / "wide"
    shutil.copytree(folder, path)
    edit_config(path, n_embd=n_embd)
    with pytest.raises(ValueError, match=r"config\.json: .*a model this size"):
        nf.GPT.from_pretrained(path)
    assert main(["sample", "--hf", str(path), "--prompt", "x"]) == 1
    one_line(capsys, "config.json", "a model this size")


def test_fewer_layers_than_the_files_hold_are_named_as_unexpected(tmp_path):
    path = tmp_path / "two"
    make_folder(path, n_layer=2)
    edit_config(path, n_layer=1)
    with pytest.raises(ValueError, match=r"unexpected \['h\.1\.attn\.c_attn\.bias'"):
        nf.GPT.from_pretrained(path)


# -- defect 7: malformed JSON, an index that is no map or leads out of the folder ---------------

def test_deeply_nested_config_json_is_one_error_naming_it(folder, tmp_path, capsys):
    import shutil
    path = tmp_path / "nested"
    shutil.copytree(folder, path)
    (path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"config\.json: not a JSON file npformer can read "
                                         r"\(nested too deeply\)"):
        nf.GPT.from_pretrained(path)
    assert main(["sample", "--hf", str(path), "--prompt", "x"]) == 1
    one_line(capsys, f"{path / 'config.json'}: not a JSON file")
    assert main(lm_argv(tmp_path, path)) == 1
    one_line(capsys, f"{path / 'config.json'}: not a JSON file")


@pytest.mark.parametrize("content", ["1" * 5000, '{"n_layer": ' + "9" * 5000 + "}"],
                         ids=["a number", "a field"])
def test_a_number_python_cannot_read_names_the_file(folder, tmp_path, content):
    import shutil
    path = tmp_path / "digits"
    shutil.copytree(folder, path)
    (path / "config.json").write_text(content)
    with pytest.raises(ValueError, match=r"config\.json: not a JSON file npformer can read"):
        nf.GPT.from_pretrained(path)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2") / "sharded"
    make_folder(path, shards=True)
    return path


def test_a_sharded_folder_loads(sharded, folder):
    np.testing.assert_array_equal(nf.GPT.from_pretrained(sharded).flat_params,
                                  nf.GPT.from_pretrained(folder).flat_params)


def edit_index(path, change):
    index = path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    index.write_text(json.dumps(change(data)))


@pytest.mark.parametrize("change,match", [
    (lambda d: {**d, "weight_map": list(d["weight_map"])},
     r"expected a JSON object whose weight_map maps tensor names to shard files, got a "
     r"weight_map of type list"),
    (lambda d: [d], r"got a JSON list"),
    (lambda d: {}, r"got no weight_map"),
    (lambda d: {**d, "weight_map": {}}, r"its weight_map maps no tensor to a shard file"),
    (lambda d: {"weight_map": {**d["weight_map"], "wte.weight": 3}},
     r"weight_map\['wte\.weight'\]: expected a shard file name, got 3"),
    (lambda d: {"weight_map": {**d["weight_map"], "wte.weight": ["a"]}},
     r"weight_map\['wte\.weight'\]: expected a shard file name, got \['a'\]"),
    (lambda d: {"weight_map": {**d["weight_map"], "wte.weight": "../outside.safetensors"}},
     r"weight_map\['wte\.weight'\]: '\.\./outside\.safetensors' leads out of the model folder"),
    (lambda d: {"weight_map": {**d["weight_map"], "wte.weight": "/etc/passwd"}},
     r"'/etc/passwd' leads out of the model folder"),
])
def test_a_bad_index_is_one_error_naming_it(sharded, tmp_path, capsys, change, match):
    import shutil
    path = tmp_path / "index"
    shutil.copytree(sharded, path)
    edit_index(path, change)
    with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json: (.*)?" + match):
        nf.GPT.from_pretrained(path)
    assert main(["sample", "--hf", str(path), "--prompt", "x"]) == 1
    one_line(capsys, "model.safetensors.index.json: ")
    assert main(lm_argv(tmp_path, path)) == 1
    one_line(capsys, "model.safetensors.index.json: ")


def test_an_index_outside_the_folder_is_not_read(sharded, tmp_path):
    """The index names a shard beside the folder, a readable safetensors file: refused by
    name, not read."""
    import shutil
    path = tmp_path / "inside"
    shutil.copytree(sharded, path)
    shutil.copy(path / "model-00001-of-00002.safetensors", tmp_path / "stolen.safetensors")
    edit_index(path, lambda d: {"weight_map": {k: "../stolen.safetensors" if
                                               v.startswith("model-00001") else v
                                               for k, v in d["weight_map"].items()}})
    with pytest.raises(ValueError, match="leads out of the model folder"):
        nf.GPT.from_pretrained(path)


# -- defect 5: the tokenizer must be the model's ------------------------------------------------

def test_a_tokenizer_with_ids_past_the_embedding_is_refused_naming_both_files(tmp_path, capsys):
    path = tmp_path / "short"
    tok = make_tokenizer()
    make_folder(path, tokenizer=tok, vocab_size=tok.get_vocab_size() - 20)
    top = tok.get_vocab_size() - 1
    for run in (lambda: main(["sample", "--hf", str(path), "--prompt", "the"]),
                lambda: main(lm_argv(tmp_path, path))):
        assert run() == 1
        one_line(capsys, f"{path / 'tokenizer.json'}: has token ids up to {top}",
                 f"{path / 'config.json'} gives the model {top + 1 - 20} embedding rows")


def test_a_tokenizer_far_smaller_than_the_embedding_is_refused(tmp_path, capsys):
    path = tmp_path / "three"
    make_folder(path, tokenizer=word_tokenizer(["[UNK]", "a", "b"]), vocab_size=300)
    for run in (lambda: main(["sample", "--hf", str(path), "--prompt", "a b"]),
                lambda: main(lm_argv(tmp_path, path))):
        assert run() == 1
        one_line(capsys, f"{path / 'tokenizer.json'}: 3 tokens, but {path / 'config.json'} "
                         f"gives the model 300 embedding rows")
    assert not (tmp_path / "run").exists()


def test_an_embedding_padded_past_its_tokenizer_is_normal(tmp_path, capsys):
    """As Qwen2.5's 151,665 tokens in 151,936 rows: a few rows no token reads are accepted."""
    path = tmp_path / "padded"
    tok = make_tokenizer()
    make_folder(path, tokenizer=tok, vocab_size=tok.get_vocab_size() + 20)
    assert main(["sample", "--hf", str(path), "--prompt", "the", "--max-new-tokens", "2",
                 "--greedy"]) == 0


def test_the_library_refuses_a_tokenizer_that_is_not_the_models(folder):
    from npformer.hf import TextTokenizer
    from npformer.training.language_model import LanguageModelTask
    tokenizer = TextTokenizer(folder)
    ids = tokenizer.encode(" ".join(TEXT))
    task = LanguageModelTask(ids[:100], ids[100:140], context=8, tokenizer=tokenizer)
    small = nf.GPT(len(tokenizer) - 1, d_model=8, n_heads=2, d_ff=8, n_layers=1, max_len=8)
    with pytest.raises(ValueError, match=r"tokenizer\.json: has token ids up to \d+, but the "
                                         r"model's configuration gives"):
        task.check_model(small)
    with pytest.raises(ValueError, match=r"tokenizer\.json: \d+ tokens, but the model's "
                                         r"configuration gives the model 1000 embedding rows"):
        task.check_model(nf.GPT(1000, d_model=8, n_heads=2, d_ff=8, n_layers=1, max_len=8))
    task.check_model(nf.GPT(len(tokenizer), d_model=8, n_heads=2, d_ff=8, n_layers=1, max_len=8))


def test_a_checkpoint_with_another_models_tokenizer_beside_it_is_refused(tmp_path, capsys):
    from npformer.training.checkpointing import save_model_checkpoint
    model = nf.GPT(300, d_model=8, n_heads=2, d_ff=8, n_layers=1, max_len=8)
    save_model_checkpoint(tmp_path / "best", model, None)
    word_tokenizer(["[UNK]", "a", "b"]).save(str(tmp_path / "tokenizer.json"))
    assert main(["sample", "--checkpoint", str(tmp_path / "best"), "--prompt", "a"]) == 1
    one_line(capsys, f"{tmp_path / 'tokenizer.json'}: 3 tokens, but checkpoint "
                     f"{tmp_path / 'best'}")


# -- the smaller ones: what the messages name ----------------------------------------------------

@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_hf_given_a_file_says_a_folder_was_expected(folder, capsys, name):
    assert main(["sample", "--hf", str(folder / name), "--prompt", "x"]) == 1
    one_line(capsys, f"{folder / name}: expected a Hugging Face model folder", "got a file")


def test_an_eos_token_id_past_the_vocabulary_is_one_warning_naming_config_json(folder, tmp_path,
                                                                              capsys):
    """Issue 77: the folder loads, as in transformers (the end id matters only to
    generation), with one warning; sampling runs to its length limit."""
    import shutil
    path = tmp_path / "eos"
    shutil.copytree(folder, path)
    edit_config(path, eos_token_id=10**6)
    assert main(["sample", "--hf", str(path), "--prompt", "x", "--max-new-tokens", "3"]) == 0
    warning = one_line(capsys, f"{path / 'config.json'}: eos_token_id: 1000000 cannot be "
                               f"produced by a model of vocab_size=", "length limit")
    assert warning.startswith("warning: ")
    edit_config(path, eos_token_id=-1)
    assert main(["sample", "--hf", str(path), "--prompt", "x"]) == 1
    one_line(capsys, f"{path / 'config.json'}: eos_token_id: expected", "got -1")


def test_a_folder_whose_name_is_not_utf8_loads(folder, tmp_path, capsys):
    """Issue 77: such a folder was refused as "tokenizer.json: not a tokenizers file" (the
    tokenizers library takes a path only as UTF-8). npformer reads the file itself, so the
    folder samples; lm refuses it as --init-from before training (a run records its base by
    name, as text), naming the folder."""
    import os
    import shutil
    path = tmp_path / os.fsdecode(b"caf\xe9")
    try:
        shutil.copytree(folder, path)
    except (OSError, UnicodeError):
        pytest.skip("this file system refuses names that are not UTF-8")
    assert len(nf.hf.TextTokenizer(path)) == len(nf.hf.TextTokenizer(folder))
    assert main(["sample", "--hf", str(path), "--prompt", "hello", "--max-new-tokens", "3",
                 "--greedy"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("hello") and not err
    assert main(lm_argv(tmp_path, path)) == 1
    one_line(capsys, "init_from", "caf\\udce9", "its name is not UTF-8 text")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("key,value,message", [
    ("n_embd", "8", "n_embd: expected a positive integer, got '8'"),
    ("vocab_size", -1, "vocab_size: expected a positive integer, got -1"),
    ("n_head", 3, "d_model: expected a multiple of n_heads=3, got 8"),
])
def test_config_json_errors_name_the_file_once(folder, tmp_path, key, value, message):
    import shutil
    path = tmp_path / "once"
    shutil.copytree(folder, path)
    edit_config(path, **{key: value})
    with pytest.raises(ValueError) as info:
        nf.GPT.from_pretrained(path)
    assert str(info.value) == f"{path / 'config.json'}: {message}"


def test_an_out_of_memory_lm_suggests_lms_own_options(monkeypatch, capsys):
    from npformer.cli import lm

    def run(args):
        raise MemoryError("Unable to allocate 9.00 TiB for an array")
    monkeypatch.setattr(lm, "run", run)
    assert main(["lm", "--data", "x.txt", "--out", "run"]) == 1
    line = one_line(capsys, "npformer lm: error: out of memory: Unable to allocate", "--layers",
                    "--context")
    assert "--max-len" not in line and "--beam" not in line


# -- defect 6 (sample's half): the text is printed as the tokens come ----------------------------

class Recorder:
    """A stdout that notes, for every write, how many decoding steps had run."""

    def __init__(self, steps):
        self.steps, self.writes = steps, []

    def write(self, text):
        self.writes.append((self.steps[0], text))

    def flush(self):
        pass

    def text(self):
        return "".join(text for _, text in self.writes)


@pytest.mark.parametrize("method", [["--greedy"], ["--seed", "1", "--temperature", "3"]])
def test_sample_prints_each_token_as_it_comes(folder, monkeypatch, method):
    """(The untrained model's greedy choice is one byte over and over, which is no character:
    it waits for the end. Its samples are written as they come.)"""
    import sys

    from npformer.decoding.search import greedy_search, sample_search
    from npformer.hf import TextTokenizer
    from npformer.nn.gpt import LanguageModelState
    steps = [0]
    step = LanguageModelState.step

    def counted(self, tokens):
        steps[0] += 1
        return step(self, tokens)
    monkeypatch.setattr(LanguageModelState, "step", counted)
    out = Recorder(steps)
    monkeypatch.setattr(sys, "stdout", out)
    prompt = "größer hello 日本"
    assert main(["sample", "--hf", str(folder), "--prompt", prompt, "--max-new-tokens", "40",
                 *method]) == 0
    monkeypatch.undo()
    # the same text as one decode of everything, written at many steps (not all at the end)
    model, tokenizer = nf.GPT.from_pretrained(folder), TextTokenizer(folder)
    ids = [int(i) for i in tokenizer.encode(prompt)]
    state = model.decoder_state(np.array([ids]), eos_id=model.eos_id, slide=True)
    hyp, = (greedy_search(state, 40) if method == ["--greedy"] else
            sample_search(state, temperature=3.0, rng=np.random.default_rng(1),
                          max_new_tokens=40))
    assert out.text() == tokenizer.decode(ids + hyp.ids) + "\n"
    assert len(hyp.ids) >= 10
    written_at = {n for n, text in out.writes if text}
    assert min(written_at) == 0                       # the prompt, before the first step
    if method != ["--greedy"]:
        assert len(written_at) >= 10, out.writes


def test_the_stream_joins_into_the_decode_of_split_characters():
    """Byte-level tokens that each hold part of a character (as a model may draw them): the
    pieces wait for the character and join into the whole decode."""
    import io

    from npformer.cli.sample import TextStream
    from npformer.hf import TextTokenizer
    tok = make_tokenizer()
    tokenizer = TextTokenizer.__new__(TextTokenizer)
    tokenizer.tokenizer = tok
    rng = np.random.default_rng(0)
    byte_ids = [tok.token_to_id(c) for c in "ĠæĹ¥Ã¶"]     # GPT-2's byte alphabet
    for trial in range(20):
        ids = list(rng.integers(0, tok.get_vocab_size(), 30)) + list(rng.choice(byte_ids, 10))
        rng.shuffle(ids)
        prompt = tokenizer.encode("日本 hello")
        out = io.StringIO()
        stream = TextStream(tokenizer, prompt, out)
        for i in ids:
            stream.add(i)
        stream.finish()
        assert out.getvalue() == tokenizer.decode(list(prompt) + ids) + "\n"
