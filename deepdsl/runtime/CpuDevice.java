package deepdsl.runtime;

/**
 * The CPU device: the generated kernels' Java bodies, and each registry op that has no index form
 * handed straight to the class of its family, which does the work: {@link CpuGemm} (the SGEMM,
 * dense layers, matrix products), {@link CpuConvolution} (through {@link Workspace}, which picks
 * im2col or the direct loops), {@link CpuPooling}, {@link CpuNormalisation} (LRN, layer norm's
 * rows, batch norm's training apply and gradient), {@link CpuLosses} (softmax, the losses, argmax,
 * accuracy), {@link CpuAttention} (the masked softmax), {@link CpuShapes} (the shape ops) and
 * {@link Rng} (the dropout mask); {@link CpuSupport} holds their threads and scratch arrays. It runs on {@link
 * Parallel#THREADS} threads (every core of the host unless {@code --threads} says otherwise) and
 * never touches a JCuda class.
 *
 * <p>In each family class an op is one {@code public static void} method, named exactly as the op,
 * taking the output first, then the statement's inputs in order, then the op's attributes in
 * alphabetical order of their names (tuples as {@code int[]}); the registry's {@code java_call}
 * names the class (tests/ops/test_registry_complete.py checks the two agree). Each computes what the
 * op's NumPy kernel in {@code deepdsl/ops/*.py} computes, in float32, to about 1e-5 relative.
 *
 * <p>Tensors are {@link Buf}s (row-major, NCHW for images); class labels, argmax results and the
 * like are exact float values; a scalar is a {@code Buf} of shape {@code {}}. No kernel supports an
 * output that shares memory with one of its inputs.
 *
 * <p><b>Threads.</b> Large kernels run on the calling thread and the {@link Parallel} team of
 * {@code availableProcessors() - 1} daemon threads: a matrix product split evenly between them, a
 * loop over images or planes cut into a few pieces per thread that the threads take as they come
 * free. A kernel called from inside such a loop runs on that thread alone.
 *
 * <p><b>Determinism.</b> Every sum is taken in an order fixed by the shapes and the thread count,
 * whichever thread takes which piece: the pieces are cut from the sizes alone, a matrix product
 * adds each element's terms in the same order however it is split, and a kernel that sums over
 * pieces keeps a partial result per piece and adds them in piece order. Two runs on the same number
 * of threads give the same bits.
 *
 * <p><b>Matrix products.</b> linear, matmul, batch_matmul and the three convolutions run on one
 * cache-blocked SGEMM ({@link CpuGemm#gemm}) that accumulates in float; a transposed operand is read
 * through strides, not transposed first. The convolutions use im2col, a few images per product (so
 * that each product's rows hold at least 512 output pixels where the batch allows): conv2d with
 * the columns, conv2d_backward_data and conv2d_backward_filter with the columns transposed (one row
 * per output pixel), which the filter gradient sums over the batch.
 *
 * <p><b>Scratch memory.</b> Every thread keeps its own scratch arrays that grow on demand and are
 * kept for the thread's life (never shrunk), so once each layer has run a step allocates only small
 * objects. Per thread, in floats, with P = OH*OW and B = min(ceil(512 / P), the images of one piece
 * of the batch) images per product:
 *
 * <ul>
 *   <li>SGEMM: 256 x 512 (a panel of B, 512 KiB; each sweep of a block also allocates two rows of
 *       at most 1024 floats, see the note in {@link CpuGemm#sweep});
 *   <li>the three convolutions: one set of row arrays, each row grown to the longest any of them
 *       asked of it: C*kh*kw rows of B*P (conv2d's columns), B*P rows of C*kh*kw
 *       (conv2d_backward_filter's transposed columns); and flat arrays of B*P x C*kh*kw
 *       (conv2d_backward_data's transposed columns) and, when B > 1, F x B*P (conv2d's products,
 *       the backward convolutions' gathered output gradients); conv2d_backward_filter also, on the
 *       calling thread only, (Q - 1) x F*(C/groups)*kh*kw for the Q = min(N, 4T) pieces of the
 *       batch on T threads (the partial filter gradients of the pieces other than the first);
 *   <li>lrn_backward: 2 x C*H*W (one image's denominators and scaled gradients).
 * </ul>
 *
 * <p>For example, on two threads LeNet's second convolution (C*kh*kw = 500, P = 64, B = 8, F = 50)
 * holds per thread 512 rows of 500 or 512 floats (1 MiB) and (500 + 50) x 512 floats (1.1 MiB)
 * of flat convolution scratch, and 7 x 50 x 500 floats (0.7 MiB) of partial filter gradients,
 * besides the 512 KiB panels.
 */
