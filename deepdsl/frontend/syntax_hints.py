"""Labelled example mistakes: a syntax error that fails where one of these fails gets its message.

Lark's `match_examples` parses each example and compares the parser state at the failure with the
user's; the first label whose example fails the same way wins.
"""

from __future__ import annotations

EXAMPLES: dict[str, list[str]] = {
    "an input's shape follows ':' (write `input x : [N, 1, 28, 28]`)": [
        "network A input x = [1, 2]",
        "network A input x [1, 2]",
    ],
    "a label needs its number of classes (write `label y : [N] classes K`)": [
        "network A label y : [4]",
        "network A label y : [4] loss = x",
        "network A label y : [4] x = 1",
    ],
    "missing ')' to close the call": [
        "network A x = f(a",
        "network A x = f(a, b",
        "network A x = f(g(a)",
        "network A x = f(a\ny = 2",
        "network A x = f(a, b\ny = 2",
        "network A x = f(a\nlayer b = 2",
        "network A x = f(a, b\nlayer c = 2",
        "network A x = f(a = 1\nloss = 2",
    ],
    "missing ']' to close the shape": [
        "network A input x : [1, 2",
        "network A input x : [1, 2 input z : [1]",
    ],
    "`o` composes two functions and needs one on each side (`f o g`)": [
        "network A x = f o",
        "network A x = o f",
        "network A x = f o o g",
        "network A x = f o\ny = 2",
        "network A x = f o\nloss = 2",
        "network A x = f o\npredict = 2",
    ],
    "a def's body is `= expr` or a block `{ ... return expr }`": [
        "network A def f(x) x",
        "network A def f(x) { y = x }",
        "network A def f(x) { }",
    ],
    "an expression is missing after '='": [
        "network A x =",
        "network A x = \ny = 2",
        "network A const N =",
    ],
}
