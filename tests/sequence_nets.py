"""Small programs of the token inputs and image ops the tests share: a bigram language model on text data, a
classifier over token ids and a float input, conv_transpose and upsample, and divided indices."""

import random

BIGRAM = """network Bigram
const N = 4
const T = 16
const V = 24
input tok : [N, T] int vocab V
label nxt : [N, T] classes V
e = embedding(tok, V, V, init=gaussian(0.1))
loss = softmax_cross_entropy(e, nxt)
predict = e
train {
  data = text("story.txt")
  optimizer = sgd(lr=1.0)
}
"""

# token ids and a float input side by side (synthetic data makes both), the embedding shared by two uses
CLASSIFIER = """network TokenClassifier
const N = 4
input x : [N, 3]
input tok : [N, 6] int vocab 9
label y : [N] classes 3
layer emb = embedding(9, 2)
h = flatten(emb(tok)) + flatten(emb(tok)) * 0.5
loss = softmax_cross_entropy(full(concat(h, x), 3), y)
predict = h
"""

IMAGES = """network Images
const N = 2
input x : [N, 3, 4, 4]
label y : [N] classes 5
# a reflect pad of H by 1 and an edge pad of W at its start by 1, as the ONNX import writes nn.ReflectionPad2d
tensor mirror(t[B, C, H, W]) -> [b, c, i: H + 2, j: W + 1] = i < 1 ? (j < 1 ? t[b, c, 1 - i, 0] : t[b, c, 1 - i, j - 1])
  : (i < H + 1 ? (j < 1 ? t[b, c, i - 1, 0] : t[b, c, i - 1, j - 1])
                : (j < 1 ? t[b, c, 2 * H - 1 - i, 0] : t[b, c, 2 * H - 1 - i, j - 1]))
h = conv_transpose(x, 6, kernel=3, stride=2, pad=1, groups=3)
u = upsample(relu(h), 2, mode="bilinear") + upsample(h, 2, mode="bilinear", align_corners=true)
v = upsample(conv(mirror(u), 2, kernel=3), 3)
loss = softmax_cross_entropy(full(flatten(v), 5), y)
predict = v
"""

# integer division and remainder in the indices of tensor functions
DIVIDED = """network Divided
const N = 2
input x : [N, 3, 4, 4]
label y : [N] classes 5
tensor up2(x[B, C, H, W]) -> [n, c, h: 2 * H, w: 2 * W] = x[n, c, h / 2, w / 2]
tensor shuffle(x[B, D]) -> [n, d: D] = x[n, (d % 2) * (D / 2) + d / 2]
tensor pool(x[B, C, H, W]) -> [n, c, i: H / 2, j: W / 2] = max[r: 4] x[n, c, 2 * i + r / 2, 2 * j + r % 2]
z = pool(conv(up2(x), 4, kernel=3, pad=1))
loss = softmax_cross_entropy(full(shuffle(flatten(z)), 5), y)
predict = z
"""


def story() -> str:
    rng = random.Random(3)
    words = "the cat sat on a mat and saw one dog run far off".split()
    return " ".join(rng.choice(words) for _ in range(300)) + ".\n"
