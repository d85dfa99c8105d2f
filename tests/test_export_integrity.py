"""A CTranslate2 export is verified when it is loaded: npformer.json records the sha256 of every
other file of the folder and of its own content, so a file that rotted or was edited, a missing
file or one that is not the export's is a one-line error naming it, never garbage with exit 0.
Leftovers of a killed export or average are removed by the next one to the same target; a full
disk names the folder; the folder honours the umask."""
import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 not installed "
                                  "(pip install 'npformer[ctranslate2]')")

import npformer as nf  # noqa: E402
from npformer.checkpoint import load_checkpoint  # noqa: E402
from npformer.cli.main import main  # noqa: E402
from npformer.ct2 import META_FILE, _meta_digest, export_ctranslate2, load_exported  # noqa: E402
from npformer.training.checkpointing import load_model_checkpoint, save_model_checkpoint  # noqa: E402
from test_ct2 import V_SRC, V_TGT, random_sources, vocab_pair  # noqa: E402

FILES = ["config.json", "model.bin", META_FILE, "source_vocabulary.json",
         "target_vocabulary.json"]


def tiny_checkpoint(path):
    """A d_model 8, one-layer checkpoint with large random weights (varied outputs), as
    test_ct2's ``make_checkpoint`` builds its larger ones."""
    model = nf.Transformer(V_SRC, V_TGT, d_model=8, n_heads=2, d_ff=8, n_encoder_layers=1,
                           n_decoder_layers=1, dropout=0.0, max_len=16, seed=0).eval()
    rng = np.random.default_rng(0)
    for p in model.parameters():
        p.data[...] = rng.normal(0, 0.5, p.data.shape)
    model.generator.bias.data[2] += 1.5                 # <eos> now and then: outputs of any length
    save_model_checkpoint(str(path), model, vocab_pair())
    return path


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """(checkpoint, export folder, sentences, their translations): made once per module; tests
    copy the folder before they change it."""
    base = tmp_path_factory.mktemp("export")
    ckpt = tiny_checkpoint(base / "model")
    out = export_ctranslate2(load_model_checkpoint(str(ckpt)), base / "ct2")
    sentences = random_sources(np.random.default_rng(1), vocab_pair(), 6)
    return ckpt, out, sentences, translate(out, sentences)


def translate(folder, sentences):
    return [t.tokens for t in load_exported(folder).translator(str.split, " ".join)
            .translate(sentences)]


def copy(export, tmp_path, name="copy"):
    folder = tmp_path / name
    shutil.copytree(export[1], folder)
    return folder


def cli_error(capsys, argv):
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def translate_cli(folder):
    return ["translate", "--engine", "ctranslate2", "--checkpoint", str(folder), "s4 s5 s6"]


def edit_json(path, **changes):
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data, indent=2))


# -- the three cases, and what the hashes cover ------------------------------------------
def test_an_edited_decoder_start_token_is_refused_naming_config_json(export, tmp_path, capsys):
    """Before: the output was empty, with exit 0."""
    folder = copy(export, tmp_path)
    edit_json(folder / "config.json", decoder_start_token="<unk>")
    err = cli_error(capsys, translate_cli(folder))
    assert f"{folder / 'config.json'}: its sha256" in err and "export the checkpoint again" in err


def test_an_edited_layer_norm_epsilon_is_refused_naming_config_json(export, tmp_path, capsys):
    """Before: '<unk> <unk> ...', with exit 0."""
    folder = copy(export, tmp_path)
    edit_json(folder / "config.json", layer_norm_epsilon=100)
    err = cli_error(capsys, translate_cli(folder))
    assert f"{folder / 'config.json'}: its sha256" in err


def test_four_kib_inverted_in_model_bin_are_refused_naming_it(export, tmp_path, capsys):
    """Before: garbage translations, with exit 0."""
    folder = copy(export, tmp_path)
    data = bytearray((folder / "model.bin").read_bytes())
    middle = len(data) // 2 - 2048
    assert middle > 0
    data[middle:middle + 4096] = bytes(255 - b for b in data[middle:middle + 4096])
    (folder / "model.bin").write_bytes(bytes(data))
    err = cli_error(capsys, translate_cli(folder))
    assert f"{folder / 'model.bin'}: its sha256" in err and "is not the one npformer.json records" in err


