"""Codes: recall a family's secret code, a task whose answers must be found by sampling and do not transfer.

Prompt ``"07:412>"`` names a family (``07``) and an instance of it (``412``); the completion is the family's
code, three digits drawn at random for the family (``CODE_DIGITS``), whatever the instance. Nothing about one
family's code says anything about another's, so a policy learns a family only from that family's own
successes; eval problems are held-out *instances* of the training families (the split is by prompt hash).

The base model's pass rate on a family is *planted* by its warm-up (``solution``): each digit of a warm-up
target of family f is the code's digit with probability ``epsilon ** (1/3)``, so a base model that fits its
data passes f at about ``epsilon``. A needle also has a *decoy*, a code that differs from the answer in every
digit and whose digits the warm-up makes the most likely ones (``DECOY_RATE``): the answer is not the base
model's mode, so sharpening the policy does not find it; only sampling it does. (Planting the whole code with
probability epsilon and a random code otherwise asks the model to learn a bump of 1-4% on one of 1,000
answers: the tiny transformer's warm-up left the needles at chance, 0.001. Per digit it learns the bumps; without
the decoy the answer was each digit's mode, and training on the anchors alone raised the needles.) Needle families have epsilon in
``NEEDLE_EPSILONS`` (rare successes to discover), anchor families in ``ANCHOR_EPSILONS`` (easy ones).

Three variants, each its own task (and so its own base model and split):

- ``codes``: drift on. Every anchor code and every needle's decoy starts with ``DRIFT_DIGIT`` and no needle code
  does, so learning the anchors raises that first digit everywhere: towards the needles' decoys, away from their
  answers.
- ``codes-nodrift``: the same families with codes drawn without that constraint (no shared feature).
- ``codes-transfer``: the code is a learnable function of the family id (``transfer_code``), so learning some
  families teaches the rest, as arithmetic does.

>>> task = CodesTask()
>>> [p] = task.problems("train", level=1, count=1, seed=0)
>>> task.reward(p, p.answer), task.reward(p, "x")
(1.0, 0.0)
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from functools import cached_property

from isosweep.tasks.base import Band, Problem, Split, draw_problems, seeded_rng

CODE_DIGITS = 3
"""Digits of a code: 1000 codes, so a random guess passes with probability 0.001."""
INSTANCES = 1000
"""Instances of each family (``000`` to ``999``); about a fifth of them are eval problems."""
NEEDLE_EPSILONS = (0.01, 0.02, 0.04)
"""The planted epsilons of the needle families, ``NEEDLES_PER_EPSILON`` families each."""
NEEDLES_PER_EPSILON = 8
ANCHOR_EPSILONS = tuple(round(0.3 + 0.3 * i / 23, 4) for i in range(24))
"""The planted epsilons of the 24 anchor families: evenly spaced over [0.3, 0.6]."""
DRIFT_DIGIT = "9"
"""With drift on, the first digit of every anchor code and of every needle's decoy, and of no needle code."""
DECOY_RATE = 0.5
"""Probability that a digit of a needle's warm-up target is its decoy's digit (the answer's is
``epsilon ** (1/3)``, at most 0.34)."""
VERSION = "2"
"""What a codes base model is (its cache key carries it). 2: needles have decoys; 1 (never published): without
them, the answer was each digit's mode, and sharpening the policy found the needles without sampling them."""
PROMPT = re.compile(r"^(\d\d):(\d{3})>$")

BANDS: dict[str, Band] = {
    "easy": Band(0.3, 0.9, high_closed=True),
    "hard": Band(0.0, 0.05, low_open=True, high_closed=True),
    "all": Band(0.0, 1.0, high_closed=True),
}
"""The difficulty bands of the codes tasks: hard is a needle seen at least once in the probe (rate in (0, 0.05]),
easy an anchor's [0.3, 0.9]; the gap between them keeps a hard problem's probe from landing it in easy by chance."""


@dataclass(frozen=True)
class Family:
    """One family of a codes task."""

    id: int
    code: str
    """The answer of every instance."""
    epsilon: float
    """Probability that a warm-up target is the code: the pass rate the warm-up plants."""
    needle: bool
    decoy: str | None = None
    """A needle's decoy: a code that differs from the answer in every digit and that the warm-up makes each
    digit's most likely value (``DECOY_RATE``), so the answer is *not* the base model's mode; None for anchors."""



def transfer_code(family: int) -> str:
    """The code of family ``ab`` in the transfer variant: ``b``, ``a``, then ``(a + b) mod 10``.

    >>> transfer_code(7), transfer_code(38)
    ('707', '831')
    """
    a, b = divmod(family, 10)
    return f"{b}{a}{(a + b) % 10}"


