"""`deepdsl run`, `eval` and `predict`: pick a device (devices.py), load data, train a Build (api.build), test, save;
report progress through a callback."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from deepdsl.backends.cuda.runner import Driver
from deepdsl.build import Build
from deepdsl.checkpoint import check_writable, save_npz
from deepdsl.data import parse_data_flag
from deepdsl.data.named import Samples, batch_size, fields_of, load_samples
from deepdsl.devices import (
    CPU,
    cuda_not_used,
    given_line,
    open_device,
    precision_json,
    precision_line,
    trainer_arch,
    with_graph,
)
from deepdsl.distributed import DistributedError, GpuComm, MpiComm, Session, startup_check
from deepdsl.errors import DslProgramError
from deepdsl.frontend.train import MAX_ITERATIONS
from deepdsl.trainer import Trainer, TrainResult

BAR = 24


def _tested(loss: float, accuracy: float | None) -> str:
    """What a test reports: the loss always, the accuracy where the loss classifies a label."""
    return f"loss {loss:.4f}" + (f", accuracy {100 * accuracy:.2f}%" if accuracy is not None else "")


def _data_label(kind: str, args: dict[Any, Any], seed: int) -> str:
    """The data source as the progress header names it: synthetic data with the seed it is made from (its own,
    `--data synthetic:SEED`, or the program's), so that `synthetic:5` says what the 5 is."""
    if kind != "synthetic":
        return kind
    own = args.get("seed", args.get(0))
    return f"synthetic (seed {seed if own is None else own})"


def metric_lines(m: dict[str, float]) -> list[str]:
    """The test phase's metrics (Trainer.measure) as the lines `run` and `eval` print at the end."""
    lines = [f"test loss: {m['test_loss']:.4f}"]
    if "test_accuracy" in m:
        lines.append(f"test accuracy: {100 * m['test_accuracy']:.2f}%")
    if "test_top5_accuracy" in m:
        lines.append(f"test top-5 accuracy: {100 * m['test_top5_accuracy']:.2f}%")
    if "test_mae" in m:
        lines.append(f"test mean absolute error: {m['test_mae']:.4f}")
    return lines


def repeats(data: Samples, batch: int, kind: str) -> list[str]:
    """The warnings of a batch larger than the training (or test) set: each batch then repeats samples (positions
    wrap around the set, docs/formats.md), a documented choice rather than an error, said once."""
    out = []
    for what, size in (("training", data.size), ("test", data.test_size if data.test is not None else 0)):
        if 0 < size < batch:
            out.append(f"the batch of {batch} is larger than the {size} {what} samples of the {kind} data: each "
                       "batch repeats samples")  # fmt: skip
    return out


def run_training(
    build: Build, iters: int | None = None, data_flag: str | None = None, load: str | None = None,
    save: str | None = None, device: str = "auto", double: bool = False, report: Callable[[str], None] | None = None,
    driver: Driver | None = None, kernels: str = "auto", graphs: bool = True, replace_readonly: bool = False,
    warn: Callable[[str], None] | None = None, session: Session | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Train `build` and report through `report` (warnings through `warn`: a batch larger than the data); `driver`
    runs it on that GPU instead of picking by `device` and `kernels` (open_device); `graphs`: on the GPU, the train
    step as a CUDA graph from its second run on; `replace_readonly`: the save may replace a read-only file
    (files.py); `session`: this process's rank of a data-parallel run, or its micro-batches (deepdsl/distributed/;
    the build then has the data-parallel program, Options.buckets)."""
    if iters is not None and not 0 <= iters <= MAX_ITERATIONS:  # (the CLI refuses it as a usage error first)
        raise DslProgramError(f"--iters takes a whole number in [0, {MAX_ITERATIONS}], not '{iters}'")
    save = save or build.program.train.save  # --save, else the train block's
    if save:
        check_writable(save, replace_readonly=replace_readonly)  # now, not after the training
    if double and build.precision == "bf16":
        raise DslProgramError("--float64 runs fp32 programs in float64; this one is compiled for bf16 "
                              "(--precision fp32 with --float64)")  # fmt: skip
    if driver:
        gpu, description, note = driver, given_line(driver), None
    elif session is not None and isinstance(session.comm, GpuComm):  # a data-parallel rank: its local rank's GPU
        try:
            gpu, description, note = open_device(device, double, kernels, build.tf32, gpu=session.world.local_rank)
        except DslProgramError as err:  # the other ranks would wait for this one: stop them
            raise DistributedError(f"rank {session.rank}: {err.message}", abort=session.world.size > 1) from None
    else:
        gpu, description, note = open_device(device, double, kernels, build.tf32)
    fallback = device == "auto" and driver is None  # a GPU that cannot take the program leaves it to the CPU
    try:
        result = _train(
            build, gpu, description, iters, data_flag, load, save, double, report, fallback, note, graphs,
            replace_readonly, warn, session,
        )  # fmt: skip
        if session is not None and isinstance(session.comm, GpuComm):
            session.comm.close()  # NCCL's communicator before the GPU's context goes (a failure: the caller aborts)
    finally:
        if gpu is not None:
            gpu.close()
    on_gpu = result.gpu_memory_bytes is not None
    out: dict[str, Any] = {"device": "cuda" if on_gpu else "cpu",
                           **precision_json(build, gpu.arch if on_gpu and gpu is not None else None),
                           "losses": result.losses}  # fmt: skip
    if result.loss_terms:
        out["loss_terms"] = result.loss_terms
    if result.learning_rates is not None:
        out["learning_rates"] = result.learning_rates
    if result.test_loss is not None:
        out["test_loss"] = result.test_loss
    if result.test_accuracy is not None:
        out["test_accuracy"] = result.test_accuracy
    out.update((k, v) for k, v in result.test_metrics.items() if k not in ("test_loss", "test_accuracy"))
    out["peak_bytes"] = result.peak_bytes
    out["arena_bytes"] = result.arena_bytes
    out["seconds_per_iter"] = result.seconds_per_iter
    out["step_seconds"] = result.step_seconds
    if result.gpu_memory_bytes is not None:
        out["gpu_memory_bytes"] = result.gpu_memory_bytes
        out["gpu_planned_bytes"] = result.gpu_planned_bytes
        out["gpu_vendor_workspace_bytes"] = result.gpu_vendor_workspace_bytes
        out["gpu_vendor_scratch_bytes"] = result.gpu_vendor_scratch_bytes
        out["gpu_graph"] = result.gpu_graph
        out["gpu_deterministic"] = result.gpu_deterministic
        out["gpu_convolutions"] = result.gpu_convolutions
    return out


def evaluate(
    build: Build, load: str, data_flag: str | None = None, device: str = "auto",
    report: Callable[[str], None] | None = None, driver: Driver | None = None, kernels: str = "auto",
) -> dict[str, Any]:  # fmt: skip
    """`deepdsl eval`: the test loss (and accuracy, for a classifier) of the parameters in `load`, no training;
    `driver` runs it on that GPU instead of picking by `device`."""
    kind, args = _source(build, data_flag)
    data = load_samples(kind, args, fields_of(build.program.graph.inputs), build.seed)
    if data.test is None:
        raise DslProgramError(f"the {kind} data has no test set to evaluate on (an npz file: the NAME_test arrays)")
    with _loaded(build, data, kind, driver, device, load, report, kernels) as trainer:
        measured = trainer.measure()
        assert measured is not None
        arch = trainer_arch(trainer)
    out: dict[str, Any] = {"device": "cuda" if arch else "cpu", **precision_json(build, arch), **measured}
    if report:
        for line in metric_lines(measured):
            report(line)
    return out


def predict(
    build: Build, load: str, output: str, data_flag: str | None = None, device: str = "auto",
    report: Callable[[str], None] | None = None, driver: Driver | None = None, kernels: str = "auto",
    replace_readonly: bool = False, split: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """`deepdsl predict`: `predict` of the parameters in `load` for every sample of one split of the data (the
    arrays named after the inputs `predict` reads; other arrays are ignored), written to `output` as the npz array
    `predict` (docs/formats.md), atomically. `split` is ``test`` or ``train``; None: the test split where the data
    has one, else the training split (a file of inputs to predict)."""
    if build.infer is None:
        raise DslProgramError("the network defines no `predict`, so there is nothing to predict")
    check_writable(output, replace_readonly=replace_readonly)  # now, not after the work
    kind, args = _source(build, data_flag)
    data = load_samples(kind, args, fields_of(build.infer.inputs), build.seed, other_arrays=True)
    if split is None:
        split = "test" if data.test is not None else "train"
    if split == "test" and data.test is None:
        raise DslProgramError(f"the {kind} data has no test split to predict (--split train predicts its training "
                              "samples)")  # fmt: skip
    arrays = data.test if split == "test" else data.train
    assert arrays is not None
    with _loaded(build, data, kind, driver, device, load, report, kernels) as trainer:
        values = trainer.predict(Samples(arrays))
        arch = trainer_arch(trainer)
    save_npz(output, {"predict": values}, replace_readonly=replace_readonly)
    if report:
        report(f"wrote {output}: predict {list(values.shape)} for {len(values)} samples (the {split} split)")
    return {"device": "cuda" if arch else "cpu", **precision_json(build, arch), "output": output, "split": split,
            "samples": len(values), "shape": list(values.shape)}  # fmt: skip


def _source(build: Build, data_flag: str | None) -> tuple[str, dict[str, Any]]:
    cfg = build.program.train
    return parse_data_flag(data_flag) if data_flag else (cfg.data[0], dict(cfg.data[1]))


@contextmanager
def _loaded(
    build: Build, data: Samples, kind: str, driver: Driver | None, device: str, load: str,
    report: Callable[[str], None] | None, kernels: str = "auto",
) -> Iterator[Trainer]:  # fmt: skip
    """A trainer of `build` on `data` holding the parameters of `load`, on `driver` (else the GPU `device` picks)
    where it takes the program (under `auto`, else the CPU), the device line reported; the GPU is closed after."""
    gpu, description, note = (driver, given_line(driver), None) if driver else open_device(device, kernels=kernels,
                                                                                         tf32=build.tf32)  # fmt: skip
    try:
        trainer = Trainer(build, data)
        if gpu is not None:
            try:
                trainer.use_gpu(gpu)
            except DslProgramError as err:
                if device != "auto":
                    raise
                description, note = CPU, cuda_not_used(err.message)
        trainer.load(load)
        if report:
            if note:
                report(note)
            report(f"device: {description}  network {build.program.graph.name}  data {kind}"
                   + precision_line(build, trainer_arch(trainer)))  # fmt: skip
        yield trainer
    finally:
        if gpu is not None:
            gpu.close()


def _train(
    build: Build, gpu: Driver | None, description: str, iters: int | None, data_flag: str | None, load: str | None,
    save: str | None, double: bool, report: Callable[[str], None] | None, fallback: bool = False,
    note: str | None = None, graphs: bool = True, replace_readonly: bool = False,
    warn: Callable[[str], None] | None = None, session: Session | None = None,
) -> TrainResult:  # fmt: skip
    program = build.program
    cfg = program.train
    kind, args = _source(build, data_flag)
    batch = batch_size(program.graph)
    n = iters if iters is not None else cfg.iterations
    if n == 0:  # nothing trained, nothing tested: no data read (`run --iters 0 --save` writes the initial state)
        data, source = Samples({}), "none (no iterations)"
    else:
        data, source = load_samples(kind, args, fields_of(program.graph.inputs), build.seed), None
        if warn:
            for line in repeats(data, batch, kind):
                warn(line)
    trainer = Trainer(build, data, np.float64 if double else np.float32, session)
    if gpu is not None:
        try:
            trainer.use_gpu(gpu, graphs)
        except DslProgramError as err:
            if not fallback:
                raise
            description, note = CPU, cuda_not_used(err.message)
    graph = trainer.gpu.graph if trainer.gpu is not None else None
    if graph is not None:
        description = with_graph(description, graph)
    if load:
        trainer.load(load)
    pids = None
    # same program, same parameters on every rank (on the GPU: through NCCL, once it is connected)
    if session is not None and (isinstance(session.comm, MpiComm) or getattr(session.comm, "reducer", None)):
        state = trainer.state()
        assert isinstance(session.comm, (MpiComm, GpuComm))
        pids = startup_check(session.comm, build.train_plan.graph, state, "loaded state" if load else "parameters")
    if report:
        if note:
            report(note)
        source = source or _data_label(kind, args, build.seed)
        report(f"device: {description}  network {program.graph.name}  batch {batch}  data {source}"
               + precision_line(build, trainer_arch(trainer)))  # fmt: skip
        if session is not None:
            w, m = session.world, session.micro_batches
            reducer = getattr(session.comm, "reducer", None)  # on the GPU: NCCL's
            report(f"data parallel: {w.size} rank(s) [{w.source}] x {m} micro-batch(es) of {batch}: global batch "
                   f"{w.size * m * batch}" + (f" ({reducer.description})" if reducer is not None else ""))  # fmt: skip
            if pids:
                report("process ids: " + ", ".join(f"rank {r} {pid}" for r, pid in enumerate(pids)))

    # what a batch holds, for the progress line: images where the first input is [N, C, H, W]
    first = next((d.value.type for d in program.graph.inputs if d.kind == "input"), None)
    unit = "images" if first is not None and len(first.shape) == 4 else "samples"

    def on_step(k: int, loss: float, seconds: float) -> None:
        if report:
            done = (k + 1) * BAR // max(n, 1)
            samples = batch * (session.shards_per_step if session is not None else 1)  # the global batch
            rate = samples / seconds if seconds > 0 else math.inf
            terms = "".join(f"{t} {v:.4f}  " for t, v in trainer.last_terms.items())  # a loss of several terms
            report(f"[{'#' * done}{'.' * (BAR - done)}] iter {k + 1:>{len(str(n))}}/{n}  loss {loss:.4f}  "
                   f"{terms}{rate:,.0f} {unit}/s")  # fmt: skip

    def on_test(k: int, loss: float, accuracy: float | None) -> None:
        if report:
            report(f"test after {k + 1} iterations: {_tested(loss, accuracy)} ({cfg.test_iterations} batches)")

    result = trainer.train(n, on_step, on_test, save, replace_readonly)
    if save:
        trainer.save(save, replace_readonly)
    if report:
        if trainer.gpu is not None and trainer.gpu.graph != graph:  # the capture failed: call for call from then on
            report(f"graph: {trainer.gpu.graph}")
        for line in metric_lines(result.test_metrics) if result.test_metrics else ():
            report(line)
        if save:
            report(f"saved: {save}")
    return result
