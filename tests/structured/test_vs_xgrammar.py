"""Mask equality with xgrammar: for every grammar of the corpus, random walks (each step a
random token that xgrammar allows) give random valid prefixes; at every prefix our allowed-
token set (structured_mask_tool) must equal xgrammar's, over Qwen3's real 151k vocabulary.

Documented differences (each differing token must be explained, else the test fails):
- strings with minLength/maxLength: xgrammar counts characters of `[^"\\\r\n]`, so it allows
  raw control characters (invalid JSON) and no escapes; we count JSON string characters
  (escapes allowed, control characters not). Differing tokens must contain a backslash or a
  control byte.
- UTF-8-encoded surrogates (ED A0..BF, U+D800-DFFF): xgrammar accepts them inside character
  classes, we do not (they are not valid UTF-8). A differing token must complete such a
  sequence, and a walk is compared only up to the first token that xgrammar let into one.
- numbers with minimum/maximum/exclusive bounds: xgrammar writes at most 6 fraction digits
  (and rounds a bound to 6 decimals); we allow every plain decimal in range, any fraction
  length. Differing tokens must be allowed by us only and continue a fraction that already
  has 6 digits (or reach 7 with their leading digits). Neither allows an exponent there.
JSON Schema `format` is left out of the corpus (our date/time/email/uri regexes are our own,
so those languages differ from xgrammar's by design)."""
import os
import zlib

import re

import numpy as np
import pytest

from corpus import CORPUS
import xgr_oracle as xo

xgr = xo.import_xgrammar()
DATA = os.environ.get("MOESERVE_SHARED_DATA", os.path.join(os.path.dirname(__file__), "../fixtures/shared-data"))
QWEN = os.path.join(DATA, "tokenizers/qwen3/tokenizer.json")
STOP = [151645, 151643]  # <|im_end|>, <|endoftext|>
SEED_OFFSET = int(os.environ.get("MOESERVE_ORACLE_SEED", "0"))  # fixed walks; other seeds to explore


SURROGATE = re.compile(rb"\xed[\xa0-\xbf]")


FRACTION_TAIL = re.compile(rb"\.(\d*)$")
LEADING_DIGITS = re.compile(rb"^\d+")


def long_fraction(before, token):
    """`token` continues the number at the end of `before` past 6 fraction digits."""
    tail, lead = FRACTION_TAIL.search(before), LEADING_DIGITS.match(token)
    return bool(tail and lead and len(tail.group(1)) + len(lead.group(0)) > 6)


@pytest.fixture(scope="module")
def vocab():
    toks, special = xo.load_vocab(QWEN)
    info = xgr.TokenizerInfo(toks, xgr.VocabType.RAW, vocab_size=len(toks), stop_token_ids=STOP)
    return toks, special, xgr.GrammarCompiler(info, max_threads=1)


def xgr_walks(compiled, size, seed, n_walks, n_steps, content=None):
    """Random walks through xgrammar: (token prefix, xgrammar mask at every step). `content`
    (a bool array over the vocabulary): 9 steps in 10 pick a token with a non-whitespace byte
    when one is allowed, so walks reach the values instead of spending their steps on
    whitespace."""
    rng = np.random.default_rng(seed)
    bm = np.zeros((1, (size + 31) // 32), dtype=np.int32)
    walks = []
    for _ in range(n_walks):
        m = xgr.GrammarMatcher(compiled)
        prefix, masks = [], []
        for _ in range(n_steps):
            m.fill_next_token_bitmask(bm, 0)
            allowed = xo.unpack_words(bm[0].view(np.uint32), size)
            masks.append(allowed.copy())
            ids = np.flatnonzero(allowed)
            ids = ids[~np.isin(ids, STOP)]
            if len(ids) == 0:
                break
            if content is not None and rng.random() < 0.9 and content[ids].any():
                ids = ids[content[ids]]
            t = int(rng.choice(ids))
            assert m.accept_token(t)
            prefix.append(t)
        walks.append((prefix, masks))
    return walks


@pytest.mark.parametrize("name,spec", CORPUS, ids=[c[0] for c in CORPUS])
def test_masks_equal_xgrammar(vocab, name, spec):
    toks, special, compiler = vocab
    size = len(toks)
    compiled = xo.xgr_compile(xgr, compiler, spec)
    content = None
    if spec.get("content_walk"):
        content = np.array([bool(t.strip(b" \t\r\n")) for t in toks])
    walks = xgr_walks(compiled, size, seed=zlib.crc32(name.encode()) + SEED_OFFSET, n_walks=6,
                      n_steps=spec.get("steps", 24), content=content)
    out = xo.run_tool(xo.tool_job(toks, special, STOP, spec, [w[0] for w in walks], all_steps=True))
    checked = 0
    for (prefix, xmasks), res in zip(walks, out["results"]):
        text = b""
        for k, t in enumerate(prefix):  # stop at the first surrogate xgrammar allowed
            if SURROGATE.search(text[-1:] + toks[t]):
                prefix, xmasks = prefix[:k], xmasks[:k + 1]
                break
            text += toks[t]
        assert res["accepted"] >= len(prefix), f"{name}: we reject a token xgrammar allowed at step {res['accepted']}"
        ours = [xo.hex_to_bool(h, size) for h in res["step_masks"]]
        if res["mask"] is not None:
            ours.append(xo.hex_to_bool(res["mask"], size))
        for step, theirs in enumerate(xmasks):
            before = b"".join(toks[t] for t in prefix[:step])[-1:]
            diff = np.flatnonzero(ours[step] != theirs)
            diff = [i for i in diff if not (theirs[i] and not ours[step][i] and SURROGATE.search(before + toks[i]))]
            if spec.get("explained") == "fraction_digits":
                text_before = b"".join(toks[t] for t in prefix[:step])
                diff = [i for i in diff if not (ours[step][i] and not theirs[i] and long_fraction(text_before, toks[i]))]
            if spec.get("explained") == "length_strings":
                diff = [i for i in diff if not (b"\\" in toks[i] or any(c < 0x20 for c in toks[i]))]
            if len(diff):
                sample = [(int(i), toks[i], bool(ours[step][i])) for i in diff[:8]]
                pytest.fail(f"{name}: step {step} after {bytes(b''.join(toks[t] for t in prefix[:step]))!r}: "
                            f"{len(diff)} tokens differ (id, bytes, ours): {sample}")
            checked += 1
    assert checked >= 4
