"""The step methods of the class and the inner classes that run the plans: one per plan (`Training`; `Inference`,
the test program, whose `predict()` is inferStep), each holding the plan's layout table (every temporary at its
arena offset, by name) and its calls, a long step split into parts named after the blocks they cover."""

from __future__ import annotations

from typing import Any

from deepdsl.backends.escape import java_comment
from deepdsl.backends.java.calls import calls
from deepdsl.backends.java.kernel_section import places
from deepdsl.backends.java.names import Namer, camel
from deepdsl.backends.java.passes import Pass, partial_names, plan_passes
from deepdsl.backends.java.roles import ancestors, gradient_values, temp_names
from deepdsl.backends.java.state import Emitter
from deepdsl.backends.java.text import long_literal, method
from deepdsl.ir import REGISTRY
from deepdsl.ir.types import DType
from deepdsl.memory import Plan
from deepdsl.memory.groups import planned_groups as _planned_groups
from deepdsl.memory.launches import planned_launches
from deepdsl.ops.collective import STATS, post_statements

MAX_STATEMENTS_PER_METHOD = 200  # keeps every step method far below Java's 64 KB of bytecode
LAYOUT_ROWS = 1000  # temporaries a layout class initialises (about 30 bytes of its constructor each)


def planned_groups(e: Emitter, p: Plan) -> list:
    """memory/groups.py's `planned_groups` of `p`, found once per plan (each pass of emit_java asks twice)."""
    key = ("groups", id(p))
    if key not in e.memo:
        e.memo[key] = (p, _planned_groups(p))  # the plan kept beside its groups, so that its id stays its own
    return e.memo[key][1]


def plan_items(e: Emitter, p: Plan) -> list[tuple[str, Any]]:
    """The plan's work in order: statements, groups of statements one loop computes (ir/groups.py), then the
    copies of the updates not computed in place."""
    g = p.graph
    key = ("launches", id(p))
    if key not in e.memo:  # reduction passes (passes.py), then the multi-tensor launches among the other groups
        out: list[Any] = []
        run: list[tuple] = []
        for x in plan_passes(p, planned_groups(e, p)):
            if isinstance(x, Pass):
                out += planned_launches(p, run) if run else []
                out.append(x)
                run = []
            else:
                run.append(x)
        out += planned_launches(p, run) if run else []
        e.memo[key] = (p, out)
    items: list[tuple[str, Any]] = []
    for x in e.memo[key][1]:  # a pass, a statement, a group of statements in one loop, or a multi-tensor launch
        if isinstance(x, Pass):
            items.append(("pass", x))
        elif len(x) > 1:
            items.append(("multi", x))
        else:
            items.append(("stmt", x[0][0]) if len(x[0]) == 1 else ("group", x[0]))
    return items + [("update", (name, v)) for name, v in g.updates if e.in_state.get(v.name) != name]


