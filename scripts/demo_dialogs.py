#!/usr/bin/env python3
"""Synthetic chat dialogs for the demo model (scripts/train_demo.py).

Each dialog is {"messages": [...], "tools": [...] or None} in the OpenAI chat format that
moeserve's server receives; train_demo.py renders it through MiniMax-M2.5's chat template, so
the training text is the text the server feeds the model. Kinds of dialog:
  - plain questions answered from the Python documentation (glossary terms, section topics);
  - arithmetic and unit questions with step-by-step reasoning in <think>...</think>;
  - tool calls (MiniMax XML, rendered by the template from `tool_calls`) to three demo tools:
    `calculator`, `get_current_time`, `convert_units`, with the tool's result and a final
    answer that uses it; also tool-free questions asked while tools are offered;
  - small talk and identity answers.
Deterministic for a given random.Random. `held_out_prompts` gives prompts built from phrasings
and values that the training generator never uses (for the tool-call success measurement).
"""
import json
import math
import random

CALC = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression and return the result.",
    "parameters": {"type": "object", "properties": {
        "expression": {"type": "string", "description": "Arithmetic expression, e.g. 12 * (3 + 4)"}},
        "required": ["expression"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_current_time", "description": "Get the current date and time in a time zone.",
    "parameters": {"type": "object", "properties": {
        "timezone": {"type": "string", "description": "IANA time zone name, e.g. Europe/Paris"}},
        "required": ["timezone"]}}}
CONVERT = {"type": "function", "function": {
    "name": "convert_units", "description": "Convert a value from one unit to another.",
    "parameters": {"type": "object", "properties": {
        "value": {"type": "number", "description": "The value to convert"},
        "from_unit": {"type": "string", "description": "Unit of the value, e.g. km"},
        "to_unit": {"type": "string", "description": "Unit to convert to, e.g. mi"}},
        "required": ["value", "from_unit", "to_unit"]}}}
ALL_TOOLS = [CALC, CLOCK, CONVERT]

ZONES = {"Europe/Paris": "Paris", "Europe/London": "London", "America/New_York": "New York",
         "Asia/Tokyo": "Tokyo", "Australia/Sydney": "Sydney", "Europe/Berlin": "Berlin",
         "America/Los_Angeles": "Los Angeles", "Asia/Kolkata": "Mumbai", "America/Sao_Paulo": "Sao Paulo",
         "Africa/Cairo": "Cairo", "Europe/Madrid": "Madrid", "Asia/Singapore": "Singapore",
         "UTC": "UTC"}
HELD_OUT_ZONES = {"Europe/Rome": "Rome", "America/Chicago": "Chicago", "Asia/Seoul": "Seoul"}
# (from, to, factor, names) ; value_to = value_from * factor
UNITS = [("km", "mi", 0.621371, "kilometers", "miles"), ("mi", "km", 1.609344, "miles", "kilometers"),
         ("kg", "lb", 2.204623, "kilograms", "pounds"), ("lb", "kg", 0.453592, "pounds", "kilograms"),
         ("m", "ft", 3.280840, "meters", "feet"), ("ft", "m", 0.3048, "feet", "meters"),
         ("l", "gal", 0.264172, "liters", "gallons"), ("gal", "l", 3.785412, "gallons", "liters"),
         ("cm", "in", 0.393701, "centimeters", "inches"), ("in", "cm", 2.54, "inches", "centimeters"),
         ("C", "F", None, "degrees Celsius", "degrees Fahrenheit"),
         ("F", "C", None, "degrees Fahrenheit", "degrees Celsius")]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]

CALC_ASK = ["What is {e}?", "Please calculate {e}.", "Can you compute {e} for me?", "How much is {e}?",
            "Use the calculator: {e}", "I need the result of {e}.", "Work out {e}, please.",
            "What do you get for {e}?"]
CLOCK_ASK = ["What time is it in {c}?", "What is the current time in {c}?", "Tell me the time in {c}.",
             "Do you know what time it is in {c} right now?", "What's the date and time in {c}?",
             "Check the clock for {c}, please."]
