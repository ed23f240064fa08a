"""Writes the DPO quickstart's preference pairs (experiments/dpo_quickstart.yaml) for the
quickstart's two tasks, in TRL's standard format: the chosen completion is the right answer, the
rejected one the distractor that the quickstart's imperfect SFT demonstrations also teach
(the difference |a-b| instead of the sum a+b; the input copied instead of reversed). Held-out
pairs use prompts that no training pair has. Deterministic: run it again to get the same files.

    python3 experiments/data/make_add_reverse_pairs.py
"""

import json
import random
from pathlib import Path

HERE = Path(__file__).parent
rng = random.Random(11)


def addition(a, b):
    return {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(abs(a - b)),
            "domain": "add"}


def reversal(word):
    return {"prompt": f"{word}>", "chosen": word[::-1], "rejected": word, "domain": "reverse"}


# Sums whose distractor equals the answer (a+b == |a-b|, b == 0 or a == 0) teach nothing: left out.
adds = [addition(a, b) for a in range(10) for b in range(10) if a and b]
rng.shuffle(adds)
words = set()
while len(words) < 1400:
    word = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 5)))
    if word != word[::-1]:
        words.add(word)
words = sorted(words)
rng.shuffle(words)
revs = [reversal(w) for w in words]

held_add, train_add = adds[:16], adds[16:]
held_rev, train_rev = revs[:200], revs[200:]
train = train_add * 6 + train_rev
rng.shuffle(train)
held = held_add + held_rev
for name, pairs in [("add_reverse_pairs.jsonl", train), ("add_reverse_pairs_eval.jsonl", held)]:
    with open(HERE / name, "w") as f:
        for p in pairs:
            f.write(json.dumps(p) + "\n")
    print(f"{name}: {len(pairs)} pairs")
