#!/usr/bin/env python3
"""Hugging Face transformers on the workloads of `roll-tui model bench`, on any torch device.

The model is Qwen2.5-0.5B's shape with random weights (hidden 896, 24 layers, 14 heads over 2 kv
heads, intermediate 4864, tied 151,936-row embedding, rope theta 1e6), built from its config: no
download. Generation: `generate` with sampling (T=1, no top-k/top-p, exactly --new-tokens each:
EOS disabled), KV cache, a batch of 6-token prompts. Forward+backward: the summed log-probs of the
response tokens (all but the first 6) of --train-batch x --train-len tokens, backward, no optimizer
step. Each figure is the median of --runs runs after one warm-up; peak device memory is torch's
max_memory_allocated over one training step. Prints one JSON line.

    python3 benches/gpu/hf_bench.py --device cuda --dtype bfloat16
"""

import argparse
import json
import statistics
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--train-batch", type=int, default=16)
    ap.add_argument("--train-len", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    dtype = getattr(torch, a.dtype)
    cfg = Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=a.layers,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=1024,
        rope_theta=1e6, tie_word_embeddings=True, rms_norm_eps=1e-6,
    )
    model = Qwen2ForCausalLM(cfg).to(device=a.device, dtype=dtype)
    sync = (lambda: torch.cuda.synchronize()) if a.device.startswith("cuda") else (lambda: None)
    vocab = cfg.vocab_size
    tok = lambda i, k: 3 + (i * 7 + k * 11) % (vocab - 3)

    prompts = torch.tensor([[tok(i, k) for k in range(6)] for i in range(a.batch)], device=a.device)
    rates = []
    for run in range(a.runs + 1):
        sync()
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0,
                top_k=0, top_p=1.0, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                eos_token_id=None, pad_token_id=0,
            )
        sync()
        if run > 0:
            rates.append((out.shape[1] - 6) * a.batch / (time.perf_counter() - t))
    generation = statistics.median(rates)

    ids = torch.tensor(
        [[tok(i, k) for k in range(a.train_len)] for i in range(a.train_batch)], device=a.device
    )
    rates, peak = [], None
    for run in range(a.runs + 1):
        if a.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        sync()
        t = time.perf_counter()
        logits = model(ids).logits[:, 5:-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 6:].unsqueeze(-1)).squeeze(-1)
        (-logp.sum()).backward()
        sync()
        if run > 0:
            rates.append(a.train_batch * a.train_len / (time.perf_counter() - t))
        if a.device.startswith("cuda"):
            peak = torch.cuda.max_memory_allocated() - base
        model.zero_grad(set_to_none=True)
        del logits, logp
    print(json.dumps({
        "peer": "transformers", "torch": torch.__version__, "device": a.device, "dtype": a.dtype,
        "generation": {"batch": a.batch, "new_tokens": a.new_tokens, "tokens_per_s": generation},
        "forward_backward": {"batch": a.train_batch, "len": a.train_len,
                             "tokens_per_s": statistics.median(rates), "peak_device_bytes": peak},
    }))


if __name__ == "__main__":
    main()
