"""Checkpoint averaging: the mean of the parameters, metadata kept, clear errors on mismatch."""
import numpy as np
import pytest

import npformer as nf
from npformer.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from npformer.cli.main import main
from npformer.data.vocab import Vocab, Vocabularies
from npformer.training.averaging import average_checkpoints, average_state_dicts, load_averaged
from npformer.training.checkpointing import load_model_checkpoint, save_model_checkpoint

SRC = Vocab(list(Vocab.SPECIALS) + ["ein", "mann", "hund"])
TGT = Vocab(list(Vocab.SPECIALS) + ["a", "man", "dog", "."])


def tiny(seed, d_ff=8):
    return nf.Transformer(len(SRC), len(TGT), d_model=8, n_heads=2, d_ff=d_ff, n_encoder_layers=1,
                          n_decoder_layers=1, max_len=8, seed=seed)


def save_three(tmp_path):
    paths = []
    for seed in (1, 2, 3):
        path = tmp_path / f"step_{seed}"
        save_model_checkpoint(path, tiny(seed), Vocabularies(SRC, TGT), extra={"src_lang": "de", "tgt_lang": "en"})
        paths.append(path)
    return paths


def test_average_is_the_mean_of_every_parameter(tmp_path):
    paths = save_three(tmp_path)
    model = average_checkpoints(paths, tmp_path / "avg")
    states = [tiny(seed).state_dict() for seed in (1, 2, 3)]
    loaded = load_model_checkpoint(tmp_path / "avg")
    for name, value in loaded.model.state_dict().items():
        expected = (states[0][name].astype(np.float64) + states[1][name] + states[2][name]) / 3
        assert value.dtype == states[0][name].dtype
        np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(value, model.state_dict()[name])
    # the seeds differ, so the mean is none of the inputs
    assert not np.array_equal(loaded.model.flat_params, tiny(1).flat_params)
    assert loaded.meta["extra"]["src_lang"] == "de"
    assert loaded.meta["extra"]["averaged_from"] == [str(p) for p in paths]
    assert loaded.vocabs.src == SRC and loaded.vocabs.tgt == TGT


def test_average_of_one_checkpoint_is_itself(tmp_path):
    (path,) = save_three(tmp_path)[:1]
    average_checkpoints([path], tmp_path / "avg")
    np.testing.assert_array_equal(load_model_checkpoint(tmp_path / "avg").model.flat_params,
                                  tiny(1).flat_params)


def test_load_averaged_holds_the_saved_average_in_memory(tmp_path):
    """What benchmarks/multi30k_tune.py scores: the same weights average_checkpoints writes,
    the same checks, nothing written."""
    paths = save_three(tmp_path)
    loaded = load_averaged(paths)
    average_checkpoints(paths, tmp_path / "avg")
    np.testing.assert_array_equal(loaded.model.flat_params,
                                  load_model_checkpoint(tmp_path / "avg").model.flat_params)
    assert not loaded.model.training and loaded.vocabs.src == SRC
    save_model_checkpoint(tmp_path / "wide", tiny(4, d_ff=16), Vocabularies(SRC, TGT))
    with pytest.raises(CheckpointError, match=r"wide.*d_ff: checkpoint has 16, expected 8"):
        load_averaged([paths[0], tmp_path / "wide"])


def test_mismatched_config_is_an_error_naming_the_file(tmp_path):
    paths = save_three(tmp_path)
    save_model_checkpoint(tmp_path / "wide", tiny(4, d_ff=16), Vocabularies(SRC, TGT))
    with pytest.raises(CheckpointError, match=r"wide.*d_ff: checkpoint has 16, expected 8"):
        average_checkpoints([paths[0], tmp_path / "wide"], tmp_path / "avg")
    assert not (tmp_path / "avg.npz").exists()


def test_mismatched_vocabulary_is_an_error(tmp_path):
    paths = save_three(tmp_path)
    other = Vocab(list(Vocab.SPECIALS) + ["a", "man", "cat", "."])
    save_model_checkpoint(tmp_path / "other", tiny(5), Vocabularies(SRC, other))
    with pytest.raises(CheckpointError, match=r"other.*tgt vocabulary differs"):
        average_checkpoints([paths[0], tmp_path / "other"], tmp_path / "avg")


def test_bad_arguments():
    with pytest.raises(ValueError, match="paths: expected a list"):
        average_checkpoints("run/step_1", "out")
    with pytest.raises(ValueError, match="at least one"):
        average_checkpoints([], "out")
    with pytest.raises(ValueError, match=r"'w' expected shape \(2,\), got \(3,\)"):
        average_state_dicts([{"w": np.zeros(2)}, {"w": np.zeros(3)}])
    with pytest.raises(CheckpointError, match="missing"):
        average_checkpoints(["/nonexistent/missing"], "out")


def test_cli_average(tmp_path, capsys):
    paths = save_three(tmp_path)
    assert main(["average", "--out", str(tmp_path / "a"), str(paths[0]), str(paths[1])]) == 0
    assert "averaged 2 checkpoints" in capsys.readouterr().out
    # --run/--last picks the last N step_<N> checkpoints of a run directory, by step
    assert main(["average", "--out", str(tmp_path / "b"), "--run", str(tmp_path), "--last", "2"]) == 0
    expected = (tiny(2).flat_params.astype(np.float64) + tiny(3).flat_params) / 2
    np.testing.assert_allclose(load_model_checkpoint(tmp_path / "b").model.flat_params, expected,
                               rtol=1e-6, atol=1e-7)
    assert main(["average", "--out", str(tmp_path / "c"), "--run", str(tmp_path), "--last", "5"]) == 1
    assert "holds 3 step_<N> checkpoints" in capsys.readouterr().err
    save_model_checkpoint(tmp_path / "wide", tiny(4, d_ff=16), Vocabularies(SRC, TGT))
    assert main(["average", "--out", str(tmp_path / "d"), str(paths[0]), str(tmp_path / "wide")]) == 1
    assert "wide" in capsys.readouterr().err


def test_a_checkpoint_with_a_nan_weight_is_refused_by_the_loader(tmp_path):
    """A NaN in one input would make every averaged value of that tensor NaN."""
    paths = save_three(tmp_path)
    arrays, meta = load_checkpoint(paths[1])
    w = arrays["model/src_embed.weight"].copy()
    w[4, 0] = np.nan
    save_checkpoint(paths[1], {**arrays, "model/src_embed.weight": w}, meta)  # a valid sha256
    with pytest.raises(CheckpointError, match=r"step_2: array 'model/src_embed.weight' holds 1 non-finite"):
        average_checkpoints(paths, tmp_path / "avg")
    assert not (tmp_path / "avg.npz").exists()
