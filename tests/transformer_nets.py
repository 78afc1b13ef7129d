"""Small Transformer programs the tests share: causal multi-head attention (the mask and the scale are format
fields, `{mask}` and `{scale}`)."""

ATTENTION = """
network Causal
const N = 2
const T = 5
const D = 8
const H = 2
input x : [N, T, D]
label y : [N] classes 4

tensor causal(s[B, Q, K]) -> [b, i, j] = {mask}

def heads(x, name) = permute(reshape(full(reshape(x, (N * T, D)), D, name=name), (N, T, H, D / H)), (0, 2, 1, 3))

q = heads(x, "q")
k = heads(x, "k")
v = heads(x, "v")
s = reshape(matmul(q, k, transpose_b=true) * {scale}, (N * H, T, T))
p = softmax(causal(s), axis=-1)
a = permute(reshape(matmul(p, reshape(v, (N * H, T, D / H))), (N, H, T, D / H)), (0, 2, 1, 3))
logits = full(reshape(a, (N, T * D)), 4, name="head")
loss = softmax_cross_entropy(logits, y)
predict = logits
"""
CAUSAL = "j <= i ? s[b, i, j] : -inf"


def causal_attention(mask: str = CAUSAL, scale: str = "0.5") -> str:
    return ATTENTION.format(mask=mask, scale=scale)
