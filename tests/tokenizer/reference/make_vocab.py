#!/usr/bin/env python3
"""Writes a tokenizer-only GGUF file from a model's Hugging Face tokenizer.json and
tokenizer_config.json, with the tokenizer keys llama.cpp's convert_hf_to_gguf.py writes for that
model, so that Strata and llama.cpp can be checked against Hugging Face on the same vocabulary.

usage: make_vocab.py TOKENIZER_DIR NAME MODEL PRE OUT.gguf
  TOKENIZER_DIR  holds tokenizer.json and tokenizer_config.json
  NAME           general.name
  MODEL          tokenizer.ggml.model: gpt2 (byte-level BPE) or llama (SentencePiece)
  PRE            tokenizer.ggml.pre, the pre-tokenizer as llama.cpp names it

What the converter would take from elsewhere is derived here from the two files, as follows.
  * The vocabulary is the tokenizer's own (model vocab and added tokens, ids without a token
    padded as [PADn]); the converter pads further to config.json's vocab_size, which changes no
    encoding.
  * SentencePiece scores come from tokenizer.model, which the packages lack. Hugging Face built
    tokenizer.json's merge list from those scores (highest first), so each token gets minus the
    rank of the first merge that makes it: the same order, hence the same encodings. Tokens that
    no merge makes (single characters, bytes) are never merge results and score below all.
  * Added tokens keep their text. The converter encodes and decodes the non-normalized ones, which
    gives each its text back, but for Gemma's runs of ▁, which become spaces either way.
  * Special ids and add_bos/add_eos: tokenizer_config.json's *_token and add_*_token, else a
    TemplateProcessing post-processor that starts with BOS or ends with EOS, as the converter.
Only the standard library; GGUF v3 as its specification gives it (no tensors).
"""
import json
import os
import re
import struct
import sys

# tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# GGUF value types
UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = 4, 5, 6, 7, 8, 9
ALIGNMENT = 32
SPACE_MARKER = "\u2581"  # SentencePiece's ▁
BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")

# tokenizer_config.json's <kind>_token -> the GGUF key of its id
SPECIAL_TOKEN_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",  # sic, as llama.cpp spells it
    "pad": "tokenizer.ggml.padding_token_id",
    "cls": "tokenizer.ggml.cls_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
}


def looks_special(text):
    """Added tokens the converter makes control tokens although tokenizer.json does not mark them
    special: chat markers such as <|fim_prefix|> and <｜tool▁sep｜>, Gemma's <unusedN> and <mask>."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def added_token_type(token):
    """(type, text): control tokens keep their text; user-defined ones are matched in raw text by
    llama.cpp, so SentencePiece's ▁ in them becomes the space it stands for."""
    if token["special"] or looks_special(token["content"]):
        return CONTROL, token["content"]
    return USER_DEFINED, token["content"].replace(SPACE_MARKER, " ")


def vocabulary(tokenizer):
    """Token texts by id, the ids of added tokens, and the number of ids."""
    texts = {token_id: text for text, token_id in tokenizer["model"]["vocab"].items()}
    added = {token["id"]: token for token in tokenizer["added_tokens"]}
    for token_id, token in added.items():
        texts[token_id] = token["content"]
    return texts, added, max(texts) + 1


def merge_pairs(merges):
    """tokenizer.json keeps merges as "left right" or, since tokenizers 0.20, as [left, right]."""
    return [merge.split(" ", 1) if isinstance(merge, str) else merge for merge in merges]


def merge_strings(merges):
    """GGUF keeps "left right", a space inside a part written as U+0120, GPT-2's alphabet for it."""
    return [" ".join(part.replace(" ", "\u0120") for part in pair) for pair in merge_pairs(merges)]


def byte_level_vocabulary(tokenizer):
    texts, added, count = vocabulary(tokenizer)
    tokens, types = [], []
    for token_id in range(count):
        if token_id not in texts:
            tokens.append(f"[PAD{token_id}]")
            types.append(UNUSED)
        elif token_id in added:
            token_type, text = added_token_type(added[token_id])
            tokens.append(text)
            types.append(token_type)
        else:
            tokens.append(texts[token_id])
            types.append(NORMAL)
    return {
        "tokenizer.ggml.tokens": (STRING, tokens),
        "tokenizer.ggml.token_type": (INT32, types),
        "tokenizer.ggml.merges": (STRING, merge_strings(tokenizer["model"]["merges"])),
    }


def adds_space_prefix(tokenizer):
    """Whether the normalizer puts ▁ in front of the text (Llama 2 style) or not (Gemma 3)."""
    def prepends(normalizer):
        if not normalizer:
            return False
        if normalizer["type"] == "Sequence":
            return any(prepends(inner) for inner in normalizer["normalizers"])
        return normalizer["type"] == "Prepend" and normalizer["prepend"] == SPACE_MARKER
    return prepends(tokenizer.get("normalizer"))


