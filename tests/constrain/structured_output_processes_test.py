#!/usr/bin/env python3
"""Structured output through real `strata serve` processes on 127.0.0.1, with the shared 260K
model (which knows nothing of JSON): for 20 schemas of increasing difficulty, response_format
json_schema gives content that parses and that python3-jsonschema validates against the schema
whenever it finished ("stop"), most of them finish within the model's 128-token context, and
the bytes are the same on one node and on a 3-node cluster, greedy and seeded. With a chat
template that writes Hermes/Qwen tool calls (and a context past the model's own, for its tools
prompt), tool_choice "required" and a named function give one call whose arguments validate
against that tool's parameters, the same bytes on 1 and 3 nodes. Also
{"type": "json_object"}, a GBNF grammar on /v1/completions, Ollama's format, and the 400s for
schemas that are invalid or use what is not supported.

usage: structured_output_processes_test.py STRATA MODEL.gguf
"""
import json
import os
import sys
import urllib.error
import urllib.request

import jsonschema

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cluster"))
from cluster_processes_test import FAILURES, Node, check, start_cluster, stop_all  # noqa: E402

S = {"type": "string", "maxLength": 8}
SCHEMAS = [
    {"type": "boolean"},
    {"enum": ["red", "green", "blue"]},
    {"type": ["integer", "null"], "minimum": 0, "maximum": 99},
    {"type": "string", "minLength": 1, "maxLength": 10},
    {"type": "integer", "minimum": -50, "maximum": 50},
    {"type": "number"},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    {"type": "object", "properties": {"name": S}, "required": ["name"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 1, "maximum": 9}},
     "required": ["ok", "n"]},
    {"type": "array", "items": {"enum": ["a", "b", 1, None]}, "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"kind": {"const": "dream"}, "colour": {"enum": ["red", "blue"]}},
     "required": ["kind", "colour"], "additionalProperties": False},
    {"type": "array", "items": S, "maxItems": 3},
    {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "array", "items": {"type": "null"}, "maxItems": 2}]},
    {"type": "object", "properties": {"a": {"type": "integer", "maximum": 9, "minimum": 0}, "b": S, "c": {"type": "boolean"}}},
    {"oneOf": [{"type": "object", "properties": {"x": {"type": "null"}}, "required": ["x"], "additionalProperties": False},
               {"const": [1, 2]}]},
    {"type": "object", "properties": {"inner": {"type": "object", "properties": {"v": {"type": ["boolean", "null"]}},
                                                 "required": ["v"]}}, "required": ["inner"]},
    {"$defs": {"word": S}, "type": "object", "properties": {"w": {"$ref": "#/$defs/word"}, "tags": {
        "type": "array", "items": {"$ref": "#/$defs/word"}, "maxItems": 2}}, "required": ["w", "tags"]},
    {"title": "Point", "description": "annotations are ignored", "type": "object",
     "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}, "y": {"type": "integer", "minimum": 0, "maximum": 9}},
     "required": ["x", "y"], "additionalProperties": False},
    {"definitions": {"tree": {"type": "object", "properties": {"leaf": {"type": "boolean"}, "kids": {
        "type": "array", "items": {"$ref": "#/definitions/tree"}, "maxItems": 2}}, "required": ["leaf"]}},
     "$ref": "#/definitions/tree"},
    {"type": "object", "properties": {"id": {"type": "integer", "minimum": 100, "maximum": 999},
                                      "who": {"type": "object", "properties": {"first": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                                              "required": ["first", "age"], "additionalProperties": False},
                                      "flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2}},
     "required": ["id", "who", "flags"], "additionalProperties": False},
]
SAMPLINGS = [{"temperature": 0}, {"temperature": 0.9, "seed": 7}]

# The shared folder's real chat templates, beside its models.
TOOL_TEMPLATE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[2]))), "templates",
                             "Qwen-Qwen2.5-7B-Instruct.jinja")
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
        "type": "object", "properties": {"city": S, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "set_mood", "parameters": {
        "type": "object", "properties": {"mood": {"enum": ["calm", "wild"]}, "loud": {"type": "boolean"}},
        "required": ["mood"]}}},
]
TOOL_CHOICES = ["required", {"type": "function", "function": {"name": "set_mood"}}]


def post(node, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{node.port}{path}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def chat(node, schema, sampling):
    return post(node, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "A dream as JSON"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}},
        **sampling})


