"""ONNX in and out for the command line: `deepdsl import` (onnx_import, then the files written) and `deepdsl export`
(the driver's forward program made an inference program, its parameters initialised or loaded, then
backends.onnx_export). Both return the lines the CLI prints."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from deepdsl import api
from deepdsl.autodiff import infer_program
from deepdsl.backends.onnx_export import DEFAULT_OPSET, export_graph
from deepdsl.checkpoint import check_names, load_npz, write_npz
from deepdsl.errors import DslError, DslProgramError, flatten
from deepdsl.files import atomic_output, check_replaceable, write_atomically
from deepdsl.frontend.program import Program
from deepdsl.initializers import init_array
from deepdsl.onnx_import import Imported, import_model

__all__ = ["DEFAULT_OPSET", "export_onnx", "import_onnx", "initial_arrays"]


def _check_target(path: str, what: str, replace_readonly: bool) -> None:
    """Whether `path` could be written (files.check_replaceable), before anything is."""
    try:
        check_replaceable(path, replace_readonly=replace_readonly)
    except OSError as e:
        raise DslProgramError(f"cannot write {what} '{path}': {e.strerror or e}") from None


def import_onnx(
    model: str,
    output: str,
    params: str | None,
    batch: int | None,
    loss: bool,
    replace_readonly: bool = False,
    share: bool = True,
) -> list[str]:
    """Write the `.ddsl` of `model` to `output` and its parameters to `params` (default: beside it, NAME.npz): both
    or neither. Each goes to its temporary file first; the parameters are put in place, then the network, so a
    failure anywhere before leaves neither new file."""
    imported: Imported = import_model(model, batch, loss, share)
    _check_imported(model, imported.text, output)
    params = params if params is not None else str(Path(output).with_suffix(".npz"))
    if os.path.abspath(params) == os.path.abspath(output):
        raise DslProgramError(f"the network and its parameters would both be written to '{output}'; give --params")
    for path, what in ((output, "the network"), (params, "the parameter file")):
        _check_target(path, what, replace_readonly)
    check_names(params, imported.arrays)
    path, what = output, "the network"
    try:
        with atomic_output(output, replace_readonly=replace_readonly) as network:
            network.write(imported.text.encode("utf-8"))
            path, what = params, "the parameter file"
            with atomic_output(params, replace_readonly=replace_readonly) as weights:
                write_npz(weights, imported.arrays)
            path, what = output, "the network"
    except OSError as e:
        raise DslProgramError(f"cannot write {what} '{path}': {e.strerror or e}") from None
    count = sum(a.size for name, a in imported.arrays.items() if not name.endswith(("running_mean", "running_var")))
    then = f"deepdsl run {output} --load {params}" if loss else f"deepdsl export {output} --load {params} -o F.onnx"
    lines = [f"wrote {output} (network {imported.network}, {count:,} parameters) and {params}",
             f"  {then}   |   deepdsl compile {output} -o out/"]  # fmt: skip
    if imported.shared:  # said, since an exporter that merges equal initialisers makes untrained clones look so
        which = ", ".join(f"{name} ({nodes} nodes)" for name, nodes in imported.shared)
        lines.append(f"note: one set of weights for several nodes, as the model reads one initialiser there: {which}; "
                     "trained, they stay one (--no-share gives each node its own copy)")  # fmt: skip
    if imported.folded_norms:  # the same outputs, but not the same training: said, with how to export for it
        some = ", ".join(imported.folded_norms[:4]) + (", ..." if len(imported.folded_norms) > 4 else "")
        lines.append(f"note: {len(imported.folded_norms)} convolutions ({some}) hold a batch norm that PyTorch's "
                     "exporter folded into them (eval mode): the outputs are the model's, but trained they have no "
                     "batch norm. To train the model as PyTorch does, export it with its batch norms: "
                     "torch.onnx.export(..., dynamo=True, optimize=False) or (..., dynamo=False, "
                     "do_constant_folding=False)")  # fmt: skip
    if imported.tied:  # said, as the tie is read off the weights' values (docs/onnx.md)
        which = ", ".join(f"{head} (the table of {tok})" for head, tok in imported.tied)
        lines.append(f"note: heads tied to an embedding, as their weight is its table: {which}; trained, they stay one "
                     "(--no-share gives each head its own weight)")  # fmt: skip
    return lines


def _check_imported(model: str, text: str, output: str) -> None:
    """What `deepdsl check` says of the network about to be written (and so what compile and javac take): an
    attribute the model gives that the language refuses (a stride past 2^31 - 1, groups that do not divide) fails
    the import, before anything is written, rather than the next command."""
    try:
        api.compile_source(text, output)
    except DslError as err:
        first = flatten(err)[0]
        line = text.splitlines()[first.span.line - 1].strip() if first.span and first.span.file == output else ""
        at = f" (`{line[:160]}`)" if line else ""
        raise DslProgramError(f"'{model}' imports as a network that does not check: {first.message}{at}") from None


def initial_arrays(program: Program, seed: int | None = None) -> dict[str, np.ndarray]:
    """Every parameter and state array of `program` as the trainer starts them (float32)."""
    seed = program.train.seed if seed is None else seed
    out = {}
    for p in program.graph.params:
        if p.kind in ("param", "state"):
            i = p.init
            out[p.value.name] = init_array(p.value.name, p.value.type.shape, i.kind, i.args, i.fan_in, i.fan_out, seed)
    return out


def export_onnx(
    c: api.Compilation, file: str, sets: dict[str, int | float], load: str | None, output: str, opset: int,
    replace_readonly: bool = False,
) -> list[str]:  # fmt: skip
    """Write the inference program of `file` as ONNX to `output`, with the parameters of `load` or the initial
    ones."""
    _check_target(output, "the ONNX model", replace_readonly)
    api.compile_file(file, sets, c=c)
    assert c.program is not None
    program = c.program
    arrays = initial_arrays(program)
    if load is not None:
        expected = {name: (a.shape, np.dtype(np.float32)) for name, a in arrays.items()}
        expected["opt/iteration"] = ((), np.dtype(np.int64))
        loaded = load_npz(load, expected, ignore_optimizer_state=True)
        arrays.update({k: v for k, v in loaded.items() if k in arrays})
    model = export_graph(infer_program(program.graph), arrays, opset)
    try:
        write_atomically(output, model.SerializeToString(), replace_readonly=replace_readonly)
    except OSError as e:
        raise DslProgramError(f"cannot write the ONNX model '{output}': {e.strerror or e}") from None
    return [f"wrote {output} (ONNX opset {opset}, {len(model.graph.node)} nodes, "
            f"{len(model.graph.initializer)} initialisers; input {program.graph.inputs[0].value.name}, "
            "output predict)"]  # fmt: skip
