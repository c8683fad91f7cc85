"""`moeserve chat` (through a pseudo-terminal, and with stdin a pipe), in process and against
a running server (--base-url), and `moeserve generate --prompt / --messages`."""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pexpect
import pytest

from chat_fixtures import (PARSER_ARGS, PLAIN_T, SCRIPT, SLOW_WORDS, SYS_A, THINK_A, THINK_R, write_tools)
from conftest import REPO, Server

sys.path.insert(0, str(REPO / "scripts"))
import demo_dialogs  # noqa: E402

BIN = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    """A served replay model; its folder and script also drive the in-process chat."""
    tmp = tmp_path_factory.mktemp("chat")
    s = Server(tmp, PARSER_ARGS, script_extra=SCRIPT)
    s.tmp = tmp
    s.tools = write_tools(tmp / "tools.json")
    yield s
    assert s.stop() == 0


def in_process_cmd(replay, *extra):
    return [BIN, "chat", str(replay.tmp / "model"), "--test-replay-backend", str(replay.tmp / "replay.json"),
            *PARSER_ARGS, "--tools", str(replay.tools), *extra]


def spawn(cmd, **env):
    child = pexpect.spawn(cmd[0], cmd[1:], encoding="utf-8", timeout=60, dimensions=(40, 160),
                          env={**os.environ, "TERM": "xterm", **env})
    child.logfile_read = sys.stdout  # shown by pytest on failure
    return child


PROMPT = "> "


def expect_prompt(child):
    child.expect_exact(PROMPT)


def say(child, line):
    child.sendline(line)
    child.expect_exact(line)  # the echo


def drive_conversation(child):
    """The scripted terminal session shared by the in-process and --base-url runs."""
    child.expect("moeserve chat with ")
    expect_prompt(child)
    say(child, "hello")
    child.expect_exact(PLAIN_T)
    expect_prompt(child)
    # Line editing and history (libedit): Up recalls "hello", Ctrl-A / Ctrl-E move in the line.
    child.send("\x1b[A")
    child.expect_exact("hello")
    child.send("\r")
    child.expect_exact(PLAIN_T)
    expect_prompt(child)
    child.send("ut it\x01THINK abo\r")  # typed "ut it", then Home, then "THINK abo" in front
    child.expect_exact(THINK_A)
    expect_prompt(child)
    say(child, "/reset")
    expect_prompt(child)
    # The reasoning streams dimmed, then collapses to one line once the answer starts.
    say(child, "THINK about it")
    child.expect_exact(THINK_R)
    child.expect(r"\x1b\[\d+A\r\x1b\[J")  # cursor up over the reasoning rows, erased
    child.expect_exact("(reasoning: 5 words; /thoughts shows it)")
    child.expect_exact(THINK_A)
    expect_prompt(child)
    say(child, "/thoughts")
    child.expect_exact(THINK_R)
    expect_prompt(child)
    # History: THINK is still in the conversation, so the next prompt matches it again.
    say(child, "and now?")
    child.expect_exact(THINK_A)
    expect_prompt(child)
    say(child, "/reset")
    child.expect_exact("conversation reset")
    expect_prompt(child)
    say(child, "hello")
    child.expect_exact(PLAIN_T)
    expect_prompt(child)
    # /system: the prompt now carries the system message (its marker picks the script).
    say(child, "/system SYSMARK be brief")
    child.expect_exact("system prompt set")
    expect_prompt(child)
    say(child, "hello")
    child.expect_exact(SYS_A)
    expect_prompt(child)
    say(child, "/system")
    child.expect_exact("system prompt cleared")
    say(child, "/reset")
    expect_prompt(child)
    # Tool calls parsed by the server's minimax_m2 parser, shown with their arguments.
    say(child, "TOOLTEST weather in Paris?")
    child.expect_exact("-> tool call get_weather(")
    child.expect('"city": *"Paris"')
    child.expect_exact("(send the result with /tool TEXT)")
    expect_prompt(child)
    say(child, "/reset")
    expect_prompt(child)
    # Ctrl-C mid-answer stops the answer, not the program.
    say(child, "SLOW please")
    child.expect_exact("word word word")
    t0 = time.monotonic()
    child.sendintr()
    child.expect_exact("[stopped]")
    stopped_after = time.monotonic() - t0
    expect_prompt(child)
    say(child, "/reset")
    expect_prompt(child)
    say(child, "hello")
    child.expect_exact(PLAIN_T)
    expect_prompt(child)
    # Ctrl-C at the prompt: a fresh prompt, still running.
    child.sendintr()
    expect_prompt(child)
    assert child.isalive()
    # Ctrl-D exits with 0.
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.exitstatus
    return stopped_after


