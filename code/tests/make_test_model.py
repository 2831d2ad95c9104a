"""Writes a GGUF with SmolLM2-135M's exact shape and random weights, for the real-server tests.

No weights can be downloaded here, and a forward pass costs the same whatever the weights are,
so a model of the right shape gives the real model's timing; its text is noise, which
--ignore-eos makes irrelevant. Shape: llama architecture, 30 layers, hidden 576, 9 heads,
3 KV heads, FFN 1536, vocabulary 49,152, tied embeddings, Q8_0 (about 144 MB).
The tokenizer is byte-level BPE whose merges spell servesim's prompt words, so loadgen's
--prompt-tokens N words come out near N tokens, plus ChatML's special tokens and template.

Needs numpy and gguf (llama.cpp's own writer): .ci/run installs them in .venv.
Run: .venv/bin/python code/tests/make_test_model.py OUT.gguf
"""
import os
import sys

import numpy as np
import gguf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from main import PROMPT_WORDS  # noqa: E402

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, CONTEXT = 30, 576, 9, 3, 1536, 49152, 8192
HEAD_DIM = HIDDEN // HEADS
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def byte_alphabet():
    """GPT-2's printable stand-in for each byte, as byte-level BPE vocabularies store them."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def vocabulary():
    tokens = list(SPECIAL) + byte_alphabet()
    types = [gguf.TokenType.CONTROL] * len(SPECIAL) + [gguf.TokenType.NORMAL] * 256
    merges, known = [], set(tokens)
    space = byte_alphabet()[ord(" ")]
    words = sorted(set(PROMPT_WORDS))
    # Merge left to right: "Ġ"+"t" -> "Ġt", "Ġt"+"h" -> "Ġth", ... so " the" is one token. BPE
    # applies the lowest-ranked merge first, so every chain that starts with the space comes
    # before any merge inside a bare word ("h"+"e"), which would otherwise split " the".
    for text in [space + w for w in words] + words:
        piece = text[0]
        for ch in text[1:]:
            merged = piece + ch
            if merged not in known:
                merges.append(f"{piece} {ch}")
                tokens.append(merged)
                types.append(gguf.TokenType.NORMAL)
                known.add(merged)
            piece = merged
    filler = 0
    while len(tokens) < VOCAB:   # visible filler words, so sampled noise always streams as text
        tokens.append(f"{space}w{filler}")
        types.append(gguf.TokenType.NORMAL)
        filler += 1
    return tokens, types, merges


def q8(rng, rows, cols):
    weights = rng.standard_normal((rows, cols), dtype=np.float32) * 0.02
    return gguf.quants.quantize(weights, gguf.GGMLQuantizationType.Q8_0)


def main(path):
    rng = np.random.default_rng(135)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("smollm2-135m-shape-random")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    tokens, types, merges = vocabulary()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)

    q8_0 = gguf.GGMLQuantizationType.Q8_0
    writer.add_tensor("token_embd.weight", q8(rng, VOCAB, HIDDEN), raw_dtype=q8_0)   # tied: also the output
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        for name, rows, cols in (("attn_q", HIDDEN, HIDDEN), ("attn_k", KV_HEADS * HEAD_DIM, HIDDEN),
                                 ("attn_v", KV_HEADS * HEAD_DIM, HIDDEN), ("attn_output", HIDDEN, HIDDEN),
                                 ("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN), ("ffn_down", HIDDEN, FFN)):
            writer.add_tensor(f"blk.{i}.{name}.weight", q8(rng, rows, cols), raw_dtype=q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_test_model.py OUT.gguf")
    main(sys.argv[1])