public final class CpuDevice implements Device {
  private final long workspaceLimit;
  private final String note;

  /**
   * @param workspaceLimit the scratch bytes a convolution may take
   * @param note why the CPU runs the program when another device was possible (null: it was asked
   *     for)
   */
  public CpuDevice(long workspaceLimit, String note) {
    this.workspaceLimit = workspaceLimit;
    this.note = note;
  }

  @Override
  public String name() {
    return "cpu";
  }

  @Override
  public String description() {
    int threads = Parallel.THREADS;
    return "cpu (Java, "
        + threads
        + (threads == 1 ? " thread" : " threads")
        + ", GEMM "
        + Blas.description()
        + ", workspace limit "
        + workspaceLimit
        + " bytes)";
  }

  @Override
  public String note() {
    return note;
  }

  @Override
  public void attach(Network net) {
    net.allocateArena();
  }

  @Override
  public float trainStep(Network net) {
    return net.trainStep();
  }

  @Override
  public float evalStep(Network net) {
    return net.evalStep();
  }

  @Override
  public Buf inferStep(Network net) {
    return net.inferStep();
  }

  // ---- the step's operations, in Java on the host ----

  @Override
  public void run(Kernel k, Buf... args) {
    k.run(args);
  }

  @Override
  public void copy(Buf from, Buf to) {
    System.arraycopy(from.a, from.off, to.a, to.off, to.numel());
  }

  @Override
  public float scalar(Buf b) {
    return b.a[b.off];
  }

  @Override
  public Buf read(Buf b) {
    return b;
  }

  @Override
  public void conv2d(
      Buf out, Buf x, Buf w, int groups, int[] pad, int[] stride, int[] dilation) {
    Workspace.conv2d(out, x, w, groups, pad, stride, dilation, workspaceLimit);
  }

  @Override
  public void conv2dBackwardData(
      Buf out, Buf g, Buf w, int groups, int[] inShape, int[] pad, int[] stride, int[] dilation) {
    CpuConvolution.conv2d_backward_data(out, g, w, groups, inShape, pad, stride, dilation);
  }

  /** The planned {@code workspace} is the CUDA device's: the CPU's scratch is its threads' own arrays. */
  @Override
  public void conv2dBackwardFilter(
      Buf out, Buf x, Buf g, int groups, int[] pad, int[] stride, int[] dilation, int[] wShape,
      Buf workspace) {
    CpuConvolution.conv2d_backward_filter(out, x, g, groups, pad, stride, dilation, wShape);
  }

  @Override
  public void linear(Buf out, Buf x, Buf w) {
    CpuGemm.linear(out, x, w);
  }

  @Override
  public void matmul(Buf out, Buf a, Buf b, boolean transposeA, boolean transposeB) {
    CpuGemm.matmul(out, a, b, transposeA, transposeB);
  }

  @Override
  public void batchMatmul(Buf out, Buf a, Buf b, boolean transposeA, boolean transposeB) {
    CpuGemm.batch_matmul(out, a, b, transposeA, transposeB);
  }

  @Override
  public void maxPool2d(Buf out, Buf x, int[] kernel, int[] pad, int[] stride) {
    CpuPooling.max_pool2d(out, x, kernel, pad, stride);
  }

  @Override
  public void maxPool2dBackward(
      Buf out, Buf x, Buf y, Buf g, int[] kernel, int[] pad, int[] stride) {
    CpuPooling.max_pool2d_backward(out, x, y, g, kernel, pad, stride);
  }

  @Override
  public void avgPool2d(Buf out, Buf x, int[] kernel, int[] pad, int[] stride) {
    CpuPooling.avg_pool2d(out, x, kernel, pad, stride);
  }

