package deepdsl.runtime;


import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.function.BiConsumer;
import java.util.function.Consumer;
import java.util.function.Supplier;
import jcuda.Pointer;

/**
 * The library ops of the CUDA device ({@link CudaDevice} extends it with its construction and the
 * graph capture): each a cuBLAS or cuDNN call where {@code --kernels} lets the library take it, else
 * our kernel of {@code NAME.cu} that takes its sizes as arguments (the convolutions are {@link
 * CudaConvolution}'s). A cuDNN call's descriptors are made at its first use, in the warm-up step,
 * never while a step is captured.
 */
abstract class CudaLibrary extends CudaConvolution {
  CudaBlas blas; // null: the GEMMs are our kernel (set by the device's constructor)
  final boolean strict; // --kernels vendor: a call cuDNN refuses is an error, not our kernel
  // the descriptors of each pooling, batch norm, softmax and LRN, by the op and its sizes (forward and backward
  // share them); and of each call (an op's forward or backward), whether cuDNN took it at its first
  // use (false: refused under --kernels auto, our kernel runs it)
  final Map<String, CudaDnnOps.Op> ops = new HashMap<>();
  final Map<String, Boolean> taken = new HashMap<>();

  CudaLibrary(Network.Settings settings, long workspaceLimit, boolean strict) {
    super(settings, workspaceLimit);
    this.strict = strict;
  }

  void gemm(Buf out, Buf a, Buf b, int batch, int m, int n, int k, boolean ta, boolean tb) {
    if (blas != null && a.bf16 == b.bf16) { // bf16 operands: cublasGemmEx (the pass makes no mixed pair)
      blas.gemm(address(out), address(a), address(b), batch, m, n, k, ta, tb, a.bf16, out.bf16);
      return;
    }
    launch(
        "dd_k_gemm",
        new int[] {tiles(n, TILE_N), tiles(m, TILE_M), batch},
        TILE_BLOCK,
        new Buf[] {out, a, b},
        i(m),
        i(n),
        i(k),
        i(ta ? 1 : 0),
        i(tb ? 1 : 0));
  }

  @Override
  public void linear(Buf out, Buf x, Buf w) {
    int k = x.shape[x.shape.length - 1];
    gemm(out, x, w, 1, out.numel() / w.shape[0], w.shape[0], k, false, true);
  }

  @Override
  public void matmul(Buf out, Buf a, Buf b, boolean transposeA, boolean transposeB) {
    int r = out.shape.length;
    int k = transposeA ? a.shape[a.shape.length - 2] : a.shape[a.shape.length - 1];
    gemm(out, a, b, 1, out.shape[r - 2], out.shape[r - 1], k, transposeA, transposeB);
  }

  @Override
  public void batchMatmul(Buf out, Buf a, Buf b, boolean transposeA, boolean transposeB) {
    int r = out.shape.length;
    int k = transposeA ? a.shape[a.shape.length - 2] : a.shape[a.shape.length - 1];
    gemm(out, a, b, out.shape[0], out.shape[r - 2], out.shape[r - 1], k, transposeA, transposeB);
  }

  /** The pooling's sizes as library.cu takes them: NC H W OH OW KH KW SH SW PH PW. */
  static Pointer[] pool(int[] x, int[] y, int[] kernel, int[] pad, int[] stride) {
    int[] v = {
      x[0] * x[1], x[2], x[3], y[2], y[3], kernel[0], kernel[1], stride[0], stride[1], pad[0], pad[1]
    };
    Pointer[] out = new Pointer[v.length];
    for (int k = 0; k < v.length; k++) {
      out[k] = i(v[k]);
    }
    return out;
  }

  /**
   * Runs a pooling, batch-norm, softmax or LRN call through cuDNN: the op's descriptors ({@code prepare}) made at
   * its first use (never captured), keyed by {@code key}, which forward and backward share. Returns
   * false where our kernel is to run instead: no cuDNN, or (under {@code auto}) a call cuDNN refused
   * at its first use; under {@code vendor} that refusal is an error.
   */
  boolean dnn(
      String key, boolean backward, Supplier<CudaDnnOps.Op> prepare, Consumer<CudaDnnOps.Op> call) {
    if (dnn == null) {
      return false;
    }
    notAfterTheLoss();
    String which = key + (backward ? " backward" : " forward");
    Boolean took = taken.get(which);
    if (took != null) {
      if (took) {
        call.accept(ops.get(key));
      }
      return took;
    }
    if (capturing) {
      throw new NotCapturable("a cuDNN call is met for the first time");
    }
    try {
      CudaDnnOps.Op o = ops.get(key);
      if (o == null) {
        o = prepare.get();
        ops.put(key, o);
      }
      call.accept(o);
      taken.put(which, true);
      return true;
    } catch (IllegalStateException e) {
      if (strict) {
        throw new Device.Unavailable(
            "--kernels vendor: cuDNN refuses a call ("
                + e.getMessage()
                + "); --kernels auto runs our kernel there");
      }
      taken.put(which, false);
      // the device line, printed at start, could not know: say it once, where it happens
      System.err.println("note: cuDNN refuses " + which + " (" + e.getMessage() + "): our kernel runs it");
      return false;
    }
  }

