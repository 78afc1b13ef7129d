"""The short names of repeated blocks (names.block_abbreviations): which scopes get them, and which keep theirs."""

from deepdsl.backends.java.names import abbreviated, block_abbreviations

RESNET = [
    "model.stem.conv",
    "model.stage1.bottleneck1.conv_bn1.conv",
    "model.stage1.bottleneck2.conv_bn3.bn",
    "model.stage2.bottleneck1.shortcut.bn",
    "model.stage1.bottleneck1",  # a statement of the def itself (the residual add)
]


def test_repeated_blocks_are_written_with_their_initials() -> None:
    short = block_abbreviations(RESNET)
    assert short == {"stage": "s", "bottleneck": "b", "conv_bn": "cb"}
    assert abbreviated("model.stage1.bottleneck2.conv_bn3.bn", short) == "model.s1.b2.cb3.bn"
    assert abbreviated("model.stem.conv", short) == "model.stem.conv"


def test_names_that_stay() -> None:
    # a block called once, a short name, a layer's own name (the last part) are not abbreviated
    assert block_abbreviations(["model.attention1.fc", "net.cv1.W", "net.cv2.W", "relu1", "relu2"]) == {}
    # two blocks with the same initials keep their names; so does one whose short form a path already spells
    assert block_abbreviations(["conv_block1.a", "conv_block2.a", "coarse_bin1.a", "coarse_bin2.a"]) == {}
    assert block_abbreviations(["stage1.b", "stage2.b", "s1"]) == {}
    assert block_abbreviations(["stage1.b", "stage2.b", "x.s1.y"]) == {}
