"""moeserve vs HF `tokenizers` on the non-BPE model types and the components that come with
them, each tokenizer.json built here with HF `tokenizers` (or sentencepiece) and compared on
the test corpus + the Big List of Naughty Strings:
  WordPiece (BERT family: BertNormalizer variants, BertPreTokenizer, BertProcessing,
  WordPiece decoder, max_input_chars_per_word, missing unk), WordLevel (+ RobertaProcessing,
  BPEDecoder), Unigram trained by HF (byte_fallback, Metaspace, Nmt, NFKD, CTC decoder) and
  Unigram from sentencepiece models whose precompiled_charsmap feeds the Precompiled
  normalizer (nmt_nfkc and nfkc_cf rules), laid out as the T5 / XLM-R converters do."""
import base64
import io
import json

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tok_oracle import check_encode_decode, check_stream, corpus, random_id_sequences

TEXTS = corpus()
# Extra texts for the normalizers: accents (composed and not), CJK, controls, odd spaces,
# sentencepiece's own meta symbol, full-width forms, ligatures, Hangul jamo, emoji sequences.
EXTRA = ["Héllo Wörld ÀÉÎÕÜ e\u0301 a\u0308\u0301", "中文字符测试，日本語のテキスト、한국어 텍스트", "tab\there\x0bvt\x0cff\x1fus\x7fdel\x85nel",
         "zero\u200bwidth\u200d joiner\ufeffbom\u2028ls\u2029ps\u1680ogham", "▁meta▁ space\ufffd", "ＦＵＬＬ ｗｉｄｔｈ １２３",
         "ﬁnal ﬂow ǅ ǈ Ⅻ ½ ㎏ ℡", "\u1100\u1161\u11a8 각 \U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F1EF\U0001F1F5",
         "  leading and   multiple   spaces  ", "İstanbul ΣΊΣΥΦΟΣ straße", "don't do not it's we're I'm they've . , ! ?",
         "\u0915\u094d\u0937 \u0e01\u0e33 \u0627\u0644\u0639\u0631\u0628\u064a\u0629", "\U00020000\U0002A700\U0002B820 \uf900 \u4e00\u9fff",
         # Characters HF's (pre-Unicode-9) category tables do not know: newer punctuation,
         # format characters and marks; HF keeps them as ordinary characters.
         "Apples are りんご 林檎 ーカタカナ", " a", "   ", "x\u0378y abc\U000C5000def \U000C5000", "ab12цд3 ζ!",
         "a\u2e43b\u2e4fc\u2e5d d\u08e2e\u0890f\U000110cdg\U00013430 h\u1885i\u07fdj\u0898k\u1ac0l a\u0301\u0898"]
ALL = TEXTS + EXTRA

_cache = {}


def save(name, tmp_path, tok):
    p = tmp_path / f"{name}.json"
    tok.save(str(p))
    return Tokenizer.from_file(str(p)), p


def wordpiece_vocab(limit_alphabet):
    key = ("wp", limit_alphabet)
    if key not in _cache:
        t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        t.normalizer = normalizers.BertNormalizer()
        t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        t.train_from_iterator(ALL, trainers.WordPieceTrainer(vocab_size=1500, limit_alphabet=limit_alphabet, show_progress=False,
                                                               special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
        _cache[key] = json.loads(t.to_str())["model"]["vocab"]
    return dict(_cache[key])


def bert(tmp_path, name, vocab, unk="[UNK]", max_chars=100, normalizer=None, decoder=None):
    t = Tokenizer(models.WordPiece(vocab=vocab, unk_token=unk, max_input_chars_per_word=max_chars))
    t.normalizer = normalizer if normalizer is not None else normalizers.BertNormalizer()
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    t.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]), ("[CLS]", vocab["[CLS]"]))
    t.decoder = decoder if decoder is not None else decoders.WordPiece()
    t.add_special_tokens(["[PAD]", "[UNK]", "[CLS]", "[SEP]", AddedToken("[MASK]", lstrip=True, special=True)])
    return save(name, tmp_path, t)


VARIANTS = {}


