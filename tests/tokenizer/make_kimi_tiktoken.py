"""Makes a Kimi-style tokenizer folder (tiktoken.model + tokenizer_config.json) from a byte-level
BPE tokenizer.json: each vocab entry's bytes (the GPT-2 byte map undone) with its id as the rank.
The real Kimi files are not available offline; the ranks here are Qwen3's (same kind of vocab).

  python3 make_kimi_tiktoken.py TOKENIZER_JSON OUT_DIR [NUM_BASE_TOKENS]

The committed fixture tests/fixtures/tokenizer/kimi_tiny was made with
  python3 make_kimi_tiktoken.py ../fixtures/shared-data/tokenizers/qwen3/tokenizer.json \
      ../fixtures/tokenizer/kimi_tiny 40000
"""
import base64
import json
import sys
from pathlib import Path

# Kimi-K2's named special tokens, as offsets from the first special id (163584 in the real
# model; wave2-research.md 5.4). The other ids of the 256 are <|reserved_token_{id}|>.
KIMI_SPECIAL = {
    0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>", 10: "<|im_system|>",
    11: "<|tool_calls_section_begin|>", 12: "<|tool_calls_section_end|>", 13: "<|tool_call_begin|>",
    14: "<|tool_call_argument_begin|>", 15: "<|tool_call_end|>", 17: "<|im_middle|>", 21: "<|media_pad|>",
    22: "<think>", 23: "</think>", 255: "[PAD]",
}


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def main():
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    limit = int(sys.argv[3]) if len(sys.argv) > 3 else None
    vocab = json.loads(src.read_text())["model"]["vocab"]
    dec = bytes_to_unicode()
    ranks = sorted((i, bytes(dec[c] for c in t)) for t, i in vocab.items() if limit is None or i < limit)
    assert [i for i, _ in ranks] == list(range(len(ranks))), "ids must be dense"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "tiktoken.model", "w") as f:
        for i, b in ranks:
            f.write(f"{base64.b64encode(b).decode()} {i}\n")
    base = len(ranks)
    cfg = {"added_tokens_decoder": {str(base + k): {"content": v, "lstrip": False, "normalized": False,
                                                     "rstrip": False, "single_word": False, "special": True}
                                    for k, v in KIMI_SPECIAL.items()},
           "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]",
           "tokenizer_class": "TikTokenTokenizer"}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


if __name__ == "__main__":
    main()
