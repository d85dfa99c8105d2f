"""Export to CTranslate2: the exported model computes npformer's log-probabilities (within
1e-5 per token) and greedy output (the same tokens), through the library and the CLI; what the
spec cannot hold, and every bad folder, is refused with a clear error."""
import json
import shutil

import numpy as np
import pytest

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 not installed "
                                  "(pip install 'npformer[ctranslate2]')")

import npformer as nf  # noqa: E402
from npformer import functional as F  # noqa: E402
from npformer.ct2 import META_FILE, _meta_digest, export_ctranslate2, load_exported  # noqa: E402
from npformer.cli.main import main  # noqa: E402
from npformer.data.vocab import Vocab, Vocabularies  # noqa: E402
from npformer.decoding.translator import Translator  # noqa: E402
from npformer.training.checkpointing import load_model_checkpoint, save_model_checkpoint  # noqa: E402

V_SRC, V_TGT = 17, 13

VARIANTS = {
    "post-norm relu": dict(),
    "pre-norm gelu": dict(norm_first=True, activation="gelu"),
    "post-norm gelu_tanh": dict(activation="gelu_tanh"),
    "tied output": dict(tie_embeddings=True),
    "all embeddings shared": dict(share_all_embeddings=True, tie_embeddings=True),
    "all shared, no generator bias": dict(share_all_embeddings=True, generator_bias=False),
}
# the greedy test raises <eos> through the generator's bias
BIASED = [name for name, kw in VARIANTS.items() if kw.get("generator_bias", True)]


def vocab(n, prefix):
    return Vocab(list(Vocab.SPECIALS) + [f"{prefix}{i}" for i in range(4, n)])


def vocab_pair(joint=False):
    return (Vocabularies.joint(vocab(V_TGT, "t")) if joint
            else Vocabularies(vocab(V_SRC, "s"), vocab(V_TGT, "t")))


def make_checkpoint(tmp_path, name="model", seed=0, eos_bias=0.0, **kw):
    joint = kw.get("share_all_embeddings", False)
    v_src = V_TGT if joint else V_SRC
    vocabs = vocab_pair(joint)
    model = nf.Transformer(v_src, V_TGT, d_model=16, n_heads=4, d_ff=24, n_encoder_layers=2,
                           n_decoder_layers=2, dropout=0.0, max_len=40, seed=seed, **kw).eval()
    rng = np.random.default_rng(seed)
    for p in model.parameters():                     # larger weights: sharper, varied outputs
        p.data[...] = rng.normal(0, 0.5, p.data.shape)
    if eos_bias:
        model.generator.bias.data[Vocab.eos_id] += eos_bias
    path = tmp_path / name
    save_model_checkpoint(str(path), model, vocabs)
    return load_model_checkpoint(str(path))


def random_sources(rng, vocabs, n, max_len=9):
    words = vocabs.src.tokens[4:]
    return [" ".join(rng.choice(words, size=rng.integers(1, max_len + 1))) for _ in range(n)]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_exported_log_probabilities_equal_npformer(tmp_path, variant):
    loaded = make_checkpoint(tmp_path, **VARIANTS[variant])
    out = export_ctranslate2(loaded, tmp_path / "ct2")
    exported = load_exported(out)
    rng = np.random.default_rng(1)
    model, vocabs = loaded.model, loaded.vocabs
    for _ in range(4):
        src_tokens = random_sources(rng, vocabs, 1)[0].split()
        tgt_ids = list(rng.integers(4, V_TGT, size=rng.integers(1, 8)))
        src = np.array([vocabs.src.encode(src_tokens)])
        tgt_in = np.array([[vocabs.tgt.bos_id] + tgt_ids])
        logp = F.log_softmax(model.forward(src, tgt_in).astype(np.float64))[0]   # (T, V)
        ours = logp[np.arange(len(tgt_ids) + 1), tgt_ids + [vocabs.tgt.eos_id]]
        target = [vocabs.tgt.id_to_token(i) for i in tgt_ids]
        theirs = exported.model.translator.score_batch([src_tokens], [target])[0].log_probs
        np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", BIASED)
