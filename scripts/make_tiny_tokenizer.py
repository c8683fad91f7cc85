#!/usr/bin/env python3
"""Builds the tiny model's tokenizer (assets/tiny-tokenizer/): a byte-level BPE with 2000 base
tokens trained with HF `tokenizers` on assets/tiny-tokenizer/train_corpus.json (a JSON list of
texts), using MiniMax-M2's o200k pre-tokenizer regex, the ByteLevel decoder, and the MiniMax-M2
added tokens after the base vocab (ids 2000-2008): the role markers are special, the think and
tool-call tags are not (see src/tokenizer/README.md, "Tiny model tokenizer"). Total ids: 2009, so a tiny
model needs vocab_size >= 2009 (2048 recommended: padded rows, as MiniMax-M2 pads to 200064).

Usage: python3 scripts/make_tiny_tokenizer.py [--out assets/tiny-tokenizer]
"""
import argparse
import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

ROOT = Path(__file__).resolve().parents[1]
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
BASE_VOCAB = 2000
SPECIAL = ["]!p~[", "]~b]", "[e~[", "]!d~[", "]~!b["]          # pad, role, eos, unk, bos
NOT_SPECIAL = ["<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"]
CHAT_TEMPLATE = Path(__file__).resolve().parent.parent / "tests/fixtures/shared-data/chat-templates/minimax-m2.jinja"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "assets" / "tiny-tokenizer"))
    ap.add_argument("--chat-template", default=str(CHAT_TEMPLATE))
    args = ap.parse_args()
    out = Path(args.out)
    texts = json.loads((ROOT / "assets" / "tiny-tokenizer" / "train_corpus.json").read_text())

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=BASE_VOCAB, min_frequency=1, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    assert tok.get_vocab_size() == BASE_VOCAB, f"corpus too small: vocab {tok.get_vocab_size()}"
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NOT_SPECIAL])
    for k, t in enumerate(SPECIAL + NOT_SPECIAL):
        assert tok.token_to_id(t) == BASE_VOCAB + k, t
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))

    decoder = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                         "single_word": False, "special": t in SPECIAL} for t in SPECIAL + NOT_SPECIAL}
    config = {
        "add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": "]~!b[", "eos_token": "[e~[", "unk_token": "]!d~[", "pad_token": "]!p~[",
        "clean_up_tokenization_spaces": False, "model_max_length": 40960000,
        "tokenizer_class": "GPT2Tokenizer",
        "chat_template": Path(args.chat_template).read_text(),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out}: {BASE_VOCAB} base tokens + {len(SPECIAL) + len(NOT_SPECIAL)} added "
          f"(ids up to {BASE_VOCAB + len(SPECIAL) + len(NOT_SPECIAL) - 1})")


if __name__ == "__main__":
    main()
