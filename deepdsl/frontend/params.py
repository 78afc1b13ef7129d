"""Parameters made during elaboration: names, sharing by layer instances, fans, and unused ones."""

from __future__ import annotations

from deepdsl.errors import DslNameError, DslProgramError, DslShapeError, DslWarning, Note, Span
from deepdsl.frontend.values import Scope, Spec, TensorVal
from deepdsl.ir import REGISTRY, Graph, GraphBuilder, Init, ParamDef, TensorType, Value


def join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def fans(shape: tuple[int, ...]) -> tuple[int, int]:
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = 1
    for d in shape[2:]:
        receptive *= d
    return shape[1] * receptive, shape[0] * receptive


class ParamStore:
    """Every parameter by full name, with the layer instance and application that made it."""

    def __init__(self, builder: GraphBuilder):
        self.b = builder
        self.store: dict[str, tuple[TensorVal, int, int]] = {}  # name -> (value, owner id, application)
        self.spans: dict[str, Span] = {}
        self.first_use: dict[str, Span] = {}  # a shared layer's parameter -> the application that made it

    def made(self, name: str) -> TensorVal | None:
        """Parameter `name` where it has been made (a tied head reads its embedding's table), else None."""
        return self.store[name][0] if name in self.store else None

    def make(
        self, scope: Scope, path: str, local: str, shape: tuple[int, ...], init: Spec, span: Span, kind: str = "param"
    ) -> TensorVal:
        """Make parameter `path.local` (or return it, for a shared layer applied again)."""
        full = join(path, local)
        if any(d <= 0 for d in shape):
            raise DslShapeError(f"parameter {full} would have the shape {list(shape)}", span)
        owner = id(scope.owner) if scope.owner is not None else 0
        if full in self.store:
            value, who, app = self.store[full]
            if owner and who == owner and app != scope.application:
                if value.shape != shape:
                    raise DslShapeError(
                        f"the shared layer '{scope.path}' is applied to an input of another shape: "
                        f"{full} was made {value.value.type}, here it would be {TensorType(shape)}", span,
                        notes=[Note("its first application", self.first_use[full])],
                    )  # fmt: skip
                return value
            raise DslNameError(
                f"parameter name '{full}' is already used",
                span,
                notes=[Note("first made here", self.spans[full])],
                hint='give one of the calls another name="..."',
            )
        t = TensorType(shape)
        fan_in, fan_out = fans(shape)
        init_args = tuple(float(v) for _, v in init.args)
        pdef = ParamDef(Value(full, t), Init(init.name, init_args, fan_in, fan_out), kind, path, span)
        value = TensorVal(self.b.add_param(pdef), f"parameter '{full}'", span)
        self.store[full] = (value, owner, scope.application)
        self.spans[full] = span
        self.first_use[full] = scope.applied_at or span
        return value


def gradient_path(graph: Graph) -> set[str]:
    """The values the loss has a gradient with respect to: those it reaches through differentiable statements
    (`accuracy` or `argmax` pass no gradient)."""
    needed = {graph.output("loss").name}
    for s in reversed(graph.stmts):
        if s.out.name in needed and REGISTRY[s.op].differentiable:
            needed.update(v.name for v in s.inputs)
    return needed


def no_gradient_check(graph: Graph, loss_span: Span | None) -> tuple[DslProgramError | None, list[DslWarning]]:
    """An error (at the `loss` line) when no trainable parameter gets a gradient from the loss, and one warning per
    layer whose trainable parameters get none."""
    needed = gradient_path(graph)
    unused: dict[str, list[ParamDef]] = {}
    for p in graph.trainable:
        if p.value.name not in needed:
            unused.setdefault(p.layer, []).append(p)
    if graph.trainable and not any(p.value.name in needed for p in graph.trainable):
        error = DslProgramError(
            "the loss has no gradient with respect to any parameter, so training would change nothing",
            loss_span,
            hint="the loss must be computed from the parameters by differentiable operations (`accuracy` and "
            "`argmax` carry no gradient); e.g. loss = softmax_cross_entropy(net(x), y)",
        )
        return error, []
    warnings = []
    for layer, params in unused.items():
        listed = ", ".join(p.value.name for p in params)
        message = f"the parameters of '{layer}' ({listed}) get no gradient from the loss and will not be trained"
        warnings.append(DslWarning(message, params[0].span))
    return None, warnings