def variant(f):
    VARIANTS[f.__name__] = f
    return f


@variant
def bert_uncased(tmp):
    return bert(tmp, "bert_uncased", wordpiece_vocab(200))


@variant
def bert_cased_no_chinese(tmp):
    return bert(tmp, "bert_cased", wordpiece_vocab(200),
                normalizer=normalizers.BertNormalizer(lowercase=False, handle_chinese_chars=False),
                decoder=decoders.WordPiece(cleanup=False))


@variant
def bert_strip_accents_only(tmp):
    return bert(tmp, "bert_strip", wordpiece_vocab(120),
                normalizer=normalizers.BertNormalizer(clean_text=False, strip_accents=True, lowercase=False))


@variant
def bert_lowercase_keep_accents_short_words(tmp):
    return bert(tmp, "bert_keep", wordpiece_vocab(120), max_chars=6,
                normalizer=normalizers.BertNormalizer(strip_accents=False, lowercase=True))


@variant
def bert_missing_unk(tmp):
    # "[UNK]" is not in the vocab: HF fails on an unknown word, so must moeserve.
    v = wordpiece_vocab(200)
    v["[UNKNOWN]"] = v.pop("[UNK]")
    t = Tokenizer(models.WordPiece(vocab=v, unk_token="[UNK]"))
    t.normalizer = normalizers.BertNormalizer()
    t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return save("bert_nounk", tmp, t)


def word_level_vocab():
    if "wl" not in _cache:
        t = Tokenizer(models.WordLevel(unk_token="<unk>"))
        t.pre_tokenizer = pre_tokenizers.Whitespace()
        t.train_from_iterator(ALL, trainers.WordLevelTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                                             show_progress=False))
        _cache["wl"] = json.loads(t.to_str())["model"]["vocab"]
    return dict(_cache["wl"])


@variant
def wordlevel_roberta(tmp):
    v = word_level_vocab()
    t = Tokenizer(models.WordLevel(vocab=v, unk_token="<unk>"))
    t.normalizer = normalizers.Sequence([normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()])
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()])
    t.post_processor = processors.RobertaProcessing(("</s>", v["</s>"]), ("<s>", v["<s>"]))
    t.decoder = decoders.BPEDecoder(suffix="s")
    t.add_special_tokens(["<s>", "</s>", "<unk>"])
    return save("wordlevel", tmp, t)


def unigram_vocab():
    if "ug" not in _cache:
        t = Tokenizer(models.Unigram())
        t.normalizer = normalizers.Nmt()
        t.pre_tokenizer = pre_tokenizers.Metaspace()
        t.train_from_iterator(ALL, trainers.UnigramTrainer(vocab_size=2500, special_tokens=["<pad>", "<unk>", "<s>"],
                                                           unk_token="<unk>", show_progress=False, max_piece_length=8))
        _cache["ug"] = [tuple(x) for x in json.loads(t.to_str())["model"]["vocab"]]
    return list(_cache["ug"])


@variant
def unigram_metaspace_nmt(tmp):
    v = unigram_vocab()
    t = Tokenizer(models.Unigram(v, unk_id=1))
    t.normalizer = normalizers.Sequence([normalizers.Nmt(), normalizers.NFKC()])
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    t.decoder = decoders.Metaspace()
    t.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", len(v))])
    t.add_special_tokens(["</s>", "<pad>"])
    return save("unigram_nmt", tmp, t)


def unigram_bf_tokenizer(tmp, name, decoder):
    # <0xXX> pieces added with low scores; unknown runs (fused) fall back to bytes.
    v = unigram_vocab() + [("<0x%02X>" % b, -30.0) for b in range(256)]
    t = Tokenizer(models.Unigram(v, unk_id=1, byte_fallback=True))
    t.normalizer = normalizers.NFKD()
    t.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
    t.decoder = decoder
    return save(name, tmp, t)


@variant
def unigram_byte_fallback(tmp):
    return unigram_bf_tokenizer(tmp, "unigram_bf", decoders.Sequence([decoders.ByteFallback(),
                                                                       decoders.Metaspace(prepend_scheme="first")]))


