#!/usr/bin/env python3
"""`roll-tui model merge` against PEFT on the same base model and adapters.

What it checks, for a plain LoRA adapter and an rsLoRA one (every linear layer, random A and B),
and then for an adapter roll-tui trains:
  1. `roll-tui model init` writes a small random Qwen2 model (f32, character tokenizer).
  2. PEFT adds a LoRA adapter (`init_lora_weights=False`: B is random too, so the adapter changes
     the model) and saves it with `save_pretrained`.
  3. `roll-tui model merge BASE --adapter ADAPTER --out MERGED` merges it.
  4. transformers loads MERGED; its logits on a few prompts equal the PeftModel's (base with the
     adapter applied) within TOL, and its weights equal PEFT's own `merge_and_unload` within TOL.
  5. roll-tui trains an adapter (SFT with `model.lora`, 6 steps); PEFT loads its checkpoint as an
     adapter, and the PeftModel's logits equal those of the model `roll-tui model merge` makes of
     it (and differ from the base's: the adapter trained).

Usage (from the repository root; needs the peer venv of ../shared/peers plus `pip install
peft==0.21.2`):
    /tmp/peervenv/bin/python tests/lora_peft.py [path-to-roll-tui]
The binary defaults to target/release/roll-tui. Exit status 0 when every check passes, 1 when one
does not, 2 on setup errors (no binary, no PEFT: it says which).
"""

import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import peft
    import torch
    import transformers
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM
except ImportError as exc:  # said plainly, not a pass
    print(f"cannot run the PEFT check: {exc} (set up the peer venv: ../shared/peers/README.md, "
          f"then pip install peft==0.21.2)", file=sys.stderr)
    sys.exit(2)

TOL = 1e-5
MODEL_ARGS = ["--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2",
              "--intermediate", "128", "--seed", "3"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[3, 4, 5, 6, 7], [10, 11, 12], [4, 4, 4, 4, 4, 4, 4, 4]]


def run(*args):
    return subprocess.run([str(a) for a in args], check=True, capture_output=True, text=True).stdout


def load(path):
    major = int(transformers.__version__.split(".")[0])
    kw = {"dtype" if major >= 5 else "torch_dtype": torch.float32}
    return AutoModelForCausalLM.from_pretrained(path, **kw).eval()


def check(binary, root, name, rslora):
    base = root / "base"
    adapter = root / f"adapter-{name}"
    merged = root / f"merged-{name}"
    torch.manual_seed(7)
    model = get_peft_model(load(base), LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM",
        init_lora_weights=False, use_rslora=rslora))
    model.save_pretrained(adapter)
    print(run(binary, "model", "merge", base, "--adapter", adapter, "--out", merged).strip())
    ours = load(merged)
    theirs = PeftModel.from_pretrained(load(base), adapter).eval()
    ok = True
    with torch.no_grad():
        for ids in PROMPTS:
            x = torch.tensor([ids])
            diff = (ours(x).logits - theirs(x).logits).abs().max().item()
            good = diff <= TOL
            ok &= good
            print(f"{name:<7} logits of {ids}: max |diff| {diff:.2e}  {'ok' if good else 'FAIL'}")
        reference = theirs.merge_and_unload().state_dict()
        worst = max((ours.state_dict()[k] - v).abs().max().item() for k, v in reference.items())
        good = worst <= TOL
        ok &= good
        print(f"{name:<7} weights against PEFT's merge_and_unload: max |diff| {worst:.2e}  "
              f"{'ok' if good else 'FAIL'}")
    return ok


def ours_into_peft(binary, root):
    """An adapter roll-tui trained (SFT with model.lora) loads into PEFT, which computes what the
    model `roll-tui model merge` makes of it computes."""
    cfg = root / "sft.yaml"
    cfg.write_text(
        f"name: sft-lora\nseed: 2\noutput_dir: {root / 'sft-lora'}\n"
        f"model: {{ path: {root / 'base'}, lora: {{ rank: 4, alpha: 8, target_modules: [q_proj, v_proj, "
        f"o_proj, up_proj, down_proj] }} }}\n"
        "data: { domains: [ { name: add, synthetic: { task: addition, count: 64, digits: 1 }, "
        "reward: math_rule } ] }\n"
        "sft: { steps: 6, batch_size: 8, optimizer: { lr: 0.01 } }\n")
    run(binary, "--store", root / "sft.db", "run", "--quiet", cfg)
    adapter = root / "sft-lora" / "checkpoints" / "sft-step6"
    merged = root / "merged-ours"
    run(binary, "model", "merge", root / "base", "--adapter", adapter, "--out", merged)
    theirs = PeftModel.from_pretrained(load(root / "base"), adapter).eval()
    ours = load(merged)
    base = load(root / "base")
    ok = True
    with torch.no_grad():
        for ids in PROMPTS:
            x = torch.tensor([ids])
            diff = (ours(x).logits - theirs(x).logits).abs().max().item()
            moved = (base(x).logits - theirs(x).logits).abs().max().item()
            good = diff <= TOL and moved > 1e-3
            ok &= good
            print(f"trained logits of {ids}: max |diff| {diff:.2e} (the adapter moved them "
                  f"{moved:.2e})  {'ok' if good else 'FAIL'}")
    return ok


def main():
    repo = Path(__file__).resolve().parent.parent
    binary = Path(sys.argv[1]) if len(sys.argv) > 1 else repo / "target/release/roll-tui"
    if not binary.is_file():
        print(f"roll-tui binary not found: {binary}", file=sys.stderr)
        return 2
    transformers.logging.set_verbosity_error()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"peft {peft.__version__}, binary {binary}")
    with tempfile.TemporaryDirectory(prefix="lora_peft_") as tmp:
        root = Path(tmp)
        run(binary, "model", "init", "--arch", "qwen2", *MODEL_ARGS, "--out", root / "base")
        ok = check(binary, root, "lora", False)
        ok &= check(binary, root, "rslora", True)
        ok &= ours_into_peft(binary, root)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
