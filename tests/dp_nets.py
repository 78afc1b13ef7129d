"""The small networks the data-parallel tests train on two ranks and on two micro-batches: the NumPy runner's
(tests/test_distributed.py) and the Java program's (tests/backends/test_java_data_parallel.py)."""

# a small batch-norm / residual network: conv + batch norm + ReLU, a residual block, pooling, a full layer, Adam
RESIDUAL = """
network TinyRes
const N = 4
input x : [N, 3, 8, 8]
label y : [N] classes 5
def cbn(x, c) = batch_norm(conv(x, c, kernel=3, pad=1, bias=false, name="conv"), name="bn")
def block(x) {
  h = cbn(relu(cbn(x, 6)), 6)
  return relu(h + x)
}
def net(x) = full(flatten(global_avg_pool(block(relu(cbn(x, 6))))), 5, name="fc")
layer model = net
loss    = softmax_cross_entropy(model(x), y)
predict = model(x)
train {
  data = synthetic
  optimizer = adam(lr=0.01)
  iterations = 3
  seed = 5
}
"""
DROPOUT = """
network Drop
const N = 4
input x : [N, 12]
label y : [N] classes 3
layer fc1 = full(16)
layer fc2 = full(3)
net = fc2 o dropout(0.5) o relu o fc1
loss    = softmax_cross_entropy(net(x), y)
predict = net(x)
train {
  data = synthetic
  optimizer = sgd(lr=0.1, momentum=0.9)
  iterations = 3
  seed = 2
}
"""
