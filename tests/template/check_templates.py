#!/usr/bin/env python3
"""Renders every chat template with Python's jinja2, set up as Hugging Face's apply_chat_template
sets it up, and with Strata's renderer (strata_render), over several conversations each, and
requires the same bytes, or an error from both (the same message where the template raised it).

usage: check_templates.py STRATA_RENDER TEMPLATES_DIR [-v]
Exit status 77 (CTest's skip) when python3-jinja2 is missing.
"""
import datetime
import json
import os
import subprocess
import sys
import tempfile

try:
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIP: python3-jinja2 is not installed (apt-get install python3-jinja2)")
    sys.exit(77)

DATE = datetime.date(2026, 3, 7)


def make_environment():
    # As transformers' _compile_jinja_template.
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return DATE.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit", "réaumur"]},
            },
            "required": ["city"],
        },
    }},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object",
                       "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
                       "required": ["query"]},
    }},
]


def conversations(uses_thinking):
    base = {"bos_token": "<s>", "eos_token": "</s>"}
    system_user = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    multi_turn = [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi there. How can I help?"},
        {"role": "user", "content": "Tell me a joke.\nA short one."},
    ]
    finished = multi_turn + [{"role": "assistant", "content": "Why did the llama cross the road?"}]
    tool_calls = [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "call00001", "type": "function",
                         "function": {"name": "get_weather",
                                      "arguments": {"city": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call00001", "name": "get_weather",
         "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
        {"role": "user", "content": "And search for museums there."},
    ]
    # Tool call ids of nine letters and digits, which Mistral's templates require.
    # As OpenAI clients send them: arguments a JSON string; an earlier turn's reasoning kept.
    string_arguments = [
        {"role": "user", "content": "Search for llamas, then tell me about them."},
        {"role": "assistant", "content": "", "reasoning_content": "The user wants a search.",
         "tool_calls": [{"id": "call00002", "type": "function",
                         "function": {"name": "search",
                                      "arguments": "{\"query\": \"llamas\", \"limit\": 3}"}}]},
        {"role": "tool", "tool_call_id": "call00002", "content": "Llamas are camelids."},
    ]
    # Content as a list of parts, as OpenAI's API allows it.
    content_parts = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Describe"},
                                     {"type": "text", "text": " a llama."}]},
    ]
    non_ascii = [
        {"role": "system", "content": "Réponds en français, s'il te plaît — «merci»."},
        {"role": "user", "content": "Zażółć gęślą jaźń: 日本語のテキスト, emoji 🦙, \"quotes\" and \\ backslash"},
        {"role": "assistant", "content": "Ça marche: 東京 🚀"},
        {"role": "user", "content": "Encore une fois ?"},
    ]
    cases = [
        ("system+user", {"messages": system_user, "add_generation_prompt": True}),
        ("multi-turn", {"messages": multi_turn, "add_generation_prompt": True}),
        ("multi-turn, no generation prompt", {"messages": finished, "add_generation_prompt": False}),
        ("tools", {"messages": tool_calls, "tools": TOOLS, "add_generation_prompt": True}),
        ("tools, string arguments", {"messages": string_arguments, "tools": TOOLS,
                                     "add_generation_prompt": True, "reasoning_effort": "high"}),
        ("content parts", {"messages": content_parts, "add_generation_prompt": True}),
        ("non-ASCII", {"messages": non_ascii, "add_generation_prompt": True}),
    ]
    if uses_thinking:
        cases += [
            ("thinking on", {"messages": multi_turn, "add_generation_prompt": True,
                             "enable_thinking": True}),
            ("thinking off", {"messages": multi_turn, "add_generation_prompt": True,
                              "enable_thinking": False}),
        ]
    return [(name, dict(base, **context)) for name, context in cases]


def python_render(env, source, context):
    """('ok', text), ('raised', message) from raise_exception, or ('error', description)."""
    try:
        template = env.from_string(source)
    except Exception as e:  # noqa: BLE001 - any failure to compile is an error for the check
        return "error", f"parse: {type(e).__name__}: {e}"
    try:
        return "ok", template.render(**context)
    except jinja2.exceptions.TemplateError as e:
        if type(e) is jinja2.exceptions.TemplateError:
            return "raised", str(e)
        return "error", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001
        return "error", f"{type(e).__name__}: {e}"


def strata_render(binary, path, context, tmp):
    context_file = os.path.join(tmp, "context.json")
    with open(context_file, "w", encoding="utf-8") as f:
        json.dump(context, f, ensure_ascii=False)
    p = subprocess.run([binary, path, context_file, DATE.isoformat()], capture_output=True,
                       timeout=60)
    if p.returncode == 0:
        return "ok", p.stdout.decode("utf-8")
    message = p.stderr.decode("utf-8", "replace").rstrip("\n")
    return ("raised" if p.returncode == 3 else "error"), message


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 1
    binary, directory = sys.argv[1], sys.argv[2]
    verbose = "-v" in sys.argv[3:]
    env = make_environment()
    names = sorted(n for n in os.listdir(directory) if n.endswith(".jinja"))
    if not names:
        print(f"no templates in {directory}")
        return 1
    total = matched = rendered = 0
    failed_templates = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = os.path.join(directory, name)
            with open(path, encoding="utf-8") as f:
                source = f.read()
            uses_thinking = "enable_thinking" in source
            failures = []
            for case, context in conversations(uses_thinking):
                total += 1
                expected = python_render(env, source, context)
                got = strata_render(binary, path, context, tmp)
                same = (expected == got if expected[0] in ("ok", "raised")
                        else got[0] in ("error", "raised"))
                if same:
                    matched += 1
                    rendered += expected[0] == "ok"
                    if verbose and expected[0] != "ok":
                        print(f"  {name} / {case}: both fail: {expected[1]!r} / {got[1]!r}")
                else:
                    failures.append((case, expected, got))
            if failures:
                failed_templates.append(name)
                print(f"MISMATCH {name}:")
                for case, expected, got in failures:
                    print(f"  {case}: jinja2 {expected[0]}, strata {got[0]}")
                    if verbose or expected[0] != got[0]:
                        print(f"    jinja2: {expected[1][:300]!r}")
                        print(f"    strata: {got[1][:300]!r}")
                    else:
                        a, b = expected[1], got[1]
                        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]),
                                 min(len(a), len(b)))
                        print(f"    first difference at character {i}:")
                        print(f"    jinja2: {a[max(0, i - 80):i + 80]!r}")
                        print(f"    strata: {b[max(0, i - 80):i + 80]!r}")
    print(f"{matched} of {total} renders match ({rendered} rendered by both, "
          f"{matched - rendered} an error in both; {len(names) - len(failed_templates)} of "
          f"{len(names)} templates in every conversation)")
    return 0 if matched == total else 1


if __name__ == "__main__":
    sys.exit(main())
