"""The models users bring from PyTorch, through ONNX into deepdsl: each exported with PyTorch's default exporter
(dynamo) and the older TorchScript one, imported by `deepdsl import`, its outputs compared with PyTorch's on the
NumPy runner (and the compiled Java program with --java), and fine-tuned a few steps (does the loss fall?).
Prints one table row per model and exporter. PyTorch is never a dependency of deepdsl; run this with a Python that
has torch, torchvision, onnx and onnxscript (the dynamo exporter's), and deepdsl on the path:

    PYTHONPATH=$PWD /work/torchvenv/bin/python scripts/pytorch_onnx_models.py [--only resnet18,vit] [--java]
        [--exporters dynamo,torchscript] [--iters 4] [--keep-norms] [--extended]

Both exporters fold each batch norm that follows a convolution into it in eval mode (the import says so): the
outputs are the model's, the trainable parameters are not. --keep-norms exports as one does to train the model
(the dynamo exporter with optimize=False, the TorchScript one with do_constant_folding=False); the `params` column
compares the import's trainable parameters with the PyTorch model's. --extended adds the torchvision models of
scripts/pytorch_onnx_zoo.py (DenseNet, GoogLeNet, Inception-v3, MNASNet, EfficientNetV2, ResNeXt, MobileNetV3-large
and three segmentation models).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOL = 1e-4
BATCH = 2
VOCAB = 50  # the token ids of gpt2_like
# the fine-tuning step: ResNet-50 at random initialisation, its batch norm over two 64x64 samples (2x2 at the
# last stage), diverges to NaN by the fourth step at 0.001
LR = {"resnet50": 1e-4}
# the dynamo exporter's opset where not its default: from 21 it writes nn.GroupNorm as ONNX's GroupNormalization
OPSET = {"group_norm_op": 21}


def models() -> dict[str, tuple[Callable, tuple]]:
    """name -> (a function making the model in eval mode, the shapes of its inputs)."""
    import torch
    import torchvision
    from torch import nn

    tv = torchvision.models

    # an nn.TransformerEncoder classifier over a sequence of feature vectors. Its two layers are copies of one, equal
    # until trained: the TorchScript exporter in eval mode merges equal initialisers, so that the import gives both
    # one set of weights (each `layer` line called twice, docs/onnx.md): PyTorch's outputs, fine-tuned tied
    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, activation="gelu")
            self.embed = nn.Linear(8, 32)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.head = nn.Linear(32, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.encoder(self.embed(x))[:, 0])

    class GPT(nn.Module):  # GPT-2 in small: token and position embeddings, causal attention by masked_fill, GELU's
        def __init__(self) -> None:  # tanh form (gelu_new), the head tied to the token embedding
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, 32), nn.Embedding(8, 32)
            self.ln1, self.ln2, self.ln_f = nn.LayerNorm(32), nn.LayerNorm(32), nn.LayerNorm(32)
            self.qkv, self.proj, self.fc, self.out = (
                nn.Linear(32, 96),
                nn.Linear(32, 32),
                nn.Linear(32, 128),
                nn.Linear(128, 32),
            )
            self.head = nn.Linear(32, VOCAB, bias=False)
            self.head.weight = self.wte.weight
            self.register_buffer("causal", torch.tril(torch.ones(8, 8)).view(1, 1, 8, 8))

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            b, t = idx.shape
            x = self.wte(idx) + self.wpe(torch.arange(t))
            q, k, v = (z.view(b, t, 4, 8).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(32, dim=2))
            att = (q @ k.transpose(-2, -1)) * (8**-0.5)
            att = torch.softmax(att.masked_fill(self.causal[:, :, :t, :t] == 0, float("-inf")), dim=-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, 32))
            x = x + self.out(nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))
            return self.head(self.ln_f(x))

    class UNet(nn.Module):  # a U-Net-style model: down, up by ConvTranspose and by Resize, a skip concatenated
        def __init__(self) -> None:
            super().__init__()
            self.down = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
            self.pool = nn.MaxPool2d(2)
            self.mid = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU())
            self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
            self.mid2 = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
            self.resize = nn.Upsample(scale_factor=2, mode="nearest")
            self.out = nn.Conv2d(16 + 16, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            d = self.down(x)
            u = self.up(self.mid(self.pool(d))) + d
            # mid2[0] applied twice: one initialiser that both Conv nodes read, one layer called twice on import
            return self.out(torch.cat([self.resize(self.mid2(u)), self.mid2[0](u)], dim=1))

    class Recurrent(nn.Module):
        def __init__(self, kind: str) -> None:
            super().__init__()
            self.rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(6, 12, batch_first=True)
            self.head = nn.Linear(12, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.rnn(x)[0][:, -1])

    class TwoInputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.image = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
            self.side = nn.Linear(5, 4)  # (a module named `meta` trips the dynamo exporter)
            self.head = nn.Linear(8, 3)

        def forward(self, image: torch.Tensor, meta: torch.Tensor) -> torch.Tensor:
            return self.head(torch.cat([self.image(image), torch.relu(self.side(meta))], dim=1))

    def resnet_block(c: int) -> nn.Sequential:  # CycleGAN's: reflect-padded 3x3 convolutions, instance norm
        return nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(c, c, 3), nn.InstanceNorm2d(c), nn.ReLU(),
                             nn.ReflectionPad2d(1), nn.Conv2d(c, c, 3), nn.InstanceNorm2d(c))  # fmt: skip

    class ResnetGenerator(nn.Module):  # CycleGAN / pix2pix's ResNet generator in small, a ReplicationPad2d, circular
        def __init__(self) -> None:
            super().__init__()
            self.down = nn.Sequential(
                nn.ReflectionPad2d(3),
                nn.Conv2d(3, 8, 7),
                nn.InstanceNorm2d(8),
                nn.ReLU(),
                nn.Conv2d(8, 16, 3, stride=2, padding=1),
                nn.InstanceNorm2d(16),
                nn.ReLU(),
            )
            self.circular = nn.Conv2d(16, 16, 3)  # after F.pad(mode="circular"): Pad wrap (dynamo), Slice+Concat
            self.blocks = nn.ModuleList([resnet_block(16), resnet_block(16)])
            self.up = nn.Sequential(
                nn.ConvTranspose2d(16, 8, 3, stride=2, padding=1, output_padding=1),
                nn.InstanceNorm2d(8, affine=True),
                nn.ReLU(),
                nn.ReplicationPad2d((1, 2, 0, 1)),
                nn.Conv2d(8, 8, (2, 4)),
                nn.ReflectionPad2d(3),
                nn.Conv2d(8, 3, 7),
                nn.Tanh(),
            )
            # fmt: skip

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.circular(nn.functional.pad(self.down(x), (1, 1, 1, 1), mode="circular"))
            for block in self.blocks:
                h = h + block(h)
            return self.up(h)

    def group_norm_op() -> nn.Module:  # nn.GroupNorm, which the dynamo exporter writes as GroupNormalization at 21
        m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                          nn.GroupNorm(8, 8), nn.Flatten(), nn.Linear(8 * 8 * 8, 5))  # fmt: skip
        with torch.no_grad():  # a weight and bias per channel that are not ones and zeros, as trained
            for norm in (m[1], m[4]):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)
        return m

    def vit() -> nn.Module:  # vit_b_16 reduced: 32x32 images, 8x8 patches, 2 layers of width 32
        return tv.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32,
                                    mlp_dim=64, num_classes=10)  # fmt: skip

    img = (BATCH, 3, 64, 64)
    return {
        "resnet18": (lambda: tv.resnet18(num_classes=10), (img,)),
        "resnet50": (lambda: tv.resnet50(num_classes=10), (img,)),
        "mobilenet_v2": (lambda: tv.mobilenet_v2(num_classes=10), (img,)),
        "mobilenet_v3_small": (lambda: tv.mobilenet_v3_small(num_classes=10), (img,)),
        "efficientnet_b0": (lambda: tv.efficientnet_b0(num_classes=10), (img,)),
        "squeezenet": (lambda: tv.squeezenet1_1(num_classes=10), (img,)),
        "convnext_tiny": (lambda: tv.convnext_tiny(num_classes=10), (img,)),
        "shufflenet_v2": (lambda: tv.shufflenet_v2_x0_5(num_classes=10), (img,)),
        "regnet_y_400mf": (lambda: tv.regnet_y_400mf(num_classes=10), (img,)),
        "swin_t": (lambda: tv.swin_t(num_classes=10), (img,)),
        "vit": (vit, ((BATCH, 3, 32, 32),)),
        "transformer_encoder": (Encoder, ((BATCH, 7, 8),)),
        "gpt2_like": (GPT, (("tokens", (BATCH, 8)),)),
        "audio_1d": (
            lambda: nn.Sequential(  # nn.Conv1d, BatchNorm1d, MaxPool1d in ceil mode, AvgPool1d
                nn.Conv1d(1, 8, 9, stride=4, padding=4),
                nn.BatchNorm1d(8),
                nn.ReLU(),
                nn.MaxPool1d(3, 2, ceil_mode=True),
                nn.Conv1d(8, 16, 3, padding=2, dilation=2, groups=2),
                nn.ReLU(),
                nn.AvgPool1d(2),
                nn.Flatten(),
                nn.Linear(16 * 12, 6),
            ),
            ((BATCH, 1, 200),),
        ),
        "unet": (UNet, ((BATCH, 3, 16, 16),)),
        "resnet_generator": (ResnetGenerator, ((BATCH, 3, 32, 32),)),
        "group_norm_op": (group_norm_op, ((BATCH, 3, 8, 8),)),
        "upsample_aligned": (
            lambda: nn.Sequential(  # bilinear upsampling with align_corners=True (Resize, 'align_corners')
                nn.Conv2d(3, 8, 3, padding=1),
                nn.ReLU(),
                nn.UpsamplingBilinear2d(scale_factor=2),
                nn.Conv2d(8, 4, 3, padding=1),
                nn.Upsample(scale_factor=3, mode="bilinear", align_corners=True),
            ),
            ((BATCH, 3, 8, 8),),
        ),
        "lstm": (lambda: Recurrent("lstm"), ((BATCH, 5, 6),)),
        "gru": (lambda: Recurrent("gru"), ((BATCH, 5, 6),)),
        "two_inputs": (TwoInputs, ((BATCH, 3, 8, 8), (BATCH, 5))),
        "group_norm": (
            lambda: nn.Sequential(  # nn.GroupNorm and an affine nn.InstanceNorm2d
                nn.Conv2d(3, 16, 3, padding=1),
                nn.GroupNorm(4, 16),
                nn.SiLU(),
                nn.Conv2d(16, 32, 3, stride=2, padding=1),
                nn.InstanceNorm2d(32, affine=True),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(32, 10),
            ),
            ((BATCH, 3, 16, 16),),
        ),
    }


def export(model, xs: tuple, path: Path, exporter: str, keep_norms: bool,  # noqa: ANN001
           opset: int | None = None) -> None:  # fmt: skip
    import torch

    names = [f"x{k}" for k in range(len(xs))] if len(xs) > 1 else ["x"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            # PyTorch's defaults: the weights in a file beside the model (external data), read from its folder
            torch.onnx.export(model, xs, str(path), input_names=names, dynamo=True, external_data=True,
                              verbose=False, optimize=not keep_norms,
                              **({"opset_version": opset} if opset else {}))  # fmt: skip
        else:
            torch.onnx.export(model, xs, str(path), input_names=names, dynamo=False, opset_version=17,
                              do_constant_folding=not keep_norms)  # fmt: skip


def deepdsl_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deepdsl", *args], capture_output=True, text=True, check=False)


def check(name: str, exporter: str, make: Callable, shapes: tuple, folder: Path, iters: int, java: bool,
          keep_norms: bool = False) -> dict:  # fmt: skip
    import torch

    from deepdsl import api
    from deepdsl.backends.numpy_runner import run
    from deepdsl.errors import DslError
    from deepdsl.onnx_import import import_model

    torch.manual_seed(0)
    model = make().eval()
    with torch.no_grad():  # batch norm statistics that are not the identity, as in a trained model
        for q in model.parameters():  # a head initialised to zeros (torchvision's ViT) would hide any difference
            if q.ndim >= 2 and not q.any():
                q.normal_(0, 0.05)
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    rng = np.random.default_rng(0)
    xs = tuple(rng.integers(0, VOCAB, s[1]).astype(np.int64) if s[0] == "tokens" else
               rng.standard_normal(s).astype(np.float32) for s in shapes)  # fmt: skip
    with torch.no_grad():
        want = model(*(torch.from_numpy(x) for x in xs)).numpy()
    row = {"model": name, "exporter": exporter}
    path = folder / f"{name}_{exporter}.onnx"
    t0 = time.perf_counter()
    try:
        export(model, tuple(torch.from_numpy(x) for x in xs), path, exporter, keep_norms, OPSET.get(name))
    except Exception as exc:  # noqa: BLE001 — the exporter's own failure
        return {**row, "result": f"PyTorch's export fails: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"}
    loss = want.ndim in (2, 3)  # classes, or classes per position [N, T, K]
    try:
        got = import_model(path, BATCH, loss)
        program = api.compile_source(got.text, f"{name}.ddsl").program
    except DslError as err:
        lines = str(err).splitlines()
        more = "; ".join(line.strip()[:70] for line in lines[1:4])
        return {
            **row,
            "result": "not imported: " + (lines[0][-120:] if len(lines) == 1 else f"{lines[0][-60:]} {more}"),
        }
    row["import_s"] = time.perf_counter() - t0
    # trainable parameters, each counted once (PyTorch's parameters() lists a tied or shared one once): gpt2_like's
    # tied head imports as full(tied=wte), one table
    theirs, ours = sum(q.numel() for q in model.parameters()), program.graph.parameter_count
    row["params"] = f"{ours:,}" + (" = PyTorch's" if ours == theirs else f" (PyTorch {theirs:,})")
    b = api.build(program)
    feeds = {d.value.name: x for d, x in zip(b.infer.inputs, xs)}  # the inputs in the model's order
    out = run(b.infer, feeds, got.arrays).outputs["predict"]
    scale = max(1.0, float(np.max(np.abs(want))))
    row["diff"] = float(np.max(np.abs(out - want))) / scale
    ddsl, npz = folder / f"{name}_{exporter}.ddsl", folder / f"{name}_{exporter}.npz"
    r = deepdsl_cli("import", str(path), "-o", str(ddsl), "--batch", str(BATCH), *([] if loss else ["--no-loss"]))
    # fine-tuning on one batch (the inputs above; labels drawn, or a target near the output): the loss must fall
    data = folder / f"{name}_{exporter}_data.npz"
    arrays = {d.value.name: x for d, x in zip(b.infer.inputs, xs)}
    if loss:
        arrays[next(d.value.name for d in program.graph.inputs if d.kind == "label")] = rng.integers(
            0, want.shape[-1], want.shape[:-1]).astype(np.int64)  # fmt: skip
    else:
        arrays["target"] = (want + rng.standard_normal(want.shape).astype(np.float32)).astype(np.float32)
    np.savez(data, **arrays)
    if r.returncode == 0:
        r = deepdsl_cli("run", str(ddsl), "--load", str(npz), "--iters", str(iters), "--device", "cpu", "--json",
                        "--data", f"npz:{data}", "--lr", str(LR.get(name, 0.001)))  # fmt: skip
    if r.returncode == 0:
        losses = json.loads(r.stdout)["losses"]
        row["loss"] = f"{losses[0]:.3f} -> {losses[-1]:.3f}" + (" (falls)" if losses[-1] < losses[0] else "")
    else:
        said = (r.stderr or r.stdout).strip().splitlines()
        row["loss"] = "run failed: " + next((line for line in said if "error" in line), said[-1])[-110:]
    if java:
        row["java"] = java_diff(ddsl, npz, folder, data, want, scale)
    row["result"] = "ok" if row["diff"] <= TOL else f"differs by {row['diff']:.2e} of the output's scale"
    return row


def java_diff(ddsl: Path, npz: Path, folder: Path, data: Path, want: np.ndarray, scale: float) -> str:
    """The compiled Java program's prediction for the same inputs (`deepdsl compile`, javac, `--predict`) against
    PyTorch's, relative to the output's scale."""
    out = folder / f"{ddsl.stem}_java"
    r = deepdsl_cli("compile", str(ddsl), "-o", str(out))
    if r.returncode != 0:
        return "compile failed: " + (r.stderr or r.stdout).strip().splitlines()[-1][:60]
    build = out / "build"
    main = next(out.glob("*.java")).stem
    c = subprocess.run(["javac", "-d", str(build), "-sourcepath", str(out), str(out / f"{main}.java")],
                       capture_output=True, text=True, check=False)  # fmt: skip
    if c.returncode != 0:
        return "javac failed"
    pred = folder / f"{ddsl.stem}_java_predict.npz"
    j = subprocess.run(["java", "-cp", str(build), main, "--predict", str(pred), "--load", str(npz), "--data",
                        f"npz:{data}"], capture_output=True, text=True, check=False)  # fmt: skip
    if j.returncode != 0:
        return "java failed: " + (j.stderr or j.stdout).strip()[-60:]
    diff = float(np.max(np.abs(np.load(pred)["predict"] - want))) / scale
    return f"{diff:.1e}" + (" ok" if diff <= TOL else " DIFFERS")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated model names (default: all)")
    p.add_argument("--exporters", default="dynamo,torchscript")
    p.add_argument("--iters", type=int, default=4, help="fine-tuning steps of `deepdsl run`")
    p.add_argument("--java", action="store_true", help="also compile the Java program and train it 2 steps")
    p.add_argument("--keep-norms", action="store_true", help="export with the batch norms kept, to train the model")
    p.add_argument("--extended", action="store_true", help="also the models of scripts/pytorch_onnx_zoo.py")
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    import torch
    from pytorch_onnx_zoo import more_models

    more = more_models(BATCH)
    table = models() | more
    names = [n for n in a.only.split(",") if n] or [n for n in table if a.extended or n not in more]
    print(f"torch {torch.__version__}; batch {BATCH}; within {TOL} of the output's scale is ok")
    print(f"{'model':<20} {'exporter':<12} {'result':<40} {'diff/scale':>10} {'export+import s':>8}  "
          f"{'params':<24} fine-tune")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            make, shapes = table[name]
            for exporter in a.exporters.split(","):
                row = check(name, exporter, make, shapes, Path(tmp), a.iters, a.java, a.keep_norms)
                diff = f"{row['diff']:.1e}" if "diff" in row else ""
                secs = f"{row['import_s']:.2f}" if "import_s" in row else ""
                print(f"{name:<20} {exporter:<12} {row['result']:<40} {diff:>10} {secs:>8}  "
                      f"{row.get('params', ''):<24} {row.get('loss', '')}"
                      + (f"  java: {row['java']}" if "java" in row else ""), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
