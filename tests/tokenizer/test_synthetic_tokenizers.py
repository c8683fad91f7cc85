"""moeserve vs HF `tokenizers` on tokenizer.json files built here with HF `tokenizers`, to
cover components the real files do not use: Metaspace + ByteFallback (sentencepiece-style
BPE), Digits, Whitespace, WhitespaceSplit, Punctuation, every Split behaviour and invert,
Replace/Prepend/Strip/Lowercase/NFKC/NFD/StripAccents normalizers, TemplateProcessing,
lstrip/rstrip/single_word/normalized added tokens, and an o200k-style Split regex."""
import json

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tok_oracle import check_encode_decode, check_stream, corpus, random_id_sequences

O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TEXTS = corpus()


def vocab_merges(tok):
    m = json.loads(tok.to_str())["model"]
    merges = [tuple(x) if isinstance(x, list) else tuple(x.split(" ", 1)) for x in m["merges"]]
    return dict(m["vocab"]), merges


_cache = {}


def byte_level_base():
    """A byte-level BPE trained on the corpus (vocab ~800)."""
    if "bl" not in _cache:
        t = Tokenizer(models.BPE())
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        t.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=800, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                           show_progress=False))
        _cache["bl"] = vocab_merges(t)
    return _cache["bl"]


def char_base(sp):
    """A character BPE with a small alphabet (so many characters are unknown); with sp=True the
    words carry sentencepiece's '▁' and the vocab gets the 256 <0xXX> byte tokens."""
    key = ("char", sp)
    if key not in _cache:
        t = Tokenizer(models.BPE(unk_token="<unk>"))
        if sp:
            t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
            t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="always")
        else:
            t.pre_tokenizer = pre_tokenizers.Whitespace()
        t.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=700, limit_alphabet=120, special_tokens=["<unk>"],
                                                           show_progress=False))
        vocab, merges = vocab_merges(t)
        if sp:
            for b in range(256):
                vocab.setdefault("<0x%02X>" % b, len(vocab))
        _cache[key] = (vocab, merges)
    return _cache[key]


def build(name, tmp_path, model, normalizer=None, pre=None, post=None, decoder=None, added=(), special=()):
    t = Tokenizer(model)
    if normalizer is not None:
        t.normalizer = normalizer
    if pre is not None:
        t.pre_tokenizer = pre
    if post is not None:
        t.post_processor = post
    if decoder is not None:
        t.decoder = decoder
    if special:
        t.add_special_tokens(list(special))
    if added:
        t.add_tokens(list(added))
    p = tmp_path / f"{name}.json"
    t.save(str(p))
    return Tokenizer.from_file(str(p)), p


def bl_model():
    v, m = byte_level_base()
    return models.BPE(vocab=v, merges=m)


def sp_model(**kw):
    v, m = char_base(True)
    return models.BPE(vocab=v, merges=m, unk_token="<unk>", byte_fallback=True, fuse_unk=True, **kw)


VARIANTS = {}


def variant(f):
    VARIANTS[f.__name__] = f
    return f


@variant
def gpt2_style_added_tokens(tmp):
    # ByteLevel with its own regex and add_prefix_space; NFKC + Lowercase; added tokens with
    # lstrip / rstrip / single_word, normalized and not.
    return build("gpt2", tmp, bl_model(), normalizer=normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]),
                 pre=pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True), decoder=decoders.ByteLevel(),
                 post=processors.ByteLevel(trim_offsets=False),
                 special=[AddedToken("<mask>", lstrip=True, special=True), AddedToken("[R]", rstrip=True, special=True),
                          AddedToken("<|endoftext|>", special=True)],
                 # "hello" is lower-case: HF 0.22 decodes a normalized added token to its content,
                 # 0.23 to its normalized content; an invariant token keeps both versions equal.
                 added=[AddedToken("hello", single_word=True, normalized=True), AddedToken("WORLD", normalized=False),
                        AddedToken("ab", single_word=True, normalized=False), AddedToken(" spaced ", normalized=False)])


@variant
def llama2_sentencepiece_bytefallback(tmp):
    return build("llama2", tmp, sp_model(),
                 normalizer=normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]),
                 decoder=decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                            decoders.Strip(" ", 1, 0)]),
                 post=processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1000)]),
                 special=[AddedToken("<s>", special=True), AddedToken("</s>", special=True)])


@variant
def metaspace_first_bytefallback(tmp):
    return build("msfirst", tmp, sp_model(), pre=pre_tokenizers.Metaspace(prepend_scheme="first"),
                 decoder=decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="first")]),
                 special=[AddedToken("<s>", special=True)], added=[AddedToken("<extra>", normalized=False)])


