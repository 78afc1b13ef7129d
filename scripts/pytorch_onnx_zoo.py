"""More torchvision models for scripts/pytorch_onnx_models.py (`--extended`): the classification and segmentation
families its default list leaves out, at small inputs (64×64; Inception-v3 at 96×96, its smallest that reaches the
last block with a window of one). Each is built in eval mode with random weights, as the default list's are; a
segmentation model's dict output is reduced to its class scores averaged over the image, so that it has a label
and fine-tunes like the rest. Imported by the script, never by deepdsl."""

from __future__ import annotations

from collections.abc import Callable


def more_models(batch: int) -> dict[str, tuple[Callable, tuple]]:
    """name -> (a function making the model in eval mode, the shapes of its inputs)."""
    import torchvision
    from torch import nn

    tv, seg = torchvision.models, torchvision.models.segmentation
    img = (batch, 3, 64, 64)

    class Scores(nn.Module):  # a segmentation model's "out" [N, K, H, W] averaged over H and W: [N, K]
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, x):  # noqa: ANN001, ANN201
            return self.net(x)["out"].mean(dim=(2, 3))

    return {
        "densenet121": (lambda: tv.densenet121(num_classes=10), (img,)),
        "googlenet": (lambda: tv.googlenet(num_classes=10, aux_logits=False, init_weights=True), (img,)),
        "inception_v3": (
            lambda: tv.inception_v3(num_classes=10, aux_logits=False, init_weights=True),
            ((batch, 3, 96, 96),),
        ),  # fmt: skip
        "mnasnet0_5": (lambda: tv.mnasnet0_5(num_classes=10), (img,)),
        "efficientnet_v2_s": (lambda: tv.efficientnet_v2_s(num_classes=10), (img,)),
        "resnext50_32x4d": (lambda: tv.resnext50_32x4d(num_classes=10), (img,)),
        "mobilenet_v3_large": (lambda: tv.mobilenet_v3_large(num_classes=10), (img,)),
        "deeplabv3_mobilenet": (
            lambda: Scores(seg.deeplabv3_mobilenet_v3_large(num_classes=5, weights_backbone=None)),
            (img,),
        ),  # fmt: skip
        "lraspp_mobilenet": (
            lambda: Scores(seg.lraspp_mobilenet_v3_large(num_classes=5, weights_backbone=None)),
            (img,),
        ),  # fmt: skip
        "fcn_resnet50": (
            lambda: Scores(seg.fcn_resnet50(num_classes=5, weights_backbone=None, aux_loss=False)),
            (img,),
        ),  # fmt: skip
    }
