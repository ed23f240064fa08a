"""Converts GSM8K's JSONL (openai/grade-school-math: {"question", "answer"}, the answer's worked
solution ending in "#### 72") into roll-tui's dataset lines: {"prompt", "ground_truth", "response"}
where ground_truth is the final answer (what math_verify compares with) and response the worked
solution with GSM8K's calculator annotations (<<48/2=24>>) removed and the answer boxed (what SFT
would imitate).

    python3 configs/examples/gsm8k_to_jsonl.py train.jsonl data/gsm8k/train.jsonl

Standard library only. A line without "####" is reported with its number and the conversion stops.
"""

import json
import os
import re
import sys

INSTRUCTION = "Solve the problem step by step. Put the final answer in \\boxed{}."
ANNOTATION = re.compile(r"<<[^>]*>>")


def convert(line: str) -> dict:
    row = json.loads(line)
    question, answer = row["question"], row["answer"]
    if "####" not in answer:
        raise ValueError("the answer has no '#### <final answer>'")
    solution, final = answer.rsplit("####", 1)
    final = final.strip().replace(",", "")
    solution = ANNOTATION.sub("", solution).strip()
    return {
        "prompt": f"{question.strip()}\n{INSTRUCTION}",
        "ground_truth": final,
        "response": f"{solution}\nThe answer is \\boxed{{{final}}}.",
    }


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    source, target = sys.argv[1], sys.argv[2]
    if not os.path.isfile(source):
        print(f"{source}: no such file (GSM8K's train.jsonl or test.jsonl)", file=sys.stderr)
        return 1
    rows = []
    with open(source, encoding="utf-8") as inp:
        for number, line in enumerate(inp, 1):
            if not line.strip():
                continue
            try:
                rows.append(convert(line))
            except KeyError as e:
                print(f"{source} line {number}: no field {e}", file=sys.stderr)
                return 1
            except ValueError as e:  # JSONDecodeError is one
                print(f"{source} line {number}: {e}", file=sys.stderr)
                return 1
    # Written whole once every line converted: a bad line leaves no partial file behind.
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    with open(target, "w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} example{'' if len(rows) == 1 else 's'} to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
