"""Numbers as kernel arguments (backends/java/constants.py): kernels that differ only in a number are one kernel."""

import re

from deepdsl.api import build, compile_source
from deepdsl.backends.java import java_program
from deepdsl.backends.java.constants import lift, numbers, varying
from deepdsl.ir.indexexpr import Apply, Const, Read, Reduce

R, V = Read(0, ()), Read(1, ())
UPDATE = Apply("+", (Apply("*", (Const(0.9), R)), Apply("*", (Const(0.1), V))))


def test_numbers_are_found_and_lifted_in_order() -> None:
    assert numbers(UPDATE) == [0.9, 0.1]
    assert lift(UPDATE, 2, (1,)) == Apply("+", (Apply("*", (Const(0.9), R)), Apply("*", (Read(2, ()), V))))
    assert lift(UPDATE, 2, (0, 1)) == Apply("+", (Apply("*", (Read(2, ()), R)), Apply("*", (Read(3, ()), V))))
    # a mean's divisor is a size of the kernel, not a number
    mean = Apply("/", (Reduce("sum", (("r0", 4),), Read(0, ())), Const(4.0)))
    assert numbers(mean) == [] and lift(mean, 1, ()) == mean


def test_only_the_positions_that_differ_become_arguments() -> None:
    assert varying({"a": {(0.9, 0.1), (0.9, 0.2)}, "b": {(0.5,)}}) == {"a": (1,)}


# two batch norms over different sizes: their running variances move by momentum * n/(n-1), two numbers
TWO_NORMS = """
network TwoNorms
input x : [4, 2, 6, 6]
label y : [4] classes 3
net = full(3) o flatten o relu o batch_norm o conv(3, kernel=3) o relu o batch_norm o conv(2, kernel=1)
loss = softmax_cross_entropy(net(x), y)
predict = net(x)
"""


def test_kernels_that_differ_in_a_number_are_one_kernel_taking_it() -> None:
    c = compile_source(TWO_NORMS, "two.ddsl")
    assert c.program is not None
    b = build(c.program)
    p = java_program(b.program, b.train_plan, b.infer_plan, b.eval_plan)
    assert "RUNNING_UPDATE_2" not in p.java and p.java.count("static final Kernel RUNNING_UPDATE =") == 1
    assert p.cuda.count("void runningUpdate(") == 1
    # the three numbers (the mean's 0.1 and each variance's) are constant fields the calls pass, named for what
    # they are: bn_momentum, bn_var_momentum_n<values per channel>
    fields = re.findall(r"private final Buf (bn_\w*momentum\w*) = constant\(", p.java)
    assert len(fields) == 3, fields
    calls = re.findall(r"updateRunning\((\w+), (\w+), (\w+)\);", p.java)
    assert {k for *_, k in calls} == set(fields)