def structured_answers(node, label):
    """Each schema's and sampling's (content, finish_reason); checks that finished ones validate."""
    answers, finished = [], 0
    for i, schema in enumerate(SCHEMAS):
        for sampling in SAMPLINGS:
            status, body = chat(node, schema, sampling)
            if not check(status == 200, f"{label}: schema {i} {sampling}: 200 ({body})"):
                answers.append(None)
                continue
            choice = body["choices"][0]
            content, reason = choice["message"]["content"], choice["finish_reason"]
            answers.append((content, reason))
            if reason == "stop":
                finished += 1
                try:
                    jsonschema.validate(json.loads(content), schema)
                except (ValueError, jsonschema.ValidationError) as e:
                    check(False, f"{label}: schema {i} {sampling}: {content!r} validates ({e})")
            else:
                check(reason == "length", f"{label}: schema {i} {sampling}: finish_reason stop or length ({reason})")
            print(f"{label} schema {i:2} {sampling}: {reason:6} {content}", flush=True)
    total = len(SCHEMAS) * len(SAMPLINGS)
    check(finished >= total * 3 // 4, f"{label}: most outputs finish ({finished} of {total})")
    return answers


def other_forms(node, label):
    """json_object, a grammar, Ollama's format, and the refusals; returns the outputs."""
    outputs = []
    status, body = post(node, "/v1/chat/completions", {"messages": [{"role": "user", "content": "JSON"}],
                                                       "response_format": {"type": "json_object"}, "temperature": 0})
    if check(status == 200, f"{label}: json_object answers ({body})"):
        content, reason = body["choices"][0]["message"]["content"], body["choices"][0]["finish_reason"]
        outputs.append(content)
        if reason == "stop":
            check(isinstance(json.loads(content), dict), f"{label}: json_object gives an object ({content!r})")
    status, body = post(node, "/v1/completions", {"prompt": "Once upon a time", "temperature": 0.7, "seed": 3,
                                                  "grammar": 'root ::= " " ("yes" | "no") "! " [a-z]{2,5} "."'})
    if check(status == 200, f"{label}: a grammar on /v1/completions answers ({body})"):
        text = body["choices"][0]["text"]
        outputs.append(text)
        words = text.split(" ")
        check(body["choices"][0]["finish_reason"] == "stop" and len(words) == 3 and words[1] in ("yes!", "no!")
              and words[2].endswith(".") and words[2][:-1].isalpha() and 2 <= len(words[2]) - 1 <= 5,
              f"{label}: the completion follows the grammar ({text!r})")
    schema = {"type": "object", "properties": {"mood": {"enum": ["calm", "wild"]}}, "required": ["mood"]}
    status, body = post(node, "/api/chat", {"messages": [{"role": "user", "content": "mood?"}],
                                            "format": schema, "stream": False, "options": {"temperature": 0}})
    if check(status == 200, f"{label}: Ollama's format answers ({body})"):
        content = body["message"]["content"]
        outputs.append(content)
        try:
            jsonschema.validate(json.loads(content), schema)
        except (ValueError, jsonschema.ValidationError) as e:
            check(False, f"{label}: Ollama's format output validates ({content!r}: {e})")
    for schema, words in [({"type": "string", "pattern": "^a"}, "unsupported keyword: pattern"),
                          ({"type": "integer", "minimum": 3, "maximum": 1}, "no integer"),
                          ({"$ref": "#/$defs/none"}, "does not resolve"),
                          ({"type": "strng"}, "/type")]:
        status, body = chat(node, schema, {"temperature": 0})
        message = body.get("error", {}).get("message", "")
        check(status == 400 and words in message and body["error"].get("param") == "response_format.json_schema.schema",
              f"{label}: {schema} is a 400 naming the problem ({status} {body})")
    status, body = post(node, "/v1/completions", {"prompt": "x", "grammar": "root ::= undefined-rule"})
    check(status == 400 and "undefined-rule" in body.get("error", {}).get("message", ""),
          f"{label}: a bad grammar is a 400 naming the problem ({status} {body})")
    return outputs


def required_calls(node, label):
    """Each tool_choice's and sampling's call as (name, arguments); checks they validate."""
    calls = []
    parameters = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
    for choice in TOOL_CHOICES:
        for sampling in SAMPLINGS:
            status, body = post(node, "/v1/chat/completions", {
                "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 200,
                "tools": TOOLS, "tool_choice": choice, **sampling})
            if not check(status == 200, f"{label}: tool_choice {choice} {sampling}: 200 ({body})"):
                calls.append(None)
                continue
            choice_body = body["choices"][0]
            made = choice_body["message"].get("tool_calls") or []
            check(choice_body["finish_reason"] == "tool_calls" and len(made) == 1,
                  f"{label}: tool_choice {choice} {sampling}: one call ({choice_body})")
            if not made:
                calls.append(None)
                continue
            name, arguments = made[0]["function"]["name"], made[0]["function"]["arguments"]
            calls.append((name, arguments))
            if isinstance(choice, dict):
                check(name == choice["function"]["name"], f"{label}: the named function is called ({name})")
            try:
                jsonschema.validate(json.loads(arguments), parameters[name])
            except (KeyError, ValueError, jsonschema.ValidationError) as e:
                check(False, f"{label}: {name}({arguments}) validates against its parameters ({e})")
            print(f"{label} tool_choice {choice} {sampling}: {name}({arguments})", flush=True)
    status, body = post(node, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "tool_choice": "required",
        "response_format": {"type": "json_object"}})
    check(status == 400 and body.get("error", {}).get("param") == "tool_choice",
          f"{label}: a required call beside a response_format is a 400 ({status} {body})")
    return calls


def main():
    single = Node("so-single", "--no-discovery")
    check(single.wait_healthy(), "the single node becomes healthy")
    alone = structured_answers(single, "1 node")
    alone_other = other_forms(single, "1 node")
    single.stop()

    tool_args = ("--no-discovery", "--chat-template", TOOL_TEMPLATE, "--ctx-size", "1024")
    single = Node("so-tools", *tool_args)
    check(single.wait_healthy(), "the single node with a tool template becomes healthy")
    alone_calls = required_calls(single, "1 node")
    single.stop()
    cluster = start_cluster(["so-ta", "so-tb", "so-tc"], *tool_args, "--placement", "memory")
    try:
        check(required_calls(cluster[1], "3 nodes") == alone_calls, "3 nodes: the required calls are one node's")
    finally:
        stop_all(cluster)

    cluster = start_cluster(["so-a", "so-b", "so-c"], "--no-discovery", "--placement", "memory")
    try:
        for entry in (cluster[0], cluster[2]):
            label = f"3 nodes via {entry.id}"
            spread = structured_answers(entry, label)
            for i, (a, b) in enumerate(zip(alone, spread)):
                check(a == b, f"{label}: answer {i} is one node's byte for byte ({a!r} vs {b!r})")
            check(other_forms(entry, label) == alone_other, f"{label}: the other forms' outputs are one node's")
    finally:
        stop_all(cluster)
    print(f"{len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
