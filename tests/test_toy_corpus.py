"""Tests for the toy Chinese→English corpus (npformer.data.toy)."""
import pytest

from npformer.data.toy import (
    ADJECTIVES, NOUNS, PERSONS, VERBS, Clause, Description, NounPhrase, ToyCorpus,
    conjugate, generate_toy_corpus, indefinite_article, pluralize, render,
    third_person_singular, toy_examples,
)

PERSON = {p.zh: p for p in PERSONS}
VERB = {v.zh: v for v in VERBS}
NOUN = {n.zh: n for n in NOUNS}
ADJ = {a.zh: a for a in ADJECTIVES}
POSSESSIVE = {p.possessive_zh: p for p in PERSONS}


@pytest.fixture(scope="module")
def corpus():
    return generate_toy_corpus(seed=0)


def words(pairs):
    return {w for zh, en in pairs for w in zh.split(" ") + en.split(" ")}


def keys_from_chinese(zh):
    """Combinations in a Chinese sentence, read off the tokens with the lexicon tables only."""
    toks = zh.split(" ")
    noun = next(t for t in reversed(toks) if t in NOUN)
    keys = {("adj", t, noun) for t in toks if t in ADJ}
    if toks[0] in PERSON:                                  # clause: subject verb object
        verb = "有" if "没有" in toks else next(t for t in toks if t in VERB)
        keys.add(("svo", toks[0], verb, noun))
    else:
        assert toks[0] in POSSESSIVE, zh
    return keys


# ---- the corpus --------------------------------------------------------------------------

def test_default_sizes_and_format(corpus):
    assert isinstance(corpus, ToyCorpus)
    assert len(corpus.train) == 3000 and len(corpus.heldout) == 300
    for zh, en in corpus.train + corpus.heldout:
        for side in (zh, en):
            toks = side.split(" ")
            assert all(toks) and side == side.strip()    # single spaces, no empty tokens
            assert 3 <= len(toks) <= 10


def test_custom_sizes():
    c = generate_toy_corpus(seed=3, n_train=500, n_heldout=25)
    assert len(c.train) == 500 and len(c.heldout) == 25
    assert generate_toy_corpus(seed=3, n_train=50, n_heldout=0).heldout == []


def test_same_seed_same_corpus(corpus):
    again = generate_toy_corpus(seed=0)
    assert again.train == corpus.train and again.heldout == corpus.heldout


def test_different_seed_different_sample(corpus):
    other = generate_toy_corpus(seed=1)
    assert other.train != corpus.train
    assert set(other.heldout) != set(corpus.heldout)


def test_more_heldout_pairs_extend_the_same_list(corpus):
    bigger = generate_toy_corpus(seed=0, n_heldout=500)
    assert bigger.train == corpus.train
    assert bigger.heldout[:300] == corpus.heldout and len(bigger.heldout) == 500


def test_no_duplicates_and_no_heldout_pair_in_train(corpus):
    train_zh = [zh for zh, _ in corpus.train]
    held_zh = [zh for zh, _ in corpus.heldout]
    assert len(set(train_zh)) == len(train_zh) and len(set(held_zh)) == len(held_zh)
    assert not set(train_zh) & set(held_zh)


def test_heldout_uses_combinations_never_seen_in_training(corpus):
    seen = set().union(*(keys_from_chinese(zh) for zh, _ in corpus.train))
    for zh, en in corpus.heldout:
        assert keys_from_chinese(zh) - seen, f"held-out {zh!r} only uses combinations seen in training"


def test_heldout_vocabulary_is_a_subset_of_train_vocabulary(corpus):
    assert words(corpus.heldout) <= words(corpus.train)
    for seed in range(5):   # a small training set covers few words: generate_toy_corpus must check
        small = generate_toy_corpus(seed=seed, n_train=40, n_heldout=10)
        assert words(small.heldout) <= words(small.train)


def test_every_chinese_sentence_has_one_translation():
    translation = {}
    for seed in range(3):
        c = generate_toy_corpus(seed=seed)
        for zh, en in c.train + c.heldout:
            assert translation.setdefault(zh, en) == en, zh


def test_names_do_not_take_their_own_possessive(corpus):
    names = [p for p in PERSONS if p.is_name]
    assert names
    for zh, _ in corpus.train + corpus.heldout:
        toks = zh.split(" ")
        for p in names:
            assert not (toks[0] == p.zh and p.possessive_zh in toks), zh


# ---- English rules, on the whole corpus ----------------------------------------------------

def test_articles_agree_with_next_word_in_corpus(corpus):
    n_an = 0
    for _, en in corpus.train + corpus.heldout:
        toks = en.split(" ")
        for t, nxt in zip(toks, toks[1:]):
            if t in ("a", "an"):
                assert t == ("an" if nxt[0] in "aeiou" else "a"), en
                n_an += t == "an"
    assert n_an > 50


def test_subject_verb_agreement_in_corpus(corpus):
    third = {p.en for p in PERSONS if p.third_singular}
    base = {p.en for p in PERSONS if not p.third_singular}
    verbs_3sg = {third_person_singular(v.en) for v in VERBS}
    verbs_base = {v.en for v in VERBS}
    for zh, en in corpus.train:
        toks = en.split(" ")
        if zh.split(" ")[0] not in PERSON:
            continue
        if toks[0] in third:
            assert toks[1] in verbs_3sg or (toks[1] == "doesn't" and toks[2] in verbs_base), en
        else:
            assert toks[0] in base
            assert toks[1] in verbs_base or (toks[1] == "don't" and toks[2] in verbs_base), en


