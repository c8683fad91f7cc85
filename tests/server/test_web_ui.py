"""The chat page at / in a real headless Chromium (Debian's `chromium`), driven over the
Chrome DevTools protocol. Two servers:
  * the replay backend (scripted tokens, deterministic): the page's mechanics with exact DOM
    checks (user message shown, answer streamed in, reasoning collapsible, tool calls, stop
    button, reload), API-key and --no-web-ui behaviour; its screenshot is left in
    <build>/test-artifacts/web-ui-replay.png and is not committed;
  * the real demo model (assets/demo-model on the CPU, the README's flags: minimax_m2 tool
    calls, minimax_m2_append_think reasoning): a scripted conversation whose answers the model
    writes (a question with its reasoning block, a tool prompt with its tool call rendered),
    DOM checks, and the screenshot <build>/test-artifacts/web-ui.png, of which
    docs/img/web-ui.png is the committed copy."""
import base64
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import httpx
import pytest

from chat_fixtures import PARSER_ARGS, PLAIN_T, SCRIPT, THINK_A, THINK_R, TOOLS
from conftest import REPO, Server

sys.path.insert(0, str(REPO / "scripts"))
import demo_dialogs  # noqa: E402


def chromium_binary():
    for name in ("chromium", "chromium-browser", "chromium-headless-shell"):
        p = shutil.which(name)
        if p:
            return p
    # Skip only when Debian has no chromium to install here; otherwise missing it is a setup error.
    policy = subprocess.run(["apt-cache", "policy", "chromium"], capture_output=True, text=True).stdout
    if re.search(r"Candidate: (?!\(none\))", policy):
        pytest.fail("chromium is installable but not installed: run scripts/install-deps.sh")
    pytest.skip("chromium is not installable on this system (apt-cache policy chromium: no candidate)")


