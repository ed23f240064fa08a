#!/usr/bin/env python3
"""Hugging Face compatibility check for model directories written by `roll-tui`.

What it checks, for each architecture (qwen2, qwen3, llama with an untied lm_head):
  1. `roll-tui model init` writes a small random model into a temporary directory.
  2. The directory loads with `transformers.AutoModelForCausalLM.from_pretrained`
     (float32) with no missing/unexpected weights, and with `AutoTokenizer.from_pretrained`.
  3. For a few prompt/completion pairs, the HF tokenizer (add_special_tokens=False)
     gives the same prompt and completion ids as `roll-tui model score --json`.
  4. The per-token log-probs of the completion under the HF model (log_softmax of
     the logits) match those printed by `roll-tui model score` within TOL.
  5. len(tokenizer) <= config.vocab_size: a larger HF tokenizer would mean transformers
     added a token the model has no embedding for.

Usage (from the repository root, needs torch + transformers + safetensors):
    python3 tests/hf_compat.py [path-to-roll-tui]
The binary defaults to target/release/roll-tui. Exit status is 0 when every
architecture passes, 1 when any id differs or any |diff| > TOL, 2 on setup errors.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

TOL = 1e-4
ARCHS = {"qwen2": [], "qwen3": [], "llama": ["--untied"]}
MODEL_ARGS = ["--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
              "--intermediate", "128", "--seed", "3"]
CASES = [("12+34=", "46"), ("7+8=", "15"), ("abc>", "hgfe")]


def run(binary, *args):
    out = subprocess.run([str(binary), *args], check=True, capture_output=True, text=True)
    return out.stdout


def ours(binary, model_dir, prompt, completion):
    """Ids and completion log-probs as computed by roll-tui."""
    res = json.loads(run(binary, "model", "score", str(model_dir),
                         "--prompt", prompt, "--completion", completion, "--json"))
    return res["prompt_ids"], res["completion_ids"], res["logprobs"]


def theirs(model, tok, prompt, completion):
    """Ids and completion log-probs as computed by transformers."""
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    c_ids = tok(completion, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([p_ids + c_ids])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)
    # The token at position i is predicted by the logits at position i - 1.
    lps = [logp[len(p_ids) + j - 1, t].item() for j, t in enumerate(c_ids)]
    return p_ids, c_ids, lps


def load(model_dir):
    major = int(transformers.__version__.split(".")[0])
    dtype_kw = "dtype" if major >= 5 else "torch_dtype"
    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, output_loading_info=True, **{dtype_kw: torch.float32})
    bad = {k: v for k, v in info.items() if v and k != "error_msgs"}
    if bad or info.get("error_msgs"):
        raise RuntimeError(f"weights did not load cleanly: {info}")
    model.eval()
    return model, AutoTokenizer.from_pretrained(model_dir)


def check_arch(binary, arch, root):
    model_dir = root / arch
    run(binary, "model", "init", "--arch", arch, *MODEL_ARGS, *ARCHS[arch], "--out", str(model_dir))
    model, tok = load(model_dir)
    ids_ok, max_diff = True, 0.0
    for prompt, completion in CASES:
        o_p, o_c, o_lp = ours(binary, model_dir, prompt, completion)
        t_p, t_c, t_lp = theirs(model, tok, prompt, completion)
        if (o_p, o_c) != (t_p, t_c):
            ids_ok = False
            print(f"  {arch}: ids differ for {prompt!r}+{completion!r}: "
                  f"ours {o_p}+{o_c}, hf {t_p}+{t_c}")
            continue
        max_diff = max(max_diff, max(abs(a - b) for a, b in zip(o_lp, t_lp)))
    return {
        "arch": arch,
        "model": type(model).__name__,
        "tokenizer": type(tok).__name__,
        "ids": "ok" if ids_ok else "MISMATCH",
        "max_diff": max_diff,
        "tok_len": f"{len(tok)}/{model.config.vocab_size}",
        "ok": ids_ok and max_diff <= TOL,
    }


def main():
    repo = Path(__file__).resolve().parent.parent
    binary = Path(sys.argv[1]) if len(sys.argv) > 1 else repo / "target/release/roll-tui"
    if not binary.is_file():
        print(f"roll-tui binary not found: {binary}", file=sys.stderr)
        return 2
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, binary {binary}")

    rows = []
    with tempfile.TemporaryDirectory(prefix="hf_compat_") as tmp:
        for arch in ARCHS:
            try:
                rows.append(check_arch(binary, arch, Path(tmp)))
            except Exception as exc:  # report every arch, then fail
                print(f"  {arch}: {type(exc).__name__}: {exc}")
                rows.append({"arch": arch, "model": "-", "tokenizer": "-", "ids": "-",
                             "max_diff": float("nan"), "tok_len": "-", "ok": False})

    header = f"{'arch':<7}{'model class':<20}{'tokenizer class':<25}{'ids':<10}{'max |diff|':<13}{'len(tok)/vocab':<16}result"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['arch']:<7}{r['model']:<20}{r['tokenizer']:<25}{r['ids']:<10}"
              f"{r['max_diff']:<13.3e}{r['tok_len']:<16}{'PASS' if r['ok'] else 'FAIL'}")
    oversized = False
    for r in rows:
        if r["tok_len"] != "-":
            n, v = map(int, r["tok_len"].split("/"))
            if n > v:
                oversized = True
                print(f"error: {r['arch']}: HF tokenizer has {n} tokens but the model only {v} "
                      f"(transformers added a special token without an embedding)")
    return 0 if all(r["ok"] for r in rows) and not oversized else 1


if __name__ == "__main__":
    sys.exit(main())
