"""Python jinja2 configured as transformers configures it (the oracle), and a runner for
the C++ engine through `moeserve chat-template`."""
import json
import os
import subprocess
import tempfile
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "chat")
SHARED = os.environ.get(
    "MOESERVE_SHARED_DATA",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "shared-data"))


def moeserve_bin():
    b = os.environ.get("MOESERVE_BIN") or os.path.join(REPO, "build", "moeserve")
    if not os.path.exists(b):
        raise RuntimeError("moeserve binary not found; set MOESERVE_BIN")
    return b


class AssistantTracker(Extension):
    """transformers' {% generation %} extension, minus the index tracking: renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    # MOESERVE_TEST_NOW (Unix seconds) pins "now" in tests; the C++ engine honours it too.
    fixed = os.environ.get("MOESERVE_TEST_NOW")
    return (datetime.fromtimestamp(int(fixed)) if fixed else datetime.now()).strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_COMPILED = {}


def _compiled(source):
    """Compiled templates are cached by source (compiling dominates the oracle's time)."""
    if source not in _COMPILED:
        _COMPILED[source] = make_env().from_string(source)
    return _COMPILED[source]


def render_py(template, messages, tools=None, add_generation_prompt=False, kwargs=None, bos=None, eos=None):
    """Returns (True, text) or (False, error message), like apply_chat_template(tokenize=False)."""
    # As ChatTemplate::render: the named inputs, then the special tokens, then the template
    # kwargs, later keys winning (so kwargs may carry `documents`).
    ctx = {"messages": messages, "tools": tools, "documents": None, "add_generation_prompt": add_generation_prompt}
    if bos:
        ctx["bos_token"] = bos
    if eos:
        ctx["eos_token"] = eos
    ctx.update(kwargs or {})
    try:
        return True, _compiled(template).render(**ctx)
    except Exception as e:  # noqa: BLE001 - any failure must also be a failure in C++
        return False, f"{type(e).__name__}: {e}"


def render_cpp(template_file=None, tokenizer_dir=None, messages=None, tools=None, add_generation_prompt=False,
               kwargs=None):
    """Runs `moeserve chat-template`; returns (True, stdout) or (False, stderr)."""
    with tempfile.TemporaryDirectory() as d:
        mpath = os.path.join(d, "messages.json")
        with open(mpath, "w", encoding="utf-8") as f:
            json.dump(messages, f, ensure_ascii=False)
        cmd = [moeserve_bin(), "chat-template", "--messages", mpath]
        if tokenizer_dir:
            cmd += ["--tokenizer", tokenizer_dir]
        if template_file:
            cmd += ["--chat-template", template_file]
        if tools is not None:
            tpath = os.path.join(d, "tools.json")
            with open(tpath, "w", encoding="utf-8") as f:
                json.dump(tools, f, ensure_ascii=False)
            cmd += ["--tools", tpath]
        if add_generation_prompt:
            cmd.append("--add-generation-prompt")
        if kwargs:
            cmd += ["--kwargs", json.dumps(kwargs)]
        p = subprocess.run(cmd, capture_output=True, timeout=60)
        if p.returncode == 0:
            return True, p.stdout.decode("utf-8")
        return False, p.stderr.decode("utf-8", "replace")


def render_cpp_source(source, variables):
    """Renders template text with arbitrary variables (as --kwargs) through the CLI."""
    with tempfile.TemporaryDirectory() as d:
        tpath = os.path.join(d, "t.jinja")
        with open(tpath, "w", encoding="utf-8") as f:
            f.write(source)
        mpath = os.path.join(d, "m.json")
        with open(mpath, "w") as f:
            f.write("[]")
        cmd = [moeserve_bin(), "chat-template", "--chat-template", tpath, "--messages", mpath,
               "--kwargs", json.dumps(variables)]
        p = subprocess.run(cmd, capture_output=True, timeout=60)
        if p.returncode == 0:
            return True, p.stdout.decode("utf-8")
        return False, p.stderr.decode("utf-8", "replace")


def render_py_source(source, variables):
    return render_py(source, [], None, False, variables)


def jinja_batch_bin():
    b = os.environ.get("MOESERVE_JINJA_BATCH") or os.path.join(REPO, "build", "tests", "jinja", "jinja_batch")
    if not os.path.exists(b):
        raise RuntimeError("jinja_batch not built; set MOESERVE_JINJA_BATCH")
    return b


def render_cpp_batch(requests):
    """Renders many cases through tests/jinja/jinja_batch in one process. Each request:
    {template, messages, tools, add_generation_prompt, kwargs, bos, eos}; returns a list of
    (ok, text-or-error)."""
    inp = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in requests).encode("utf-8")
    p = subprocess.run([jinja_batch_bin()], input=inp, capture_output=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError("jinja_batch failed: " + p.stderr.decode("utf-8", "replace"))
    out = [json.loads(line) for line in p.stdout.decode("utf-8").splitlines()]
    assert len(out) == len(requests), (len(out), len(requests))
    return [(o["ok"], o["text"] if o["ok"] else o["error"]) for o in out]
