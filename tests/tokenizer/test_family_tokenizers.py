"""moeserve vs HF `tokenizers` on tokenizers shaped like the common model families, each
trained here with HF `tokenizers` on a generated multilingual corpus:
  o200k-style (MiniMax-M2 / GPT-4o: Split with the o200k regex + ByteLevel without its
  regex, ~32k merges), GPT-2-style (ByteLevel with its own regex, add_prefix_space true and
  false), Llama-3-style (Split with the Llama-3 regex + ByteLevel, TemplateProcessing adding
  BOS, reserved special tokens), Mistral-style (Metaspace prepend_scheme first, no split,
  byte_fallback) and Llama-2-style (Prepend/Replace normalizers, sentencepiece decoder
  sequence); plus added-token edge cases (overlapping tokens, tokens also in the vocab,
  normalized tokens under a lowercasing normalizer, special tokens glued to text)."""
import random

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from test_synthetic_tokenizers import O200K
from tok_oracle import check_encode_decode, check_stream, corpus, random_id_sequences

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")

SCRIPTS = {
    "latin": "abcdefghijklmnopqrstuvwxyzéèàüößñç", "upper": "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "cyrillic": "абвгдеёжзийклмнопрстуфхцчшщъыьэюя", "greek": "αβγδεζηθικλμνξοπρστυφχψω",
    "cjk": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长",
    "kana": "あいうえおかきくけこさしすせそたちつてとなにぬねのアイウエオカキクケコ", "hangul": "가나다라마바사아자차카타파하한국어말글",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهوي", "devanagari": "कखगघचछजझटठडढणतथदधनपफबभमयरलवशसह",
    "thai": "กขคงจฉชซญฎฏฐดตถทธนบปผพฟภมยรลวศษสหอฮ",
}
PUNCT = [" ", " ", " ", " ", ", ", ". ", "\n", "\n\n", "  ", "\t", "!", "?", ": ", "'s ", "'ll ", " (", ") ", " {", "}\n", " = ",
         " == ", "();\n", "    ", " 123", " 2024", "3.14", " #", " //", " -> ", "...", "’", "“", "”", " 😀", " 🇯🇵", "\r\n"]


def generated_corpus(seed, lines):
    """Deterministic pseudo-text: words of repeated syllables per script, mixed with
    punctuation, numbers, code and emoji, so BPE learns many merges in every script."""
    rng = random.Random(seed)
    sylls = {k: ["".join(rng.choice(v) for _ in range(rng.randint(1, 3))) for _ in range(120)] for k, v in SCRIPTS.items()}
    out = []
    for _ in range(lines):
        script = rng.choice(list(SCRIPTS))
        parts = []
        for _ in range(rng.randint(4, 30)):
            s = script if rng.random() < 0.85 else rng.choice(list(SCRIPTS))
            w = "".join(rng.choice(sylls[s][:rng.randint(5, 120)]) for _ in range(rng.randint(1, 4)))
            if s == "latin" and rng.random() < 0.2:
                w = w.capitalize()
            parts.append(w)
            parts.append(rng.choice(PUNCT))
        out.append("".join(parts))
    return out


TRAIN = generated_corpus(1, 7000) + corpus()
TEXTS = corpus() + generated_corpus(2, 150)
_cache = {}


def trained_bpe(key, pre, vocab_size, byte_level=True, normalizer=None, **model_kw):
    if key not in _cache:
        t = Tokenizer(models.BPE(**model_kw))
        if normalizer is not None:
            t.normalizer = normalizer
        t.pre_tokenizer = pre
        kw = dict(initial_alphabet=pre_tokenizers.ByteLevel.alphabet()) if byte_level else dict(limit_alphabet=1000)
        t.train_from_iterator(TRAIN, trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                                           special_tokens=[] if byte_level else ["<unk>", "<s>", "</s>"], **kw))
        _cache[key] = t.to_str()
    return Tokenizer.from_str(_cache[key])


def save(tmp, name, t):
    p = tmp / f"{name}.json"
    t.save(str(p))
    return Tokenizer.from_file(str(p)), p


VARIANTS = {}


def variant(f):
    VARIANTS[f.__name__] = f
    return f


def o200k_pre():
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(O200K), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


