"""The collapse of contiguous axes (backends/collapse.py): which pairs of adjacent axes a shaped kernel loops over
as one. Its numbers are checked against `evaluate` by test_java_emit's kernel cases (the `collapse_*` ones)."""

from __future__ import annotations

from deepdsl.backends.collapse import collapse
from deepdsl.ir.indexexpr import Affine, Apply, Read, Reduce, Var


def v(name: str) -> Affine:
    return Affine.var(name)


OUT4 = (("i0", 2), ("i1", 3), ("i2", 4), ("i3", 5))
BIAS_ADD = Apply("+", (Read(0, (v("i0"), v("i1"), v("i2"), v("i3"))), Read(1, (v("i1"),))))


def test_a_channel_bias_add_loops_over_h_times_w() -> None:
    c = collapse(BIAS_ADD, OUT4, ((2, 3, 4, 5), (3,)))
    assert c.out == (("i0", 2), ("i1", 3), ("i2", 20))  # axis 0 stays (the runtime splits rows); i1 is broadcast
    assert c.shapes == ((2, 3, 20), (3,)) and c.out_axes == ((0,), (1,), (2, 3))
    assert c.in_axes == (((0,), (1,), (2, 3)), ((0,),))
    assert c.body == Apply("+", (Read(0, (v("i0"), v("i1"), v("i2"))), Read(1, (v("i1"),))))


def test_an_elementwise_run_merges_every_axis_after_the_first() -> None:
    body = Apply("*", (Read(0, (v("i0"), v("i1"), v("i2"), v("i3"))), Read(1, (v("i0"), v("i1"), v("i2"), v("i3")))))
    c = collapse(Apply("+", (body, Read(2, (v("i0"),)))), OUT4, ((2, 3, 4, 5), (2, 3, 4, 5), (2,)))
    assert c.out == (("i0", 2), ("i1", 60)) and c.out_axes == ((0,), (1, 2, 3))


def test_the_reductions_adjacent_plain_axes_merge() -> None:
    sums = Reduce("sum", (("r0", 2), ("r1", 4), ("r2", 5)), Read(0, (v("r0"), v("i0"), v("r1"), v("r2"))))
    c = collapse(sums, (("i0", 3),), ((2, 3, 4, 5),))
    assert c.body == Reduce("sum", (("r0", 2), ("r1", 20)), Read(0, (v("r0"), v("i0"), v("r1"))))
    assert c.shapes == ((2, 3, 20),) and c.in_axes == (((0,), (1,), (2, 3)),)


def refused(body, out=OUT4, shapes=((2, 3, 4, 5), (3,))) -> bool:  # noqa: ANN001
    """Whether the last axis (W) stays an axis of its own (an earlier pair may still merge)."""
    return collapse(body, out, shapes).out_axes[-1] == (len(out) - 1,)


def test_a_transposed_shifted_strided_or_sliced_read_refuses() -> None:
    transposed = Read(0, (v("i0"), v("i1"), v("i3"), v("i2")))
    assert collapse(transposed, OUT4, ((2, 3, 5, 4),)).out == OUT4
    shifted = Read(0, (v("i0"), v("i1"), Affine((("i2", 1),), 1), v("i3")))  # padded: reads row i2 + 1
    assert collapse(shifted, OUT4, ((2, 3, 4, 5),)).out == OUT4
    padded = Read(0, (v("i0"), v("i1"), v("i2"), Affine((("i3", 1),), -1)))
    assert refused(padded, shapes=((2, 3, 4, 5),))
    strided = Read(0, (v("i0"), v("i1"), v("i2"), Affine((("i3", 2),), 0)))
    assert refused(strided, shapes=((2, 3, 4, 10),))
    assert collapse(strided, OUT4, ((2, 3, 4, 10),)).out_axes == ((0,), (1, 2), (3,))  # C, H still merge
    sliced = Read(0, (v("i0"), v("i1"), v("i2"), v("i3")))  # the input's rows are longer than the output's
    assert refused(sliced, shapes=((2, 3, 4, 6),))
    one_of_them = Apply("+", (BIAS_ADD, Read(2, (v("i3"),))))  # a bias over W alone
    assert refused(one_of_them, shapes=((2, 3, 4, 5), (3,), (5,)))
    as_value = Apply("+", (BIAS_ADD, Var("i2")))  # the index as a number
    assert refused(as_value)


def test_an_input_read_two_ways_is_not_merged() -> None:
    """in0 read as itself and transposed: merging its axes 2, 3 for the first read would break the second."""
    both = Apply("+", (Read(0, (v("i0"), v("i1"), v("i2"), v("i3"))), Read(0, (v("i0"), v("i1"), v("i3"), v("i2")))))
    assert refused(both, out=(("i0", 2), ("i1", 3), ("i2", 4), ("i3", 4)), shapes=((2, 3, 4, 4),))
    windows = Reduce("sum", (("r0", 2), ("r1", 2)), Read(0, (v("i0"), Affine((("i1", 2), ("r0", 1)), 0), v("r1"))))
    assert collapse(windows, (("i0", 2), ("i1", 3)), ((2, 6, 2),)).body == windows  # r0 is in a window index