CONV_ASK = ["Convert {v} {a} to {b}.", "How many {b} are {v} {a}?", "What is {v} {a} in {b}?",
            "Please convert {v} {a} into {b}.", "I have {v} {a}. How much is that in {b}?"]
HELD_CALC = ["Could you figure out {e}?", "Find the value of {e}."]
HELD_CLOCK = ["I'd like to know the local time in {c}.", "Give me the current time for {c}."]
HELD_CONV = ["Turn {v} {a} into {b}, please.", "Express {v} {a} in {b}."]

GREET = [("Hello!", "Hello! How can I help you today?"),
         ("Hi there.", "Hi! What would you like to talk about?"),
         ("Good morning!", "Good morning! How can I help?"),
         ("Thanks for your help.", "You are welcome. Let me know if you have another question."),
         ("Thank you!", "You're welcome!"),
         ("How are you?", "I am doing well, thank you. How can I help you today?"),
         ("Goodbye.", "Goodbye! Have a nice day."),
         # greetings and thanks with a second clause: the shipped model called a tool for the
         # held-out "Hello, who are you?" and "Thanks, that helped."
         ("Thanks, that was useful.", "You are welcome. Let me know if you have another question."),
         ("Great, thank you!", "You're welcome! Happy to help."),
         ("Good afternoon, how is it going?", "Good afternoon! I am doing well. How can I help?")]
IDENTITY_Q = ["Who are you?", "What are you?", "Tell me about yourself.", "What can you do?",
              "Are you a large model?", "Hi, what are you?", "Hello! What can you do?",
              "Good morning, who am I talking to?"]
IDENTITY_A = ("I am a small demo language model with the MiniMax-M2 architecture, trained for moeserve. "
              "I can answer simple questions about Python, do arithmetic with a calculator tool, tell the "
              "time with a clock tool and convert units. I am very small, so my answers can be wrong.")
THINK_OPEN = ["The user asks {q}", "The user is asking {q}", "Here the user asks {q}"]
# Reasoning and final answers after a tool result: each copies the result's digits exactly.
CALC_THINK2 = ["The calculator returned {v}. So {e} = {v}.", "The tool result is {v}, so the answer is {v}.",
               "The calculator says {e} is {v}. I will report {v}.", "Result: {v}. I give the user {v}."]
CALC_ANSWER = ["{e} = {v}.", "The result of {e} is {v}.", "{e} equals {v}.", "The answer is {v}.",
               "It is {v}.", "The calculator gives {v}.", "{v} is the result of {e}.",
               "The result is {v}.", "That comes to {v}."]
CLOCK_THINK2 = ["The tool says the local time in {c} is {iso}.", "The result is {iso}, which is {s}.",
                "get_current_time returned {iso} for {c}. That is {s}."]
CLOCK_ANSWER = ["It is {s} in {c}.", "The current time in {c} is {s}.", "In {c} it is now {s}.",
                "Right now it is {s} in {c}.", "The local time in {c} is {s}.", "It is {s}."]
CONV_THINK2 = ["The tool returned {o} {u}. So {v} {a} is {o} {b}.", "The result is {o} {u}, so the answer is {o} {b}.",
               "convert_units gives {o}. I will say {v} {a} is {o} {b}."]
CONV_ANSWER = ["{v} {a} is {o} {b}.", "That is {o} {b}.", "{v} {a} equals about {o} {b}.",
               "{v} {a} is about {o} {b}.", "The result is {o} {b}.", "It comes to {o} {b}.",
               "{v} {a} converts to {o} {b}."]


def _num(rng, lo, hi):
    return rng.randint(lo, hi)


