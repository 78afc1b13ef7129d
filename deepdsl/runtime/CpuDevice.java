package deepdsl.runtime;

/**
 * The CPU device: the generated kernels' Java bodies and {@link CpuOps} in plain Java on {@link
 * Parallel#THREADS} threads (every core of the host unless {@code --threads} says otherwise). It
 * never touches a JCuda class.
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
  public void conv2d(Buf out, Buf x, Buf w, int groups, int[] pad, int[] stride) {
    Workspace.conv2d(out, x, w, groups, pad, stride, workspaceLimit);
  }

  @Override
  public void conv2dBackwardData(
      Buf out, Buf g, Buf w, int groups, int[] inShape, int[] pad, int[] stride) {
    CpuOps.conv2d_backward_data(out, g, w, groups, inShape, pad, stride);
  }

  @Override
  public void conv2dBackwardFilter(
      Buf out, Buf x, Buf g, int groups, int[] pad, int[] stride, int[] wShape) {
    CpuOps.conv2d_backward_filter(out, x, g, groups, pad, stride, wShape);
  }

  @Override
  public void linear(Buf out, Buf x, Buf w) {
    CpuOps.linear(out, x, w);
  }

  @Override
  public void matmul(Buf out, Buf a, Buf b, boolean transposeA, boolean transposeB) {
    CpuOps.matmul(out, a, b, transposeA, transposeB);
  }

  @Override
  public void batchMatmul(Buf out, Buf a, Buf b, boolean transposeA, boolean transposeB) {
    CpuOps.batch_matmul(out, a, b, transposeA, transposeB);
  }

  @Override
  public void maxPool2d(Buf out, Buf x, int[] kernel, int[] pad, int[] stride) {
    CpuOps.max_pool2d(out, x, kernel, pad, stride);
  }

  @Override
  public void maxPool2dBackward(
      Buf out, Buf x, Buf y, Buf g, int[] kernel, int[] pad, int[] stride) {
    CpuOps.max_pool2d_backward(out, x, y, g, kernel, pad, stride);
  }

  @Override
  public void avgPool2d(Buf out, Buf x, int[] kernel, int[] pad, int[] stride) {
    CpuOps.avg_pool2d(out, x, kernel, pad, stride);
  }

  @Override
  public void avgPool2dBackward(
      Buf out, Buf g, int[] inShape, int[] kernel, int[] pad, int[] stride) {
    CpuOps.avg_pool2d_backward(out, g, inShape, kernel, pad, stride);
  }

  @Override
  public void maskedSoftmax(Buf out, Buf x, float scale, boolean causal, int period) {
    CpuOps.masked_softmax(out, x, scale, causal, period);
  }

  @Override
  public void softmax(Buf out, Buf x) {
    CpuOps.softmax(out, x);
  }

  @Override
  public void logSoftmax(Buf out, Buf x) {
    CpuOps.log_softmax(out, x);
  }

  @Override
  public void softmaxBackward(Buf out, Buf y, Buf g) {
    CpuOps.softmax_backward(out, y, g);
  }

  @Override
  public void logSoftmaxBackward(Buf out, Buf y, Buf g) {
    CpuOps.log_softmax_backward(out, y, g);
  }

  @Override
  public void softmaxCrossEntropy(Buf out, Buf x, Buf labels) {
    CpuOps.softmax_cross_entropy(out, x, labels);
  }

  @Override
  public void softmaxCrossEntropyBackward(Buf out, Buf x, Buf labels, Buf g) {
    CpuOps.softmax_cross_entropy_backward(out, x, labels, g);
  }

  @Override
  public void crossEntropy(Buf out, Buf p, Buf labels) {
    CpuOps.cross_entropy(out, p, labels);
  }

  @Override
  public void crossEntropyBackward(Buf out, Buf p, Buf labels, Buf g) {
    CpuOps.cross_entropy_backward(out, p, labels, g);
  }

  @Override
  public void argmax(Buf out, Buf x) {
    CpuOps.argmax(out, x);
  }

  @Override
  public void accuracy(Buf out, Buf x, Buf labels) {
    CpuOps.accuracy(out, x, labels);
  }

  @Override
  public void lrn(Buf out, Buf x, float alpha, float beta, float k, int size) {
    CpuOps.lrn(out, x, alpha, beta, k, size);
  }

  @Override
  public void lrnBackward(
      Buf out, Buf x, Buf y, Buf g, float alpha, float beta, float k, int size) {
    CpuOps.lrn_backward(out, x, y, g, alpha, beta, k, size);
  }

  @Override
  public void layerNormRows(Buf out, Buf x, float eps) {
    CpuOps.layer_norm_rows(out, x, eps);
  }

  @Override
  public void layerNormRowsBackward(Buf out, Buf x, Buf g, float eps) {
    CpuOps.layer_norm_rows_backward(out, x, g, eps);
  }

  @Override
  public void bnApply(Buf out, Buf x, Buf mean, Buf var, Buf gamma, Buf beta, float eps) {
    CpuOps.bn_train_apply(out, x, mean, var, gamma, beta, eps);
  }

  @Override
  public void bnTrainBackward(
      Buf out, Buf x, Buf g, Buf mean, Buf var, Buf gamma, Buf gammaGrad, Buf betaGrad, float eps) {
    CpuOps.bn_train_backward(out, x, g, mean, var, gamma, gammaGrad, betaGrad, eps);
  }

  @Override
  public void dropoutMask(Buf out, long step, float p, long seed, String site) {
    CpuOps.dropout_mask(out, step, p, seed, site);
  }

  @Override
  public void close() {}
}
