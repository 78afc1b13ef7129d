"""networks/vit_tiny.ddsl written in PyTorch, and its parameter count against the hand-derived formula.

    python scripts/vit_tiny_pytorch.py          # needs torch; prints both counts and exits 1 if they differ

`parameter_count` is the formula, itemised layer by layer; tests/networks/test_vit_tiny.py holds the deepdsl
network's count to the same function (PyTorch is not a dependency of the package, so only this script imports
it). Layouts match deepdsl's: Conv2d weight [out, in, k, k], Linear weight [out, in], LayerNorm weight and bias
(deepdsl's NAME.gamma, NAME.beta), the class token [D] and the position embedding [T, D] (PyTorch's carry
leading 1s, the same elements).
"""

from __future__ import annotations

import sys

# the network of networks/vit_tiny.ddsl: CIFAR-10 images, 4x4 patches, width 64, 4 heads, MLP 128, 4 blocks
CONFIG = {"channels": 3, "size": 32, "classes": 10, "patch": 4, "width": 64, "heads": 4, "mlp": 128, "blocks": 4}


def parameter_count(channels: int, size: int, classes: int, patch: int, width: int, heads: int, mlp: int,
                    blocks: int) -> int:  # fmt: skip
    """Trainable parameters of the ViT, by hand: every weight, bias, norm scale and shift, token and embedding."""
    d = width
    tokens = (size // patch) ** 2 + 1  # the patches and the class token
    embed = channels * patch * patch * d + d  # the patch conv's weight and bias
    cls_and_positions = d + tokens * d
    norm = 2 * d  # a LayerNorm's scale and shift
    attention = 4 * (d * d + d)  # q, k, v and the output projection, each a Linear(d, d)
    feed_forward = (d * mlp + mlp) + (mlp * d + d)  # Linear(d, mlp), GELU, Linear(mlp, d)
    block = norm + attention + norm + feed_forward
    head = norm + d * classes + classes  # the final LayerNorm and Linear(d, classes)
    del heads  # the heads split the width: they add no parameters
    return embed + cls_and_positions + blocks * block + head


def pytorch_model(channels: int, size: int, classes: int, patch: int, width: int, heads: int, mlp: int,
                  blocks: int):  # noqa: ANN201  # fmt: skip
    """The same network as a torch.nn.Module (pre-norm blocks, exact GELU, class-token readout)."""
    import torch
    from torch import nn

    d, tokens = width, (size // patch) ** 2 + 1

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n, t, _ = x.shape
            split = lambda y: y.reshape(n, t, heads, d // heads).permute(0, 2, 1, 3)  # noqa: E731
            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            weights = torch.softmax(q @ k.transpose(-2, -1) * (d // heads) ** -0.5, dim=-1)
            return self.proj((weights @ v).permute(0, 2, 1, 3).reshape(n, t, d))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.attention, self.ln2 = nn.LayerNorm(d), Attention(), nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, mlp), nn.GELU(), nn.Linear(mlp, d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attention(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class ViT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Conv2d(channels, d, kernel_size=patch, stride=patch)
            self.cls = nn.Parameter(torch.zeros(1, 1, d))
            self.pos = nn.Parameter(torch.zeros(1, tokens, d))
            self.blocks = nn.Sequential(*(Block() for _ in range(blocks)))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.embed(x).flatten(2).transpose(1, 2)  # [N, patches, d]
            h = torch.cat([self.cls.expand(len(h), -1, -1), h], dim=1) + self.pos
            return self.head(self.ln(self.blocks(h))[:, 0])

    return ViT()


def main() -> int:
    import torch

    model = pytorch_model(**CONFIG)
    counted = sum(p.numel() for p in model.parameters() if p.requires_grad)
    formula = parameter_count(**CONFIG)
    logits = model(torch.zeros(2, CONFIG["channels"], CONFIG["size"], CONFIG["size"]))
    print(f"PyTorch: {counted:,} parameters, output {tuple(logits.shape)}; formula: {formula:,}")
    return 0 if counted == formula else 1


if __name__ == "__main__":
    sys.exit(main())
