"""The whole model against torch.nn.Transformer: same weights -> same logits, loss, gradients and
Adam/AdamW steps. Skips where torch is absent (CI installs it)."""
import numpy as np
import pytest

import npformer as nf

torch = pytest.importorskip("torch", reason="PyTorch is the reference; install torch==2.13.0")
from torch_reference import build_reference  # noqa: E402

torch.set_num_threads(1)

PAD = 0


@pytest.fixture(autouse=True, params=["numba", "numpy"])
def backend(request):
    """Every parity test runs on both backends: the Numba kernels and the NumPy reference."""
    previous = nf.get_backend()
    nf.set_backend(request.param)
    yield request.param
    nf.set_backend(previous)


def make_model(dtype, norm_first=False, tie=False, d_model=32, generator_bias=True):
    """``tie``: False, True (the generator shares the target embedding) or "all" (source and
    target embeddings and the generator share one matrix over a joint vocabulary)."""
    share_all = tie == "all"
    return nf.Transformer(src_vocab_size=23, tgt_vocab_size=23 if share_all else 19,
                          d_model=d_model, n_heads=4, d_ff=48, n_encoder_layers=2,
                          n_decoder_layers=2, dropout=0.0, max_len=32, pad_id=PAD,
                          norm_first=norm_first, tie_embeddings=bool(tie),
                          share_all_embeddings=share_all, generator_bias=generator_bias,
                          dtype=dtype, seed=3)