def test_every_file_is_recorded_and_verified(export):
    meta = json.loads((export[1] / META_FILE).read_text())
    assert sorted(meta["files"]) == sorted(set(FILES) - {META_FILE})
    assert sorted(p.name for p in export[1].iterdir()) == sorted(FILES)
    assert meta["sha256"] == _meta_digest(meta)
    assert list(meta)[-1] == "sha256"


def test_npformer_json_itself_is_verified(export, tmp_path, capsys):
    """An edit of the metadata (here a smaller max_len, which would cut every translation) is
    caught by its own sha256; a forger who re-seals it cannot drop or add a file either."""
    folder = copy(export, tmp_path)
    meta_path = folder / META_FILE
    meta = json.loads(meta_path.read_text())
    meta["config"]["max_len"] = 4
    meta_path.write_text(json.dumps(meta, indent=1))
    err = cli_error(capsys, translate_cli(folder))
    assert f"{meta_path}: its content does not match the sha256 it records" in err

    meta = json.loads((export[1] / META_FILE).read_text())
    del meta["files"]["target_vocabulary.json"]        # re-sealed, but a file left out
    meta["sha256"] = _meta_digest(meta)
    meta_path.write_text(json.dumps(meta, indent=1))
    err = cli_error(capsys, translate_cli(folder))
    assert f"{folder / 'target_vocabulary.json'}: is not a file of this export" in err

    meta["files"]["target_vocabulary.json"] = "0" * 64  # re-sealed, with a wrong hash
    meta["sha256"] = _meta_digest(meta)
    meta_path.write_text(json.dumps(meta, indent=1))
    err = cli_error(capsys, translate_cli(folder))
    assert f"{folder / 'target_vocabulary.json'}: its sha256" in err

    meta.pop("sha256")                                 # files recorded, but the seal removed
    meta_path.write_text(json.dumps(meta, indent=1))
    err = cli_error(capsys, translate_cli(folder))
    assert f"{meta_path}: its content does not match the sha256 it records" in err


def test_a_missing_or_an_added_file_is_refused(export, tmp_path, capsys):
    folder = copy(export, tmp_path)
    (folder / "target_vocabulary.json").unlink()
    err = cli_error(capsys, translate_cli(folder))
    assert f"{folder / 'target_vocabulary.json'}: missing" in err
    folder = copy(export, tmp_path, "added")
    # CTranslate2 would read a shared vocabulary before the source and target ones
    (folder / "shared_vocabulary.json").write_text(json.dumps(vocab_pair().tgt.tokens))
    err = cli_error(capsys, translate_cli(folder))
    assert f"{folder / 'shared_vocabulary.json'}: is not a file of this export" in err


def test_an_export_from_before_the_hashes_loads_with_a_warning(export, tmp_path):
    """Rot cannot turn a verified export into one of these (it would have to remove two fields
    and leave valid JSON); a deliberate editor could re-seal one anyway. So an old export keeps
    working, with a warning that says to export again."""
    folder = copy(export, tmp_path)
    meta = json.loads((folder / META_FILE).read_text())
    del meta["files"], meta["sha256"]
    (folder / META_FILE).write_text(json.dumps(meta, indent=1))
    with pytest.warns(UserWarning, match="written before exports recorded the sha256.*export "
                                         "the checkpoint again"):
        assert translate(folder, export[2]) == export[3]


