#!/usr/bin/env python3
"""An independent GGUF reader, written from the specification, that checks files Strata writes.

Usage: independent_reader.py FILE...   Exits non-zero naming the first problem.
It checks what other GGUF readers (llama.cpp's among them) rely on: the header, every metadata
value, tensor infos whose data lies aligned and inside the file without overlapping, and the
keys and tensors a loader of its architecture needs.
"""
import struct
import sys

# ggml type id -> (elements per block, bytes per block)
BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
          10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 20: (32, 18),
          23: (256, 136), 30: (1, 2), 39: (32, 17)}
SCALARS = {0: '<B', 1: '<b', 2: '<H', 3: '<h', 4: '<I', 5: '<i', 6: '<f', 7: '<?', 10: '<Q', 11: '<q', 12: '<d'}


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise ValueError(f'truncated at {self.pos}')
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += size
        return value

    def string(self):
        n = self.take('<Q')
        raw = self.data[self.pos:self.pos + n]
        if len(raw) != n:
            raise ValueError('truncated string')
        self.pos += n
        return raw.decode('utf-8')

    def value(self, kind):
        if kind == 8:
            return self.string()
        if kind == 9:
            inner, count = self.take('<I'), self.take('<Q')
            return [self.value(inner) for _ in range(count)]
        if kind not in SCALARS:
            raise ValueError(f'unknown value type {kind}')
        return self.take(SCALARS[kind])


def check(path):
    with open(path, 'rb') as f:
        data = f.read()
    r = Reader(data)
    if data[:4] != b'GGUF':
        raise ValueError('bad magic')
    r.pos = 4
    version, n_tensors, n_kv = r.take('<I'), r.take('<Q'), r.take('<Q')
    if version not in (2, 3):
        raise ValueError(f'version {version}')
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.take('<I'))
    alignment = meta.get('general.alignment', 32)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take('<Q') for _ in range(r.take('<I'))]
        kind, offset = r.take('<I'), r.take('<Q')
        per_block, block_bytes = BLOCKS[kind]
        elements = 1
        for d in dims:
            elements *= d
        if dims[0] % per_block:
            raise ValueError(f'{name}: row not a whole number of blocks')
        infos.append((offset, elements // per_block * block_bytes, name, dims))
    start = (r.pos + alignment - 1) // alignment * alignment
    end_of_previous = 0
    for offset, size, name, _ in sorted(infos):
        if offset % alignment or offset < end_of_previous or start + offset + size > len(data):
            raise ValueError(f'{name}: misplaced data')
        end_of_previous = offset + size
    arch = meta['general.architecture']
    for key in ('context_length', 'embedding_length', 'block_count', 'feed_forward_length',
                'attention.head_count', 'attention.layer_norm_rms_epsilon'):
        if f'{arch}.{key}' not in meta:
            raise ValueError(f'missing {arch}.{key}')
    tokens = meta['tokenizer.ggml.tokens']
    names = {name: dims for _, _, name, dims in infos}
    if names['token_embd.weight'] != [meta[f'{arch}.embedding_length'], len(tokens)]:
        raise ValueError('token_embd.weight does not match the vocabulary')
    experts = meta.get(f'{arch}.expert_count', 0)
    # GLM-4.5 begins with dense layers; its shared expert is ffn_*_shexp, its FFN norm
    # post_attention_norm. Phi-3 fuses Q, K and V (attn_qkv) and gate and up (ffn_up). gpt-oss
    # names its pre-FFN norm post_attention_norm too, and has a sink per attention head.
    dense_layers = meta.get(f'{arch}.leading_dense_block_count', 0)
    shared = ('ffn_gate_shexp', 'ffn_up_shexp', 'ffn_down_shexp') if meta.get(f'{arch}.expert_shared_count', 0) else ()
    attention = ('attn_qkv',) if arch == 'phi3' else ('attn_q', 'attn_k', 'attn_v')
    attention += ('attn_sinks',) if arch == 'gpt-oss' else ()
    ffn_norm = 'post_attention_norm' if arch in ('glm4moe', 'gpt-oss') else 'ffn_norm'
    dense = ('ffn_up', 'ffn_down') if arch == 'phi3' else ('ffn_gate', 'ffn_up', 'ffn_down')
    for i in range(meta[f'{arch}.block_count']):
        moe = experts and i >= dense_layers
        # A Mixture-of-Experts layer has a router and 3-D tensors of its experts instead of one FFN.
        ffn = ('ffn_gate_inp', 'ffn_gate_exps', 'ffn_up_exps', 'ffn_down_exps') + shared if moe else dense
        for part in ('attn_norm',) + attention + ('attn_output', ffn_norm) + ffn:
            if f'blk.{i}.{part}.weight' not in names:
                raise ValueError(f'missing blk.{i}.{part}.weight')
        for part in ('ffn_gate_exps', 'ffn_up_exps', 'ffn_down_exps') if moe else ():
            if len(names[f'blk.{i}.{part}.weight']) != 3 or names[f'blk.{i}.{part}.weight'][2] != experts:
                raise ValueError(f'blk.{i}.{part}.weight does not hold {experts} experts')
    return f'{path}: GGUF v{version}, {len(meta)} keys, {len(infos)} tensors, {len(tokens)} tokens'


if __name__ == '__main__':
    for file_path in sys.argv[1:]:
        try:
            print(check(file_path))
        except (ValueError, KeyError, UnicodeDecodeError) as error:
            print(f'{file_path}: {error!r}')
            sys.exit(1)
