#!/usr/bin/env python3
"""Guess the number: an example external environment for roll-tui (Python standard library only).

roll-tui starts this program and speaks JSON lines with it: one request per line on stdin, one
reply per line on stdout (see README, "External environments"). Requests:

  {"cmd": "reset", "seed": 7, "params": {"high": "100"}}
  {"cmd": "step", "action": "50"}
  {"cmd": "close"}                      (no reply; also exit when stdin closes)

Parameters (strings, from the run config's rl.env.params or `--set`):
  high         the number is drawn from 1..high (default 100)
  max_guesses  the episode ends after this many guesses (default 7)
  step_delay   seconds each step sleeps, times a factor drawn from 0.5..1.5 (default 0): a slow,
               variable environment for benchmarks

Only stdout carries the protocol: anything diagnostic goes to stderr.
"""

import json
import random
import sys
import time


class GuessNumber:
    def reset(self, seed, params):
        self.high = int(params.get("high", "100"))
        self.max_guesses = int(params.get("max_guesses", "7"))
        self.step_delay = float(params.get("step_delay", "0"))
        if self.high < 1 or self.max_guesses < 1 or self.step_delay < 0:
            raise ValueError("high and max_guesses must be >= 1, step_delay >= 0")
        self.rng = random.Random(seed)
        self.target = self.rng.randint(1, self.high)
        self.low, self.top, self.guesses, self.done = 1, self.high, 0, False
        return self.reply(f"Guess the number from 1 to {self.high}. "
                          f"You have {self.max_guesses} guesses.", success=False)

    def step(self, action):
        if self.step_delay > 0:
            time.sleep(self.step_delay * (0.5 + self.rng.random()))
        try:
            guess = int(action.strip())
        except ValueError:
            return {"invalid": f"'{action}' is not a whole number"}
        if not 1 <= guess <= self.high:
            return {"invalid": f"{guess} is not between 1 and {self.high}"}
        if self.done:
            return {**self.reply("The game is over.", success=self.low == self.top == self.target),
                    "reward": 0.0, "done": True}
        self.guesses += 1
        if guess == self.target:
            self.low = self.top = guess
            self.done = True
            return {**self.reply(f"{guess} is right!", success=True), "reward": 1.0, "done": True}
        if guess < self.target:
            self.low = max(self.low, guess + 1)
            hint = f"{guess} is too low."
        else:
            self.top = min(self.top, guess - 1)
            hint = f"{guess} is too high."
        self.done = self.guesses >= self.max_guesses
        left = self.max_guesses - self.guesses
        text = f"{hint} It is between {self.low} and {self.top}; {left} guesses left."
        return {**self.reply(text, success=False), "reward": 0.0, "done": self.done}

    def reply(self, observation, success):
        return {
            "observation": observation,
            "action_format": f"a whole number from 1 to {self.high}",
            "actions": [str(n) for n in range(self.low, self.top + 1)],
            # What the player knows: equal knowledge, equal state (GiGPO groups turns by it).
            "state_hash": f"{self.low}-{self.top}-{self.guesses}",
            "info": {"success": success, "guesses": self.guesses},
        }


def main():
    env = GuessNumber()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            cmd = request.get("cmd")
            if cmd == "close":
                break
            if cmd == "reset":
                reply = env.reset(int(request["seed"]), request.get("params") or {})
            elif cmd == "step":
                reply = env.step(str(request["action"]))
            else:
                reply = {"error": f"unknown cmd {cmd!r}"}
        except Exception as e:  # noqa: BLE001 -- every failure is reported, never a silent exit
            print(f"guess_number: {type(e).__name__}: {e}", file=sys.stderr)
            reply = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