  @Override
  public void avgPool2dBackward(
      Buf out, Buf g, int[] inShape, int[] kernel, int[] pad, int[] stride) {
    CpuPooling.avg_pool2d_backward(out, g, inShape, kernel, pad, stride);
  }

  @Override
  public void maskedSoftmax(Buf out, Buf x, float scale, boolean causal, int period) {
    CpuAttention.masked_softmax(out, x, scale, causal, period);
  }

  @Override
  public void softmax(Buf out, Buf x) {
    CpuLosses.softmax(out, x);
  }

  @Override
  public void logSoftmax(Buf out, Buf x) {
    CpuLosses.log_softmax(out, x);
  }

  @Override
  public void softmaxBackward(Buf out, Buf y, Buf g) {
    CpuLosses.softmax_backward(out, y, g);
  }

  @Override
  public void logSoftmaxBackward(Buf out, Buf y, Buf g) {
    CpuLosses.log_softmax_backward(out, y, g);
  }

  @Override
  public void softmaxCrossEntropy(Buf out, Buf x, Buf labels) {
    CpuLosses.softmax_cross_entropy(out, x, labels);
  }

  @Override
  public void softmaxCrossEntropyBackward(Buf out, Buf x, Buf labels, Buf g) {
    CpuLosses.softmax_cross_entropy_backward(out, x, labels, g);
  }

  @Override
  public void crossEntropy(Buf out, Buf p, Buf labels) {
    CpuLosses.cross_entropy(out, p, labels);
  }

  @Override
  public void crossEntropyBackward(Buf out, Buf p, Buf labels, Buf g) {
    CpuLosses.cross_entropy_backward(out, p, labels, g);
  }

  @Override
  public void argmax(Buf out, Buf x) {
    CpuLosses.argmax(out, x);
  }

  @Override
  public void accuracy(Buf out, Buf x, Buf labels) {
    CpuLosses.accuracy(out, x, labels);
  }

  @Override
  public void lrn(Buf out, Buf x, float alpha, float beta, float k, int size) {
    CpuNormalisation.lrn(out, x, alpha, beta, k, size);
  }

  @Override
  public void lrnBackward(
      Buf out, Buf x, Buf y, Buf g, float alpha, float beta, float k, int size) {
    CpuNormalisation.lrn_backward(out, x, y, g, alpha, beta, k, size);
  }

  @Override
  public void layerNormRows(Buf out, Buf x, float eps) {
    CpuNormalisation.layer_norm_rows(out, x, eps);
  }

  @Override
  public void layerNormRowsBackward(Buf out, Buf x, Buf g, float eps) {
    CpuNormalisation.layer_norm_rows_backward(out, x, g, eps);
  }

  @Override
  public void bnApply(Buf out, Buf x, Buf mean, Buf var, Buf gamma, Buf beta, float eps) {
    CpuNormalisation.bn_train_apply(out, x, mean, var, gamma, beta, eps);
  }

  @Override
  public void bnTrainBackward(
      Buf out, Buf x, Buf g, Buf mean, Buf invstd, Buf gamma, Buf gammaGrad, Buf betaGrad, float eps) {
    CpuNormalisation.bn_train_backward(out, x, g, mean, invstd, gamma, gammaGrad, betaGrad, eps);
  }

  @Override
  public void dropoutMask(Buf out, long step, float p, long seed, String site) {
    Rng.dropout_mask(out, step, p, seed, site);
  }

  @Override
  public void dropoutMaskAt(Buf out, long step, long offset, float p, long seed, String site) {
    Rng.dropout_mask_at(out, step, offset, p, seed, site);
  }

  @Override
  public void randomNormalAt(Buf out, long step, long offset, long seed, String site) {
    Rng.random_normal_at(out, step, offset, seed, site);
  }

  @Override
  public void randomUniformAt(Buf out, long step, long offset, float low, float high, long seed, String site) {
    Rng.random_uniform_at(out, step, offset, low, high, seed, site);
  }

  @Override
  public void randomNormal(Buf out, long step, long seed, String site) {
    Rng.random_normal(out, step, seed, site);
  }

  @Override
  public void randomUniform(Buf out, long step, float low, float high, long seed, String site) {
    Rng.random_uniform(out, step, low, high, seed, site);
  }

  @Override
  public void close() {}
}