def reward(problem: Problem, completion: str) -> float:
    """1.0 iff the completion, stripped of surrounding whitespace, is exactly the family's code.

    >>> p = Problem(prompt="07:412>", answer="301", task="codes", level=1)
    >>> reward(p, "301"), reward(p, " 301\\n"), reward(p, "3010"), reward(p, "31")
    (1.0, 1.0, 0.0, 0.0)
    """
    return 1.0 if completion.strip() == problem.answer else 0.0


class CodesTask:
    """One variant of the codes task: 24 needle and 24 anchor families, one level (``1``)."""

    levels: tuple[int, ...] = (1,)
    bands: dict[str, Band] = BANDS
    version: str = VERSION

    def __init__(self, name: str = "codes", drift: bool = True, transfer: bool = False):
        if drift and transfer:
            raise ValueError("codes: the transfer variant has no drift feature (its codes are a function of the family)")
        self.name = name
        self.drift = drift
        self.transfer = transfer

    @cached_property
    def families(self) -> tuple[Family, ...]:
        """Every family, by id. Which ids are needles is a fixed shuffle (so needles and anchors interleave);
        codes are distinct, drawn per family from a stream seeded by the task's name."""
        epsilons = [e for e in NEEDLE_EPSILONS for _ in range(NEEDLES_PER_EPSILON)] + list(ANCHOR_EPSILONS)
        needles = len(NEEDLE_EPSILONS) * NEEDLES_PER_EPSILON
        order = list(range(len(epsilons)))
        seeded_rng("codes", "families").shuffle(order)  # the same roles in every variant
        codes: set[str] = set()
        families = []
        for family, slot in enumerate(order):
            needle = slot < needles
            code = self._code(family, needle, codes)
            codes.add(code)
            decoy = self._decoy(family, code) if needle else None
            families.append(Family(family, code, epsilons[slot], needle, decoy))
        return tuple(families)

    def _code(self, family: int, needle: bool, taken: set[str]) -> str:
        """A code no family before this one has (two families with one code would share what they learn)."""
        if self.transfer:
            return transfer_code(family)  # distinct by construction: the first two digits are the id's, swapped
        rng = seeded_rng(self.name, "code", family)
        while True:
            first = rng.choice("0123456789") if not self.drift else DRIFT_DIGIT if not needle else rng.choice("012345678")
            code = first + "".join(rng.choice("0123456789") for _ in range(CODE_DIGITS - 1))
            if code not in taken:
                return code

    def _decoy(self, family: int, code: str) -> str:
        """A needle's decoy: every digit other than the code's; with drift on its first digit is the anchors'."""
        rng = seeded_rng(self.name, "decoy", family)
        digits = [rng.choice([d for d in "0123456789" if d != c]) for c in code]
        if self.drift:
            digits[0] = DRIFT_DIGIT
        return "".join(digits)

    def family_of(self, problem: Problem) -> Family:
        """The family a problem of this task belongs to (``ValueError`` for a prompt of another form)."""
        match = PROMPT.match(problem.prompt)
        if match is None or int(match[1]) >= len(self.families):
            raise ValueError(f"{self.name}: {problem.prompt!r} is not a prompt of this task (e.g. '07:412>')")
        return self.families[int(match[1])]

    def problems(self, split: Split, level: int, count: int, seed: int) -> list[Problem]:
        def draw(rng: random.Random) -> Problem:
            family = self.families[rng.randrange(len(self.families))]
            instance = rng.randrange(INSTANCES)
            return Problem(prompt=f"{family.id:02d}:{instance:03d}>", answer=family.code, task=self.name, level=level)

        return draw_problems(self, split, level, count, seed, draw)

    def reward(self, problem: Problem, completion: str) -> float:
        return reward(problem, completion)

    def solution(self, problem: Problem, rng: random.Random) -> str:
        """A warm-up target, digit by digit: the code's digit with probability ``q = epsilon ** (1/3)``, so the
        whole code with probability epsilon; for a needle its decoy's digit with probability ``DECOY_RATE``; else
        one of the other digits, uniformly. Not always a correct completion: this is how the base model's pass
        rate is planted."""
        family = self.family_of(problem)
        q = family.epsilon ** (1 / CODE_DIGITS)
        target = []
        for k, digit in enumerate(problem.answer):
            u = rng.random()
            decoy = family.decoy[k] if family.decoy else None
            if u < q:
                target.append(digit)
            elif decoy is not None and u < q + DECOY_RATE:
                target.append(decoy)
            else:
                target.append(rng.choice([d for d in "0123456789" if d not in (digit, decoy)]))
        return "".join(target)
