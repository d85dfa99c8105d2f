"""Tests for npformer.data.vocab.Vocab."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from npformer.data.vocab import Vocab

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
SENTENCES = [["我", "有", "苹果"], ["你", "有", "猫"], ["我", "喜欢", "猫"], ["我", "有", "书"]]


def test_special_ids():
    v = Vocab(SPECIALS + ["a"])
    assert (v.pad_id, v.bos_id, v.eos_id, v.unk_id) == (0, 1, 2, 3)
    assert [v.token_to_id(t) for t in SPECIALS] == [0, 1, 2, 3]
    assert [Vocab.PAD, Vocab.BOS, Vocab.EOS, Vocab.UNK] == SPECIALS


def test_build_orders_by_frequency_then_token():
    v = Vocab.build(SENTENCES)
    # 我: 3, 有: 3, 猫: 2, then the singletons in code-point order
    assert v.tokens == SPECIALS + ["我", "有", "猫", "书", "你", "喜欢", "苹果"]
    assert len(v) == 11


@settings(max_examples=30)
@given(st.permutations(SENTENCES))
def test_build_does_not_depend_on_sentence_order(sentences):
    assert Vocab.build(sentences) == Vocab.build(SENTENCES)


def test_build_min_freq_and_max_size():
    assert Vocab.build(SENTENCES, min_freq=2).tokens == SPECIALS + ["我", "有", "猫"]
    assert Vocab.build(SENTENCES, max_size=6).tokens == SPECIALS + ["我", "有"]
    assert Vocab.build(SENTENCES, max_size=4).tokens == SPECIALS


def test_build_skips_special_tokens_in_the_data():
    v = Vocab.build([["<unk>", "a", "<eos>", "<unk>"]])
    assert v.tokens == SPECIALS + ["a"]


@pytest.mark.parametrize("kwargs, match", [
    ({"min_freq": 0}, "min_freq"), ({"min_freq": 1.5}, "min_freq"),
    ({"max_size": 3}, "max_size"), ({"max_size": "10"}, "max_size"),
])
def test_build_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Vocab.build(SENTENCES, **kwargs)


def test_build_rejects_untokenised_sentences():
    with pytest.raises(ValueError, match=r"sentences\[1\].*split it first"):
        Vocab.build([["a"], "a b c"])


@pytest.mark.parametrize("tokens, match", [
    (SPECIALS + ["a", "b", "a"], r"unique.*'a'.*ids 4 and 6"),
    (["<pad>", "<bos>", "<eos>", "a"], "must start with the special tokens"),
    (["<bos>", "<pad>", "<eos>", "<unk>"], "must start with the special tokens"),
    (["a", "b"], "must start with the special tokens"),
    (SPECIALS + [""], r"tokens\[4\] must be a non-empty string"),
    (SPECIALS + [7], r"tokens\[4\] must be a non-empty string"),
    ("<pad><bos>", "list of strings"),
])
def test_constructor_rejects_bad_token_lists(tokens, match):
    with pytest.raises(ValueError, match=match):
        Vocab(tokens)


def test_lookup():
    v = Vocab.build(SENTENCES)
    assert "猫" in v and "狗" not in v
    assert v.id_to_token(v.token_to_id("猫")) == "猫"
    assert v.token_to_id("狗") == v.unk_id
    assert v.id_to_token(np.int64(4)) == "我"
    with pytest.raises(ValueError, match=r"token id 11 is out of range for a vocabulary of size 11"):
        v.id_to_token(11)
    with pytest.raises(ValueError, match=r"token id -1 is out of range"):
        v.id_to_token(-1)
    with pytest.raises(ValueError, match="must be an integer"):
        v.id_to_token("4")


def test_encode_specials_and_unknowns():
    v = Vocab.build(SENTENCES)
    ids, unknown = v.encode_with_unknowns(["我", "有", "狗", "和", "猫"], add_bos=True, add_eos=True)
    assert ids == [v.bos_id, v.token_to_id("我"), v.token_to_id("有"), v.unk_id, v.unk_id,
                   v.token_to_id("猫"), v.eos_id]
    assert unknown == ["狗", "和"]
    assert v.encode(["我", "狗"]) == [v.token_to_id("我"), v.unk_id]
    with pytest.raises(ValueError, match="split it first"):
        v.encode("我 有")


@settings(max_examples=50)
@given(st.lists(st.sampled_from(["我", "有", "苹果", "你", "猫", "喜欢", "书"]), max_size=12),
       st.booleans(), st.booleans())
def test_encode_decode_round_trip(tokens, add_bos, add_eos):
    v = Vocab.build(SENTENCES)
    ids = v.encode(tokens, add_bos=add_bos, add_eos=add_eos)
    assert len(ids) == len(tokens) + add_bos + add_eos
    assert v.decode(ids) == tokens
    assert v.decode(np.array(ids, dtype=np.int64)) == tokens


def test_decode_strip_special():
    v = Vocab.build(SENTENCES)
    a, b = v.token_to_id("我"), v.token_to_id("猫")
    ids = [v.bos_id, a, v.unk_id, v.pad_id, b, v.eos_id, a, v.pad_id]
    assert v.decode(ids) == ["我", "<unk>", "猫"]
    assert v.decode(ids, strip_special=False) == [
        "<bos>", "我", "<unk>", "<pad>", "猫", "<eos>", "我", "<pad>"]


def test_decode_rejects_bad_ids():
    v = Vocab.build(SENTENCES)
    with pytest.raises(ValueError, match=r"token id 99 is out of range for a vocabulary of size 11"):
        v.decode([4, 99])
    with pytest.raises(ValueError, match=r"1-D.*\(2, 2\)"):
        v.decode(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="must be an integer"):
        v.decode([4.0])


def test_dict_round_trip():
    v = Vocab.build(SENTENCES)
    assert Vocab.from_dict(v.to_dict()) == v
    assert Vocab.from_dict(json.loads(json.dumps(v.to_dict()))) == v
    with pytest.raises(ValueError, match="format"):
        Vocab.from_dict({"tokens": v.tokens})
    with pytest.raises(ValueError, match="version"):
        Vocab.from_dict({**v.to_dict(), "version": 99})


def test_save_load_round_trip_keeps_chinese_readable(tmp_path):
    v = Vocab.build(SENTENCES)
    path = tmp_path / "vocab.json"
    v.save(path)
    assert "苹果" in path.read_text(encoding="utf-8")       # ensure_ascii=False, no \u escapes
    assert Vocab.load(path) == v
    assert Vocab.load(str(path)) == v


def test_load_rejects_files_that_are_not_vocabularies(tmp_path):
    other = tmp_path / "config.json"
    other.write_text(json.dumps({"d_model": 64}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"config\.json.*not a valid vocabulary"):
        Vocab.load(other)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.json.*not valid UTF-8 JSON"):
        Vocab.load(broken)
    bad_tokens = tmp_path / "bad.json"
    bad_tokens.write_text(json.dumps({"format": "npformer-vocab", "version": 1, "tokens": ["a"]}))
    with pytest.raises(ValueError, match=r"bad\.json.*special tokens"):
        Vocab.load(bad_tokens)


# ---- Vocabularies: a model's vocabularies as one value -----------------------------------------

def test_vocabularies_build_one_per_side_or_one_joint():
    from npformer.data.vocab import Vocabularies
    pairs = [("ich habe".split(), "i have".split()), ("ich".split(), "i".split())]
    two = Vocabularies.build(pairs)
    assert not two.is_joint and two.src.tokens[4:] == ["ich", "habe"]
    assert two.tgt.tokens[4:] == ["i", "have"]
    assert [side for side, _ in two.sides()] == ["src", "tgt"]
    joint = Vocabularies.build(pairs, joint=True)
    assert joint.is_joint and joint.src is joint.tgt and [s for s, _ in joint.sides()] == ["joint"]
    assert sorted(joint.src.tokens[4:]) == ["habe", "have", "i", "ich"]
    assert Vocabularies.from_dict(joint.to_dict()) == joint != two
    # a side left with only the special tokens cannot learn: the error names min_freq and the side
    with pytest.raises(ValueError, match=r"min_freq 3: leaves the source vocabulary with only its 4"):
        Vocabularies.build(pairs, min_freq=3)
    with pytest.raises(ValueError, match=r"min_freq 3: leaves the joint vocabulary"):
        Vocabularies.build(pairs, min_freq=3, joint=True)


def test_vocabularies_check_fits_names_the_side_and_the_size():
    from npformer.data.vocab import Vocabularies
    src, tgt = Vocab(list(SPECIALS) + ["a"]), Vocab(list(SPECIALS) + ["b", "c"])
    vocabs = Vocabularies(src, tgt)
    assert Vocabularies.check_fits(vocabs, {"src": 5, "tgt": 6}) is vocabs
    with pytest.raises(ValueError, match=r"where: the tgt vocabulary has 6 tokens but the model's "
                                         r"configuration says tgt_vocab_size=5"):
        Vocabularies.check_fits(vocabs, {"src": 5, "tgt": 5}, "where")
    with pytest.raises(ValueError, match=r"vocabs: expected a Vocabularies .* got Vocab"):
        Vocabularies.check_fits(src, {"src": 5})
    with pytest.raises(ValueError, match=r"tgt: expected a Vocab, got list"):
        Vocabularies(src, ["<pad>"])