def plan_class(e: Emitter, title: str, doc: str, p: Plan, result: str | None,
               segments: list[tuple[str, str, list[tuple[str, Any]]]]) -> list[str]:  # fmt: skip
    """The inner class `title` that runs plan `p`: its temporaries first, each at its offset of the arena (the
    plan's layout table), then one method per segment (name, doc, items; the doc left to the class's where there
    is one segment), a long one split into parts named after the blocks they cover."""
    g = p.graph
    e.temps = Namer(tuple(e.namer.taken))
    e.temp_names = temp_names(g, result, e.prefix, e.short)
    e.gradient = gradient_values(g, result)
    layout = []
    e.in_state = dict(p.in_state)
    e.places = places(p)
    # a statement marked in-place (passes/inplace.py) writes over a temporary of its type that dies there: its
    # result is that temporary's field, as an epilogue's is (so fc1 + bias + ReLU is `fc1_out` in both steps),
    # where both are of one pass (a gradient written over a forward result keeps a gradient's name)
    produced = {s.out.name for s in g.stmts if s.out.name not in e.in_state}
    e.written_over = {}
    for s in g.stmts:
        over = s.inputs[s.a["inplace"]].name if "inplace" in s.a else None
        if (over in produced and s.out.name in produced and (s.out.name in e.gradient) == (over in e.gradient)
                and p.buffer_of(s.out.name) is p.buffer_of(over)):  # fmt: skip
            e.written_over[s.out.name] = over
    for group in planned_groups(e, p):
        for s in group:
            if s.out.name in e.in_state or s.out.name in e.written_over:
                continue
            t = e.tensor(s.out)
            if s.out.name in e.gradient:
                e.roles[t] = "grad"
            shape = ", ".join(map(str, s.out.type.shape))
            if s.op == "bucket_slice":  # a reduced gradient: its elements of the bucket
                at = f"{e.tensor(s.inputs[0])}, {int(s.a['offset'])}"
                layout.append(f"final Buf {t} = slice({at}{', ' + shape if shape else ''});")
            elif REGISTRY[s.op].view:
                layout.append(f"final Buf {t} = view({e.tensor(s.inputs[0])}{', ' + shape if shape else ''});")
            else:
                offset = long_literal(p.buffer_of(s.out.name).offset)
                at = "atBf16" if s.out.type.dtype is DType.BF16 else "at"  # a bf16 value: two bytes an element
                layout.append(f"final Buf {t} = {at}({offset}{', ' + shape if shape else ''});")
    e.workspaces = {}
    for s in g.stmts:  # a library call's planned workspace (a filter gradient's partial sums on the CUDA device)
        call = REGISTRY[s.op].java
        if call is not None and call.workspace and s.out.name in p.workspace:
            ws = p.workspace[s.out.name]
            field = e.workspaces[s.out.name] = e.temps(f"workspace:{s.out.name}", f"{e.tensor(s.out)}_workspace")
            layout.append(f"final Buf {field} = at({long_literal(ws.offset)}, {ws.nbytes // 4});")
    for _, _, items in segments:  # a reduction pass's partial sums (doubles): its workspace in the plan
        for what, item in items:
            if what == "pass":
                for field, (offset, doubles) in zip(partial_names(e, item), item.partials):
                    layout.append(f"final Buf {field} = at({long_literal(offset)}, {doubles} * 2);")
    methods = []
    for name, mdoc, items in segments:
        parts = _split(items)
        if len(parts) == 1:
            methods.append(method(f"/** {mdoc} */" if len(segments) > 1 else "", f"void {name}()", calls(e, parts[0])))
            continue
        names = [e.temps(f"{name}:part{k}", _part_name(name, part, e.gradient))
                 for k, part in enumerate(parts)]  # fmt: skip
        methods.append(
            method(f"/** {mdoc} */" if len(segments) > 1 else "", f"void {name}()", [f"{n}();" for n in names])
        )
        for k, part in enumerate(parts):
            pdoc = f"/** Part {k + 1} of {name}: {java_comment(_layers(part))}. */"
            methods.append(method(pdoc, f"private void {names[k]}()", calls(e, part)))
    # a class's field initialisers are one constructor, which Java limits to 64 KB of bytecode: a long table is
    # continued in classes the step's class extends, each under LAYOUT_ROWS rows
    chunks = [layout[k : k + LAYOUT_ROWS] for k in range(0, len(layout), LAYOUT_ROWS)] or [[]]
    lines = []
    for k, rows in enumerate(chunks[:-1]):
        parent = f" extends {title}Layout{k}" if k else ""
        lines += [f"  /** The layout of {title}, rows {k * LAYOUT_ROWS + 1} to {k * LAYOUT_ROWS + len(rows)}. */",
                  f"  private class {title}Layout{k + 1}{parent} {{",
                  *(f"    {line}" for line in rows), "  }", ""]  # fmt: skip
    parent = f" extends {title}Layout{len(chunks) - 1}" if len(chunks) > 1 else ""
    lines += [f"  /** {doc} */", f"  private final class {title}{parent} {{", *(f"    {line}" for line in chunks[-1])]
    for m in methods:
        lines += ["", *(f"  {line}" if line else "" for line in m.split("\n"))]
    return [*lines, "  }"]


