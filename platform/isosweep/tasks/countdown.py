"""Countdown: reach a target with + - * and parentheses, using each given number exactly once.

Prompt ``"3,5,7>22:"`` lists the numbers (level L = L numbers, each 1..12), then ``>`` and the
target, then ``:``; a completion such as ``"3*5+7"`` is an expression over those numbers.
Problems are generated from a random expression over the numbers, so every one is solvable; its
answer is that generating expression, one solution among possibly many. Unlike the original
game there is no division, which keeps every value an integer and the alphabet small.
"""

from __future__ import annotations

import ast
import random
from typing import Union

from isosweep.tasks.base import Problem, Split, draw_problems

NAME = "countdown"
NUMBER_RANGE = (1, 12)
"""Inclusive bounds of each given number."""
TARGET_RANGE = (1, 999)
"""Inclusive bounds of a target; at most three digits keeps prompts short."""
MAX_COMPLETION_CHARS = 256
"""Longer completions score 0 without being parsed; real solutions are under 30 characters."""
COMPLETION_CHARS = frozenset("0123456789+-*() ")

Expr = Union[int, tuple[str, "Expr", "Expr"]]
"""An expression tree: a number, or (operator, left, right) with operator in "+-*"."""

_PRECEDENCE = {"+": 1, "-": 1, "*": 2}
_AST_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}


def evaluate(expr: Expr) -> int:
    """Value of an expression tree.

    >>> evaluate(("*", ("+", 1, 2), 4))
    12
    """
    if isinstance(expr, int):
        return expr
    op, left, right = expr
    a, b = evaluate(left), evaluate(right)
    return a + b if op == "+" else a - b if op == "-" else a * b


def render(expr: Expr) -> str:
    """Spell a tree with the fewest parentheses that keep its value.

    >>> render(("*", ("+", 1, 2), 4)), render(("-", 9, ("-", 5, 2))), render(("+", 9, ("-", 5, 2)))
    ('(1+2)*4', '9-(5-2)', '9+5-2')
    """
    if isinstance(expr, int):
        return str(expr)
    op, left, right = expr
    left_text, right_text = render(left), render(right)
    if _precedence(left) < _PRECEDENCE[op]:
        left_text = f"({left_text})"
    # a-(b-c) and a-(b+c) need their parentheses; a+(b-c) and a*(b*c) do not.
    if _precedence(right) < _PRECEDENCE[op] or (op == "-" and _precedence(right) == 1):
        right_text = f"({right_text})"
    return f"{left_text}{op}{right_text}"


def _precedence(expr: Expr) -> int:
    return 3 if isinstance(expr, int) else _PRECEDENCE[expr[0]]


def leaves(expr: Expr) -> list[int]:
    """The numbers of a tree, left to right."""
    if isinstance(expr, int):
        return [expr]
    return leaves(expr[1]) + leaves(expr[2])


def parse(text: str) -> Expr | None:
    """Parse a completion into a tree, or None if it is anything but ints, + - * and parentheses.

    Python's own parser does the grammar; we then accept only the node types above, so there is
    no unary minus, division, power or name, and nothing is ever evaluated by Python.

    >>> parse("(1+2)*4")
    ('*', ('+', 1, 2), 4)
    >>> parse("2**99999") is None, parse("-3+5") is None, parse("6/2") is None
    (True, True, True)
    """
    text = text.strip()
    if not text or len(text) > MAX_COMPLETION_CHARS or not set(text) <= COMPLETION_CHARS:
        return None
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return _from_ast(tree.body)


def _from_ast(node: ast.AST) -> Expr | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _AST_OPS:
        left, right = _from_ast(node.left), _from_ast(node.right)
        if left is None or right is None:
            return None
        return (_AST_OPS[type(node.op)], left, right)
    return None


def target_of(prompt: str) -> int | None:
    """The target of a prompt ``"3,5,7>22:"``, or None if the prompt is malformed.

    >>> target_of("3,5,7>22:")
    22
    """
    _, sep, tail = prompt.rpartition(">")
    if not sep or not tail.endswith(":") or not tail[:-1].isdigit():
        return None
    return int(tail[:-1])


def reward(problem: Problem, completion: str) -> float:
    """1.0 iff the completion uses each of the problem's numbers once and evaluates to the target.

    Never raises: a malformed completion scores 0.0. The multiset check runs before evaluation,
    so the value is bounded by products of at most four numbers up to 12.

    >>> p = Problem("3,5,7>22:", answer="3*5+7", task="countdown", level=3, numbers=(3, 5, 7))
    >>> reward(p, "3*5+7"), reward(p, " 7+5*3 "), reward(p, "(3+5)*7"), reward(p, "3*5+7+0")
    (1.0, 1.0, 0.0, 0.0)
    >>> reward(p, "2**99999"), reward(p, "3*5+7=22"), reward(p, "15+7")
    (0.0, 0.0, 0.0)
    """
    expr = parse(completion)
    target = target_of(problem.prompt)
    if expr is None or target is None or sorted(leaves(expr)) != sorted(problem.numbers):
        return 0.0
    return 1.0 if evaluate(expr) == target else 0.0


def random_expr(rng: random.Random, numbers: list[int]) -> Expr:
    """A random tree over ``numbers`` in the given order: random split point, random operator."""
    if len(numbers) == 1:
        return numbers[0]
    cut = rng.randint(1, len(numbers) - 1)
    op = rng.choice("+-*")
    return (op, random_expr(rng, numbers[:cut]), random_expr(rng, numbers[cut:]))


def _commuted(rng: random.Random, expr: Expr) -> Expr:
    """Swap the operands of + and * at random: another correct spelling of the same solution."""
    if isinstance(expr, int):
        return expr
    op, left, right = expr
    left, right = _commuted(rng, left), _commuted(rng, right)
    if op != "-" and rng.random() < 0.5:
        left, right = right, left
    return (op, left, right)


class CountdownTask:
    """Countdown problems at levels 2..4 (how many numbers are given)."""

    name: str = NAME
    levels: tuple[int, ...] = (2, 3, 4)

    def problems(self, split: Split, level: int, count: int, seed: int) -> list[Problem]:
        def draw(rng: random.Random) -> Problem:
            while True:
                numbers = tuple(rng.randint(*NUMBER_RANGE) for _ in range(level))
                # The expression uses the numbers in another order than the prompt lists them,
                # so the model cannot just copy the prompt and insert operators.
                order = list(numbers)
                rng.shuffle(order)
                expr = random_expr(rng, order)
                target = evaluate(expr)
                if TARGET_RANGE[0] <= target <= TARGET_RANGE[1]:
                    break
            prompt = f"{','.join(map(str, numbers))}>{target}:"
            return Problem(prompt, answer=render(expr), task=NAME, level=level, numbers=numbers)

        return draw_problems(self, split, level, count, seed, draw)

    def reward(self, problem: Problem, completion: str) -> float:
        return reward(problem, completion)

    def solution(self, problem: Problem, rng: random.Random) -> str:
        expr = parse(problem.answer)
        if expr is None:
            raise ValueError(
                f"countdown problem {problem.prompt!r} has an unparsable answer {problem.answer!r}"
            )
        return render(_commuted(rng, expr))