  /**
   * Whether every tensor of a call is float32: cuDNN's pooling, softmax, LRN and batch norm are
   * float32-only here (as the PyCUDA runner's vendor.py), so a call touching a bf16 value
   * (--precision bf16) runs our kernel, which loads and stores bf16 itself.
   */
  static boolean float32(Buf... tensors) {
    for (Buf b : tensors) {
      if (b.bf16) {
        return false;
      }
    }
    return true;
  }

  static String key(String call, int[]... sizes) {
    StringBuilder b = new StringBuilder(call);
    for (int[] s : sizes) {
      b.append(Arrays.toString(s));
    }
    return b.toString();
  }

  @Override
  public void maxPool2d(Buf out, Buf x, int[] kernel, int[] pad, int[] stride) {
    int[] y = out.shape;
    if (float32(out, x) && dnn(
        key("maxPool", x.shape, y, kernel, pad, stride),
        false,
        () -> dnn.ops.pooling(CudaDnnOps.MAX_POOL, x.shape, y, kernel, pad, stride),
        o -> dnn.ops.forward(o, address(out), address(x)))) {
      return;
    }
    launch(
        "dd_k_max_pool2d", elements(out.numel()), THREADS, new Buf[] {out, x},
        pool(x.shape, out.shape, kernel, pad, stride));
  }

  @Override
  public void maxPool2dBackward(
      Buf out, Buf x, Buf y, Buf g, int[] kernel, int[] pad, int[] stride) {
    if (float32(out, x, y, g) && dnn(
        key("maxPool", x.shape, g.shape, kernel, pad, stride),
        true,
        () -> dnn.ops.pooling(CudaDnnOps.MAX_POOL, x.shape, g.shape, kernel, pad, stride),
        o -> dnn.ops.backward(o, address(out), address(x), address(y), address(g)))) {
      return;
    }
    launch(
        "dd_k_max_pool2d_backward", elements(out.numel()), THREADS, new Buf[] {out, x, y, g},
        pool(x.shape, g.shape, kernel, pad, stride));
  }

  @Override
  public void avgPool2d(Buf out, Buf x, int[] kernel, int[] pad, int[] stride) {
    int[] y = out.shape;
    if (float32(out, x) && dnn(
        key("avgPool", x.shape, y, kernel, pad, stride),
        false,
        () -> dnn.ops.pooling(CudaDnnOps.AVG_POOL, x.shape, y, kernel, pad, stride),
        o -> dnn.ops.forward(o, address(out), address(x)))) {
      return;
    }
    launch(
        "dd_k_avg_pool2d", elements(out.numel()), THREADS, new Buf[] {out, x},
        pool(x.shape, out.shape, kernel, pad, stride));
  }

  @Override
  public void avgPool2dBackward(
      Buf out, Buf g, int[] inShape, int[] kernel, int[] pad, int[] stride) {
    // cuDNN reads neither x nor y here: dx and dy stand for them (their sizes)
    if (float32(out, g) && dnn(
        key("avgPool", inShape, g.shape, kernel, pad, stride),
        true,
        () -> dnn.ops.pooling(CudaDnnOps.AVG_POOL, inShape, g.shape, kernel, pad, stride),
        o -> dnn.ops.backward(o, address(out), address(out), address(g), address(g)))) {
      return;
    }
    launch(
        "dd_k_avg_pool2d_backward", elements(out.numel()), THREADS, new Buf[] {out, g},
        pool(inShape, g.shape, kernel, pad, stride));
  }

  /** Softmax over axis 1 of [A, D, B]. */
  void softmaxFamily(String kernel, Buf[] bufs, int[] shape, boolean logarithm) {
    int a = shape[0];
    int d = shape[1];
    int b = 1;
    for (int k = 2; k < shape.length; k++) {
      b *= shape[k];
    }
    launch(kernel, rows((long) a * b), THREADS, bufs, i(a), i(d), i(b), i(logarithm ? 1 : 0));
  }

