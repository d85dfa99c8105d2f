"""Schedules, clipping and gradient accumulation."""
import math

import numpy as np
import pytest

import npformer as nf


def small_model():
    return nf.Transformer(src_vocab_size=11, tgt_vocab_size=9, d_model=8, n_heads=2, d_ff=16,
                          n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, dtype=np.float64)


def data(seed, b=4):
    rng = np.random.default_rng(seed)
    return rng.integers(1, 11, (b, 5)), rng.integers(1, 9, (b, 4)), rng.integers(1, 9, (b, 4))


def test_noam_schedule_peaks_at_warmup():
    s = nf.NoamSchedule(d_model=512, warmup_steps=4000)
    assert math.isclose(s(4000), 512 ** -0.5 * 4000 ** -0.5)
    assert s(100) < s(4000) > s(20000)
    assert math.isclose(s(1000), 1000 * 4000 ** -1.5 * 512 ** -0.5)


def test_warmup_schedules():
    inv = nf.WarmupInverseSqrtSchedule(peak_lr=1e-3, warmup_steps=100)
    assert inv(50) == pytest.approx(5e-4) and inv(100) == pytest.approx(1e-3)
    assert inv(400) == pytest.approx(5e-4)
    cos = nf.WarmupCosineSchedule(peak_lr=1e-3, warmup_steps=10, total_steps=110, min_lr=1e-5)
    assert cos(10) == pytest.approx(1e-3) and cos(60) == pytest.approx((1e-3 + 1e-5) / 2)
    assert cos(110) == pytest.approx(1e-5) and cos(500) == pytest.approx(1e-5)
    with pytest.raises(ValueError, match="warmup_steps"):
        nf.WarmupCosineSchedule(1e-3, 200, 100)
    lin = nf.WarmupLinearSchedule(peak_lr=1e-3, warmup_steps=10, total_steps=110, min_lr=1e-5)
    assert lin(5) == pytest.approx(5e-4) and lin(10) == pytest.approx(1e-3)
    assert lin(35) == pytest.approx(1e-5 + 0.75 * (1e-3 - 1e-5))        # a quarter of the way
    assert lin(60) == pytest.approx((1e-3 + 1e-5) / 2) and lin(110) == pytest.approx(1e-5)
    assert lin(500) == pytest.approx(1e-5)
    # the straight line runs below the cosine in the first half of the decay, above it after
    assert lin(35) < cos(35) and lin(85) > cos(85)


def test_the_cosine_keeps_its_formula():
    """The cosine shares its warm-up and bounds with the linear schedule; its rates are still
    min_lr + 0.5 (peak - min_lr)(1 + cos(pi p)), bit for bit."""
    cos = nf.WarmupCosineSchedule(peak_lr=3e-3, warmup_steps=100, total_steps=2200, min_lr=1e-4)
    for step in range(100, 2300, 7):
        p = min(1.0, (step - 100) / 2100)
        assert cos(step) == 1e-4 + 0.5 * (3e-3 - 1e-4) * (1.0 + math.cos(math.pi * p))


@pytest.mark.parametrize("name", ["linear", "cosine"])
def test_decay_schedules_match_hugging_face(name):
    """Hugging Face's get_linear_schedule_with_warmup / get_cosine_schedule_with_warmup (min_lr
    0): the rate of our 1-based update s is the one their scheduler gives after s steps, up to
    the last update."""
    torch = pytest.importorskip("torch", reason="torch is the schedules' reference")
    transformers = pytest.importorskip("transformers", reason="transformers' schedules are the "
                                                              "reference")
    ours = {"linear": nf.WarmupLinearSchedule, "cosine": nf.WarmupCosineSchedule}[name](
        peak_lr=2e-3, warmup_steps=30, total_steps=250)
    make = {"linear": transformers.get_linear_schedule_with_warmup,
            "cosine": transformers.get_cosine_schedule_with_warmup}[name]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-3)
    theirs = make(opt, num_warmup_steps=30, num_training_steps=250)
    for step in range(1, 251):
        opt.step()
        theirs.step()
        assert ours(step) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12, abs=1e-18), step
    assert ours(251) == ours(400) == 0.0           # past the end, min_lr (their cosine climbs)