def test_chat_in_process_terminal(replay):
    stopped_after = drive_conversation(spawn(in_process_cmd(replay)))
    # Stopped at once, not after the SLOW_WORDS tokens (about 6 s at the replay's pace).
    assert stopped_after < 2.0, stopped_after


def test_chat_terminal_utf8_input_and_prompt_interrupts(replay):
    """Non-ASCII typed at the prompt stays in the line (libedit in the C locale dropped it), and a
    Ctrl-C sent the moment a prompt appears always gives a fresh prompt (it could land before
    libedit blocked in read() and be lost)."""
    child = spawn(in_process_cmd(replay), LANG="C.UTF-8", LC_ALL="C.UTF-8")
    child.expect("moeserve chat with ")
    expect_prompt(child)
    child.send("/system héllo→ok 日本\r")
    child.expect_exact("system prompt set")
    assert "héllo→ok 日本" in child.before, repr(child.before)
    expect_prompt(child)
    for _ in range(20):
        child.sendintr()
        expect_prompt(child)
    assert child.isalive()
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.exitstatus


def test_chat_base_url_terminal(replay):
    before = replay.metrics()
    stopped_after = drive_conversation(spawn([BIN, "chat", "--base-url", replay.base, "--tools", str(replay.tools)]))
    assert stopped_after < 3.0, stopped_after  # libcurl's progress callback: about once a second
    after = replay.metrics()
    # The stopped answer was aborted on the server (a client disconnect), not run to its end.
    key = next((k for k in after if k.startswith("vllm:request_success_total") and 'finished_reason="abort"' in k),
               None)
    assert key and after[key] - before.get(key, 0) >= 1, {k: v for k, v in after.items() if "success" in k}


def test_chat_history_file(replay, tmp_path):
    hist = tmp_path / "history"
    child = spawn(in_process_cmd(replay, "--history-file", str(hist)))
    expect_prompt(child)
    say(child, "THINK of a number")
    child.expect_exact(THINK_A)
    expect_prompt(child)
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "THINK\\040of\\040a\\040number" in hist.read_text()  # libedit vis(3) encoding
    # A new session recalls it with Up.
    child = spawn(in_process_cmd(replay, "--history-file", str(hist)))
    expect_prompt(child)
    child.send("\x1b[A\r")
    child.expect_exact(THINK_A)
    expect_prompt(child)
    child.sendeof()
    child.expect(pexpect.EOF)