def plan_classes(
    e: Emitter, cls: str, train: Plan, infer: Plan | None, test: Plan
) -> tuple[list[list[str]], list[str]]:
    """The inner classes that run the plans, and the step methods of the class that call them. The test program
    (evalStep) computes `predict` too: where its statements that `predict` needs come first, inferStep runs them
    alone (its plan is then the test plan's beginning), else inferStep runs the inference plan of its own."""
    names = Namer((cls,))
    training, inference, testing = (names(n) for n in ("Training", "Inference", "Testing"))

    def instance(title: str) -> str:  # the field holding the inner class's instance
        return title[:1].lower() + title[1:]

    e.in_state = dict(train.in_state)
    e.counters = frozenset(d.value.name for d in train.graph.inputs if d.kind in ("step", "offset"))  # longs
    doc = "The training step (forward, backward, update): its temporaries at their offsets of the arena, its calls."
    train_items = plan_items(e, train)
    split = pre_post(train, train_items)
    segments = [("step", doc, train_items)]
    if split is not None:  # data parallel: the part run per micro-batch, then the reductions' waits and the updates
        segments = [("pre", "The step up to its reductions: forward, backward, the buckets' starts (per micro-batch).",
                     split[0]),
                    ("post", "The step after its reductions: the buckets' waits, the updates (once a step).",
                     split[1])]  # fmt: skip
    classes = [plan_class(e, training, doc, train, "loss", segments)]
    field_lines = [f"private {training} {instance(training)};"]
    placed = [f"{instance(training)} = new {training}();"]
    train_loss = f"{instance(training)}.{e.tensor(train.graph.output('loss'))}"
    run_step = [f"{instance(training)}.{name}();" for name, _, _ in segments]
    steps = [
        method("/** One training step on the batch in the inputs; returns the loss. */", "protected float trainStep()",
               [*run_step, f"return dev.scalar({train_loss});"])
    ]  # fmt: skip
    if split is not None:  # gradient accumulation (--micro-batches): DataParallel runs pre per micro-batch, then post
        steps += [
            method("/** The step's statements before its reductions, for one micro-batch. */",
                   "@Override\n  protected void microBatchPre()", [f"{instance(training)}.pre();"]),
            method("/** The step's statements after its reductions, once; returns the loss (their mean). */",
                   "@Override\n  protected float microBatchPost()",
                   [f"{instance(training)}.post();", f"return dev.scalar({train_loss});"]),
            method("/** The step separates into pre and post: it accumulates micro-batches. */",
                   "@Override\n  protected boolean accumulates()", ["return true;"]),
        ]  # fmt: skip
    if any(s.op == "allreduce_start" and s.a["kind"] == STATS for s in train.graph.stmts):
        steps.append(method("/** Batch norm's statistics are summed over the ranks in the step (sync_batch_norm). */",
                            "@Override\n  protected boolean syncsBatchNorm()", ["return true;"]))  # fmt: skip
    terms = [(n.removeprefix("loss:"), v) for n, v in train.graph.outputs if n.startswith("loss:")]
    if terms:  # the named terms of a loss of several (`loss = rec + 0.5 * kl`), reported beside it
        names = ", ".join(f'"{n}"' for n, _ in terms)
        values = ", ".join(f"dev.scalar({instance(training)}.{e.tensor(v)})" for _, v in terms)
        steps.append(method("/** The names of the loss's terms. */", "@Override\n  protected String[] lossTermNames()",
                            [f"return new String[] {{{names}}};"]))  # fmt: skip
        steps.append(
            method(
                "/** The loss's terms at the last training step. */",
                "@Override\n  protected float[] lossTerms()",
                [f"return new float[] {{{values}}};"],
            )
        )
    e.in_state = dict(test.in_state)
    e.counters = frozenset(d.value.name for d in test.graph.inputs if d.kind == "step")
    items = plan_items(e, test)
    cut = _predict_first(test, items) if infer is not None else None
    if cut is not None:
        doc = "The test program (inference semantics): its temporaries at their offsets, the prediction, the loss."
        segments = [("predict", "The prediction (inferStep runs this alone).", items[:cut]),
                    ("loss", "The loss of the prediction.", items[cut:])]  # fmt: skip
        classes.append(plan_class(e, inference, doc, test, None, segments))
        run = instance(inference)
        predict_calls = [f"{run}.predict();"]
        eval_calls = [f"{run}.predict();", f"{run}.loss();"]
        loss = f"{run}.{e.tensor(test.graph.output('loss'))}"
        predict = f"{run}.{e.tensor(test.graph.output('predict'))}"
    else:
        doc = "The test program (inference semantics): its temporaries at their offsets of the arena, the loss."
        classes.append(plan_class(e, testing, doc, test, None, [("loss", doc, items)]))
        run = instance(testing)
        eval_calls = [f"{run}.loss();"]
        loss = f"{run}.{e.tensor(test.graph.output('loss'))}"
        if infer is not None:
            e.in_state = dict(infer.in_state)
            doc = "The inference program: its temporaries at their offsets of the arena, the prediction."
            classes.append(plan_class(e, inference, doc, infer, None, [("predict", doc, plan_items(e, infer))]))
            predict_calls = [f"{instance(inference)}.predict();"]
            predict = f"{instance(inference)}.{e.tensor(infer.graph.output('predict'))}"
    for c in (inference, testing):
        if any(f"private final class {c} " in line for k in classes for line in k):
            field_lines.append(f"private {c} {instance(c)};")
            placed.append(f"{instance(c)} = new {c}();")
    steps.append(method("/** The loss on the batch in the inputs in inference semantics (the test phase). */",
                        "protected float evalStep()", [*eval_calls, f"return dev.scalar({loss});"]))  # fmt: skip
    if infer is None:
        steps.append(method("/** The network defines no `predict`. */", "protected Buf inferStep()", ["return null;"]))
    else:
        steps.append(method("/** The network's prediction for the batch in the inputs. */",
                            "protected Buf inferStep()", [*predict_calls, f"return dev.read({predict});"]))  # fmt: skip
    hook = method("/** The steps' temporaries, placed in the arena of the device that took the network. */",
                  "@Override\n  protected void placeTemporaries()", placed)  # fmt: skip
    return classes, ["\n".join(f"  {line}" for line in field_lines), hook, *steps]


