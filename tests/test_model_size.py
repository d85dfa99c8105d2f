"""A model's size is known before it is built (issue 66): the configurations count their
parameters in closed form (no loop over layers), the model constructors and ``build_model``
refuse what this machine's memory cannot hold before allocating anything, and ``npformer lm``
checks its options as ``train`` does, naming them."""
import math
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import npformer as nf
from npformer import configs, parts
from npformer.cli import common
from npformer.cli.main import main
from npformer.configs import GPTConfig, TransformerConfig


def shape_sum(config):
    return sum(math.prod(shape) for shape in config.parameter_shapes().values())


sizes = st.integers(1, 3)


@settings(max_examples=60, deadline=None)
@given(vocab=st.integers(1, 40), heads=sizes, head_size=st.integers(1, 3).map(lambda h: 2 * h),
       ff=st.integers(1, 20), layers=st.integers(1, 4), max_len=st.integers(1, 30),
       positions=st.sampled_from(list(parts.POSITIONS)), tie=st.booleans(),
       norm=st.sampled_from(list(parts.NORMS)), own_head=st.one_of(st.none(), sizes),
       qkv_bias=st.booleans(), proj_bias=st.booleans(), ffn=st.sampled_from(list(parts.FFNS)),
       kv_divisor=st.sampled_from([1, 2, 3]), qk_norm=st.booleans())
def test_gpt_closed_form_equals_the_sum_of_its_shapes(vocab, heads, head_size, ff, layers,
                                                      max_len, positions, tie, norm, own_head,
                                                      qkv_bias, proj_bias, ffn, kv_divisor,
                                                      qk_norm):
    """Every field that sets a shape: positions, tying, the norm, the feed-forward, a head size
    of its own (even, for rotary), the bias flags, grouped key/value heads, the head norms."""
    config = GPTConfig(vocab_size=vocab, d_model=heads * head_size, n_heads=heads, d_ff=ff,
                       n_layers=layers, max_len=max_len, positions=positions, tie_embeddings=tie,
                       norm=norm, head_dim=None if own_head is None else 2 * own_head,
                       qkv_bias=qkv_bias, proj_bias=proj_bias, ffn=ffn, qk_norm=qk_norm,
                       n_kv_heads=heads // kv_divisor if heads % kv_divisor == 0 else None)
    assert config.parameter_count() == shape_sum(config)


@settings(max_examples=60, deadline=None)
@given(src=st.integers(1, 40), tgt=st.integers(1, 40), heads=sizes, head_size=sizes,
       qk_head=st.one_of(st.none(), sizes), ff=st.integers(1, 20), enc=st.integers(1, 3),
       dec=st.integers(1, 3), tie=st.booleans(), share=st.booleans(), bias=st.booleans())
def test_transformer_closed_form_equals_the_sum_of_its_shapes(src, tgt, heads, head_size, qk_head,
                                                              ff, enc, dec, tie, share, bias):
    config = TransformerConfig(src_vocab_size=src, tgt_vocab_size=src if share else tgt,
                               d_model=heads * head_size, n_heads=heads, d_ff=ff,
                               n_encoder_layers=enc, n_decoder_layers=dec,
                               qk_dim=None if qk_head is None else heads * qk_head,
                               tie_embeddings=tie, share_all_embeddings=share,
                               generator_bias=bias)
    assert config.parameter_count() == shape_sum(config)


def test_the_count_is_the_built_models():
    for model in (nf.GPT(11, d_model=8, n_heads=2, d_ff=12, n_layers=2, max_len=5,
                         tie_embeddings=False),
                  nf.Transformer(9, 7, d_model=8, n_heads=2, d_ff=12, n_encoder_layers=1,
                                 n_decoder_layers=2, qk_dim=4)):
        assert model.config.parameter_count() == model.num_parameters()


@pytest.mark.parametrize("build", [
    lambda: nf.GPT(10, d_model=8, n_heads=2, d_ff=8, n_layers=10**9, max_len=4),
    lambda: nf.GPT(10, d_model=8, n_heads=2, d_ff=8, n_layers=1, max_len=10**12,
                   positions="sinusoidal"),
    lambda: nf.Transformer(10, 10, d_model=8, n_heads=2, d_ff=8, n_encoder_layers=1,
                           n_decoder_layers=10**9),
    lambda: nf.build_model(GPTConfig(vocab_size=10**12, d_model=8, n_heads=2, d_ff=8,
                                     n_layers=1, max_len=4)),
    lambda: nf.build_model(TransformerConfig(src_vocab_size=10, tgt_vocab_size=10, d_model=8,
                                             n_heads=2, d_ff=10**12, n_encoder_layers=1,
                                             n_decoder_layers=1)),
])
def test_a_model_too_big_for_memory_is_refused_before_anything_is_allocated(build):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"=\d+ .*: a model this size \([\d,]+ float32 "
                                         r"parameters\) needs at least [\d,]+ GiB of memory .*, "
                                         r"more than this machine's [\d,.]+ GiB"):
        build()
    assert time.perf_counter() - start < 0.5


