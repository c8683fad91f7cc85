"""Replay-backend scripts shared by the chat tests (terminal chat and the web page): each
script is chosen by a marker word in the prompt (see conftest.Server and replay_executor.h), so
what the model "answers" shows what the prompt contained (history, /reset, the system prompt)."""
import json

from conftest import TOOL, encode

PLAIN_T = "Hello there! I am a scripted replay model."
THINK_R = "Let me think about it."
THINK_A = "The answer is 42."
SYS_A = "System prompt seen."
SLOW_WORDS = 400  # at STEP_US per token: long enough to be stopped mid-answer
STEP_US = 15000

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]

# First match wins: SLOW, TOOLTEST, THINK, SYSMARK, then the global script.
SCRIPT = {
    "step_sleep_us": STEP_US,
    "scripts": [
        {"marker": encode("SLOW"), "tokens": encode("</think>" + "word " * SLOW_WORDS)},
        {"marker": encode("TOOLTEST"), "tokens": encode(TOOL)},
        {"marker": encode("THINK"), "tokens": encode(THINK_R + "</think>\n\n" + THINK_A)},
        {"marker": encode("SYSMARK"), "tokens": encode("</think>" + SYS_A)},
        {"marker": [], "tokens": encode("</think>" + PLAIN_T)},
    ],
}

PARSER_ARGS = ["--reasoning-parser", "minimax_m2", "--tool-call-parser", "minimax_m2", "--enable-auto-tool-choice"]


def write_tools(path):
    path.write_text(json.dumps(TOOLS))
    return path
