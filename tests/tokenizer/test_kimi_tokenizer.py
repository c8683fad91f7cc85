"""Kimi's tokenizer (tiktoken.model + tokenization_kimi.py's regex and special tokens) against
the `tiktoken` package: moeserve's encode/decode/stream must equal
tiktoken.Encoding(pat_str=KIMI_PAT, mergeable_ranks, special_tokens) run as tokenization_kimi.py
runs it (400k-character pieces, runs of at most 25k (non-)whitespace characters,
allowed_special="all"). The real Kimi ranks are not available offline: the committed fixture
(tests/fixtures/tokenizer/kimi_tiny, 40,000 ranks) and a full-size one made here from Qwen3's
151,643-token vocabulary (make_kimi_tiktoken.py) stand in."""
import json
import random
import subprocess
import sys

import pytest

from tok_oracle import DATA, FIXTURES, corpus, run_batch

tiktoken = pytest.importorskip("tiktoken")
from tiktoken.load import load_tiktoken_bpe  # noqa: E402

# tokenization_kimi.py's pat_str, verbatim (with the "&&" class intersections).
KIMI_PAT = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
# moeserve's rewrite (src/tokenizer/tiktoken.cpp): [X&&[^\p{Han}]] -> (?:(?!\p{Han})[X]).
REWRITTEN = (KIMI_PAT.replace(r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]", r"(?:(?!\p{Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])")
             .replace(r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]", r"(?:(?!\p{Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])"))
NUM_SPECIAL = 256


def split_runs(s, max_len):  # tokenization_kimi.py _split_whitespaces_or_nonwhitespaces
    cur_len, cur_space, start = 0, (s[0].isspace() if s else False), 0
    for i in range(len(s)):
        sp = s[i].isspace()
        if cur_space ^ sp:
            cur_len, cur_space = 1, sp
        else:
            cur_len += 1
            if cur_len > max_len:
                yield s[start:i]
                start, cur_len = i, 1
    yield s[start:]


class Kimi:
    """The oracle: tokenization_kimi.py's TikTokenTokenizer, minus transformers."""

    def __init__(self, folder, pat=KIMI_PAT):
        ranks = load_tiktoken_bpe(str(folder / "tiktoken.model"))
        base = len(ranks)
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        named = {int(i): t["content"] for i, t in cfg["added_tokens_decoder"].items()}
        self.special = {named.get(i, f"<|reserved_token_{i}|>"): i for i in range(base, base + NUM_SPECIAL)}
        self.base = base
        self.enc = tiktoken.Encoding(name="kimi-test", pat_str=pat, mergeable_ranks=ranks, special_tokens=self.special)

    def encode(self, text):
        ids = []
        for i in range(0, len(text), 400_000):
            for sub in split_runs(text[i:i + 400_000], 25_000):
                ids += self.enc.encode(sub, allowed_special="all")
        return ids

    def decode(self, ids, skip=False):
        return self.enc.decode([i for i in ids if not (skip and i >= self.base)])


def kimi_corpus():
    texts = corpus()
    texts += [
        "你好，世界！今天天气很好。我们去北京大学吧",
        "Kimi是月之暗面开发的模型，supports English和中文混合 text。",
        "日本語のテキスト：東京タワー、ひらがなとカタカナ。々〇〡〢〩 〪〭 ー",
        "한국어 텍스트와 漢字 혼합; Ελληνικά, русский текст, العربية, עברית, हिन्दी",
        "I'm sure they'll say it's fine; WE'VE DONE IT, she'd've, O'NEIL's, 'S 'T",
        "ǅemal ǈubljana ʰʲ ˢᵘᵖ Ⅻ ⅻ 𝐀𝐁𝐂 ａｂｃ ＡＢＣ １２３",
        "1234567890 3.14159 1,000,000 ٣٤٥ ४५६ 12ab34 x86_64",
        "tabs\t\tand\nnewlines\r\n\r\n   spaces    \n\n\n  end  ",
        "e\u0301 a\u0308 \u0301start 漢\u0301字 n\u0303o",
        "emoji 😀👍🏽 👨‍👩‍👧 flags 🇫🇷 ✓ ★",
        "<|im_system|>system<|im_middle|>You are Kimi.<|im_end|><|im_user|>user<|im_middle|>hi<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>hmm</think>ok<|tool_calls_section_begin|>"
        "<|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
        "[BOS]text[EOS] [PAD]<|reserved_token_163590|><|reserved_token_40005|> <|im_end|x <think",
        "a" * 30_000 + " " * 26_000 + "b" * 50_001 + "\n" * 25_001 + "中" * 25_002,
        "<think>" + "x" * 24_998 + "<|im_end|>" + "y" * 5,
    ]
    rng = random.Random(5)
    pool = list("aZ 中文ー々〇'sll\n\t\r 123٣éß😀,.!?-_<|>[]") + ["\u0301", "\u3000", "\u00a0", "\u2028", "<think>", "<|im_end|>"]
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(0, 60))) for _ in range(400)]
    return texts


@pytest.fixture(scope="module", params=["kimi_tiny", "qwen3_full"])
def folder(request, tmp_path_factory):
    if request.param == "kimi_tiny":
        return FIXTURES / "kimi_tiny"
    src = DATA / "tokenizers" / "qwen3" / "tokenizer.json"
    if not src.exists():
        pytest.skip("no Qwen3 tokenizer.json in the shared data")
    out = tmp_path_factory.mktemp("kimi_full")
    subprocess.check_call([sys.executable, str(FIXTURES.parent.parent / "tokenizer" / "make_kimi_tiktoken.py"),
                           str(src), str(out)])
    return out


def test_rewritten_pattern_equals_the_original_under_tiktoken(folder):
    # The same (Rust) engine with both patterns: the rewrite of "&&" changes nothing.
    orig, rew = Kimi(folder), Kimi(folder, REWRITTEN)
    for t in kimi_corpus():
        assert orig.encode(t) == rew.encode(t), t[:80]


def test_encode_decode_stream_equal_tiktoken(folder):
    k = Kimi(folder)
    texts = kimi_corpus()
    reqs = [{"op": "encode", "text": t, "special": s} for t in texts for s in (False, True)]
    got = run_batch(folder, reqs)
    bad = [(t, k.encode(t), g) for t, g in zip([t for t in texts for _ in (0, 1)], got) if g.get("ids") != k.encode(t)]
    assert not bad, "encode mismatches (first 2): %r" % ([(t[:60], w[:20], g) for t, w, g in bad[:2]],)
    # Decode and streaming of the encodings and of random id sequences (specials included;
    # random ids give invalid UTF-8, which both replace with U+FFFD).
    rng = random.Random(11)
    n = k.base + NUM_SPECIAL
    seqs = [k.encode(t) for t in texts[:300]]
    seqs += [[rng.randrange(n) for _ in range(rng.randint(0, 40))] for _ in range(300)]
    reqs = [{"op": op, "ids": s, "skip": skip} for s in seqs for op in ("decode", "stream") for skip in (False, True)]
    got = run_batch(folder, reqs)
    bad = []
    for r, g in zip(reqs, got):
        want = k.decode(r["ids"], r["skip"])
        have = g.get("text") if r["op"] == "decode" else "".join(g.get("deltas", ["<error>"]))
        if have != want:
            bad.append((r, want, g))
    assert not bad, "decode/stream mismatches (first 2): %r" % (bad[:2],)
    info = run_batch(folder, [{"op": "info"}])[0]
    assert info["vocab_size"] == n