@variant
def o200k_large_vocab(tmp):
    t = trained_bpe("o200k", o200k_pre(), 32000)
    t.normalizer = normalizers.NFC()
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["]~!b[", "]~b]", "[e~[", "<|endoftext|>"]])
    t.add_tokens([AddedToken(s, normalized=False) for s in ["<think>", "</think>", "<minimax:tool_call>"]])
    assert t.get_vocab_size() > 30000
    return save(tmp, "o200k", t)


@variant
def gpt2_prefix_space(tmp):
    t = trained_bpe("gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False), 6000)
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    t.post_processor = processors.ByteLevel(trim_offsets=True)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return save(tmp, "gpt2_ps", t)


@variant
def gpt2_no_prefix_space(tmp):
    t = trained_bpe("gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False), 6000)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    return save(tmp, "gpt2", t)


@variant
def llama3_style(tmp):
    pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
                                   pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    t = trained_bpe("llama3", pre, 8000, ignore_merges=True)
    t.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    specials += [f"<|reserved_special_token_{k}|>" for k in range(20)]
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    bos = t.token_to_id("<|begin_of_text|>")
    t.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),
                                            processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                                                          special_tokens=[("<|begin_of_text|>", bos)])])
    return save(tmp, "llama3", t)


def sp_bpe(key, normalizer, pre):
    t = trained_bpe(key, pre, 4000, byte_level=False, normalizer=normalizer, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    # sentencepiece BPE vocabularies carry the 256 byte tokens right after the specials.
    import json
    j = json.loads(t.to_str())
    vocab = j["model"]["vocab"]
    for b in range(256):
        vocab.setdefault("<0x%02X>" % b, len(vocab))
    return Tokenizer.from_str(json.dumps(j))


SP_DECODER = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])


@variant
def mistral_metaspace_first(tmp):
    t = sp_bpe("mistral", None, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False))
    t.decoder = SP_DECODER
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", t.token_to_id("<s>"))])
    return save(tmp, "mistral", t)


@variant
def llama2_prepend_replace(tmp):
    t = sp_bpe("llama2", normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]), None)
    t.decoder = SP_DECODER
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<unk>", "<s>", "</s>"]])
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", t.token_to_id("<s>"))])
    return save(tmp, "llama2", t)


@variant
def added_token_edge_cases(tmp):
    t = trained_bpe("gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False), 6000)
    t.normalizer = normalizers.Lowercase()
    t.decoder = decoders.ByteLevel()
    vocab = t.get_vocab()
    in_vocab = sorted((k for k in vocab if len(k) >= 3 and k.isalpha()), key=lambda k: vocab[k])[:2]
    t.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<a>", "<a><b>", "<ab", "ab>", "<|im_end|>"]])
    t.add_tokens([AddedToken(s, normalized=False) for s in in_vocab])  # already model tokens: keep their ids
    t.add_tokens([AddedToken("HELLO", normalized=True),  # matched after lowercasing: "Hello", "hello", "HELLO"
                  AddedToken("Wor", normalized=True, single_word=True), AddedToken("ld", normalized=False, rstrip=True),
                  AddedToken("<x>", normalized=False, lstrip=True, rstrip=True)])
    return save(tmp, "added", t)


EDGE_TEXTS = ["<a><b><ab>ab><a>x<|im_end|>y", "text<|im_end|>text<a>b", "Hello HELLO hello world World wor ld  ld <x>  <x>",
              "<|im_end|><|im_end|>\n<|im_end|> ", "<a><b<a><b>>", "worldHELLOworld", "İstanbul HELLO"]


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_family_encode_decode(name, tmp_path):
    hf, path = VARIANTS[name](tmp_path)
    check_encode_decode(hf, path, TEXTS + EDGE_TEXTS)


@pytest.mark.parametrize("name", ["o200k_large_vocab", "llama3_style", "mistral_metaspace_first", "gpt2_prefix_space"])
def test_family_stream(name, tmp_path):
    hf, path = VARIANTS[name](tmp_path)
    vocab = hf.get_vocab()
    extra = [vocab[t] for t in vocab if t.startswith("<0x")][:256]
    check_stream(hf, path, random_id_sequences(hf, seed=7, count=150, max_len=40, extra_ids=extra))
    check_stream(hf, path, [hf.encode(t).ids for t in TEXTS[:80]])
