"""The Java runtime's shape (issue 35): the generated step calls the device, the device calls the family class that
does the work, with no class of one-line static forwarders between them, no runtime file past 600 lines, and
CpuGemm's two copies of its inner sweep (kept apart for the JIT) the same code.

Both checks read the sources only (no javac), and each is shown to fail on a planted copy of what they forbid.
"""

from __future__ import annotations

import re

from deepdsl.backends.java import runtime_sources

MAX_LINES = 600

# `static ... name(params) {` then one statement calling Other.name2(the same parameters, in order), then `}`
_STATIC = re.compile(
    r"(?:public |private |protected )?static [\w<>\[\], ]+? (\w+)\(([^)]*)\)\s*(?:throws [\w., ]+)?\{"
    r"\s*(?:return )?([A-Z]\w*)\.(\w+)\(([^;]*)\);\s*\}"
)


def forwarders(sources: dict[str, str]) -> list[str]:
    """`Cls.method -> Other.target` for each static method of the runtime whose whole body hands its own
    parameters, unchanged and in order, to a static method of another runtime class."""
    classes = {name.removesuffix(".java") for name in sources}
    out = []
    for file, text in sources.items():
        cls = file.removesuffix(".java")
        for m in _STATIC.finditer(text):
            method, params, target_cls, target, args = m.groups()
            names = [p.split()[-1] for p in params.split(",") if p.strip()]
            passed = [a.strip() for a in args.split(",") if a.strip()]
            if target_cls in classes and target_cls != cls and passed == names:
                out.append(f"{cls}.{method} -> {target_cls}.{target}")
    return out


def method_text(source: str, signature: str) -> str:
    """The text of the method that starts at `signature` (its indented line) up to its closing brace at 2 spaces."""
    start = source.index(signature)
    return source[start : source.index("\n  }\n", start) + 4]


def copies_differ(source: str) -> str | None:
    """CpuGemm keeps `sweepNarrow`, a copy of `sweep` in a method of its own so that the JIT tunes each for its
    widths (its comment says why): None when the two are the same code, else the first line where they part."""
    wide = method_text(source, "  static void sweep(").split("\n")
    narrow = method_text(source, "  static void sweepNarrow(").replace("sweepNarrow(", "sweep(", 1).split("\n")
    for a, b in zip(wide, narrow):
        if a != b:
            return f"sweep: {a.strip()!r} / sweepNarrow: {b.strip()!r}"
    return None if len(wide) == len(narrow) else "sweep and sweepNarrow differ in length"


def too_long(sources: dict[str, str]) -> list[str]:
    return [f"{name}: {text.count(chr(10))} lines" for name, text in sources.items() if text.count("\n") > MAX_LINES]


def test_no_runtime_class_only_forwards_to_another() -> None:
    assert forwarders(runtime_sources()) == []


def test_a_forwarding_layer_is_found() -> None:
    planted = dict(runtime_sources())
    planted["CpuOps.java"] = (
        "package deepdsl.runtime;\n\npublic final class CpuOps {\n"
        "  public static void lrn(Buf out, Buf x, float alpha, float beta, float k, int size) {\n"
        "    CpuNormalisation.lrn(out, x, alpha, beta, k, size);\n  }\n\n"
        "  static float scale(Buf x) {\n    return CpuSupport.scale(x);\n  }\n"
        "  static void own(Buf out, Buf x) {\n    CpuShapes.transpose(out, x, new int[] {1, 0});\n  }\n}\n"
    )
    assert forwarders(planted) == ["CpuOps.lrn -> CpuNormalisation.lrn", "CpuOps.scale -> CpuSupport.scale"]


def test_the_narrow_sweep_is_the_same_code_as_the_wide_one() -> None:
    source = runtime_sources()["CpuGemm.java"]
    assert copies_differ(source) is None
    # a change made to one copy alone is found
    changed = source.replace("t0[j] += x0 * r0[j];", "t0[j] += x0 * r0[j] * 1.0f;", 1)
    assert changed != source and copies_differ(changed) is not None


def test_no_runtime_file_is_past_600_lines() -> None:
    assert too_long(runtime_sources()) == []
    assert too_long({"Big.java": "x\n" * (MAX_LINES + 1), "Small.java": "x\n" * MAX_LINES}) == ["Big.java: 601 lines"]