  @Override
  public void maskedSoftmax(Buf out, Buf x, float scale, boolean causal, int period) {
    launch(
        "dd_k_masked_softmax", rows(x.shape[0]), THREADS, new Buf[] {out, x}, i(x.shape[0]),
        i(x.shape[1]), i(period), i(causal ? 1 : 0), Pointer.to(new float[] {scale}));
  }

  /** Softmax or log-softmax over axis 1 (forward: {@code g} null) through cuDNN, if it takes it. */
  boolean dnnSoftmax(boolean log, Buf out, Buf x, Buf g) {
    int[] shape = x.shape;
    if (!float32(out, x) || g != null && g.bf16) {
      return false;
    }
    String key = key(log ? "logSoftmax" : "softmax", shape);
    if (g == null) {
      return dnn(
          key, false, () -> dnn.ops.softmax(log, shape), o -> dnn.ops.forward(o, address(out), address(x)));
    }
    return dnn(
        key,
        true,
        () -> dnn.ops.softmax(log, shape),
        o -> dnn.ops.backward(o, address(out), address(out), address(x), address(g)));
  }

  @Override
  public void softmax(Buf out, Buf x) {
    if (!dnnSoftmax(false, out, x, null)) {
      softmaxFamily("dd_k_softmax", new Buf[] {out, x}, x.shape, false);
    }
  }

  @Override
  public void logSoftmax(Buf out, Buf x) {
    if (!dnnSoftmax(true, out, x, null)) {
      softmaxFamily("dd_k_softmax", new Buf[] {out, x}, x.shape, true);
    }
  }

  @Override
  public void softmaxBackward(Buf out, Buf y, Buf g) {
    if (!dnnSoftmax(false, out, y, g)) {
      softmaxFamily("dd_k_softmax_backward", new Buf[] {out, y, g}, y.shape, false);
    }
  }

  @Override
  public void logSoftmaxBackward(Buf out, Buf y, Buf g) {
    if (!dnnSoftmax(true, out, y, g)) {
      softmaxFamily("dd_k_softmax_backward", new Buf[] {out, y, g}, y.shape, true);
    }
  }

  @Override
  public void softmaxCrossEntropy(Buf out, Buf x, Buf labels) {
    launch(
        "dd_k_softmax_cross_entropy", ONE, THREADS, new Buf[] {out, x, labels},
        i(x.shape[0]), i(x.shape[1]));
  }

  @Override
  public void softmaxCrossEntropyBackward(Buf out, Buf x, Buf labels, Buf g) {
    launch(
        "dd_k_softmax_cross_entropy_backward", rows(x.shape[0]), THREADS,
        new Buf[] {out, x, labels, g}, i(x.shape[0]), i(x.shape[1]));
  }

  @Override
  public void crossEntropy(Buf out, Buf p, Buf labels) {
    launch(
        "dd_k_cross_entropy", ONE, THREADS, new Buf[] {out, p, labels},
        i(p.shape[0]), i(p.shape[1]));
  }

  @Override
  public void crossEntropyBackward(Buf out, Buf p, Buf labels, Buf g) {
    launch(
        "dd_k_cross_entropy_backward", elements(p.numel()), THREADS,
        new Buf[] {out, p, labels, g}, i(p.shape[0]), i(p.shape[1]));
  }

  @Override
  public void argmax(Buf out, Buf x) {
    launch(
        "dd_k_argmax", elements(x.shape[0]), THREADS, new Buf[] {out, x},
        i(x.shape[0]), i(x.shape[1]));
  }

  @Override
  public void accuracy(Buf out, Buf x, Buf labels) {
    launch(
        "dd_k_accuracy", ONE, THREADS, new Buf[] {out, x, labels},
        i(x.shape[0]), i(x.shape[1]));
  }

  static Pointer[] lrnSizes(int[] x, float alpha, float beta, float k, int size) {
    int hw = x[2] * x[3];
    return new Pointer[] {
      i(x[0]), i(x[1]), i(hw), i(size), Pointer.to(new float[] {k}),
      Pointer.to(new float[] {alpha}), Pointer.to(new float[] {beta})
    };
  }

