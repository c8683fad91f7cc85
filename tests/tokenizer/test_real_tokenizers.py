"""moeserve vs HF `tokenizers` on the real tokenizer.json files in shared data."""
import pytest
from tokenizers import Tokenizer

from tok_oracle import DATA, check_decode, check_encode_decode, check_stream, corpus, random_id_sequences, run_batch

NAMES = ["qwen3", "deepseek-v3"]


def path_of(name):
    p = DATA / "tokenizers" / name / "tokenizer.json"
    if not p.exists():
        pytest.skip(f"{p} missing")
    return p


@pytest.mark.parametrize("name", NAMES)
def test_encode_decode_corpus(name):
    p = path_of(name)
    check_encode_decode(Tokenizer.from_file(str(p)), p, corpus())


@pytest.mark.parametrize("name", NAMES)
def test_vocab_size(name):
    p = path_of(name)
    hf = Tokenizer.from_file(str(p))
    got = run_batch(p, [{"op": "info"}])[0]
    want = max(max(hf.get_vocab(with_added_tokens=True).values()) + 1, 0)
    assert got["vocab_size"] == want


@pytest.mark.parametrize("name", NAMES)
def test_decode_random_ids(name):
    p = path_of(name)
    hf = Tokenizer.from_file(str(p))
    check_decode(hf, p, random_id_sequences(hf, seed=1, count=300, max_len=40))


@pytest.mark.parametrize("name", NAMES)
def test_stream_random_ids(name):
    p = path_of(name)
    hf = Tokenizer.from_file(str(p))
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