class Cdp:
    """A minimal Chrome DevTools protocol client over one page's websocket."""

    def __init__(self, ws_url):
        import websocket
        self.ws = websocket.create_connection(ws_url, timeout=60, suppress_origin=True)
        self.next_id = 0

    def call(self, method, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            m = json.loads(self.ws.recv())
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m["result"]

    def js(self, expr):
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait(self, expr, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            v = self.js(expr)
            if v:
                return v
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {expr}; body: {self.js('document.body.innerText')}")

    def close(self):
        self.ws.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    binary = chromium_binary()
    profile = tmp_path_factory.mktemp("chromium")
    proc = subprocess.Popen([binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                             "--no-first-run", "--remote-debugging-port=0", "--remote-allow-origins=*",
                             f"--user-data-dir={profile}", "--window-size=1280,860", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and port is None:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            break
        m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
        if m:
            port = int(m.group(1))
    assert port, "chromium did not start its DevTools endpoint"
    pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list").read())
    page = next(p for p in pages if p["type"] == "page")
    cdp = Cdp(page["webSocketDebuggerUrl"])
    cdp.call("Page.enable")
    cdp.call("Runtime.enable")
    yield cdp
    cdp.close()
    proc.terminate()
    proc.wait(timeout=20)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("webui"), PARSER_ARGS, script_extra=SCRIPT)
    yield s
    assert s.stop() == 0


def open_page(cdp, url):
    cdp.call("Page.navigate", url=url)
    cdp.wait("document.readyState === 'complete' && !!document.getElementById('messages')")


def send(cdp, text):
    cdp.js(f"document.getElementById('input').value = {json.dumps(text)};"
           "document.getElementById('send').click(); true")


def assistant_count(cdp):
    return cdp.js("document.querySelectorAll('.msg.assistant').length")


def last(cdp, selector):
    return (f"(() => {{ const a = document.querySelectorAll('.msg.assistant'); const m = a[a.length - 1];"
            f" const e = m && m.querySelector({json.dumps(selector)}); return e ? e.textContent : null; }})()")


def idle(cdp):
    return "document.getElementById('stop').disabled && !document.getElementById('send').disabled"


def test_page_served_offline_and_self_contained(server):
    r = httpx.get(server.base + "/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["content-security-policy"]
    html = r.text
    # Nothing loaded from elsewhere: no src/href to another origin, no @import.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html, re.I), "external resource in the page"
    assert "@import" not in html
    assert httpx.head(server.base + "/").status_code == 200
    assert httpx.post(server.base + "/", content="x").status_code == 405


def test_scripted_conversation(server, browser, tmp_path):
    cdp = browser
    open_page(cdp, server.base + "/")
    cdp.js("sessionStorage.clear(); localStorage.clear(); document.getElementById('new-chat').click(); true")
    assert cdp.wait("document.getElementById('model-name').textContent === 'replay'")

    # 1. A plain message: the user bubble, then the answer streamed into an assistant bubble.
    send(cdp, "hello")
    assert cdp.wait("document.querySelector('.msg.user .content')?.textContent") == "hello"
    cdp.wait(idle(cdp))
    assert cdp.js(last(cdp, ".content")) == PLAIN_T
    assert "finish: stop" in cdp.js(last(cdp, ".stats"))

    # 2. Reasoning: streamed into a <details> that is open while streaming, collapsed after.
    send(cdp, "THINK about it")
    cdp.wait(f"{last(cdp, '.reasoning-text')} === {json.dumps(THINK_R)}")
    cdp.wait(idle(cdp))
    assert cdp.js(last(cdp, ".content")) == THINK_A
    assert cdp.js("(() => { const d = document.querySelectorAll('details.reasoning'); "
                  "return d.length === 1 && !d[0].open; })()")

    # 3. Tool calls (tools set in the settings panel) rendered with name and arguments.
    cdp.js(f"document.getElementById('tools').value = {json.dumps(json.dumps(TOOLS))}; true")
    cdp.js("document.getElementById('new-chat').click(); true")
    send(cdp, "TOOLTEST weather in Paris?")
    cdp.wait(idle(cdp))
    call = cdp.js(last(cdp, ".tool-call"))
    assert "get_weather" in call and '"city": "Paris"' in call, call
    assert "finish: tool_calls" in cdp.js(last(cdp, ".stats"))

    # 4. Stop: the answer is streaming (partial text, stop enabled), the button aborts it.
    cdp.js("document.getElementById('new-chat').click(); document.getElementById('tools').value = ''; true")
    send(cdp, "SLOW please")
    cdp.wait(f"({last(cdp, '.content')} || '').length > 20")
    assert cdp.js("!document.getElementById('stop').disabled")
    cdp.js("document.getElementById('stop').click(); true")
    cdp.wait(idle(cdp))
    assert "stopped" in cdp.js(last(cdp, ".stats"))
    partial = cdp.js(last(cdp, ".content"))
    time.sleep(0.5)
    assert cdp.js(last(cdp, ".content")) == partial and partial.count("word") < 300  # no longer growing

    # 5. The conversation survives a reload (sessionStorage) and the next message still works.
    open_page(cdp, server.base + "/")
    cdp.wait("document.querySelectorAll('.msg.user').length === 1")
    assert cdp.js("document.querySelector('.msg.user .content').textContent") == "SLOW please"
    cdp.js("document.getElementById('new-chat').click(); true")
    send(cdp, "THINK once more")
    cdp.wait(idle(cdp))
    assert cdp.js(last(cdp, ".content")) == THINK_A
    send(cdp, "hello again")  # THINK stays in the history: the model sees the conversation
    cdp.wait(f"document.querySelectorAll('.msg.assistant').length === 2")
    cdp.wait(idle(cdp))
    assert cdp.js(last(cdp, ".content")) == THINK_A

    # Screenshot for the docs: a conversation with an answer, reasoning (expanded) and a tool
    # call, and the settings panel open.
    cdp.js("document.getElementById('new-chat').click(); true")
    for text in ("hello", "THINK: what is six times seven?", "TOOLTEST: and the weather in Paris?"):
        if text.startswith("TOOLTEST"):
            cdp.js(f"document.getElementById('tools').value = {json.dumps(json.dumps(TOOLS))}; true")
        send(cdp, text)
        cdp.wait(f"document.querySelectorAll('.msg.user').length === "
                 f"document.querySelectorAll('.msg.assistant').length")
        cdp.wait(idle(cdp))
    assert "get_weather" in cdp.js(last(cdp, ".tool-call"))
    cdp.js("document.getElementById('temperature').value = '0.7'; document.getElementById('max-tokens').value = '256';"
           "document.getElementById('settings').hidden = false;"
           "document.querySelectorAll('details.reasoning').forEach(d => d.open = true);"
           "const m = document.getElementById('messages'); m.scrollTop = m.scrollHeight; true")
    png = base64.b64decode(cdp.call("Page.captureScreenshot", format="png")["data"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000
    out = REPO / "build" / "test-artifacts"
    if (REPO / "build").is_dir():
        out.mkdir(exist_ok=True)
        (out / "web-ui-replay.png").write_bytes(png)


DEMO = REPO / "assets" / "demo-model"
# The demo's three tools, as its training dialogs offer them.
DEMO_TOOLS = demo_dialogs.ALL_TOOLS


def test_demo_model_conversation(browser, tmp_path):
    """The real demo model behind the page (greedy): what it writes is the model's own, so the
    checks are on structure: reasoning in its collapsible block (moved out of the content that
    the append_think parser returns), an English answer, the tool call rendered."""
    s = Server(tmp_path, ["--max-model-len", "2048", "--enable-auto-tool-choice", "--tool-call-parser", "minimax_m2",
                          "--reasoning-parser", "minimax_m2_append_think"], model=DEMO)
    try:
        cdp = browser
        open_page(cdp, s.base + "/")
        cdp.js("sessionStorage.clear(); document.getElementById('new-chat').click();"
               f"document.getElementById('tools').value = {json.dumps(json.dumps(DEMO_TOOLS))};"
               "document.getElementById('temperature').value = '0'; document.getElementById('max-tokens').value = '160';"
               "true")
        assert cdp.wait("document.getElementById('model-name').textContent === 'moeserve-demo'")

        send(cdp, "What is a list in Python?")
        cdp.wait(f"document.querySelectorAll('.msg.assistant').length === 1 && {idle(cdp)}", timeout=120)
        answer = cdp.js(last(cdp, ".content"))
        reasoning = cdp.js(last(cdp, ".reasoning-text"))
        assert reasoning and len(reasoning.split()) >= 5, reasoning
        assert "<think>" not in answer and "</think>" not in answer, answer
        assert len(answer.split()) >= 5 and answer.rstrip()[-1:] in ".!?", answer
        assert cdp.js("(() => { const d = document.querySelectorAll('details.reasoning'); "
                      "return d.length === 1 && !d[0].open; })()")
        assert "finish: stop" in cdp.js(last(cdp, ".stats"))

        send(cdp, "Please calculate 17 * 23 - 4.")
        cdp.wait(f"document.querySelectorAll('.msg.assistant').length === 2 && {idle(cdp)}", timeout=120)
        call = cdp.js(last(cdp, ".tool-call"))
        assert call and "calculator" in call and "17 * 23 - 4" in call, (call, cdp.js("document.body.innerText"))
        assert "finish: tool_calls" in cdp.js(last(cdp, ".stats"))
        assert cdp.js(f"{last(cdp, '.reasoning-text')}")

        cdp.js("document.getElementById('settings').hidden = false;"
               "document.querySelectorAll('details.reasoning').forEach(d => d.open = true);"
               "const m = document.getElementById('messages'); m.scrollTop = m.scrollHeight; true")
        png = base64.b64decode(cdp.call("Page.captureScreenshot", format="png")["data"])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000
        out = REPO / "build" / "test-artifacts"
        if (REPO / "build").is_dir():
            out.mkdir(exist_ok=True)
            (out / "web-ui.png").write_bytes(png)
    finally:
        assert s.stop() == 0


def test_api_key_typed_in_page(tmp_path, browser):
    s = Server(tmp_path, PARSER_ARGS + ["--api-key", "sekrit"], script_extra=SCRIPT)
    try:
        # The page itself needs no key; the API does.
        assert httpx.get(s.base + "/").status_code == 200
        assert httpx.get(s.base + "/v1/models").status_code == 401
        cdp = browser
        open_page(cdp, s.base + "/")
        cdp.js("sessionStorage.clear(); document.getElementById('api-key').value = ''; "
               "document.getElementById('new-chat').click(); true")
        open_page(cdp, s.base + "/")
        cdp.wait("document.getElementById('status').textContent.includes('API key needed')")
        send(cdp, "hello")
        cdp.wait(idle(cdp))
        assert "HTTP 401" in cdp.js(last(cdp, ".content"))
        cdp.js("const k = document.getElementById('api-key'); k.value = 'sekrit';"
               "k.dispatchEvent(new Event('change')); true")
        cdp.wait("document.getElementById('model-name').textContent === 'replay'")
        send(cdp, "hello")
        cdp.wait(f"{last(cdp, '.content')} === {json.dumps(PLAIN_T)}")
    finally:
        assert s.stop() == 0


def test_no_web_ui_is_404(tmp_path):
    s = Server(tmp_path, ["--no-web-ui"])
    try:
        r = httpx.get(s.base + "/")
        assert r.status_code == 404 and r.json() == {"detail": "Not Found"}
        assert httpx.get(s.base + "/health").status_code == 200
    finally:
        assert s.stop() == 0


def test_flag_in_help():
    binary = os.environ.get("MOESERVE_BIN", str(REPO / "build/moeserve"))
    out = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True).stdout
    assert "--no-web-ui" in out