  /**
   * The LRN (forward: {@code g} null) through cuDNN, if it takes it: an odd window alone, where
   * cuDNN's (which looks (size - 1) / 2 channels behind, size / 2 ahead) is ours; within cuDNN's
   * limits (window 1..16, k at least 1e-5, beta at least 0.01), as the registry's vendor rule
   * (deepdsl/ops/lrn.py), so that {@code vendor} runs our kernel outside them too.
   */
  boolean dnnLrn(Buf out, Buf x, Buf y, Buf g, float alpha, float beta, float k, int size) {
    if (size % 2 == 0 || size < 1 || size > 16 || k < 1e-5f || beta < 0.01f || !float32(out, x)
        || y != null && (y.bf16 || g.bf16)) {
      return false;
    }
    String key =
        key("lrn", x.shape, new int[] {size, Float.floatToIntBits(alpha), Float.floatToIntBits(beta),
            Float.floatToIntBits(k)});
    if (g == null) {
      return dnn(
          key,
          false,
          () -> dnn.ops.lrn(x.shape, size, alpha, beta, k),
          o -> dnn.ops.forward(o, address(out), address(x)));
    }
    return dnn(
        key,
        true,
        () -> dnn.ops.lrn(x.shape, size, alpha, beta, k),
        o -> dnn.ops.backward(o, address(out), address(x), address(y), address(g)));
  }

  @Override
  public void lrn(Buf out, Buf x, float alpha, float beta, float k, int size) {
    if (dnnLrn(out, x, null, null, alpha, beta, k, size)) {
      return;
    }
    launch(
        "dd_k_lrn", elements(out.numel()), THREADS, new Buf[] {out, x},
        lrnSizes(x.shape, alpha, beta, k, size));
  }

  @Override
  public void lrnBackward(
      Buf out, Buf x, Buf y, Buf g, float alpha, float beta, float k, int size) {
    if (dnnLrn(out, x, y, g, alpha, beta, k, size)) {
      return;
    }
    launch(
        "dd_k_lrn_backward", elements(out.numel()), THREADS, new Buf[] {out, x, y, g},
        lrnSizes(x.shape, alpha, beta, k, size));
  }

  @Override
  public void layerNormRows(Buf out, Buf x, float eps) {
    launch(
        "dd_k_layer_norm_rows", rows(x.shape[0]), THREADS, new Buf[] {out, x}, i(x.shape[0]),
        i(x.shape[1]), Pointer.to(new float[] {eps}));
  }

  @Override
  public void layerNormRowsBackward(Buf out, Buf x, Buf g, float eps) {
    launch(
        "dd_k_layer_norm_rows_backward", rows(x.shape[0]), THREADS, new Buf[] {out, x, g},
        i(x.shape[0]), i(x.shape[1]), Pointer.to(new float[] {eps}));
  }

  /** Below this eps (an older cuDNN's CUDNN_BN_MIN_EPSILON) batch norm is our kernel. */
  static final float BN_MIN_EPSILON = 1e-5f;

  /**
   * A batch-norm call through cuDNN where it takes it: eps passed as the double its shortest
   * decimal names (1e-5f widened is 0.0000099999997, under cuDNN's minimum), as the Python runner's
   * attribute.
   */
  boolean dnnBatchNorm(Buf x, float eps, BiConsumer<CudaDnnOps.Op, Double> call) {
    if (eps < BN_MIN_EPSILON || x.bf16) {
      return false;
    }
    double e = Rng.shortestDecimal(eps);
    String key = key("batch_norm", x.shape);
    return dnn(key, false, () -> dnn.ops.batchNorm(x.shape), o -> call.accept(o, e));
  }

  /** Our per-channel batch-norm kernel over x [N, C, ...] (the second of {@code bufs}). */
  void perChannel(String kernel, Buf[] bufs, float eps) {
    int[] x = bufs[1].shape;
    int n = bufs[0].numel();
    launch(
        kernel, elements(n), THREADS, bufs, i(n), i(x[1]), i(n / (x[0] * x[1])),
        Pointer.to(new float[] {eps}));
  }

  @Override
  public void bnApply(Buf out, Buf x, Buf mean, Buf var, Buf gamma, Buf beta, float eps) {
    if (!dnnBatchNorm(
        x,
        eps,
        (o, e) ->
            dnn.ops.batchNormForward(
                o, address(out), address(x), address(mean), address(var), address(gamma),
                address(beta), e))) {
      perChannel("dd_k_bn_apply", new Buf[] {out, x, mean, var, gamma, beta}, eps);
    }
  }

  /**
   * Batch norm's training gradient dx: our one element-wise pass on the statements' scale and shift gradients,
   * under every {@code --kernels}. cuDNN's backward is not called: it cannot take those sums, so it would
   * compute them again (a reduction over x and dy) and throw them away (deepdsl/ops/norm.py, bn_train_backward).
   */
  @Override
  public void bnTrainBackward(
      Buf out, Buf x, Buf g, Buf mean, Buf invstd, Buf gamma, Buf gammaGrad, Buf betaGrad, float eps) {
    perChannel(
        "dd_k_bn_train_backward", new Buf[] {out, x, g, mean, invstd, gamma, gammaGrad, betaGrad}, eps);
  }

