"""moeserve vs HF `tokenizers` on the real tokenizer.json files in shared data."""
import pytest

from tok_oracle import DATA, ROOT, check_decode, check_encode_decode, check_stream, corpus, random_id_sequences, run_batch, hf_tokenizer

# "tiny": the built-in tiny model's tokenizer (assets/tiny-tokenizer, MiniMax-M2 layout).
NAMES = ["qwen3", "deepseek-v3", "tiny"]


def path_of(name):
    if name == "tiny":
        return ROOT / "assets" / "tiny-tokenizer" / "tokenizer.json"
    p = DATA / "tokenizers" / name / "tokenizer.json"
    if not p.exists():
        pytest.fail(f"{p} missing")
    return p


@pytest.mark.parametrize("name", NAMES)
def test_encode_decode_corpus(name):
    p = path_of(name)
    check_encode_decode(hf_tokenizer(p), p, corpus())


@pytest.mark.parametrize("name", NAMES)
def test_vocab_size(name):
    p = path_of(name)
    hf = hf_tokenizer(p)
    got = run_batch(p, [{"op": "info"}])[0]
    want = max(max(hf.get_vocab(with_added_tokens=True).values()) + 1, 0)
    assert got["vocab_size"] == want


@pytest.mark.parametrize("name", NAMES)
def test_decode_random_ids(name):
    p = path_of(name)
    hf = hf_tokenizer(p)
    check_decode(hf, p, random_id_sequences(hf, seed=1, count=300, max_len=40))


@pytest.mark.parametrize("name", NAMES)
def test_stream_random_ids(name):
    p = path_of(name)
    hf = hf_tokenizer(p)
    # Byte-level tokens for lone UTF-8 lead/continuation bytes make partial characters likely.
    byte_ids = [i for i in (hf.token_to_id(c) for c in "ĀāĂăĄąĆćĈĉĊċČčĎďĐđĒēĔĕĖėĘęĚěĜĝĞğĠġĢģĤĥĦħĨĩĪīĬĭĮįİıĲĳĴĵĶķĸĹĺĻļĽľĿŀŁłÃÂÅâãäåæçèéêëìíîïðñòóôõö÷øùúûüýþÿ€") if i is not None]
    check_stream(hf, p, random_id_sequences(hf, seed=2, count=300, max_len=60, extra_ids=byte_ids))
    # Streams of real text.
    ids = [hf.encode(t).ids for t in corpus()[:80]]
    check_stream(hf, p, ids)


def test_invalid_utf8_rejected():
    p = path_of("qwen3")
    got = run_batch(p, [{"op": "encode", "text_hex": "61ff62"}, {"op": "encode", "text_hex": "e282"},
                        {"op": "encode", "text_hex": "eda080"}])
    for g in got:
        assert "error" in g and "UTF-8" in g["error"], g


def test_tiny_tokenizer_minimax_tokens():
    """The tiny tokenizer carries MiniMax-M2's added tokens; role markers are special, the
    think / tool-call tags are not (they survive skip_special_tokens)."""
    p = path_of("tiny")
    hf = hf_tokenizer(p)
    text = "]~!b[]~b]user\nhi[e~[\n]~b]ai\n<think>x</think><minimax:tool_call>y</minimax:tool_call>[e~["
    got = run_batch(p, [{"op": "encode", "text": text}])[0]["ids"]
    assert got == hf.encode(text, add_special_tokens=False).ids
    assert got[0] == 2004 and got[1] == 2001  # ]~!b[ then ]~b]
    skipped = run_batch(p, [{"op": "decode", "ids": got, "skip": True}])[0]["text"]
    assert skipped == "user\nhi\nai\n<think>x</think><minimax:tool_call>y</minimax:tool_call>"
    assert run_batch(p, [{"op": "info"}])[0]["vocab_size"] == 2009
