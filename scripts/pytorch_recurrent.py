"""deepdsl's `lstm` and `gru` against PyTorch's nn.LSTM / nn.GRU over a few SGD steps, from the same weights.

    PYTHONPATH=$PWD python scripts/pytorch_recurrent.py [--steps 5] [--dtype float64|float32] [--onnx]

Builds networks/examples/lstm_classifier.ddsl (lstm(H) -> gru(H, sequences=false) -> full(K), cross-entropy), takes
deepdsl's initial parameters (the train block's seed, the initialisers the NumPy runner and the Java program use),
loads them unchanged into torch (rnn.W_ih -> weight_ih_l0, rnn.W_hh -> weight_hh_l0, rnn.b_ih -> bias_ih_l0, ...),
then trains both with plain SGD on the same batches and prints, per step, the two losses and, at the end, the
largest parameter difference. A second network checks the other settings: gru(H) every step -> lstm(H,
sequences=false, bias=false) -> full. Exits 1 when a difference is past the tolerance (1e-9 in float64, 1e-4 in
float32). With --onnx it also exports nn.LSTM / nn.GRU with both of torch.onnx's exporters (TorchScript and dynamo),
imports them with `deepdsl import` and compares deepdsl's output with PyTorch's. PyTorch is no dependency of
deepdsl: only this script imports it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "networks" / "examples" / "lstm_classifier.ddsl"
OTHER = """network Other
const N = 6
input x : [N, 7, 5]
label y : [N] classes 3
layer rnn = gru(9)
layer rnn2 = lstm(4, sequences=false, bias=false)
layer fc = full(3)
loss = softmax_cross_entropy(fc(rnn2(rnn(x))), y)
"""
LR = 0.5


def deepdsl_setup(text: str, file: str, dtype: type):  # noqa: ANN201
    from deepdsl import api
    from deepdsl.autodiff import train_program
    from deepdsl.initializers import init_array

    graph = api.compile_source(text, file, stop_at="graph").program.graph
    program = train_program(graph, ("sgd", (("lr", LR), ("momentum", 0.0), ("weight_decay", 0.0), ("clip", 0.0))))
    params = {
        p.value.name: init_array(p.value.name, p.value.type.shape, p.init.kind, p.init.args, p.init.fan_in,
                                 p.init.fan_out, 1, dtype)  # the train block's seed 1
        for p in graph.params
    }  # fmt: skip
    shapes = {d.value.name: (d.value.type.shape, d.classes) for d in graph.inputs}
    return program, params, shapes


def torch_model(kinds: list[tuple[str, int, int, bool, bool]], d_out: tuple[int, int]):  # noqa: ANN201
    """kinds: (lstm|gru, input size, hidden, sequences, bias) per recurrent layer, then Linear(d_out)."""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnns = nn.ModuleList(
                (nn.LSTM if k == "lstm" else nn.GRU)(i, h, batch_first=True, bias=b) for k, i, h, _, b in kinds
            )
            self.seq = [s for *_, s, _ in kinds]
            self.fc = nn.Linear(*d_out)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for rnn, seq in zip(self.rnns, self.seq):
                out, _ = rnn(x)  # zero initial states
                x = out if seq else out[:, -1]
            return self.fc(x)

    return Net()


def load(net, params: dict, names: list[str]) -> None:  # noqa: ANN001
    import torch

    with torch.no_grad():
        for rnn, name in zip(net.rnns, names):
            for ours, theirs in (("W_ih", "weight_ih_l0"), ("W_hh", "weight_hh_l0"), ("b_ih", "bias_ih_l0"),
                                 ("b_hh", "bias_hh_l0")):  # fmt: skip
                if f"{name}.{ours}" in params:
                    getattr(rnn, theirs).copy_(torch.from_numpy(params[f"{name}.{ours}"]))
        net.fc.weight.copy_(torch.from_numpy(params["fc.W"]))
        net.fc.bias.copy_(torch.from_numpy(params["fc.b"]))


def compare(label: str, text: str, file: str, kinds: list, names: list[str], steps: int, dtype: type) -> float:
    import torch

    from deepdsl.backends.numpy_runner import run

    program, params, shapes = deepdsl_setup(text, file, dtype)
    (xshape, _), (yshape, classes) = shapes["x"], shapes["y"]
    net = torch_model(kinds, (params["fc.W"].shape[1], params["fc.W"].shape[0])).to(
        torch.float64 if dtype == np.float64 else torch.float32
    )
    load(net, params, names)
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    rng = np.random.default_rng(7)
    worst = 0.0
    print(f"{label}: {', '.join(f'{k}(hidden={h}, sequences={s}, bias={b})' for k, _, h, s, b in kinds)}, "
          f"x {list(xshape)}, SGD lr={LR}, {np.dtype(dtype).name}")  # fmt: skip
    for step in range(steps):
        x = rng.standard_normal(xshape).astype(dtype)
        y = rng.integers(0, classes, yshape)
        result = run(program, {"x": x, "y": y}, params, dtype)
        ours = float(result.outputs["loss"])
        params = {k: result.updates.get(k, v) for k, v in params.items()}
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        theirs = float(loss.detach())
        worst = max(worst, abs(ours - theirs))
        print(f"  step {step}: loss deepdsl {ours:.12f}  pytorch {theirs:.12f}  difference {abs(ours - theirs):.2e}")
    state = {k: v.detach().numpy() for k, v in net.state_dict().items()}
    largest = 0.0
    for k, rnn_name in enumerate(names):
        for ours, theirs in (("W_ih", "weight_ih_l0"), ("W_hh", "weight_hh_l0"), ("b_ih", "bias_ih_l0"),
                             ("b_hh", "bias_hh_l0")):  # fmt: skip
            if f"{rnn_name}.{ours}" in params:
                diff = np.abs(params[f"{rnn_name}.{ours}"] - state[f"rnns.{k}.{theirs}"]).max()
                largest = max(largest, float(diff))
    largest = max(largest, float(np.abs(params["fc.W"] - state["fc.weight"]).max()),
                  float(np.abs(params["fc.b"] - state["fc.bias"]).max()))  # fmt: skip
    print(f"  largest loss difference {worst:.2e}, largest parameter difference after {steps} steps {largest:.2e}")
    return max(worst, largest)


def onnx_import_check(folder: Path) -> float:
    """nn.LSTM / nn.GRU (batch_first) exported by both of torch.onnx's exporters, imported by `deepdsl import`,
    run by deepdsl's NumPy runner against PyTorch's forward pass: the largest difference."""
    import torch
    from torch import nn

    from deepdsl import api
    from deepdsl.backends.numpy_runner import run
    from deepdsl.onnx_import import import_model

    class Model(nn.Module):
        def __init__(self, kind: str, last: bool) -> None:
            super().__init__()
            self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(5, 7, batch_first=True)
            self.fc = nn.Linear(7, 3)
            self.last = last

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y, _ = self.rnn(x)
            return self.fc(y[:, -1]) if self.last else y

    worst = 0.0
    for kind in ("lstm", "gru"):
        for last in (True, False):
            for dynamo in (False, True):
                torch.manual_seed(1)
                m = Model(kind, last).eval()
                x = torch.randn(4, 6, 5)
                path = folder / f"{kind}_{last}_{dynamo}.onnx"
                torch.onnx.export(m, (x,), str(path), input_names=["x"], dynamo=dynamo, opset_version=18 if dynamo
                                  else 17, **({} if dynamo else {"dynamic_axes": {"x": {0: "N"}}}))  # fmt: skip
                got = import_model(path, 4, loss=last)
                program = api.compile_source(got.text, "imported.ddsl").program
                b = api.build(program)
                ours = run(b.infer, {b.infer.inputs[0].value.name: x.numpy()}, got.arrays).outputs["predict"]
                with torch.no_grad():
                    theirs = m(x).numpy()
                diff = float(np.abs(ours - theirs).max())
                worst = max(worst, diff)
                layer = next(line for line in got.text.splitlines() if f"= {kind}(" in line)
                print(
                    f"  torch.onnx.export(dynamo={dynamo}) of nn.{kind.upper()}, "
                    f"{'y[:, -1] -> Linear' if last else 'every step'}: `{layer}`, largest difference {diff:.2e}"
                )
    return worst


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64")
    parser.add_argument("--onnx", action="store_true", help="also import torch.onnx exports of nn.LSTM / nn.GRU")
    args = parser.parse_args()
    dtype = np.float64 if args.dtype == "float64" else np.float32
    import torch

    torch.manual_seed(0)
    example = [("lstm", 12, 32, True, True), ("gru", 32, 32, False, True)]
    other = [("gru", 5, 9, True, True), ("lstm", 9, 4, False, False)]
    worst = max(
        compare("networks/examples/lstm_classifier.ddsl", EXAMPLE.read_text(), str(EXAMPLE), example,
                ["rnn", "rnn2"], args.steps, dtype),
        compare("other", OTHER, "other.ddsl", other, ["rnn", "rnn2"], args.steps, dtype),
    )  # fmt: skip
    tol = 1e-9 if dtype == np.float64 else 1e-4
    print(f"largest difference {worst:.2e} ({'within' if worst <= tol else 'PAST'} {tol:g})")
    if args.onnx:
        import tempfile

        print("deepdsl import of PyTorch's ONNX exports, against PyTorch (float32):")
        with tempfile.TemporaryDirectory() as folder:
            imported = onnx_import_check(Path(folder))
        print(f"largest difference {imported:.2e} ({'within' if imported <= 1e-5 else 'PAST'} 1e-05)")
        return 0 if worst <= tol and imported <= 1e-5 else 1
    return 0 if worst <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
