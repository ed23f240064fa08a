#!/usr/bin/env python3
"""roll-tui's DPO stage against TRL's DPOTrainer on the same model, pairs and settings.

What it checks, for each loss TRL shares with us (sigmoid = DPO, ipo, and sigmoid plus a weighted
sft term on the chosen completions, TRL's `loss_type: [sigmoid, sft]`, RPO):
  1. `roll-tui model init` writes a small random Qwen2 model (f32, character tokenizer).
  2. roll-tui runs a DPO-only config on it for 2 steps: every step is the whole set of pairs
     (batch_size = pairs), AdamW at a constant lr without warm-up or weight decay, gradient norm
     clipped at 1.0.
  3. TRL's DPOTrainer runs the same 2 steps on a fresh load of the same directory (its reference:
     a frozen copy of the model, as ours is), logging every step.
  4. Step 1 (policy = reference) and step 2 (after one AdamW step, so the policy and the reference
     differ) are compared metric by metric: loss, rewards/chosen|rejected|accuracies|margins,
     logps/chosen|rejected, within TOL (relative above 1). Step 2 checks the gradients too: it
     is where one AdamW step from each side's gradients has taken the policy.

Usage (from the repository root; needs the peer venv of ../shared/peers: torch, transformers, trl):
    /tmp/peervenv/bin/python tests/dpo_trl.py [path-to-roll-tui]
The binary defaults to target/release/roll-tui. Exit status 0 when every metric of every loss is
within TOL, 1 when one is not, 2 on setup errors (no binary, no TRL: it says which).
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    from trl import DPOConfig, DPOTrainer
except ImportError as exc:  # said plainly, not a pass
    print(f"cannot run the TRL check: {exc} (set up the peer venv: ../shared/peers/README.md)",
          file=sys.stderr)
    sys.exit(2)

TOL = 1e-5
LR = 1e-3
METRICS = ["loss", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected"]
# cDPO (sigmoid with label_smoothing) is not compared: TRL 1.16's sigmoid ignores label_smoothing
# (it moved to its robust, exo_pair and aot losses); ours is checked against hand-computed values.
LOSSES = {
    "sigmoid": {"types": ["sigmoid"]},
    "ipo": {"types": ["ipo"]},
    "rpo": {"types": ["sigmoid", "sft"], "weights": [1.0, 0.5]},
}
MODEL_ARGS = ["--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
              "--intermediate", "128", "--seed", "3"]
# Prompts and completions of different lengths, right and wrong answers both ways.
PAIRS = [
    ("3+5=", "8", "2"),
    ("7+2=", "9", "5"),
    ("12+30=", "42", "18"),
    ("9+6=", "15", "3"),
    ("abc>", "cba", "abc"),
    ("hgfe>", "efgh", "hgf"),
    ("4+4=", "8", "0"),
    ("bad>", "dab", "bda"),
]


def run(*args):
    return subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True).stdout


def ours(binary, model_dir, pairs_file, root, name, extra):
    cfg = root / f"{name}.yaml"
    smoothing = extra.get("label_smoothing", 0.0)
    loss_type = "[" + ", ".join(extra["types"]) + "]"
    weights = extra.get("weights")
    weights = f"  loss_weights: [{', '.join(str(w) for w in weights)}]\n" if weights else ""
    cfg.write_text(
        f"name: {name}\nseed: 1\noutput_dir: {root / name}\n"
        f"model: {{ path: {model_dir} }}\n"
        f"dpo:\n  data: {pairs_file}\n  steps: 2\n  batch_size: {len(PAIRS)}\n"
        f"  beta: 0.1\n  loss_type: {loss_type}\n{weights}  label_smoothing: {smoothing}\n"
        f"  optimizer: {{ lr: {LR}, warmup_steps: 0, schedule: constant, weight_decay: 0.0, "
        f"max_grad_norm: 1.0, betas: [0.9, 0.999], eps: 1.0e-8 }}\n")
    store = root / f"{name}.db"
    run(binary, "--store", store, "run", "--quiet", cfg)
    series = json.loads(run(binary, "--store", store, "metrics", name, "--json"))
    got = {}
    for s in series:
        if s["stage"] == "dpo" and s["key"] in METRICS:
            for step, v in zip(s["steps"], s["values"]):
                got.setdefault(step, {})[s["key"]] = v
    return got


def theirs(model_dir, extra, out):
    major = int(transformers.__version__.split(".")[0])
    dtype_kw = "dtype" if major >= 5 else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(model_dir, **{dtype_kw: torch.float32})
    tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    data = Dataset.from_list([{"prompt": p, "chosen": c, "rejected": r} for p, c, r in PAIRS])
    args = DPOConfig(
        output_dir=str(out), beta=0.1, loss_type=extra["types"], loss_weights=extra.get("weights"),
        label_smoothing=extra.get("label_smoothing", 0.0),
        per_device_train_batch_size=len(PAIRS), gradient_accumulation_steps=1, max_steps=2,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0,
        logging_steps=1, save_strategy="no", report_to=[], seed=1, use_cpu=True,
        max_length=None, bf16=False, fp16=False, disable_tqdm=True,
    )
    trainer = DPOTrainer(model=model, args=args, train_dataset=data, processing_class=tok)
    trainer.train()
    got = {}
    for entry in trainer.state.log_history:
        if "step" in entry and "loss" in entry:
            got[entry["step"]] = {k: entry[k] for k in METRICS if k in entry}
    return got


def main():
    repo = Path(__file__).resolve().parent.parent
    binary = Path(sys.argv[1]) if len(sys.argv) > 1 else repo / "target/release/roll-tui"
    if not binary.is_file():
        print(f"roll-tui binary not found: {binary}", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}, "
          f"binary {binary}")
    ok = True
    with tempfile.TemporaryDirectory(prefix="dpo_trl_") as tmp:
        root = Path(tmp)
        model_dir = root / "model"
        run(binary, "model", "init", "--arch", "qwen2", *MODEL_ARGS, "--out", model_dir)
        pairs_file = root / "pairs.jsonl"
        pairs_file.write_text("".join(
            json.dumps({"prompt": p, "chosen": c, "rejected": r}) + "\n" for p, c, r in PAIRS))
        for name, extra in LOSSES.items():
            a = ours(binary, model_dir, pairs_file, root, name, extra)
            b = theirs(model_dir, extra, root / f"trl-{name}")
            for step in (1, 2):
                for key in METRICS:
                    x, y = a.get(step, {}).get(key), b.get(step, {}).get(key)
                    if x is None or y is None:
                        print(f"{name} step {step} {key}: missing (ours {x}, trl {y})")
                        ok = False
                        continue
                    diff = abs(x - y)
                    good = diff <= TOL * max(1.0, abs(y))
                    ok &= good
                    print(f"{name:<8} step {step} {key:<20} ours {x:+.7f}  trl {y:+.7f}  "
                          f"|diff| {diff:.2e}  {'ok' if good else 'FAIL'}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
