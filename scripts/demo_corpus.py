"""Corpus and tokenizer for the demo model (scripts/train_demo.py).

English text: the reStructuredText sources of the Python 3.11 documentation as Debian's
`python3.11-doc` package ships them (usr/share/doc/python3.11/html/_sources/**/*.rst.txt),
licensed under the PSF License Agreement version 2 (the package's debian/copyright and the
docs' own license.rst.txt; examples and code additionally under 0BSD). Only prose survives
the cleaning here: directives, literal/code blocks, tables and markup are dropped, roles and
links are reduced to their text.

Tokenizer: byte-level BPE trained with HF `tokenizers` (o200k pre-tokenizer regex as
MiniMax-M2 uses, ByteLevel decoder), base vocabulary sized so that base + added tokens is
exactly VOCAB, then MiniMax-M2's added tokens as far as they are documented in
shared/reference/minimax-m2.md and shared/data/README.md.
"""
import glob
import json
import os
import re

VOCAB = 8192
O200K = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Special (skipped by skip_special_tokens): pad, role marker, EOS, unk, BOS (ids in the real
# tokenizer: 200000, 200019, 200020, 200021, 200034), the media markers and M2.5's
# extra_special_tokens whose names are documented (the <issue_*> / <jupyter_*> families are
# not, so they are left out).
SPECIAL = ["]!p~[", "]~b]", "[e~[", "]!d~[", "]~!b[",
           "]<]start of image[>[", "]<]end of image[>[", "]<]vision pad[>[", "]<]image[>[", "]<]video[>[",
           "]<]speech[>[", "]<]start of video[>[", "]<]end of video[>[", "]<]start of speech[>[",
           "]<]end of speech[>[",
           "<code_interpreter>", "<commit_after>", "<commit_before>", "<commit_msg>", "<empty_output>",
           "<filename>", "<fim_middle>", "<fim_pad>", "<fim_prefix>", "<fim_suffix>", "<function_call>",
           "<gh_stars>", "<reponame>", "<add_file>", "<delete_file>", "<rename_file>", "<edit_file>",
           "<commit_message>", "<empty_source_file>", "<repo_struct>", "<code_context>", "<file_content>",
           "<source_files>", "<pr_start>", "<review_comment>", "<filepath>", "<file_sep>"]
# Added but not special: the reasoning and tool-call parsers find them in decoded text.
NOT_SPECIAL = ["<think>", "</think>", "<minimax:tool_call>", "</minimax:tool_call>"]

SOURCES = "usr/share/doc/python3.11/html/_sources"
_ROLE = re.compile(r":[\w:.-]+:`(?:[^`<]*<)?~?!?([^`>]+)>?`")   # :func:`name` / :ref:`text <label>`
_LINK = re.compile(r"`([^`<]+?)\s*<[^>]+>`_+")                  # `text <url>`_
_LIT = re.compile(r"``([^`]+)``")
_EMPH = re.compile(r"\*\*?([^*]+)\*\*?")
_SUBST = re.compile(r"\|([\w-]+)\|")
_ADORN = re.compile(r"^([=\-~^\"'`#*+.:_])\1{2,}\s*$")


def clean_inline(s):
    s = _LINK.sub(r"\1", s)
    s = _ROLE.sub(lambda m: m.group(1).lstrip("~.!"), s)
    s = _LIT.sub(r"\1", s)
    s = _EMPH.sub(r"\1", s)
    s = _SUBST.sub(r"\1", s)
    s = s.replace("`", "")
    s = re.sub(r"\\([^A-Za-z0-9])", r"\1", s)  # reST escapes; keep \n and the like
    return re.sub(r"\s+", " ", s).strip()


def _is_prose(p):
    letters = sum(c.isalpha() for c in p)
    return len(p) >= 60 and letters > 0.7 * len(p.replace(" ", "")) and p[-1] in ".!?:)" and \
        not p.startswith(("..", ">>>", "$", "+", "|"))


def parse_rst(text):
    """Returns (paragraphs, sections): prose paragraphs in order, and (title, first paragraph)
    pairs for sections whose first block is prose."""
    lines = text.splitlines()
    paras, sections = [], []
    title, want_first = None, False
    i, n = 0, len(lines)
    cur = []

    def flush():
        nonlocal cur, want_first
        if cur:
            p = clean_inline(" ".join(cur))
            if _is_prose(p):
                paras.append(p)
                if want_first and title:
                    sections.append((title, p))
            want_first = False
        cur = []

    while i < n:
        ln = lines[i]
        if i + 1 < n and ln.strip() and _ADORN.match(lines[i + 1]) and not ln.startswith(" ") \
                and len(lines[i + 1].strip()) >= len(ln.strip()) - 1:
            flush()
            title, want_first = clean_inline(ln), True
            i += 2
            continue
        if _ADORN.match(ln):
            flush()
            i += 1
            continue
        if ln.startswith(".. ") or (ln.startswith(" ") and not cur):
            # a directive with its indented body, or an indented (literal / quoted) block
            flush()
            i += 1
            while i < n and (not lines[i].strip() or lines[i].startswith(" ")):
                i += 1
            continue
        if not ln.strip():
            ended_literal = cur and cur[-1].endswith("::")
            if ended_literal:
                cur[-1] = cur[-1][:-1] if not cur[-1].endswith(" ::") else cur[-1][:-3]
            flush()
            i += 1
            if ended_literal:  # skip the literal block that follows "::"
                while i < n and (not lines[i].strip() or lines[i].startswith(" ")):
                    i += 1
            continue
        if ln.lstrip().startswith(("* ", "- ", "#. ")) or re.match(r"^\d+\. ", ln):
            flush()
            cur = [re.sub(r"^\s*(\*|-|#\.|\d+\.)\s+", "", ln)]
            i += 1
            continue
        cur.append(ln.strip())
        i += 1
    flush()
    return paras, sections


def parse_glossary(text):
    """(term, definition) from glossary.rst.txt: terms at 3 spaces, definitions at 6."""
    out, term, body = [], None, []
    for ln in text.splitlines():
        if re.match(r"^ {3}\S", ln):
            if term and body:
                out.append((term, body))
            term, body = clean_inline(ln.strip()), []
        elif term is not None and re.match(r"^ {6}\S", ln):
            body.append(ln.strip())
        elif term is not None and not ln.strip() and body:
            if term and body:
                out.append((term, body))
            term, body = None, []
    res = []
    for t, b in out:
        d = clean_inline(" ".join(b))
        if _is_prose(d) and not t.startswith((">>>", "...")) and len(t) < 40:
            sent = re.split(r"(?<=[.!?])\s+", d)
            res.append((t, " ".join(sent[:3])))
    return res


def load_python_docs(root):
    """root: where python3.11-doc's .deb was unpacked (dpkg -x). Returns dict with train/val
    prose (every 20th file, by sorted path, is validation), glossary and sections."""
    src = os.path.join(root, SOURCES)
    files = sorted(glob.glob(os.path.join(src, "**", "*.rst.txt"), recursive=True))
    if not files:
        raise SystemExit(f"no *.rst.txt under {src}: unpack python3.11-doc there (dpkg -x)")
    train, val, sections, glossary = [], [], [], []
    for k, f in enumerate(files):
        rel = os.path.relpath(f, src)
        text = open(f, encoding="utf-8").read()
        if rel == "glossary.rst.txt":
            glossary = parse_glossary(text)
            continue
        if rel.startswith(("license", "copyright", "whatsnew/changelog")):
            continue
        paras, secs = parse_rst(text)
        (val if k % 20 == 7 else train).append("\n\n".join(paras))
        if k % 20 != 7:
            sections += [(t, p) for t, p in secs if 3 <= len(t) <= 60 and len(p) <= 700 and p.endswith(".")
                         and not re.search(r"[(){}\[\]=]", t)]
    return {"train": [t for t in train if t], "val": [t for t in val if t], "glossary": glossary,
            "sections": sections, "files": len(files)}


def train_tokenizer(texts, out_dir, chat_template):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    added = SPECIAL + NOT_SPECIAL
    base = VOCAB - len(added)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=base, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    assert tok.get_vocab_size() == base, f"corpus too small: vocab {tok.get_vocab_size()} < {base}"
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in NOT_SPECIAL])
    for k, t in enumerate(added):
        assert tok.token_to_id(t) == base + k, t
    assert tok.get_vocab_size() == VOCAB
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    decoder = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                         "single_word": False, "special": t in SPECIAL} for t in added}
    config = {
        "add_bos_token": False, "add_eos_token": False, "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "bos_token": "]~!b[", "eos_token": "[e~[", "unk_token": "]!d~[", "pad_token": "]!p~[",
        "clean_up_tokenization_spaces": False, "model_max_length": 4096,
        "tokenizer_class": "GPT2Tokenizer",
        "chat_template": chat_template,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as fh:
        fh.write(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return tok


def render_dialogs(dialogs, chat_template):
    """Renders each dialog with the chat template the way HF's apply_chat_template does
    (jinja2 sandbox, trim_blocks, lstrip_blocks, loopcontrols, tojson(ensure_ascii=...))."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(msg):
        raise ValueError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    tpl = env.from_string(chat_template)
    return [tpl.render(messages=d["messages"], tools=d["tools"], add_generation_prompt=False) for d in dialogs]


def render_prompt(messages, tools, chat_template):
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, ensure_ascii=False, **k: json.dumps(x, ensure_ascii=ensure_ascii)
    return env.from_string(chat_template).render(messages=messages, tools=tools, add_generation_prompt=True)