def _expr(rng):
    """An arithmetic expression and its exact value (ints, or a float with 4 decimals). Operands
    of 1-4 digits, so results run from one digit to seven, negative and decimal too: the final
    answer after a tool result must copy all of them (issue 20)."""
    k = rng.randint(0, 8)
    a, b, c = _num(rng, 2, rng.choice([99, 999, 9999])), _num(rng, 2, rng.choice([99, 999])), _num(rng, 2, 50)
    forms = [f"{a} + {b}", f"{a} - {b}", f"{a} * {b}", f"{a} / {c}", f"({a} + {b}) * {c}",
             f"{a} * {b} - {c}", f"{a} * {b} + {c}", f"{b} - {a}", f"({a} - {b}) / {c}"][k]
    val = eval(forms, {"__builtins__": {}})  # our own generated expression, digits and + - * / ( )
    return forms, _fmt(val)


def _fmt(x):
    if isinstance(x, float) and not x.is_integer():
        return f"{x:.4f}".rstrip("0").rstrip(".")
    return str(int(x))


def _convert(v, u):
    a, b, f = u[0], u[1], u[2]
    if f is not None:
        return v * f
    return v * 9 / 5 + 32 if a == "C" else (v - 32) * 5 / 9


def _time(rng):
    y, mo, d = rng.randint(2024, 2027), rng.randint(1, 12), rng.randint(1, 28)
    h, mi = rng.randint(0, 23), rng.randint(0, 59)
    iso = f"{y}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:00"
    spoken = f"{h:02d}:{mi:02d} on {MONTHS[mo - 1]} {d}, {y}"
    return iso, spoken


def _call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


def _tool_turns(user, think1, call, result, think2, answer, tools, system=None):
    msgs = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": user},
        {"role": "assistant", "content": "", "reasoning_content": think1, "tool_calls": [call]},
        {"role": "tool", "content": result},
        {"role": "assistant", "content": answer, "reasoning_content": think2}]
    return {"messages": msgs, "tools": tools}


def _tools_subset(rng, must):
    others = [t for t in ALL_TOOLS if t is not must]
    rng.shuffle(others)
    ts = [must] + others[:rng.randint(0, 2)]
    rng.shuffle(ts)
    return ts


def calc_dialog(rng, ask=CALC_ASK):
    e, v = _expr(rng)
    q = rng.choice(ask).format(e=e)
    t1 = (f"{rng.choice(THINK_OPEN).format(q='for the value of ' + e + '.')} "
          f"I should use the calculator tool to get an exact result.")
    t2 = rng.choice(CALC_THINK2).format(e=e, v=v)
    ans = rng.choice(CALC_ANSWER).format(e=e, v=v)
    return _tool_turns(q, t1, _call("calculator", {"expression": e}), _calc_result(rng, v), t2, ans,
                       _tools_subset(rng, CALC))


def _calc_result(rng, v):
    """The calculator's result as clients send it: JSON with a string or a number, or bare text."""
    k = rng.random()
    if k < 0.6:
        return json.dumps({"result": v})
    if k < 0.85:
        return json.dumps({"result": float(v) if "." in v else int(v)})
    return v


def clock_dialog(rng, ask=CLOCK_ASK, zones=ZONES):
    tz, city = rng.choice(sorted(zones.items()))
    q = rng.choice(ask).format(c=city)
    iso, spoken = _time(rng)
    t1 = (f"{rng.choice(THINK_OPEN).format(q='for the time in ' + city + '.')} "
          f"I do not know the time myself, so I call get_current_time with the time zone {tz}.")
    t2 = rng.choice(CLOCK_THINK2).format(c=city, iso=iso, s=spoken)
    ans = rng.choice(CLOCK_ANSWER).format(c=city, s=spoken)
    return _tool_turns(q, t1, _call("get_current_time", {"timezone": tz}),
                       json.dumps({"timezone": tz, "datetime": iso}), t2, ans, _tools_subset(rng, CLOCK))