def sentencepiece_vocabulary(tokenizer):
    model = tokenizer["model"]
    if model["type"] != "BPE" or not model.get("byte_fallback"):
        raise ValueError("a SentencePiece vocabulary needs a BPE model with byte_fallback")
    texts, added, count = vocabulary(tokenizer)
    merges = merge_pairs(model["merges"])
    first_merge_rank = {}
    for rank, (left, right) in enumerate(merges):
        first_merge_rank.setdefault(left + right, rank)

    tokens, scores, types = [], [], []
    for token_id in range(count):
        text = texts.get(token_id)
        if text is None:
            tokens.append(f"[PAD{token_id}]")
            scores.append(-1000.0)
            types.append(UNUSED)
        elif token_id in added:
            token_type, text = added_token_type(added[token_id])
            tokens.append(text)
            scores.append(-1000.0)
            types.append(token_type)
        else:
            tokens.append(text)
            scores.append(-float(first_merge_rank.get(text, len(merges))))
            if text == model.get("unk_token"):
                types.append(UNKNOWN)
            elif BYTE_TOKEN.fullmatch(text):
                types.append(BYTE)
            else:
                types.append(NORMAL)
    return {
        "tokenizer.ggml.tokens": (STRING, tokens),
        "tokenizer.ggml.scores": (FLOAT32, scores),
        "tokenizer.ggml.token_type": (INT32, types),
        "tokenizer.ggml.add_space_prefix": (BOOL, adds_space_prefix(tokenizer)),
    }


def special_tokens(tokenizer, config):
    """The special token ids and add_bos/add_eos flags, from tokenizer_config.json first."""
    keys = {}
    adds = {}
    post = tokenizer.get("post_processor") or {}
    for processor in post.get("processors", [post]):
        if processor.get("type") != "TemplateProcessing":
            continue
        single = processor.get("single", [])
        if len(single) > 1:
            first = single[0].get("SpecialToken", {}).get("id")
            last = single[-1].get("SpecialToken", {}).get("id")
            if first is not None:
                adds["bos"] = first == token_content(config.get("bos_token"))
            if last is not None:
                adds["eos"] = last == token_content(config.get("eos_token"))
    for kind, key in SPECIAL_TOKEN_KEYS.items():
        if isinstance(config.get(f"add_{kind}_token"), bool):
            adds[kind] = config[f"add_{kind}_token"]
        content = token_content(config.get(f"{kind}_token"))
        ids = [token["id"] for token in tokenizer["added_tokens"] if token["content"] == content]
        if ids:
            keys[key] = (UINT32, ids[0])
    for kind in ("bos", "eos"):
        if kind in adds:
            keys[f"tokenizer.ggml.add_{kind}_token"] = (BOOL, adds[kind])
    return keys


def token_content(entry):
    """A *_token entry of tokenizer_config.json: a string, an AddedToken object or null."""
    return entry.get("content") if isinstance(entry, dict) else entry


# llama.cpp loads a vocabulary-only file through a model architecture, whose required keys these
# are; like llama.cpp's own vocabulary files it uses "llama" whatever the model.
ARCHITECTURE_KEYS = {
    "general.architecture": (STRING, "llama"),
    "llama.context_length": (UINT32, 4096),
    "llama.embedding_length": (UINT32, 4096),
    "llama.block_count": (UINT32, 1),
    "llama.feed_forward_length": (UINT32, 11008),
    "llama.attention.head_count": (UINT32, 32),
    "llama.attention.head_count_kv": (UINT32, 32),
    "llama.attention.layer_norm_rms_epsilon": (FLOAT32, 1e-5),
    "llama.rope.dimension_count": (UINT32, 128),
}


def encode_string(text):
    raw = text.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def encode_value(value_type, value):
    if value_type == STRING:
        return encode_string(value)
    if value_type == BOOL:
        return struct.pack("<?", value)
    return struct.pack({UINT32: "<I", INT32: "<i", FLOAT32: "<f"}[value_type], value)


def encode_entry(key, value_type, value):
    out = [encode_string(key)]
    if isinstance(value, list):
        out.append(struct.pack("<IIQ", ARRAY, value_type, len(value)))
        out.extend(encode_value(value_type, item) for item in value)
    else:
        out.append(struct.pack("<I", value_type))
        out.append(encode_value(value_type, value))
    return b"".join(out)


def write_gguf(path, metadata):
    body = b"".join(encode_entry(key, *typed) for key, typed in metadata.items())
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata))
    data = header + body
    data += bytes(-len(data) % ALIGNMENT)  # the (empty) data section starts aligned
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    tokenizer_dir, name, model, pre, out_path = sys.argv[1:]
    with open(os.path.join(tokenizer_dir, "tokenizer.json"), encoding="utf-8") as f:
        tokenizer = json.load(f)
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)

    metadata = dict(ARCHITECTURE_KEYS)
    metadata["general.name"] = (STRING, name)
    metadata["tokenizer.ggml.model"] = (STRING, model)
    metadata["tokenizer.ggml.pre"] = (STRING, pre)
    if model == "gpt2":
        metadata.update(byte_level_vocabulary(tokenizer))
    elif model == "llama":
        metadata.update(sentencepiece_vocabulary(tokenizer))
    else:
        sys.exit(f"unknown tokenizer model {model!r} (gpt2 or llama)")
    metadata.update(special_tokens(tokenizer, config))
    write_gguf(out_path, metadata)


if __name__ == "__main__":
    main()