  @Override
  public void dropoutMask(Buf out, long step, float p, long seed, String site) {
    double threshold = Rng.shortestDecimal(p);
    float keep = (float) (1.0 / (1.0 - threshold));
    int n = out.numel();
    if (step != counterValue) { // a train step's counter is sent before it (a graph's too)
      if (capturing) {
        throw new NotCapturable("it draws dropout masks for another step than its own");
      }
      sendCounter(step);
    }
    launch(
        "dd_k_dropout_mask", elements(n), THREADS, new Buf[] {out},
        Pointer.to(counter), i(n),
        Pointer.to(new long[] {Rng.streamSeed(site + "#dropout", seed)}),
        Pointer.to(new double[] {threshold}), Pointer.to(new float[] {keep}));
  }

  /**
   * The dropout mask of a data-parallel shard (registry op dropout_mask_at): draws from the shard's
   * first sample in the global batch on. Its first draw is passed by value, the offset of the
   * micro-batch being run: with one micro-batch a step a rank's offset is the same every step, so a
   * captured graph keeps it; with more (--micro-batches M) the steps run call for call, each
   * micro-batch's launch given its own (CudaDevice.accumulates), never a captured one.
   */
  @Override
  public void dropoutMaskAt(Buf out, long step, long offset, float p, long seed, String site) {
    double threshold = Rng.shortestDecimal(p);
    float keep = (float) (1.0 / (1.0 - threshold));
    int n = out.numel();
    counterFor(step, "dropout masks");
    launch(
        "dd_k_dropout_mask_at", elements(n), THREADS, new Buf[] {out},
        Pointer.to(counter), Pointer.to(new long[] {firstDraw(out, offset)}), i(n),
        Pointer.to(new long[] {Rng.streamSeed(site + "#dropout", seed)}),
        Pointer.to(new double[] {threshold}), Pointer.to(new float[] {keep}));
  }

  /** The first draw of a shard whose first sample is {@code offset}: offset x the draws a sample. */
  private static long firstDraw(Buf out, long offset) {
    return offset * (out.numel() / out.shape[0]);
  }

  @Override
  public void randomNormalAt(Buf out, long step, long offset, long seed, String site) {
    int n = out.numel();
    counterFor(step, "normal samples");
    launch(
        "dd_k_random_normal_at", elements(n), THREADS, new Buf[] {out},
        Pointer.to(counter), Pointer.to(new long[] {firstDraw(out, offset)}), i(n),
        Pointer.to(new long[] {Rng.streamSeed(site + "#sample", seed)}));
  }

  @Override
  public void randomUniformAt(Buf out, long step, long offset, float low, float high, long seed, String site) {
    int n = out.numel();
    counterFor(step, "uniform samples");
    launch(
        "dd_k_random_uniform_at", elements(n), THREADS, new Buf[] {out},
        Pointer.to(counter), Pointer.to(new long[] {firstDraw(out, offset)}), i(n),
        Pointer.to(new long[] {Rng.streamSeed(site + "#sample", seed)}),
        Pointer.to(new double[] {Rng.shortestDecimal(low)}),
        Pointer.to(new double[] {Rng.shortestDecimal(high)}));
  }

  /** Sends the step counter the draws of {@code step} read, as dropoutMask does. */
  private void counterFor(long step, String what) {
    if (step != counterValue) { // a train step's counter is sent before it (a graph's too)
      if (capturing) {
        throw new NotCapturable("it draws " + what + " for another step than its own");
      }
      sendCounter(step);
    }
  }

  @Override
  public void randomNormal(Buf out, long step, long seed, String site) {
    int n = out.numel();
    counterFor(step, "normal samples");
    launch(
        "dd_k_random_normal", elements(n), THREADS, new Buf[] {out},
        Pointer.to(counter), i(n),
        Pointer.to(new long[] {Rng.streamSeed(site + "#sample", seed)}));
  }

  @Override
  public void randomUniform(Buf out, long step, float low, float high, long seed, String site) {
    int n = out.numel();
    counterFor(step, "uniform samples");
    launch(
        "dd_k_random_uniform", elements(n), THREADS, new Buf[] {out},
        Pointer.to(counter), i(n),
        Pointer.to(new long[] {Rng.streamSeed(site + "#sample", seed)}),
        Pointer.to(new double[] {Rng.shortestDecimal(low)}),
        Pointer.to(new double[] {Rng.shortestDecimal(high)}));
  }
}
