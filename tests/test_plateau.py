"""schedule="plateau": PyTorch's ReduceLROnPlateau rule on the validation loss, held against
torch step for step, and the trainer's use of it (the rate falls, a resume continues it)."""
import numpy as np
import pytest

from npformer.optim import PlateauSchedule
from npformer.training.toy import toy_data
from npformer.training.trainer import TrainConfig
from npformer.training.translation import translation_trainer

torch = pytest.importorskip("torch", reason="PyTorch is the reference for ReduceLROnPlateau")


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(factor=0.5, patience=2, threshold=0.01),
    dict(factor=0.3, patience=1, threshold=0.05, threshold_mode="abs", cooldown=2),
    dict(factor=0.1, patience=0, min_lr=2e-4),
    dict(factor=0.5, patience=1, mode="max", threshold=0.02),
])
def test_plateau_follows_torch_reduce_lr_on_plateau(kwargs):
    rng = np.random.default_rng(0)
    # a falling, then noisy, then flat series: improvements, plateaus and ties
    values = np.concatenate([np.linspace(3.0, 2.0, 8), 2.0 + 0.05 * rng.standard_normal(25),
                             np.full(10, 1.99)])
    ours = PlateauSchedule(1e-3, **kwargs)
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1e-3)
    theirs = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, **kwargs)    # the same names
    rates = []
    for v in values:
        rates.append(ours.observe(v))
        theirs.step(float(v))
        assert ours(len(rates)) == opt.param_groups[0]["lr"], (len(rates), kwargs)
    assert len(set(rates)) > 1 or kwargs == {}          # the series makes most of them fall


def test_plateau_refuses_bad_values():
    with pytest.raises(ValueError, match="factor"):
        PlateauSchedule(1e-3, factor=1.0)
    with pytest.raises(ValueError, match="threshold_mode"):
        PlateauSchedule(1e-3, threshold_mode="relative")
    with pytest.raises(ValueError, match="plateau_patience"):
        TrainConfig(schedule="plateau", plateau_patience=-1)


def _trainer(data, **cfg):
    import npformer as nf
    model = nf.Transformer(len(data.vocabs.src), len(data.vocabs.tgt), d_model=16, n_heads=2,
                           d_ff=32, n_encoder_layers=1, n_decoder_layers=1, max_len=16, seed=0)
    config = TrainConfig(**{"batch_size": 16, "lr": 3e-3, "schedule": "plateau", "quiet": True,
                            "plateau_patience": 0, "plateau_threshold": 0.5,
                            "eval_every_steps": 2, "log_every": 1, **cfg})
    return translation_trainer(model, data.vocabs, data.train, data.valid, config)


def test_the_trainer_lowers_the_rate_on_a_plateau_and_resumes_it(tmp_path):
    data = toy_data(seed=1, n_train=64, n_heldout=4, n_valid=8)
    # threshold 0.5: no validation improves the loss by half, so every one after the first
    # counts as bad, and with patience 0 divides the rate by 10. (The extra validation of the
    # final weights, when a run stops between scheduled ones, moves nothing, as for patience.)
    trainer = _trainer(data, max_steps=7, out_dir=str(tmp_path / "run"))
    trainer.fit()
    assert trainer.optimizer.lr == pytest.approx(3e-5)           # validations at 2, 4, 6
    straight = _trainer(data, max_steps=9)
    straight.fit()
    half = _trainer(data, max_steps=5, out_dir=str(tmp_path / "half"))
    half.fit()
    resumed = _trainer(data, max_steps=9).resume(tmp_path / "half" / "last")
    assert resumed.optimizer.lr == pytest.approx(3e-4)
    resumed.fit()
    assert resumed.schedule.state_dict() == straight.schedule.state_dict()
    np.testing.assert_array_equal(resumed.model.flat_params, straight.model.flat_params)


def test_plateau_needs_validation_data():
    data = toy_data(seed=1, n_train=32, n_heldout=4, n_valid=8)
    import npformer as nf
    model = nf.Transformer(len(data.vocabs.src), len(data.vocabs.tgt), d_model=16, n_heads=2,
                           d_ff=32, n_encoder_layers=1, n_decoder_layers=1, max_len=16)
    with pytest.raises(ValueError, match="schedule: 'plateau' watches the validation loss, and "
                                         "the translation task has no validation data"):
        translation_trainer(model, data.vocabs, data.train, None, TrainConfig(schedule="plateau"))