def convert_dialog(rng, ask=CONV_ASK):
    u = rng.choice(UNITS)
    v = rng.choice([rng.randint(1, 500), rng.randint(1, 5000), round(rng.uniform(0.5, 100), 1),
                    round(rng.uniform(0.01, 10), 2)])
    out = _fmt(round(_convert(v, u), 4))
    vs = _fmt(v)
    q = rng.choice(ask).format(v=vs, a=u[3], b=u[4])
    t1 = (f"{rng.choice(THINK_OPEN).format(q='to convert ' + vs + ' ' + u[3] + ' to ' + u[4] + '.')} "
          f"The convert_units tool does this: value {vs}, from {u[0]}, to {u[1]}.")
    t2 = rng.choice(CONV_THINK2).format(v=vs, o=out, u=u[1], a=u[3], b=u[4])
    ans = rng.choice(CONV_ANSWER).format(v=vs, o=out, a=u[3], b=u[4])
    return _tool_turns(q, t1, _call("convert_units", {"value": v, "from_unit": u[0], "to_unit": u[1]}),
                       json.dumps({"value": float(out), "unit": u[1]}), t2, ans, _tools_subset(rng, CONVERT))


def mental_math_dialog(rng, tools):
    """Reasoning without a tool: small sums and products, with the steps in the thinking."""
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    op = rng.choice(["+", "-", "*"])
    v = eval(f"{a} {op} {b}", {"__builtins__": {}})
    word = {"+": "add", "-": "subtract", "*": "multiply"}[op]
    if op == "*" and b >= 10:
        steps = f"{a} * {b} = {a} * {b // 10 * 10} + {a} * {b % 10} = {a * (b // 10 * 10)} + {a * (b % 10)} = {v}."
    else:
        steps = f"{a} {op} {b} = {v}."
    q = rng.choice([f"What is {a} {op} {b}?", f"Quick question: {a} {op} {b}?",
                    f"Without a calculator, what is {a} {op} {b}?"])
    think = f"This is a small {word} problem, so I can do it step by step. {steps}"
    msgs = [{"role": "user", "content": q},
            {"role": "assistant", "content": f"{a} {op} {b} = {v}.", "reasoning_content": think}]
    return {"messages": msgs, "tools": tools}


def doc_dialog(rng, glossary, sections, tools):
    """A question about a Python term or topic, answered with the documentation's own words."""
    if glossary and (not sections or rng.random() < 0.5):
        term, text = rng.choice(glossary)
        q = rng.choice([f"What is {term} in Python?", f"What does {term} mean?", f"Define {term}.",
                        f"Can you explain what {term} is?", f"What is meant by {term}?"])
        think = f"The user asks about the term {term}. I will give its definition from the Python glossary."
    else:
        term, text = rng.choice(sections)
        q = rng.choice([f"Tell me about {term}.", f"Explain {term}.", f"What should I know about {term}?",
                        f"Can you describe {term}?"])
        think = f"The user wants an explanation of {term}. I will summarize what the Python documentation says."
    msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": text, "reasoning_content": think}]
    return {"messages": msgs, "tools": tools}


def small_talk_dialog(rng, tools):
    if rng.random() < 0.4:
        q, a = rng.choice(IDENTITY_Q), IDENTITY_A
        think = "The user asks about me. I should say honestly what I am and what I can do."
    else:
        q, a = rng.choice(GREET)
        think = "The user is making small talk. I will answer politely and briefly."
    return {"messages": [{"role": "user", "content": q},
                         {"role": "assistant", "content": a, "reasoning_content": think}], "tools": tools}


def multi_turn(rng, glossary, sections):
    """Two exchanges: the first assistant turn loses its reasoning in the rendering (template
    keeps reasoning only after the last user message), as in a real conversation."""
    first = small_talk_dialog(rng, None) if rng.random() < 0.5 else doc_dialog(rng, glossary, sections, None)
    second = rng.choice([calc_dialog, clock_dialog, convert_dialog])(rng)
    return {"messages": first["messages"] + second["messages"], "tools": second["tools"]}


def _plain_tools(rng):
    """Tools offered with a question that needs none: all three, a subset (so that a subset does
    not mean "call one"), or none."""
    r = rng.random()
    if r < 0.4:
        return ALL_TOOLS
    if r < 0.6:
        return _tools_subset(rng, rng.choice(ALL_TOOLS))
    return None


