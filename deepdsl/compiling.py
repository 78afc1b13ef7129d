"""`deepdsl compile`'s work for the command line: a Build's Java program (the class, its CUDA source and the
runtime), its PTX for the GPU architectures asked for, and its Maven project, written; returns the lines the CLI
prints. The CLI parses and checks the options; this module runs the backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

from deepdsl import api
from deepdsl.backends import java
from deepdsl.errors import DslProgramError

__all__ = ["BadTarget", "java_target", "write_program"]


class BadTarget(DslProgramError):
    """An option that names what cannot be written: `-o` with another class's file name, an `--arch` the CUDA
    compiler does not know (the CLI's usage errors, exit 2)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def java_target(output: str, name: str) -> Path:
    """The folder `-o output` names for class `name`: `DIR`, or `DIR/Name.java` (a DslProgramError for another
    file name)."""
    out = Path(output)
    if out.suffix != ".java":
        return out
    if out.stem != name:
        raise BadTarget("-o", f"-o {output}: the class is {name}, so the file must be named {name}.java")
    return out.parent


def ptx_modules(source: str, name: str, archs: tuple[str, ...]) -> dict[str, str]:
    """`source` (the program's CUDA) compiled to PTX for each of `archs` with NVRTC or nvcc; a DslProgramError
    naming what to install when there is no compiler; BadTarget for the architectures it does not know."""
    from deepdsl.backends import cuda

    which = cuda.compiler()  # no compiler: a DslError with what to install (exit 1)
    known = cuda.supported_archs()
    unknown = [a for a in archs if known is not None and a not in known]
    if unknown:
        raise BadTarget("--arch", f"{which} does not compile for {', '.join(unknown)}; it knows "
                                  f"{', '.join(known or ())}")  # fmt: skip
    return {arch: cuda.ptx(source, arch, f"{name}.cu") for arch in archs}


def write_program(
    b: api.Build, output: str | None, maven: str | None, workspace_limit: int, archs: tuple[str, ...],
    replace_readonly: bool = False,
) -> Iterator[str]:  # fmt: skip
    """Write `b`'s Java program into the folder `output` names (java_target) and/or the Maven project `maven`,
    with PTX for `archs` (none: the program compiles its `.cu` with NVRTC when it starts); yields what was
    written and how to build it, a line at a time. Every target is checked before anything is written."""
    name = java.class_name(b.program.graph.name)
    folder = java_target(output, name) if output is not None else None
    # the precision compiled in (--precision, else the train block's): the program's default for its --precision
    program = dataclasses.replace(b.program, train=dataclasses.replace(b.program.train, precision=b.precision))
    prog = java.java_program(program, b.train_plan, b.infer_plan, b.eval_plan, workspace_limit,
                             b.options.deterministic)  # fmt: skip
    modules = ptx_modules(prog.cuda, name, archs) if archs else {}
    if folder is not None:
        java.write_sources(folder, prog, replace_readonly=replace_readonly)
        yield (f"wrote {folder / (name + '.java')}, {folder / (name + '.cu')} and the runtime under "
               f"{folder / 'deepdsl' / 'runtime'}")  # fmt: skip
        for path in java.write_ptx(folder, name, modules, replace_readonly):
            yield f"wrote {path}"
        if not modules:
            yield f"no PTX (--ptx writes it): the CUDA device compiles {name}.cu with NVRTC when it starts"
        for line in java.build_commands(folder, name):
            yield f"  {line}"
    if maven is not None:
        resources = java.write_maven(Path(maven), prog, replace_readonly, data_parallel=b.options.buckets is not None)
        java.write_ptx(resources, name, modules, replace_readonly)
        jar = f"target/{name.lower()}-1.0.jar"
        yield f"wrote the Maven project {maven}: cd {maven} && mvn -q package && java -jar {jar}"