def test_exported_greedy_output_equals_npformer(tmp_path, variant):
    """The same tokens, and the same end: random weights run to the state's capacity (CT2's
    max_decoding_length must be npformer's), a raised <eos> bias stops early or at once (CT2's
    min_decoding_length 0)."""
    joint = VARIANTS[variant].get("share_all_embeddings", False)
    sentences = random_sources(np.random.default_rng(2), vocab_pair(joint), 40)
    ends = set()
    for n, eos_bias in enumerate((0.0, 1.5, 10.0)):
        loaded = make_checkpoint(tmp_path, f"m{n}", seed=3, eos_bias=eos_bias, **VARIANTS[variant])
        exported = load_exported(export_ctranslate2(loaded, tmp_path / f"ct2-{n}"))
        ours = Translator(loaded.model, loaded.vocabs, batch_size=16).translate(sentences)
        theirs = exported.translator(str.split, " ".join, batch_size=16).translate(sentences)
        assert [t.tokens for t in theirs] == [t.tokens for t in ours]
        assert [t.finished for t in theirs] == [t.finished for t in ours]
        ends |= {t.finished for t in ours}
    assert ends == {True, False}


def test_int8_export_loads_and_translates(tmp_path):
    """int8 weights give log-probabilities close to the float32 export's, not equal. How close
    depends on CTranslate2's int8 kernels for the CPU (AVX2 and AVX-512 machines round the
    activations differently): held to 0.5 nats, and to well within how far another model's
    float32 log-probabilities lie."""
    loaded = make_checkpoint(tmp_path)
    exported = load_exported(export_ctranslate2(loaded, tmp_path / "ct2", quantization="int8"))
    assert json.loads((tmp_path / "ct2" / META_FILE).read_text())["quantization"] == "int8"
    f32 = load_exported(export_ctranslate2(loaded, tmp_path / "f32"))
    other = load_exported(export_ctranslate2(make_checkpoint(tmp_path, "other", seed=1),
                                             tmp_path / "other-ct2"))
    src, tgt = ["s4", "s5", "s6"], ["t5", "t6", "t7"]
    a, b, c = (np.array(e.model.translator.score_batch([src], [tgt])[0].log_probs)
               for e in (exported, f32, other))
    np.testing.assert_allclose(a, b, atol=0.5)
    assert np.abs(a - b).max() < np.abs(c - b).max() / 3
    assert (a != b).any()