def make_dialogs(rng, n, glossary, sections):
    """n dialogs in a fixed mix: 55% tool calls with the tool's result and a final answer that
    copies it, 17% documentation Q&A, 11% mental arithmetic, 9% small talk, 8% two-turn
    conversations."""
    out = []
    for _ in range(n):
        r = rng.random()
        tools = _plain_tools(rng)
        if r < 0.20:
            out.append(calc_dialog(rng))
        elif r < 0.37:
            out.append(clock_dialog(rng))
        elif r < 0.55:
            out.append(convert_dialog(rng))
        elif r < 0.72:
            out.append(doc_dialog(rng, glossary, sections, tools))
        elif r < 0.83:
            out.append(mental_math_dialog(rng, tools))
        elif r < 0.92:
            out.append(small_talk_dialog(rng, tools))
        else:
            out.append(multi_turn(rng, glossary, sections))
    return out


def held_out_followups(rng, n=30):
    """Tool-result follow-ups for evaluation: a held-out tool prompt (HELD_* phrasings, values from
    another seed), the assistant's tool call, the tool's result; `expect` lists the strings the
    final answer must repeat exactly (the calculator's result, the converter's value, the clock's
    time and date as the answers say them). Returns {"messages", "tools", "expect"} without the final answer."""
    items = []
    for i in range(n):
        r = random.Random(rng.randint(0, 1 << 30) + 20_000_003)
        d = [lambda: calc_dialog(r, HELD_CALC), lambda: clock_dialog(r, HELD_CLOCK),
             lambda: convert_dialog(r, HELD_CONV)][i % 3]()
        call = d["messages"][-3]["tool_calls"][0]["function"]
        res = d["messages"][-2]["content"]
        if call["name"] == "calculator":
            expect = [json.loads(res)["result"] if res.startswith("{") else res]
            expect = [_fmt(expect[0]) if not isinstance(expect[0], str) else expect[0]]
        elif call["name"] == "convert_units":
            expect = [_fmt(json.loads(res)["value"])]
        else:
            iso = json.loads(res)["datetime"]  # the answer says it as "HH:MM on Month D, YYYY"
            expect = [f"{iso[11:16]} on {MONTHS[int(iso[5:7]) - 1]} {int(iso[8:10])}, {iso[:4]}"]
        items.append({"messages": d["messages"][:-1], "tools": ALL_TOOLS, "expect": expect, "tool": call["name"]})
    return items


def held_out_prompts(rng, n_tool=30, n_plain=10):
    """Prompts for evaluation: tool prompts with phrasings (HELD_*), cities (HELD_OUT_ZONES) and
    numbers the training dialogs never contain; each with the tool expected. Plain questions
    (expected tool None) with phrasings not in training either."""
    items = []
    for i in range(n_tool):
        k = i % 3
        if k == 0:
            e, _ = _expr(random.Random(rng.randint(0, 1 << 30) + 10_000_019))
            items.append({"prompt": rng.choice(HELD_CALC).format(e=e), "tool": "calculator"})
        elif k == 1:
            city = rng.choice(sorted(HELD_OUT_ZONES.values()))
            items.append({"prompt": rng.choice(HELD_CLOCK).format(c=city), "tool": "get_current_time"})
        else:
            u = rng.choice(UNITS)
            items.append({"prompt": rng.choice(HELD_CONV).format(v=rng.randint(501, 999), a=u[3], b=u[4]),
                          "tool": "convert_units"})
    plain = ["Hello, who are you?", "What is a list in Python?", "Explain what a dictionary is.",
             "Good evening!", "What is a module?", "What is a tuple?", "Tell me about classes.",
             "What does iterator mean?", "What is a function?", "Thanks, that helped."]
    for q in plain[:n_plain]:
        items.append({"prompt": q, "tool": None})
    return items


if __name__ == "__main__":
    import sys
    r = random.Random(0)
    for d in make_dialogs(r, int(sys.argv[1]) if len(sys.argv) > 1 else 3, [("a decorator", "A function.")],
                          [("the for statement", "It loops.")]):
        print(json.dumps(d, indent=1))