def pre_post(p: Plan, items: list[tuple[str, Any]]) -> tuple[list, list] | None:
    """A data-parallel training plan's items cut into those run per micro-batch (pre) and those run once after the
    reductions (post: passes/data_parallel.py's `post_statements`, and the copies of the updates), where running
    every pre item before every post one computes what the plan's order does: no pre statement placed after a post
    one in the plan writes (its result, its scratch) over memory holding a pre value that a post statement reads,
    such as a bucket. None for a plan without the pass, or where they cannot be separated so (then the step runs in
    the plan's order and accumulates no micro-batches)."""
    g = p.graph
    if not any(s.op == "allreduce_start" for s in g.stmts):
        return None
    post = post_statements(g)
    pre_items: list[tuple[str, Any]] = []
    post_items: list[tuple[str, Any]] = []
    first_post = None
    late_pre: list[Any] = []  # the statements of pre items placed after the first post item
    for k, (what, item) in enumerate(items):
        stmts = item_stmts(what, item)
        sides = {st.out.name in post for st in stmts} if stmts else {True}
        if len(sides) > 1:  # one loop computing both: not separable
            return None
        if sides.pop():
            post_items.append((what, item))
            first_post = k if first_post is None else first_post
        else:
            pre_items.append((what, item))
            if first_post is not None:
                late_pre += stmts
    read = [v.name for what, item in post_items if what != "update"
            for st in item_stmts(what, item) for v in st.inputs if v.name not in post]  # fmt: skip
    read += [v.name for what, item in post_items if what == "update" for v in (item[1],) if v.name not in post]
    kept = [p.buffer_of(n) for n in read if n in p.index]
    for st in late_pre:
        if REGISTRY[st.op].view:
            continue
        written = [p.buffer_of(st.out.name)] if st.out.name in p.index else []
        written += [p.workspace[st.out.name]] if st.out.name in p.workspace else []
        for w in written:
            if any(w.offset < b.offset + b.nbytes and b.offset < w.offset + w.nbytes for b in kept):
                return None
    return pre_items, post_items