@variant
def metaspace_always_nosplit(tmp):
    return build("msalways", tmp, sp_model(ignore_merges=True), pre=pre_tokenizers.Metaspace(prepend_scheme="always", split=False),
                 decoder=decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(), decoders.Metaspace(prepend_scheme="always")]))


@variant
def metaspace_never_custom(tmp):
    v, m = char_base(True)
    return build("msnever", tmp, models.BPE(vocab=v, merges=m, unk_token="<unk>", fuse_unk=False),
                 pre=pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never"),
                 decoder=decoders.Metaspace(prepend_scheme="never"))


@variant
def bert_like_pipeline(tmp):
    v, m = char_base(False)
    return build("bertlike", tmp, models.BPE(vocab=v, merges=m, unk_token="<unk>", fuse_unk=True),
                 normalizer=normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents(), normalizers.Lowercase(),
                                                  normalizers.Strip(), normalizers.Replace(Regex(r"\d{4}"), "YYYY")]),
                 pre=pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True),
                                              pre_tokenizers.Punctuation()]),
                 post=processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 701), ("[SEP]", 702)]),
                 special=[AddedToken("[CLS]", special=True), AddedToken("[SEP]", special=True)])


@variant
def whitespace_split_digits_contiguous(tmp):
    v, m = char_base(False)
    return build("wsplit", tmp, models.BPE(vocab=v, merges=m, unk_token="<unk>"),
                 normalizer=normalizers.Sequence([normalizers.NFKD(), normalizers.Strip(left=False, right=True)]),
                 pre=pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(individual_digits=False),
                                              pre_tokenizers.CharDelimiterSplit("e"),
                                              pre_tokenizers.Punctuation(behavior="merged_with_next")]),
                 decoder=decoders.Fuse())


@variant
def o200k_minimax_style(tmp):
    return build("o200k", tmp, bl_model(), normalizer=normalizers.NFC(),
                 pre=pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(O200K), behavior="isolated"),
                                              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
                 decoder=decoders.ByteLevel(),
                 special=[AddedToken(t, special=True, normalized=False) for t in ["]!p~[", "]~b]", "[e~[", "]!d~[", "]~!b["]],
                 added=[AddedToken(t, special=False, normalized=False) for t in
                        ["<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"]])


@variant
def subword_prefix_and_suffix(tmp):
    # continuing_subword_prefix "##" and end_of_word_suffix "</w>" (merges then drop the
    # right side's prefix), WhitespaceSplit, unk without fuse.
    if "sub" not in _cache:
        t = Tokenizer(models.BPE(unk_token="<unk>", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
        t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        t.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=900, limit_alphabet=150, special_tokens=["<unk>"],
                                                           continuing_subword_prefix="##", end_of_word_suffix="</w>",
                                                           show_progress=False))
        _cache["sub"] = vocab_merges(t)
    v, m = _cache["sub"]
    return build("subword", tmp, models.BPE(vocab=v, merges=m, unk_token="<unk>", continuing_subword_prefix="##",
                                            end_of_word_suffix="</w>"),
                 pre=pre_tokenizers.WhitespaceSplit(), decoder=decoders.Replace("</w>", " "))


BEHAVIORS = ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]
for _beh in BEHAVIORS:
    for _inv in (False, True):
        def _make(tmp, beh=_beh, inv=_inv):
            pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\s+|\d|[.,!?]"), behavior=beh, invert=inv),
                                           pre_tokenizers.Split("ab", behavior=beh, invert=inv),
                                           pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
            return build(f"split_{beh}_{inv}", tmp, bl_model(), pre=pre, decoder=decoders.ByteLevel())
        VARIANTS[f"split_{_beh}_{'invert' if _inv else 'plain'}"] = _make


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_encode_decode(name, tmp_path):
    hf, path = VARIANTS[name](tmp_path)
    check_encode_decode(hf, path, TEXTS)


@pytest.mark.parametrize("name", ["llama2_sentencepiece_bytefallback", "metaspace_first_bytefallback",
                                  "metaspace_always_nosplit", "gpt2_style_added_tokens", "o200k_minimax_style"])
def test_variant_stream(name, tmp_path):
    hf, path = VARIANTS[name](tmp_path)
    vocab = hf.get_vocab()
    byte_ids = [vocab[t] for t in vocab if t.startswith("<0x")] + [vocab[t] for t in vocab if t.startswith("▁")][:50]
    check_stream(hf, path, random_id_sequences(hf, seed=3, count=200, max_len=40, extra_ids=byte_ids))
    check_stream(hf, path, [hf.encode(t).ids for t in TEXTS[:60]])
