"""The Java emitter does each piece of work once per class: a kernel that ResNet-50's repeated blocks, its training
and test steps and emit_java's two passes all ask for is printed once and reused (issue 35: the Java emitter
printed 1,078 kernels through java_kernel 2,044 times and ie_kernel 2,095 times, 70% of a compile)."""

from __future__ import annotations

from collections import Counter

import pytest

from deepdsl.backends import java
from deepdsl.backends.java import kernel_section
from deepdsl.memory import groups


def test_each_distinct_kernel_and_each_plans_groups_are_computed_once(
    compiled, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    b = compiled("resnet50", {"N": 2}, "plan").build
    calls: Counter = Counter()

    def counted(module: object, name: str, key) -> None:  # noqa: ANN001
        real = getattr(module, name)

        def wrapper(*args, **kw):  # noqa: ANN002, ANN003, ANN202
            calls[(name, key(args, kw))] += 1
            return real(*args, **kw)

        monkeypatch.setattr(module, name, wrapper)

    for name in ("java_kernel", "ie_kernel"):  # by value: equal arguments print the same text
        counted(kernel_section, name, lambda args, kw: repr((args, sorted(kw.items()))))
    counted(groups, "kernel_groups", lambda args, kw: id(args[0]))  # by plan (its statements)
    java.java_program(b.program, b.train_plan, b.infer_plan, b.eval_plan)
    printed = Counter(name for name, _ in calls)
    assert printed["java_kernel"] > 50 and printed["ie_kernel"] > 50 and printed["kernel_groups"] >= 2
    again = Counter(name for (name, _), n in calls.items() if n > 1)
    assert again == Counter(), f"computed more than once: {dict(again)}"


def test_a_kernel_printed_once_is_reused_only_for_the_very_same_body() -> None:
    # +0.0 == -0.0 in Python, so bodies that differ in a zero's sign compare equal; their kernels do not
    from deepdsl.backends.java.state import Emitter
    from deepdsl.ir.indexexpr import Affine, Apply, Const, Read

    e = Emitter()
    out = (("i0", 2), ("i1", 3))
    read = Read(0, (Affine.var("i1"), Affine.var("i0")))  # a transpose: a shaped kernel, not a flat one
    names = [kernel_section.kernel(e, "t", f"v{k}", Apply("+", (read, Const(z))), out, (), "", ((3, 2),), ("float",))
             for k, z in enumerate((0.0, -0.0, 0.0))]  # fmt: skip
    assert names[0] == names[2] != names[1]
    assert "-0.0f" in e.kernel_text[1] and "-0.0f" not in e.kernel_text[0]
