#!/usr/bin/env python3
"""Writes the files llm.c's CPU trainer (train_gpt2.c, github.com/karpathy/llm.c) reads, so its
step time on GPT-2 124M can be set beside the zoo's: the model checkpoint gpt2_124M.bin holding
the zoo's own GPT-2 124M weights (zoo_models.py, torch.manual_seed(0)) in llm.c's layout, and
random token files in place of Tiny Shakespeare. Nothing here comes from llm.c, and nothing
fetches it: build llm.c from its public source in a folder outside this repository, run this
script with --out pointing at that folder, and run ./train_gpt2 there. Optional, never needed by
CI (torch, transformers, numpy).

    python3 benchmarks/zoo/llmc_inputs.py --out /path/to/llm.c
    cd /path/to/llm.c && OMP_NUM_THREADS=2 ./train_gpt2   # prints "step N: ... (took X ms)"

train_gpt2.c trains B=4, T=64 with AdamW (lr 1e-4, no weight decay), as the zoo's gpt2_124m;
its "took" time covers the data, forward, backward and update of a step, and leaves out its
validation (every 10 steps) and its sampling (every 20). gpt2_tokenizer.bin is not written:
without it the sampling prints token ids instead of text.

The checkpoint format (read by its gpt2_build_from_checkpoint): 256 int32 (magic 20240326,
version 3, max_seq_len, vocab_size, num_layers, num_heads, channels, padded_vocab_size), then
float32 tensors in this order: wte [Vp, C] (rows past V zero), wpe [maxT, C], and per kind, all
layers in a row: ln1 weight and bias, qkv weight [3C, C] and bias, attention projection [C, C]
and bias, ln2 weight and bias, fc [4C, C] and bias, fc projection [C, 4C] and bias; then the
final LayerNorm's weight and bias. Linear weights are [out, in]; transformers' GPT-2 stores
its Conv1D weights as [in, out], so they are transposed. Token files: 256 int32 (magic
20240520, version 1, token count), then uint16 tokens.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_models  # noqa: E402

PADDED_VOCAB = 50304  # llm.c pads the vocabulary to a multiple of 128


def write_checkpoint(path):
    model = zoo_models.BY_NAME["gpt2_124m"].build()
    lm = model.lm
    config = lm.config
    state = {k: v.detach().numpy().astype(np.float32) for k, v in lm.state_dict().items()}
    layers = config.n_layer
    C = config.n_embd
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [20240326, 3, config.n_positions, config.vocab_size, layers, config.n_head, C,
                  PADDED_VOCAB]
    wte = np.zeros((PADDED_VOCAB, C), dtype=np.float32)
    wte[:config.vocab_size] = state["transformer.wte.weight"]

    def per_layer(suffix, transpose=False):
        tensors = [state[f"transformer.h.{i}.{suffix}"] for i in range(layers)]
        return [t.T.copy() if transpose else t for t in tensors]

    tensors = [wte, state["transformer.wpe.weight"]]
    for suffix, transpose in [("ln_1.weight", False), ("ln_1.bias", False),
                              ("attn.c_attn.weight", True), ("attn.c_attn.bias", False),
                              ("attn.c_proj.weight", True), ("attn.c_proj.bias", False),
                              ("ln_2.weight", False), ("ln_2.bias", False),
                              ("mlp.c_fc.weight", True), ("mlp.c_fc.bias", False),
                              ("mlp.c_proj.weight", True), ("mlp.c_proj.bias", False)]:
        tensors += per_layer(suffix, transpose)
    tensors += [state["transformer.ln_f.weight"], state["transformer.ln_f.bias"]]
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes())
        for tensor in tensors:
            f.write(np.ascontiguousarray(tensor, dtype=np.float32).tobytes())
    os.replace(path + ".tmp", path)


def write_tokens(path, count, seed):
    tokens = np.random.default_rng(seed).integers(0, zoo_models.GPT2_VOCAB, size=count,
                                                  dtype=np.uint16)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, count]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="llm.c's folder (where train_gpt2 runs)")
    args = parser.parse_args()
    write_checkpoint(os.path.join(args.out, "gpt2_124M.bin"))
    data = os.path.join(args.out, "dev", "data", "tinyshakespeare")
    write_tokens(os.path.join(data, "tiny_shakespeare_train.bin"), 4 * 64 * 200 + 1, 1)
    write_tokens(os.path.join(data, "tiny_shakespeare_val.bin"), 4 * 64 * 20 + 1, 2)
    print(f"wrote {args.out}/gpt2_124M.bin and {data}/tiny_shakespeare_{{train,val}}.bin")


if __name__ == "__main__":
    main()