# -- the CLI ----------------------------------------------------------------------------------
def test_cli_export_then_translate_and_eval_with_ctranslate2(tmp_path, capsys):
    loaded = make_checkpoint(tmp_path)
    ckpt, out = tmp_path / "model", tmp_path / "ct2"
    assert main(["export", "--checkpoint", str(ckpt), "--format", "ctranslate2", "--out",
                 str(out)]) == 0
    capsys.readouterr()
    sentences = random_sources(np.random.default_rng(5), loaded.vocabs, 12)
    src = tmp_path / "src.txt"
    src.write_text("\n".join(sentences) + "\n")
    assert main(["translate", "--checkpoint", str(ckpt), "--input", str(src)]) == 0
    ours = capsys.readouterr().out
    assert main(["translate", "--engine", "ctranslate2", "--checkpoint", str(out), "--input",
                 str(src)]) == 0
    assert capsys.readouterr().out == ours
    ref = tmp_path / "ref.txt"
    ref.write_text(ours)
    assert main(["eval", "--engine", "ctranslate2", "--checkpoint", str(out), "--src", str(src),
                 "--ref", str(ref), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["exact_match"] == 1.0


@pytest.mark.parametrize("option", [["--sample", "--seed", "0"], ["--trace"]])
def test_sampling_and_trace_are_refused_by_the_ctranslate2_engine(tmp_path, capsys, option):
    make_checkpoint(tmp_path)
    out = tmp_path / "ct2"
    main(["export", "--checkpoint", str(tmp_path / "model"), "--format", "ctranslate2", "--out",
          str(out)])
    capsys.readouterr()
    err = _cli_error(capsys, ["translate", "--engine", "ctranslate2", "--checkpoint", str(out),
                              *option, "s4 s5"])
    assert option[0] in err and "npformer engine" in err
    with pytest.raises(ValueError, match="method 'sample'"):      # the library refuses it too
        load_exported(out).translator(str.split, " ".join).translate(["s4"], method="sample")


def _cli_error(capsys, argv):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_export_refuses_what_ctranslate2_cannot_hold(tmp_path, capsys):
    make_checkpoint(tmp_path, name="qk", qk_dim=8)
    err = _cli_error(capsys, ["export", "--checkpoint", str(tmp_path / "qk"), "--format",
                              "ctranslate2", "--out", str(tmp_path / "ct2")])
    assert "qk_dim=8" in err and not (tmp_path / "ct2").exists()
    gpt = nf.GPT(V_TGT, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_len=16)
    save_model_checkpoint(str(tmp_path / "gpt"), gpt, None)
    err = _cli_error(capsys, ["export", "--checkpoint", str(tmp_path / "gpt"), "--format",
                              "ctranslate2", "--out", str(tmp_path / "ct2")])
    assert "encoder-decoder" in err and "'gpt'" in err


def test_export_never_overwrites_by_accident(tmp_path, capsys):
    make_checkpoint(tmp_path)
    ckpt, out = str(tmp_path / "model"), tmp_path / "ct2"
    argv = ["export", "--checkpoint", ckpt, "--format", "ctranslate2", "--out", str(out)]
    assert main(argv) == 0
    stamp = (out / "model.bin").stat().st_mtime_ns
    err = _cli_error(capsys, argv)
    assert "already exists" in err and "--overwrite" in err
    assert (out / "model.bin").stat().st_mtime_ns == stamp
    assert main(argv + ["--overwrite"]) == 0                       # an earlier export: replaced
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    err = _cli_error(capsys, argv[:-1] + [str(other), "--overwrite"])
    assert "not an npformer CTranslate2 export" in err
    assert (other / "keep.txt").read_text() == "mine"
    err = _cli_error(capsys, argv[:-1] + [str(tmp_path), "--overwrite"])   # holds the checkpoint
    assert "holds the input" in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_interrupted_export_leaves_nothing(tmp_path, monkeypatch):
    loaded = make_checkpoint(tmp_path)
    from ctranslate2.specs import model_spec

    def crash(self, output_dir):
        (tmp_path / "seen").write_text(output_dir)
        raise KeyboardInterrupt
    monkeypatch.setattr(model_spec.ModelSpec, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        export_ctranslate2(loaded, tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "model.npz", "seen"]


def test_engine_refuses_folders_that_are_not_exports(tmp_path, capsys):
    loaded = make_checkpoint(tmp_path)
    err = _cli_error(capsys, ["translate", "--engine", "ctranslate2", "--checkpoint",
                              str(tmp_path / "model"), "s4"])
    assert "expected a CTranslate2 model folder" in err
    out = export_ctranslate2(loaded, tmp_path / "ct2")
    err = _cli_error(capsys, ["translate", "--checkpoint", str(out), "s4"])
    assert "--engine ctranslate2" in err
    bare = tmp_path / "bare"
    shutil.copytree(out, bare)
    (bare / META_FILE).unlink()
    err = _cli_error(capsys, ["translate", "--engine", "ctranslate2", "--checkpoint", str(bare),
                              "s4"])
    assert META_FILE in err
    meta = json.loads((out / META_FILE).read_text())
    meta["vocabularies"]["src"][5] = "changed"          # the model's words are not CT2's any more
    meta["sha256"] = _meta_digest(meta)                 # re-sealed: only the vocabulary check is left
    (out / META_FILE).write_text(json.dumps(meta))
    err = _cli_error(capsys, ["translate", "--engine", "ctranslate2", "--checkpoint", str(out),
                              "s4"])
    assert "source_vocabulary" in err and "is not the one npformer.json records" in err
