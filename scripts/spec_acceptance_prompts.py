"""Fixed prompt set for the draft heads' acceptance test (tests/model/test_spec_heads.cpp,
SpecHeads.AcceptanceOnHeldOutText) and the spec benchmark (docs/benchmarks.md, "Speculative decoding").

The demo card measured acceptance on greedy continuations of 96-token windows of held-out text,
half Python-docs prose, half synthetic dialogs (scripts/train_eagle.py measure_acceptance). The
Python docs are not on this machine, so the prose half is moeserve's own prose (paragraphs of
docs/architecture.md at PROSE_REV, English the model never saw); the dialog half comes from the demo's dialog
generator with a seed the training did not use, rendered with the demo's chat template.
Writes tests/fixtures/spec_acceptance/prompts.json: {"prompts": [[ids...], ...], "kinds": [...]}.
Run: .venv/bin/python scripts/spec_acceptance_prompts.py"""
import json
import os
import random
import re
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from tokenizers import Tokenizer  # noqa: E402

import demo_corpus  # noqa: E402
import demo_dialogs  # noqa: E402

N, LEN = 16, 96
PROSE_REV = "e02b2ef"  # docs/architecture.md as it was when prompts.json was written


def main():
    demo = os.path.join(ROOT, "assets", "demo-model")
    tok = Tokenizer.from_file(os.path.join(demo, "tokenizer.json"))
    template = json.load(open(os.path.join(demo, "tokenizer_config.json")))["chat_template"]
    rng = random.Random(20261202)
    # Dialogs: a window starting at a dialog start plus 0..199 tokens, as the card's.
    dialogs = demo_dialogs.make_dialogs(rng, 4 * N, [("a decorator", "A function that returns another function.")],
                                        [("the for statement", "It iterates over the items of any sequence.")])
    texts = demo_corpus.render_dialogs(dialogs, template)
    prompts, kinds = [], []
    for t in texts:
        ids = tok.encode(t, add_special_tokens=False).ids
        if len(ids) < LEN + 210:
            continue
        s = rng.randint(0, 199)
        prompts.append(ids[s:s + LEN])
        kinds.append("dialog")
        if len(prompts) == N:
            break
    # Prose: paragraphs of docs/architecture.md without code or tables, concatenated. Read at
    # PROSE_REV (the revision the checked-in fixture was made from), not the working tree: the
    # file has since been cut to the contract and its text moved to src/*/README.md, so reading
    # today's file would give other prompts.
    text = subprocess.run(["git", "-C", ROOT, "show", PROSE_REV + ":docs/architecture.md"], check=True,
                          capture_output=True, text=True).stdout
    paras = [p for p in re.split(r"\n\s*\n", text) if not p.lstrip().startswith(("#", "|", "```", "-", "1."))]
    ids = tok.encode("\n\n".join(paras), add_special_tokens=False).ids
    for i in range(N):
        s = rng.randint(0, len(ids) - LEN - 1)
        prompts.append(ids[s:s + LEN])
        kinds.append("prose")
    assert len(prompts) == 2 * N, len(prompts)
    out = os.path.join(ROOT, "tests", "fixtures", "spec_acceptance", "prompts.json")
    with open(out, "w") as fh:
        json.dump({"prompts": prompts, "kinds": kinds}, fh)
    print(f"wrote {out}: {len(prompts)} prompts of {LEN} tokens")


if __name__ == "__main__":
    main()
