"""networks/gpt_tiny.ddsl written in PyTorch, and its parameter count against the hand-derived formula.

    python scripts/gpt_tiny_pytorch.py          # needs torch; prints both counts and exits 1 if they differ

`parameter_count` is the formula, itemised layer by layer; tests/networks/test_gpt_tiny.py holds the deepdsl
network's count to the same function (PyTorch is not a dependency of the package, so only this script imports
it). Layouts match deepdsl's: Embedding weight [V, D] (deepdsl's model.embed.W), the position embedding [T, D]
(model.positions1.pos), Linear weight [out, in], LayerNorm weight and bias (deepdsl's NAME.gamma, NAME.beta).
The head is untied: a Linear(D, V) with its own weight and bias, not the token embedding's transpose.
"""

from __future__ import annotations

import sys

# the network of networks/gpt_tiny.ddsl: 65 characters, context 64, width 64, 4 heads, MLP 256, 4 blocks
CONFIG = {"vocab": 65, "context": 64, "width": 64, "heads": 4, "mlp": 256, "blocks": 4}


def parameter_count(vocab: int, context: int, width: int, heads: int, mlp: int, blocks: int) -> int:
    """Trainable parameters of the GPT, by hand: every embedding, weight, bias, norm scale and shift."""
    d = width
    embeddings = vocab * d + context * d  # token embedding [V, D] and learned positions [T, D]
    norm = 2 * d  # a LayerNorm's scale and shift
    attention = 4 * (d * d + d)  # q, k, v and the output projection, each a Linear(d, d)
    feed_forward = (d * mlp + mlp) + (mlp * d + d)  # Linear(d, mlp), GELU, Linear(mlp, d)
    block = norm + attention + norm + feed_forward
    head = norm + d * vocab + vocab  # the final LayerNorm and the untied Linear(d, vocab)
    del heads  # the heads split the width: they add no parameters
    return embeddings + blocks * block + head


def pytorch_model(vocab: int, context: int, width: int, heads: int, mlp: int, blocks: int):  # noqa: ANN201
    """The same network as a torch.nn.Module (pre-norm blocks, causal attention, exact GELU, untied head)."""
    import torch
    from torch import nn

    d = width

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v, self.proj = (nn.Linear(d, d) for _ in range(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n, t, _ = x.shape
            split = lambda y: y.reshape(n, t, heads, d // heads).permute(0, 2, 1, 3)  # noqa: E731
            q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
            scores = q @ k.transpose(-2, -1) * (d // heads) ** -0.5
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()  # key j <= query i
            weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
            return self.proj((weights @ v).permute(0, 2, 1, 3).reshape(n, t, d))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.attention, self.ln2 = nn.LayerNorm(d), Attention(), nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, mlp), nn.GELU(), nn.Linear(mlp, d))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attention(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.zeros(context, d))
            self.blocks = nn.Sequential(*(Block() for _ in range(blocks)))
            self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            return self.head(self.ln(self.blocks(self.embed(tokens) + self.pos)))  # scores [N, T, V]

    return GPT()


def main() -> int:
    import torch

    model = pytorch_model(**CONFIG)
    counted = sum(p.numel() for p in model.parameters() if p.requires_grad)
    formula = parameter_count(**CONFIG)
    scores = model(torch.zeros(2, CONFIG["context"], dtype=torch.long))
    print(f"PyTorch: {counted:,} parameters, scores {tuple(scores.shape)}; formula: {formula:,}")
    return 0 if counted == formula else 1


if __name__ == "__main__":
    sys.exit(main())