def test_clip_grad_norm_scales_to_max_norm():
    model = small_model()
    src, tgt_in, tgt_out = data(0)
    _, d = nf.cross_entropy(model.forward(src, tgt_in), tgt_out)
    model.backward(d * 100)
    before = nf.clip_grad_norm(model, 1.0)
    assert before > 1.0
    assert np.linalg.norm(model.flat_grads) == pytest.approx(1.0, rel=1e-5)
    assert nf.clip_grad_norm(model, 10.0) == pytest.approx(1.0, rel=1e-5)   # no change below max


def test_gradient_accumulation_equals_the_full_batch():
    """Two half batches, each loss weighted by its share of tokens, sum to the full gradient."""
    model = small_model()
    src, tgt_in, tgt_out = data(1, b=6)
    _, d = nf.cross_entropy(model.forward(src, tgt_in), tgt_out)
    model.zero_grad()
    model.backward(d)
    full = model.flat_grads.copy()
    model.zero_grad()
    for half in (slice(0, 2), slice(2, 6)):
        share = tgt_out[half].size / tgt_out.size
        _, d = nf.cross_entropy(model.forward(src[half], tgt_in[half]), tgt_out[half])
        model.backward(d * share)
    np.testing.assert_allclose(model.flat_grads, full, rtol=1e-10, atol=1e-13)


def test_optimizer_state_round_trip_and_errors():
    model = small_model()
    opt = nf.AdamW(model, lr=1e-2)
    src, tgt_in, tgt_out = data(2)
    _, d = nf.cross_entropy(model.forward(src, tgt_in), tgt_out)
    model.backward(d)
    opt.step()
    state = opt.state_dict()
    opt2 = nf.AdamW(small_model(), lr=1e-2)
    opt2.load_state_dict(state)
    assert opt2.step_count == 1
    np.testing.assert_array_equal(opt2.exp_avg, opt.exp_avg)
    with pytest.raises(ValueError, match="exp_avg_sq"):
        opt2.load_state_dict({"step_count": 1, "exp_avg": opt.exp_avg})
    with pytest.raises(ValueError, match="lr: expected a finite number >= 0"):
        nf.Adam(model, lr=-1)


def test_training_reduces_the_loss():
    model = small_model()
    opt = nf.Adam(model, lr=1e-2)
    src, tgt_in, tgt_out = data(3, b=8)
    losses = []
    for _ in range(100):
        loss, d = nf.cross_entropy(model.forward(src, tgt_in), tgt_out)
        model.zero_grad()
        model.backward(d)
        opt.step()
        losses.append(loss)
    assert losses[-1] < 0.25 * losses[0]


def test_decay_chooses_parameters_and_all_of_them_is_the_default():
    """decay=lambda ... True gives the very bits of the default (one range, the fused pass);
    matrices_only leaves biases and LayerNorm parameters undecayed."""
    from npformer.optim import matrices_only
    runs = {}
    for name, decay in (("default", None), ("all", lambda n, p: True), ("matrices", matrices_only)):
        model = small_model()
        opt = nf.AdamW(model, lr=1e-2, weight_decay=0.5, decay=decay)
        before = {n: p.data.copy() for n, p in model.named_parameters()}
        model.flat_grads.fill(0)                     # no gradient: only the decay moves weights
        opt.step()
        runs[name] = (model, before)
    np.testing.assert_array_equal(runs["all"][0].flat_params, runs["default"][0].flat_params)
    model, before = runs["matrices"]
    decayed = dict(runs["default"][0].named_parameters())
    for name, p in model.named_parameters():
        expected = decayed[name].data if p.data.ndim >= 2 else before[name]
        np.testing.assert_array_equal(p.data, expected, err_msg=name)
        assert p.data.ndim < 2 or not np.array_equal(p.data, before[name])
    with pytest.raises(ValueError, match="decay: expected None or a function"):
        nf.AdamW(small_model(), decay="matrices")