def test_number_agreement_in_corpus(corpus):
    singular = {n.en for n in NOUNS}
    plural = {pluralize(n.en) for n in NOUNS}
    for zh, en in corpus.train:
        toks = en.split(" ")
        if {"two", "three", "some"} & set(toks):
            assert toks[-1] in plural, en
        if {"a", "an"} & set(toks):
            assert toks[-1] in singular, en


# ---- rule functions ----------------------------------------------------------------------

@pytest.mark.parametrize("word, article", [
    ("apple", "an"), ("egg", "an"), ("umbrella", "an"), ("old", "an"), ("orange", "an"),
    ("elephant", "an"), ("big", "a"), ("red", "a"), ("car", "a"), ("small", "a"),
])
def test_indefinite_article(word, article):
    assert indefinite_article(word) == article


@pytest.mark.parametrize("noun, plural", [
    ("apple", "apples"), ("box", "boxes"), ("peach", "peaches"), ("bus", "buses"),
    ("strawberry", "strawberries"), ("day", "days"), ("mouse", "mice"), ("sheep", "sheep"),
    ("knife", "knives"), ("dish", "dishes"),
])
def test_pluralize(noun, plural):
    assert pluralize(noun) == plural


@pytest.mark.parametrize("verb, form", [
    ("have", "has"), ("like", "likes"), ("wash", "washes"), ("carry", "carries"),
    ("buy", "buys"), ("eat", "eats"), ("go", "goes"), ("watch", "watches"),
])
def test_third_person_singular(verb, form):
    assert third_person_singular(verb) == form


def test_conjugate():
    assert conjugate("have", True) == ["has"]
    assert conjugate("have", False) == ["have"]
    assert conjugate("like", True, negated=True) == ["doesn't", "like"]
    assert conjugate("like", False, negated=True) == ["don't", "like"]


@pytest.mark.parametrize("fn", [indefinite_article, pluralize, third_person_singular])
@pytest.mark.parametrize("bad", ["", "Apple", "two words", 3, None])
def test_rule_functions_reject_bad_words(fn, bad):
    with pytest.raises(ValueError, match="must be a non-empty lower-case English word"):
        fn(bad)


def test_conjugate_rejects_non_bool():
    with pytest.raises(ValueError, match="third_singular"):
        conjugate("have", 1)


# ---- rendering ---------------------------------------------------------------------------

def test_render_clause_agreement_article_and_reordering():
    he, i, have, like = PERSON["他"], PERSON["我"], VERB["有"], VERB["喜欢"]
    apple, box = NOUN["苹果"], NOUN["盒子"]
    assert render(Clause(i, have, NounPhrase(apple, "number", 1))) == ("我 有 一个 苹果", "i have an apple")
    assert render(Clause(he, have, NounPhrase(apple, "number", 1))) == ("他 有 一个 苹果", "he has an apple")
    # colour before size in Chinese, size before colour in English; the article follows "old"
    np_ = NounPhrase(box, "number", 1, size=ADJ["旧"], colour=ADJ["红色的"])
    assert render(Clause(he, like, np_)) == ("他 喜欢 一个 红色的 旧 盒子", "he likes an old red box")
    np_ = NounPhrase(box, "number", 3, colour=ADJ["白色的"])
    assert render(Clause(he, like, np_, negated=True)) == (
        "他 不 喜欢 三个 白色的 盒子", "he doesn't like three white boxes")
    assert render(Clause(i, have, NounPhrase(NOUN["老鼠"], "bare"), negated=True)) == (
        "我 没有 老鼠", "i don't have mice")
    np_ = NounPhrase(NOUN["猫"], "possessive", possessor=PERSON["小明"])
    assert render(Clause(PERSON["她"], VERB["洗"], np_)) == ("她 洗 小明的 猫", "she washes xiaoming's cat")


def test_render_description():
    me, car = PERSON["我"], NOUN["车"]
    assert render(Description(me, car, ADJ["大"])) == ("我的 车 很 大", "my car is big")
    assert render(Description(me, car, ADJ["大"], negated=True)) == ("我的 车 不 大", "my car is not big")
    assert render(Description(me, car, ADJ["红色的"], negated=True)) == (
        "我的 车 不 是 红色的", "my car is not red")


def test_render_rejects_unknown_structures():
    with pytest.raises(ValueError, match="Clause or a Description"):
        render("我 有 一个 苹果")
    with pytest.raises(ValueError, match="NounPhrase.det"):
        render(Clause(PERSON["我"], VERB["有"], NounPhrase(NOUN["苹果"], "the")))


# ---- arguments and examples --------------------------------------------------------------

@pytest.mark.parametrize("kwargs, name", [
    ({"n_train": 0}, "n_train"), ({"n_train": 2.5}, "n_train"), ({"n_heldout": -1}, "n_heldout"),
    ({"seed": "0"}, "seed"), ({"seed": True}, "seed"), ({"seed": -1}, "seed must be an integer >= 0"),
    ({"n_train": 10 ** 6}, "n_train"),
])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        generate_toy_corpus(**kwargs)


def test_toy_examples(corpus):
    examples = toy_examples(corpus, n=6)
    assert len(examples) == 6 and len(set(examples)) == 6
    assert set(examples) <= set(corpus.heldout)
    english = [en.split(" ") for _, en in examples]
    assert any("an" in e for e in english)
    assert any("doesn't" in e for e in english)
    assert toy_examples(corpus, n=0) == []
    assert toy_examples(n=3) == toy_examples(corpus, n=3)
    with pytest.raises(ValueError, match="corpus"):
        toy_examples(corpus=[("我", "i")])