# -- writing: full disk, umask, leftovers -------------------------------------------------------
def test_a_full_disk_during_export_names_the_folder(export, tmp_path, capsys, monkeypatch):
    from ctranslate2.specs import model_spec

    def full(self, path):                  # as model.write() fails: an OSError naming no file
        Path(path).write_bytes(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(model_spec.ModelSpec, "_serialize", full)
    out = tmp_path / "ct2"
    err = cli_error(capsys, ["export", "--checkpoint", str(export[0]), "--format", "ctranslate2",
                             "--out", str(out)])
    assert f"no space left on device writing {out}" in err and "nothing saved before was lost" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("umask, mode", [(0o022, 0o755), (0o077, 0o700), (0o002, 0o775)])
def test_the_export_folder_honours_the_umask(export, tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        out = export_ctranslate2(load_model_checkpoint(str(export[0])), tmp_path / "ct2")
    finally:
        os.umask(old)
    assert out.stat().st_mode & 0o777 == mode


KILLED_EXPORT = """
import os, signal, sys
from ctranslate2.specs import model_spec
from npformer.cli.main import main
save = model_spec.ModelSpec.save
def save_then_die(self, output_dir):
    save(self, output_dir)                               # model.bin written, then kill -9
    os.kill(os.getpid(), signal.SIGKILL)
model_spec.ModelSpec.save = save_then_die
main(["export", "--checkpoint", sys.argv[1], "--format", "ctranslate2", "--out", sys.argv[2]])
"""


def test_a_later_export_removes_what_a_killed_one_left(export, tmp_path, capsys):
    out = tmp_path / "ct2"
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED_EXPORT),
                            str(export[0]), str(out)], capture_output=True, text=True)
    assert child.returncode == -9, child.stderr
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(".ct2.") and left[0].endswith(".partial")
    assert (tmp_path / left[0] / "model.bin").exists()
    (tmp_path / ".ct2.k3j_x9ab.partial").mkdir()          # as older exports (mkdtemp) named it
    (tmp_path / ".ct2.0123abcd.old").mkdir()              # a replaced export: kept while ct2 is gone
    keep = [".other.0123abcd.partial", ".last.npz.0123abcd.tmp", "notes.txt"]
    (tmp_path / keep[0]).mkdir()
    for name in keep[1:]:
        (tmp_path / name).write_text("not this export's")
    argv = ["export", "--checkpoint", str(export[0]), "--format", "ctranslate2", "--out", str(out)]
    assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep + [".ct2.0123abcd.old", "ct2"])
    assert main(argv + ["--overwrite"]) == 0               # ct2 exists again: .old goes too
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep + ["ct2"])
    assert translate(out, export[2]) == export[3]


def test_a_later_average_removes_what_a_killed_one_left(export, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(str(export[0]) + ".npz", run / "step_1.npz")
    stale = [".averaged.npz.0123456789abcdef.tmp", ".averaged.json.fedcba9876543210.tmp"]
    keep = [".last.npz.0123456789abcdef.tmp"]                # another writer's, in the same folder
    for name in stale + keep:
        (run / name).write_bytes(b"\0" * 1000)
    assert main(["average", str(run / "step_1"), "--out", str(run / "averaged")]) == 0
    assert sorted(p.name for p in run.iterdir()) == sorted(
        keep + ["averaged.json", "averaged.npz", "step_1.npz"])
    assert load_checkpoint(run / "averaged")[1]["extra"]["averaged_from"] == [str(run / "step_1")]


# -- the loader under byte flips, truncations and edits of every file ----------------------------
def _flip(data, at, mask):
    data = bytearray(data)
    data[at % len(data)] ^= mask
    return bytes(data)


EDITS = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 2**20), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.floats(0, 1, exclude_max=True)),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=8)),
    st.tuples(st.just("splice"), st.floats(0, 1), st.binary(min_size=1, max_size=64)),
)


def _apply(data, edit):
    kind = edit[0]
    if kind == "flip":
        return _flip(data, edit[1], edit[2])
    if kind == "truncate":
        return data[:int(len(data) * edit[1])]
    if kind == "append":
        return data + edit[1]
    at = int(len(data) * edit[1])
    return data[:at] + edit[2] + data[at + len(edit[2]):]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(FILES), edit=EDITS)
def test_the_loader_refuses_every_changed_file_or_translates_as_before(export, tmp_path_factory,
                                                                       name, edit):
    folder = tmp_path_factory.mktemp("changed") / "ct2"
    shutil.copytree(export[1], folder)
    path = folder / name
    before = path.read_bytes()
    after = _apply(before, edit)
    path.write_bytes(after)
    try:
        result = translate(folder, export[2])
    except ValueError as e:
        message = str(e)
        assert len(message.splitlines()) == 1 and str(path) in message, message
        assert after != before
    else:                                  # only a change that keeps every hash may load
        assert result == export[3]
        assert after == before or (name == META_FILE and
                                   json.loads(after) == json.loads(before)), (name, edit)
    finally:
        shutil.rmtree(folder.parent)
