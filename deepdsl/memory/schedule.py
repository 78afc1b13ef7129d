"""The statement order the plan follows (DESIGN §5): the program's own order, with every statement that frees at
least as much as it allocates moved up to the moment it becomes ready (an update that is its parameter's last
reader allocates nothing: the plan writes it into the parameter's storage).

Such a statement can only lower the live bytes by running earlier: its inputs die (it is their last reader) and
its result is no bigger than what they free. The typical case is a parameter's optimizer update, which becomes
ready when the parameter's gradient is complete: run then, the gradient (and, in place, its update) dies at once
instead of living through the rest of the backward pass. A statement marked to share the loop of the one before
it (`same_loop`) follows that one. The updates marked `multi_tensor` (passes/multi_tensor.py) are not moved: they
stay together at the end of the step, one launch. Everything else keeps its relative order, which the optimiser's
motion pass already chose for short live ranges.
"""

from __future__ import annotations

from collections.abc import Iterator

from deepdsl.ir import REGISTRY, Graph, Stmt
from deepdsl.ir.analysis import readers, reads_pointwise, returned
from deepdsl.memory.plan import aligned

SMALL = 256  # bytes: a result this small may be computed early to let a statement share its predecessor's loop


def schedule(g: Graph) -> Graph:
    stmts = g.stmts
    made = {s.out.name: i for i, s in enumerate(stmts)}
    read_by = readers(stmts)
    pinned = returned(g)
    producer = {s.out.name: s for s in stmts}
    target = {v.name: name for name, v in g.updates if v.name in producer and reads_pointwise(producer[v.name], name)}
    waiting = [sum(1 for v in {v.name for v in s.inputs} if v in made) for s in stmts]  # inputs not yet computed
    unread = {v: len(r) for v, r in read_by.items()}  # readers not yet run
    done = [False] * len(stmts)
    order: list[Stmt] = []

    def stays_last_reader(i: int) -> bool:
        """An in-place statement must stay its input's last reader: it may not run before the others."""
        s = stmts[i]
        return "inplace" in s.a and unread.get(s.inputs[s.a["inplace"]].name) != 1

    def frees_enough(i: int) -> bool:
        s = stmts[i]
        if REGISTRY[s.op].view or stays_last_reader(i) or s.a.get("multi_tensor"):
            return False  # (the optimiser's updates of one multi-tensor launch stay together at the end)
        freed = sum(
            aligned(v.type.nbytes) for v in {v.name: v for v in s.inputs}.values()
            if v.name in made and v.name not in pinned and unread[v.name] == 1 and not _viewed(v.name, stmts, read_by)
        )  # fmt: skip
        if s.out.name in target and unread.get(target[s.out.name], 0) <= 1:
            return True  # an update that can go straight into its parameter's storage: it takes no arena space
        return freed > 0 and aligned(s.out.type.nbytes) <= freed

    def emit(first: int) -> None:
        """Emit `first` and what it lets run early, depth first; an explicit stack of steps, not recursion, so
        that a long chain of statements that each free enough (a deep residual network's backward pass) needs
        no Python stack."""
        stack = [steps(first)]
        while stack:
            nested = next(stack[-1], None)
            if nested is None:
                stack.pop()
            else:
                stack.append(steps(nested))

    def steps(i: int) -> Iterator[int]:
        """The work of emitting statement `i`; yields each statement to emit before it continues."""
        done[i] = True  # claimed first: nothing that runs before it below may emit it again
        # small results that the statements sharing this one's loop still wait for (Adam's bias correction, from
        # the step counter) come first, so that nothing separates those statements
        j = i + 1
        while j < len(stmts) and stmts[j].a.get("same_loop") and not done[j]:
            for v in stmts[j].inputs:
                m = made.get(v.name, i)
                if (
                    not (i <= m <= j or done[m] or waiting[m] or stays_last_reader(m))
                    and stmts[m].out.type.nbytes <= SMALL
                ):
                    yield m
            j += 1
        s = stmts[i]
        order.append(s)
        touched = []
        for v in dict.fromkeys(v.name for v in s.inputs):
            if v in unread:
                unread[v] -= 1
                touched.append(v)
        for r in read_by.get(s.out.name, ()):
            waiting[r] -= 1
        # the statement marked to share this one's loop (ir/groups.py) stays right after it; then readers that
        # became ready, and readers of inputs that now have one reader left, may free enough now
        nxt = i + 1
        if nxt < len(stmts) and stmts[nxt].a.get("same_loop") and not done[nxt] and not waiting[nxt]:
            if frees_enough(nxt):  # only when that costs no memory
                yield nxt
        candidates = [r for r in read_by.get(s.out.name, ()) if waiting[r] == 0]
        candidates += [r for v in touched if unread[v] == 1 for r in read_by[v]]
        for r in candidates:
            if not done[r] and waiting[r] == 0 and frees_enough(r):
                yield r

    for i in range(len(stmts)):
        if not done[i]:
            emit(i)
    return g.replace(stmts=tuple(order))


def _viewed(name: str, stmts: tuple[Stmt, ...], read_by: dict[str, list[int]]) -> bool:
    """A view's base lives as long as the view: reading the base last frees nothing."""
    return any(REGISTRY[stmts[r].op].view for r in read_by.get(name, ()))