def make_batch(seed=0):
    """Padded source and target with different lengths per row (no row fully padded)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 23, size=(4, 9))
    tgt = rng.integers(1, 19, size=(4, 8))
    for row, (ls, lt) in enumerate([(9, 8), (5, 6), (7, 3), (2, 8)]):
        src[row, ls:] = PAD
        tgt[row, lt:] = PAD
    tgt_in = np.concatenate([np.full((4, 1), 1), tgt[:, :-1]], axis=1)
    tgt_in[tgt_in == PAD] = PAD
    return src, tgt_in, tgt


def torch_step(ref, src, tgt_in, tgt_out, smoothing):
    logits = ref(torch.from_numpy(src), torch.from_numpy(tgt_in))
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), torch.from_numpy(tgt_out).reshape(-1),
        ignore_index=PAD, label_smoothing=smoothing)
    return logits, loss


CASES = [(nf_first, tie, ls, True) for nf_first in (False, True) for tie in (False, True, "all")
         for ls in (0.0, 0.1)]
# without the generator's bias: Transformer-Tiny's (all shared, post-norm) and an untied pre-norm
CASES += [(False, "all", 0.1, False), (True, False, 0.0, False)]


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
@pytest.mark.parametrize("norm_first,tie,smoothing,generator_bias", CASES)
def test_logits_loss_and_gradients_match_torch(dtype, tol, norm_first, tie, smoothing,
                                               generator_bias):
    model = make_model(dtype, norm_first, tie, generator_bias=generator_bias)
    assert (model.generator.bias is None) == (not generator_bias)
    ref = build_reference(model, torch.float64 if dtype == np.float64 else torch.float32)
    ref.train()                          # dropout is 0; train mode keeps torch off its fast path
    src, tgt_in, tgt_out = make_batch()

    logits = model.forward(src, tgt_in)
    loss, dlogits = nf.cross_entropy(logits, tgt_out, ignore_index=PAD, label_smoothing=smoothing)
    model.zero_grad()
    model.backward(dlogits)

    ref_logits, ref_loss = torch_step(ref, src, tgt_in, tgt_out, smoothing)
    ref_loss.backward()

    scale = np.abs(ref_logits.detach().numpy()).max()
    np.testing.assert_allclose(logits, ref_logits.detach().numpy(), rtol=0, atol=tol * scale)
    assert abs(loss - ref_loss.item()) <= tol * max(1.0, abs(loss))
    grads = nf.interop.to_torch_state_dict(model, grads=True)
    for name, p in ref.named_parameters():
        g_ref = p.grad.numpy()
        g_scale = max(np.abs(g_ref).max(), 1e-12)
        err = np.abs(grads[name] - g_ref).max() / g_scale
        # gradients pass through the whole network: allow float32 a little more than the logits
        assert err <= (tol if dtype == np.float64 else 5e-4), (name, err)


@pytest.mark.parametrize("opt_name,weight_decay", [("Adam", 0.0), ("Adam", 0.01), ("AdamW", 0.01)])
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_five_optimizer_steps_match_torch(opt_name, weight_decay, norm_first, smoothing):
    model = make_model(np.float64, norm_first, tie=False)
    ref = build_reference(model, torch.float64)
    ref.train()
    kwargs = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=weight_decay)
    opt = getattr(nf, opt_name)(model, **kwargs)
    ref_opt = getattr(torch.optim, opt_name)(ref.parameters(), foreach=False, **kwargs)
    for step in range(5):
        src, tgt_in, tgt_out = make_batch(seed=step)
        logits = model.forward(src, tgt_in)
        _, dlogits = nf.cross_entropy(logits, tgt_out, ignore_index=PAD, label_smoothing=smoothing)
        model.zero_grad()
        model.backward(dlogits)
        opt.step()
        ref_opt.zero_grad()
        torch_step(ref, src, tgt_in, tgt_out, smoothing)[1].backward()
        ref_opt.step()
    ours = nf.interop.to_torch_state_dict(model)
    d = model.config.d_model
    for name, p in ref.named_parameters():
        theirs = p.detach().numpy()
        if name.endswith("in_proj_bias"):
            # The key bias adds q.b_k to every score of a row, which softmax cancels: its true
            # gradient is exactly 0, both sides see round-off (~1e-18). Adam's L2 term (g + wd p)
            # feeds p back into g and amplifies that round-off to ~lr, differently on each side.
            # So: the key bias only has to stay within lr-sized steps; the rest must match.
            key = slice(d, 2 * d)
            assert np.abs(ours[name][key]).max() <= 5 * kwargs["lr"], name
            assert np.abs(theirs[key]).max() <= 5 * kwargs["lr"], name
            ours[name][key] = theirs[key] = 0.0
        np.testing.assert_allclose(ours[name], theirs, rtol=0, atol=1e-9, err_msg=name)


@pytest.mark.parametrize("opt_name", ["Adam", "AdamW"])
def test_weight_decay_on_matrices_only_matches_torchs_two_parameter_groups(opt_name):
    """decay=matrices_only: GPT-2's practice, torch's groups {matrices: wd} and {the rest: 0}."""
    model = make_model(np.float64, norm_first=True, tie=False)
    ref = build_reference(model, torch.float64)
    ref.train()
    kwargs = dict(lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    opt = getattr(nf, opt_name)(model, weight_decay=0.1, decay=nf.optim.matrices_only, **kwargs)
    groups = [{"params": [p for p in ref.parameters() if p.ndim >= 2], "weight_decay": 0.1},
              {"params": [p for p in ref.parameters() if p.ndim < 2], "weight_decay": 0.0}]
    ref_opt = getattr(torch.optim, opt_name)(groups, foreach=False, **kwargs)
    assert len(opt.segments) > 2                      # runs of matrices between biases and norms
    for step in range(4):
        src, tgt_in, tgt_out = make_batch(seed=step)
        logits = model.forward(src, tgt_in)
        _, dlogits = nf.cross_entropy(logits, tgt_out, ignore_index=PAD)
        model.zero_grad()
        model.backward(dlogits)
        before = model.flat_grads.copy()
        opt.step()
        np.testing.assert_array_equal(model.flat_grads, before)   # the L2 term stays out of .grad
        ref_opt.zero_grad()
        torch_step(ref, src, tgt_in, tgt_out, 0.0)[1].backward()
        ref_opt.step()
    ours = nf.interop.to_torch_state_dict(model)
    d = model.config.d_model
    for name, p in ref.named_parameters():
        theirs = p.detach().numpy()
        if name.endswith("in_proj_bias"):             # the key bias: see the test above
            key = slice(d, 2 * d)
            assert np.abs(ours[name][key] - theirs[key]).max() <= 4 * kwargs["lr"], name
            ours[name][key] = theirs[key] = 0.0
        np.testing.assert_allclose(ours[name], theirs, rtol=0, atol=1e-9, err_msg=name)