def _predict_first(p: Plan, items: list[tuple[str, Any]]) -> int | None:
    """Where the statements `predict` needs end in `items` when none of the others comes before; else None."""
    needed = ancestors(p.graph, [p.graph.output("predict").name])
    marks = []
    for what, item in items:
        stmts = item_stmts(what, item)
        marks.append(any(st.out.name in needed for st in stmts) if stmts else False)
    if True not in marks:
        return None
    cut = len(marks) - marks[::-1].index(True)
    return cut if all(marks[:cut]) or all(m or items[k][0] == "stmt" and REGISTRY[items[k][1].op].view
                                          for k, m in enumerate(marks[:cut])) else None  # fmt: skip


def _part_name(kind: str, part: list[tuple[str, Any]], gradient: set[str]) -> str:
    """A part's method, after the blocks it covers and, in a training step, its pass: `forwardStemToStage2`,
    `backwardStage3`, `updates`; `predictStage3` in a segment `predict`."""
    blocks: list[str] = []
    stmts = [st for what, item in part for st in item_stmts(what, item)]
    for st in stmts:
        top = _block(st.layer).split(".")[-1] if st.layer else ""
        if top and top not in blocks:
            blocks.append(top)
    if not blocks:
        return "updates"
    backward = any(st.out.name in gradient for st in stmts)
    forward = any(st.out.name not in gradient for st in stmts)
    where = blocks[0] if len(blocks) == 1 else f"{blocks[0]}_to_{blocks[-1]}"
    if kind != "step":
        return camel(f"{kind}_{where}")
    passes = "" if backward == forward else "backward_" if backward else "forward_"
    return camel(f"{passes}{where}")


def _layers(part: list[tuple[str, Any]]) -> str:
    names: list[str] = []
    for what, item in part:
        first = item_stmts(what, item)[0] if what != "update" else None
        top = _block(first.layer) if first is not None and first.layer else ""
        if top and top not in names:
            names.append(top)
    if not names:
        return "the updates"
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} ... {names[-1]}"


def _split(items: list[tuple[str, Any]]) -> list[list[tuple[str, Any]]]:
    """Consecutive pieces of at most MAX_STATEMENTS_PER_METHOD statements, cut where the block (`model.stage2`)
    changes; a reduction pass counts its call and the statements' own calls the CPU runs under it."""
    if sum(_weight(item) for item in items) <= MAX_STATEMENTS_PER_METHOD:
        return [items]
    parts: list[list[tuple[str, Any]]] = [[]]
    size = 0
    for k, item in enumerate(items):
        if size + _weight(item) > MAX_STATEMENTS_PER_METHOD or (
            size >= MAX_STATEMENTS_PER_METHOD // 2 and _top(item) != _top(items[k - 1])
        ):
            parts.append([])
            size = 0
        parts[-1].append(item)
        size += _weight(item)
    return [part for part in parts if part]


def _weight(item: tuple[str, Any]) -> int:
    """The statements an item writes into its method: a pass's call and its statements' own calls, else one."""
    what, x = item
    return len(x.stmts) + 1 if what == "pass" else 1


def _top(item: tuple[str, Any]) -> str:
    what, x = item
    if what == "update":
        return "update"
    return _block(item_stmts(what, x)[0].layer)


def item_stmts(what: str, item: Any) -> tuple:
    """The statements of a plan item (plan_items): a statement, a group's, a multi-tensor launch's; an update's
    copy has none."""
    if what == "stmt":
        return (item,)
    if what == "group":
        return tuple(item)
    if what == "multi":
        return tuple(st for group in item for st in group)
    if what == "pass":
        return tuple(item.stmts)
    return ()


def _block(layer: str) -> str:
    """The block a layer belongs to: its path's first two parts (`model.stage2`)."""
    return ".".join(layer.split(".")[:2])