def test_chat_pipe_in_process(replay):
    lines = "hello\nTHINK now\n/reset\nhello\n/nonsense\n"
    r = subprocess.run(in_process_cmd(replay, "--max-tokens", "64"), input=lines, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert not ANSI.search(r.stdout), r.stdout  # not a terminal: plain text
    assert r.stdout == (f"{PLAIN_T}\n[reasoning] {THINK_R}\n{THINK_A}\nconversation reset\n{PLAIN_T}\n"
                        "unknown command /nonsense (/help lists them)\n"), r.stdout


def test_chat_pipe_base_url_tool_call_and_result(replay):
    lines = "TOOLTEST weather?\n/tool {\"temp_c\": 21}\n"
    r = subprocess.run([BIN, "chat", "--base-url", replay.base + "/v1", "--tools", str(replay.tools), "--reasoning",
                        "hide"], input=lines, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "(reasoning: 6 words; /thoughts shows it)", out
    head = "[tool call] get_weather "
    assert out[1].startswith(head) and json.loads(out[1][len(head):]) == {"city": "Paris", "days": 3}, out
    assert out[2] == "(send the result with /tool TEXT)"
    # The tool result went back as a role "tool" message; TOOLTEST is still in the history.
    assert out[3].startswith("(reasoning:") and out[4].startswith("[tool call] get_weather"), out


def test_chat_demo_model_defaults_to_minimax_parsers(tmp_path):
    """`moeserve chat assets/demo-model` with no parser flag: config.json's model_type
    minimax_m2 picks MiniMax's reasoning and tool-call parsers, so the reasoning is split off
    and a tool call is shown parsed (not raw </think> and XML). The real demo model, greedy."""
    demo = REPO / "assets" / "demo-model"
    (tmp_path / "tools.json").write_text(json.dumps([demo_dialogs.CALC]))
    r = subprocess.run([BIN, "chat", str(demo), "--device", "cpu", "--temperature", "0", "--max-tokens", "120",
                        "--tools", str(tmp_path / "tools.json")], input="Please calculate 12 * 34.\n",
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = [x for x in r.stdout.splitlines() if x.strip()]  # the blank lines between reasoning and call
    assert out[0].startswith("[reasoning] ") and len(out[0].split()) > 5, out
    head = "[tool call] calculator "
    assert out[1].startswith(head) and json.loads(out[1][len(head):]) == {"expression": "12 * 34"}, out
    assert "</think>" not in r.stdout and "<minimax:tool_call>" not in r.stdout, r.stdout


def test_chat_base_url_errors(replay, tmp_path):
    # A refused request is reported and the conversation goes on.
    r = subprocess.run([BIN, "chat", "--base-url", replay.base, "--top-p", "1.5"], input="hello\n",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("[error: HTTP 400"), r.stdout
    # No server there: a clear error, exit 1.
    r = subprocess.run([BIN, "chat", "--base-url", "http://127.0.0.1:9"], input="", capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "GET /v1/models" in r.stderr, r.stderr
    # In-process flags with --base-url are refused, not ignored.
    r = subprocess.run([BIN, "chat", "--base-url", replay.base, "--device", "cpu"], input="", capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "--device configures the in-process engine" in r.stderr, r.stderr
    r = subprocess.run([BIN, "chat"], input="", capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "give a MODEL" in r.stderr, r.stderr
    r = subprocess.run([BIN, "chat", str(replay.tmp / "model"), "--api-key", "k"], input="", capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "--api-key is for --base-url" in r.stderr, r.stderr


def test_chat_base_url_api_key(tmp_path):
    s = Server(tmp_path, PARSER_ARGS + ["--api-key", "sekrit"], script_extra=SCRIPT)
    try:
        r = subprocess.run([BIN, "chat", "--base-url", s.base], input="hello\n", capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1 and "401" in r.stderr, r.stderr
        r = subprocess.run([BIN, "chat", "--base-url", s.base, "--api-key", "sekrit"], input="hello\n",
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and r.stdout == PLAIN_T + "\n", (r.stdout, r.stderr)
    finally:
        assert s.stop() == 0


def test_chat_real_engine_matches_serve(tiny, tmp_path):
    """In process on the real CPU executor (make-tiny): the answer equals serve's for the same
    greedy request, so chat runs serve's pipeline (template, tokenizer, engine, detokenizer)."""
    import httpx
    import openai
    from conftest import free_port
    # --reasoning-parser "": no parser, as serve below (a minimax_m2 folder gets MiniMax's parsers
    # in chat by default; any parser flag turns that off)
    r = subprocess.run([BIN, "chat", str(tiny), "--device", "cpu", "--temperature", "0", "--max-tokens", "8",
                        "--reasoning-parser", ""],
                       input="Hello, who are you?\n", capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([BIN, "serve", str(tiny), "--device", "cpu", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            time.sleep(0.05)
        c = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
        resp = c.chat.completions.create(model=str(tiny), messages=[{"role": "user", "content": "Hello, who are you?"}],
                                         temperature=0, max_tokens=8)
        choice = resp.choices[0]
        content = (choice.message.content or "").lstrip("\r\n")
        expected = (content + "\n" if content else "") + ("[max_tokens reached]\n" if choice.finish_reason == "length"
                                                          else "")
        assert r.stdout == expected, (r.stdout, expected)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


# --- generate --prompt / --messages (the real CPU executor on `make-tiny`'s random model) -------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model = tmp_path_factory.mktemp("tiny") / "model"
    subprocess.run([BIN, "make-tiny", str(model)], check=True, capture_output=True)
    return model


def generate(tiny, *args):
    r = subprocess.run([BIN, "generate", "--model", str(tiny), "--max-tokens", "6", *args], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout


def eos_ids(tiny):
    ids = set()
    for f in ("generation_config.json", "config.json"):
        p = tiny / f
        if p.exists():
            e = json.loads(p.read_text()).get("eos_token_id")
            ids |= set(e if isinstance(e, list) else [e] if e is not None else [])
    return ids


def expected_text(tiny, tok, generated):
    eos = eos_ids(tiny)
    shown = []
    for t in generated:
        if t in eos:
            break
        shown.append(t)
    return tok.decode(shown, skip_special_tokens=True)


def test_generate_prompt_text(tiny):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    j = json.loads(generate(tiny, "--prompt", "Hello, world", "--json"))
    assert j["prompt_ids"] == tok.encode("Hello, world").ids  # HF encode: special tokens added
    assert len(j["generated_ids"]) == 6
    assert j["text"] == expected_text(tiny, tok, j["generated_ids"])
    # Without --json: the text alone; the same ids as generating from the ids (greedy).
    assert generate(tiny, "--prompt", "Hello, world") == j["text"] + "\n"
    ids = generate(tiny, "--prompt-ids", ",".join(map(str, j["prompt_ids"])))
    assert ids.strip() == ",".join(map(str, j["generated_ids"]))


def test_generate_messages(tiny, tmp_path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "2+2?"}]}]
    f = tmp_path / "msgs.json"
    f.write_text(json.dumps(msgs))
    # The oracle: the conversation rendered by `chat-template` (tested against Jinja2) with the
    # content parts joined as chat/completions joins them (vLLM: one "\n" between text parts).
    flat = [msgs[0], {"role": "user", "content": "What is \n2+2?"}]
    (tmp_path / "flat.json").write_text(json.dumps(flat))
    prompt = subprocess.run([BIN, "chat-template", "--tokenizer", str(tiny), "--messages", str(tmp_path / "flat.json"),
                             "--add-generation-prompt"], capture_output=True, text=True, check=True).stdout
    j = json.loads(generate(tiny, "--messages", str(f), "--json"))
    assert j["prompt_ids"] == tok.encode(prompt, add_special_tokens=False).ids
    assert j["text"] == expected_text(tiny, tok, j["generated_ids"])
    # {"messages", "tools"} is accepted too (the tools rendered by the template).
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
    f.write_text(json.dumps({"messages": flat, "tools": tools}))
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    prompt = subprocess.run([BIN, "chat-template", "--tokenizer", str(tiny), "--messages", str(tmp_path / "flat.json"),
                             "--tools", str(tmp_path / "tools.json"), "--add-generation-prompt"],
                            capture_output=True, text=True, check=True).stdout
    assert "get_time" in prompt
    assert json.loads(generate(tiny, "--messages", str(f), "--json"))["prompt_ids"] == tok.encode(
        prompt, add_special_tokens=False).ids
    # Bad messages: the chat route's own checks, as a CLI error.
    for bad, why in [([{"content": "x"}], "field `role` is required"), ([], "at least one message"),
                     ({"msgs": []}, 'an object with "messages"')]:
        f.write_text(json.dumps(bad))
        r = subprocess.run([BIN, "generate", "--model", str(tiny), "--messages", str(f)], capture_output=True,
                           text=True)
        assert r.returncode == 1 and "--messages" in r.stderr and why in r.stderr, r.stderr


def test_generate_prompt_flags_exclusive(tiny):
    r = subprocess.run([BIN, "generate", "--model", str(tiny), "--prompt", "a", "--prompt-ids", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "excludes" in r.stderr, r.stderr
    r = subprocess.run([BIN, "generate", "--model", str(tiny)], capture_output=True, text=True)
    assert r.returncode == 1 and "give a prompt" in r.stderr, r.stderr
