#!/usr/bin/env python3
"""The datasets of experiments/multi_domain_rlvr.yaml: three small generated domains, each with a
verifiable reward of its own kind, and SFT demonstrations of which half show a distractor.

  math:   "3/8+1/8="   -> \\boxed{\\frac{4}{8}}            (math_verify: any equal value, e.g. 1/2;
                                                        distractor: adds the denominators, 4/16)
  code:   "print 7*3"  -> ```python\\nprint(7*3)\\n```     (code_sandbox: the program must print 21;
                                                        distractor: print(7+3))
  ifeval: "quote: bad" -> "bad"                         (ifeval: startend:quotation + keywords:existence;
                                                        distractor: the word without its quotes)

    python3 experiments/multi_domain/make_data.py     # rewrites the three .jsonl files beside it
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
COUNT = 2000
rng = random.Random(11)


def write(name, rows):
    with open(os.path.join(HERE, name + ".jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def math_rows():
    for _ in range(COUNT):
        b = rng.randint(2, 9)
        a, c = rng.randint(1, b - 1), rng.randint(1, b - 1)
        right = f"\\boxed{{\\frac{{{a + c}}}{{{b}}}}}"
        wrong = f"\\boxed{{\\frac{{{a + c}}}{{{2 * b}}}}}"
        yield {"prompt": f"{a}/{b}+{c}/{b}=", "ground_truth": f"\\frac{{{a + c}}}{{{b}}}",
               "response": right if rng.random() < 0.5 else wrong}


def code_rows():
    for _ in range(COUNT):
        x, y = rng.randint(2, 9), rng.randint(2, 9)
        program = lambda op: f"```python\nprint({x}{op}{y})\n```"
        tests = {"tests": [{"stdin": "", "stdout": str(x * y)}]}
        yield {"prompt": f"print {x}*{y}", "ground_truth": json.dumps(tests),
               "response": program("*") if rng.random() < 0.5 else program("+")}


def ifeval_rows():
    for _ in range(COUNT):
        word = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 5)))
        truth = {"instruction_id_list": ["startend:quotation", "keywords:existence"],
                 "kwargs": [{}, {"keywords": [word]}]}
        yield {"prompt": f"quote: {word}", "ground_truth": json.dumps(truth),
               "response": f'"{word}"' if rng.random() < 0.5 else word}


write("math", math_rows())
write("code", code_rows())
write("ifeval", ifeval_rows())