@variant
def unigram_unicode_scripts(tmp):
    v = unigram_vocab()
    t = Tokenizer(models.Unigram(v, unk_id=1))
    t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.UnicodeScripts(), pre_tokenizers.Metaspace()])
    t.decoder = decoders.Metaspace()
    return save("unigram_scripts", tmp, t)


@variant
def unigram_ctc_decoder(tmp):
    # CTC collapses repeats, so it is not streamed (a speech-model decoder).
    return unigram_bf_tokenizer(tmp, "unigram_ctc", decoders.Sequence([decoders.ByteFallback(),
                                                                        decoders.CTC(pad_token="<pad>", word_delimiter_token="▁")]))


def sentencepiece_model(rule):
    """Trains a small sentencepiece unigram model; returns (pieces, unk_id, charsmap bytes)."""
    if ("spm", rule) not in _cache:
        spm = pytest.importorskip("sentencepiece")
        from sentencepiece import sentencepiece_model_pb2 as pb
        buf = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(ALL * 3), model_writer=buf, vocab_size=2000, model_type="unigram",
                                       normalization_rule_name=rule, byte_fallback=True, hard_vocab_limit=False,
                                       character_coverage=0.9995, minloglevel=2, num_threads=1, seed_sentencepiece_size=20000)
        m = pb.ModelProto()
        m.ParseFromString(buf.getvalue())
        pieces = [(p.piece, p.score) for p in m.pieces]
        _cache[("spm", rule)] = (pieces, m.trainer_spec.unk_id, m.normalizer_spec.precompiled_charsmap)
    return _cache[("spm", rule)]


def spm_tokenizer(tmp, name, rule, byte_fallback):
    # Layout of transformers' T5/XLM-R conversion: Precompiled + collapse runs of spaces,
    # Metaspace pre-tokenizer and decoder, </s> appended.
    pieces, unk_id, charsmap = sentencepiece_model(rule)
    assert charsmap, "sentencepiece gave no precompiled_charsmap"
    t = Tokenizer(models.Unigram(pieces, unk_id=unk_id, byte_fallback=byte_fallback))
    t.normalizer = normalizers.Sequence([normalizers.Precompiled(charsmap), normalizers.Replace(Regex(" {2,}"), " ")])
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    t.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")])
    eos = [i for i, (p, _) in enumerate(pieces) if p == "</s>"][0]
    t.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", eos)])
    t.add_special_tokens(["<s>", "</s>", "<unk>"])
    return save(name, tmp, t)


@variant
def sentencepiece_t5_nmt_nfkc(tmp):
    return spm_tokenizer(tmp, "spm_nmt", "nmt_nfkc", byte_fallback=False)


@variant
def sentencepiece_llama_nfkc_cf_byte_fallback(tmp):
    return spm_tokenizer(tmp, "spm_cf", "nfkc_cf", byte_fallback=True)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_model_type_encode_decode(name, tmp_path):
    hf, path = VARIANTS[name](tmp_path)
    check_encode_decode(hf, path, ALL)


@pytest.mark.parametrize("name", ["bert_uncased", "unigram_byte_fallback", "sentencepiece_llama_nfkc_cf_byte_fallback",
                                  "bert_cased_no_chinese"])
def test_model_type_stream(name, tmp_path):
    hf, path = VARIANTS[name](tmp_path)
    vocab = hf.get_vocab()
    extra = [vocab[t] for t in vocab if t.startswith("<0x") or t.startswith("##")][:300]
    check_stream(hf, path, random_id_sequences(hf, seed=5, count=150, max_len=30, extra_ids=extra))
    check_stream(hf, path, [hf.encode(t).ids for t in ALL[:60]])


def test_precompiled_charsmap_is_exercised(tmp_path):
    """The sentencepiece charsmap really changes text (else the Precompiled test proves little)."""
    _, _, charsmap = sentencepiece_model("nmt_nfkc")
    n = normalizers.Precompiled(charsmap)
    assert n.normalize_str("ﬁ１２") == "fi12"
    assert base64.b64encode(charsmap)