def test_the_refusal_names_the_fields_and_the_estimate():
    config = GPTConfig(vocab_size=10, d_model=8, n_heads=2, d_ff=8, n_layers=10**9, max_len=4)
    with pytest.raises(ValueError) as info:
        config.check_memory(memory=8 << 30)
    assert str(info.value).startswith(
        "vocab_size=10 d_model=8 d_ff=8 n_layers=1000000000 max_len=4: a model this size "
        f"({config.parameter_count():,} float32 parameters) needs at least "
        f"{4 * config.parameter_count() / 2**30:,.0f} GiB of memory for its weights, ")
    assert "8 GiB" in str(info.value)
    small = GPTConfig(vocab_size=10, d_model=8, n_heads=2, d_ff=8, n_layers=2, max_len=4)
    small.check_memory(training=True, memory=small.memory_estimate(training=True))
    with pytest.raises(ValueError, match="for its weights, gradients and Adam's two moments"):
        small.check_memory(training=True, memory=small.memory_estimate(training=True) - 1)


def test_the_available_memory_respects_an_address_space_limit():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    physical = configs.physical_memory()
    assert physical and configs.available_memory() <= physical
    resource.setrlimit(resource.RLIMIT_AS, (min(hard, 2**44), hard))    # 16 TiB, above it all
    try:
        limited = configs.available_memory()
        assert 0 < limited <= min(physical, 2**44)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.mark.parametrize("option,value", [("--layers", "1000000000"), ("--d-model", "6000000"),
                                          ("--context", "1000000000000")])
def test_lm_refuses_a_model_too_big_naming_its_options(tmp_path, capsys, monkeypatch, option,
                                                       value):
    monkeypatch.setattr(common, "physical_memory", lambda: 8 << 30)
    data = tmp_path / "text.txt"
    data.write_text("hello world\n" * 100, encoding="utf-8")
    start = time.perf_counter()
    assert main(["lm", "--data", str(data), "--out", str(tmp_path / "run"), option, value,
                 "--quiet"]) == 1
    assert time.perf_counter() - start < 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"{option} {value}" in lines[0], err
    assert "GiB of memory" in lines[0] and "choose smaller values" in lines[0]
    assert not (tmp_path / "run").exists()


RESIDENT = """
import numpy as np
import npformer as nf

def resident():
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return int(status["VmRSS"].split()[0]) * 1024

start = resident()
model = nf.GPT(64, d_model=512, n_heads=8, d_ff=2048, n_layers=10, max_len=32).eval()
weights = model.flat_params.nbytes
model.forward(np.zeros((1, 8), dtype=np.int64))
sampled = resident() - start
model.train()
model.backward(np.ones((1, 8, 64), dtype=model.dtype) * 1e-3)    # now the gradients are written
trained = resident() - start
print(weights, sampled, trained)
"""


def test_a_model_that_samples_holds_its_weights_not_its_gradients():
    """memory_estimate(training=False) counts the weights and tables, no gradients: measured, a
    model built and run forward holds about its weights; a backward pass then writes the
    gradient buffer, which holds as much again."""
    import subprocess
    import sys
    if not Path("/proc/self/status").is_file():
        pytest.skip("no /proc/self/status to read the resident memory from")
    done = subprocess.run([sys.executable, "-c", RESIDENT], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    weights, sampled, trained = map(int, done.stdout.split())
    config = GPTConfig(vocab_size=64, d_model=512, n_heads=8, d_ff=2048, n_layers=10, max_len=32)
    assert config.memory_estimate() - weights < 2**20                # the tables: small here
    assert sampled < 1.5 * weights, (weights, sampled)
    assert trained > sampled + 0.8 * weights, (weights, sampled, trained)
