package deepdsl.runtime;

import java.lang.invoke.MethodHandle;
import java.util.Arrays;

/**
 * The CUDA device's pooling, batch norm, softmax and LRN (forward and backward) through cuDNN 9, on the handle
 * and stream of {@link CudaDnn}, whose descriptors it makes (and destroys at its close): the calls
 * of libcudnn_ops, reached by name through JavaCPP's CUDA presets.
 *
 * <p>Pooling, softmax and LRN (an {@link Op} each) take the Python runner's modes
 * (deepdsl/backends/cuda/cudnn.py): max pooling is {@code CUDNN_POOLING_MAX_DETERMINISTIC} with NaN
 * propagated; where a window holds tied maxima our kernels send its gradient to the first in
 * row-major order, and cuDNN does not document which it picks, so on ties the two may differ in
 * where (not how much) gradient goes. Average pooling counts the padding ({@code
 * CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING}); its backward reads neither X nor Y, which it is
 * given as dX and dY. Softmax is {@code CUDNN_SOFTMAX_ACCURATE} or {@code _LOG} over the channels
 * ({@code CUDNN_SOFTMAX_MODE_CHANNEL}) of {@code [A, D, B, 1]}: axis 1 of {@code [A, D, ...]}, as
 * our kernel. LRN is the cross-channel one, whose window is ours for odd sizes only. Batch norm is
 * {@code CUDNN_BATCHNORM_SPATIAL} over {@code [N, C, ...]} as {@code [N, C, H, W]} (the trailing axes
 * as H and W): its forward the inference form (the statistics given: the running ones, or in training
 * the batch's). Its training gradient is never cuDNN's: {@code cudnnBatchNormalizationBackward} cannot
 * take the scale's and shift's gradients, which the program computes anyway, so it would compute them
 * again; {@link CudaLibrary#bnTrainBackward} runs our one pass.
 */
final class CudaDnnOps {
  private static final int MAX_DETERMINISTIC = 3;
  private static final int AVERAGE_INCLUDE_PADDING = 1;
  private static final int PROPAGATE_NAN = 1;
  private static final int SOFTMAX_ACCURATE = 1;
  private static final int SOFTMAX_LOG = 2;
  private static final int SOFTMAX_CHANNEL = 1;
  private static final int LRN_CROSS_CHANNEL = 0;
  private static final int BATCHNORM_SPATIAL = 1;

  static final int MAX_POOL = 0;
  static final int AVG_POOL = 1;
  static final int SOFTMAX = 2;
  static final int LOG_SOFTMAX = 3;
  static final int LRN = 4;
  static final int BATCH_NORM = 5;
  private static final String[] FORWARDS = {
    "cudnnPoolingForward", "cudnnPoolingForward", "cudnnSoftmaxForward", "cudnnSoftmaxForward",
    "cudnnLRNCrossChannelForward", "cudnnBatchNormalizationForwardInference"
  };
  private static final String[] BACKWARDS = {
    "cudnnPoolingBackward", "cudnnPoolingBackward", "cudnnSoftmaxBackward", "cudnnSoftmaxBackward",
    "cudnnLRNCrossChannelBackward"
  };

  /**
   * A pooling ({@code MAX_POOL}, {@code AVG_POOL}), softmax ({@code SOFTMAX}, {@code LOG_SOFTMAX})
   * or LRN call ready to run, forward or backward: its descriptors.
   */
  static final class Op {
    final int kind;
    final Object op; // the pooling or LRN descriptor; batch norm: its per-channel one; softmax: null
    final Object x; // x and dx
    final Object y; // y and dy

    Op(int kind, Object op, Object x, Object y) {
      this.kind = kind;
      this.op = op;
      this.x = x;
      this.y = y;
    }
  }

  private final CudaDnn dnn;
  private final Class<?> poolClass;
  private final Class<?> lrnClass;
  private final MethodHandle poolForward;
  private final MethodHandle poolBackward;
  private final MethodHandle softmaxForward;
  private final MethodHandle softmaxBackward;
  private final MethodHandle lrnForward;
  private final MethodHandle lrnBackward;
  private final MethodHandle bnForward;
  private final Object first; // the operands of one call: Pointers whose address is set
  private final Object second;
  private final Object third;
  private final Object out;
  private final Object fourth;
  private final Object fifth;

  CudaDnnOps(CudaDnn dnn) throws ReflectiveOperationException {
    this.dnn = dnn;
    poolClass = dnn.type("cudnn.cudnnPoolingStruct");
    lrnClass = dnn.type("cudnn.cudnnLRNStruct");
    Class<?> c = dnn.contextClass;
    Class<?> t = dnn.tensorClass;
    Class<?> p = dnn.pointer().getClass();
    Class<?> i = int.class;
    poolForward = dnn.handle("cudnnPoolingForward", c, poolClass, p, t, p, p, t, p);
    poolBackward = dnn.handle("cudnnPoolingBackward", c, poolClass, p, t, p, t, p, t, p, p, t, p);
    softmaxForward = dnn.handle("cudnnSoftmaxForward", c, i, i, p, t, p, p, t, p);
    softmaxBackward = dnn.handle("cudnnSoftmaxBackward", c, i, i, p, t, p, t, p, p, t, p);
    lrnForward = dnn.handle("cudnnLRNCrossChannelForward", c, lrnClass, i, p, t, p, p, t, p);
    lrnBackward =
        dnn.handle("cudnnLRNCrossChannelBackward", c, lrnClass, i, p, t, p, t, p, t, p, p, t, p);
    Class<?> d = double.class;
    bnForward =
        dnn.handle(
            "cudnnBatchNormalizationForwardInference", c, i, p, p, t, p, t, p, t, p, p, p, p, d);
    first = dnn.pointer();
    second = dnn.pointer();
    third = dnn.pointer();
    out = dnn.pointer();
    fourth = dnn.pointer();
    fifth = dnn.pointer();
  }

  /** Batch norm over the channels of x {@code [N, C, ...]}: its descriptors. */
  Op batchNorm(int[] x) {
    int h = x.length > 2 ? x[2] : 1;
    int w = 1;
    for (int k = 3; k < x.length; k++) {
      w *= x[k];
    }
    try {
      Object xd = dnn.descriptor(dnn.tensorClass, "Tensor");
      Object per = dnn.descriptor(dnn.tensorClass, "Tensor");
      dnn.tensor(xd, x[0], x[1], h, w);
      dnn.tensor(per, 1, x[1], 1, 1);
      return new Op(BATCH_NORM, per, xd, xd);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("cuDNN's batch-norm descriptors failed", e);
    }
  }

  /** {@code y = gamma (x - mean) / sqrt(var + eps) + beta} per channel, at device addresses. */
  void batchNormForward(
      Op o, long y, long x, long mean, long var, long gamma, long beta, double eps) {
    int status;
    try {
      dnn.setAddress.invokeExact(first, x);
      dnn.setAddress.invokeExact(out, y);
      dnn.setAddress.invokeExact(second, gamma);
      dnn.setAddress.invokeExact(third, beta);
      dnn.setAddress.invokeExact(fourth, mean);
      dnn.setAddress.invokeExact(fifth, var);
      status =
          (int)
              bnForward.invokeExact(
                  dnn.handle, BATCHNORM_SPATIAL, dnn.one, dnn.zero, o.x, first, o.y, out, o.op,
                  second, third, fourth, fifth, eps);
    } catch (Throwable e) {
      throw new IllegalStateException(FORWARDS[BATCH_NORM] + " failed", e);
    }
    CudaDnn.check(FORWARDS[BATCH_NORM], status);
  }

  /**
   * The pooling {@code kind} ({@code MAX_POOL} or {@code AVG_POOL}) of x {@code [N, C, H, W]} into
   * y: its descriptors, y checked against cuDNN's own output size.
   */
  Op pooling(int kind, int[] x, int[] y, int[] kernel, int[] pad, int[] stride) {
    Class<?> i = int.class;
    try {
      Object pd = dnn.descriptor(poolClass, "Pooling");
      Object xd = dnn.descriptor(dnn.tensorClass, "Tensor");
      Object yd = dnn.descriptor(dnn.tensorClass, "Tensor");
      int mode = kind == MAX_POOL ? MAX_DETERMINISTIC : AVERAGE_INCLUDE_PADDING;
      dnn.call(
          "cudnnSetPooling2dDescriptor",
          new Class<?>[] {poolClass, i, i, i, i, i, i, i, i},
          pd, mode, PROPAGATE_NAN, kernel[0], kernel[1], pad[0], pad[1], stride[0], stride[1]);
      dnn.tensor(xd, x[0], x[1], x[2], x[3]);
      int[][] dims = {{0}, {0}, {0}, {0}};
      Class<?> a = int[].class;
      dnn.call(
          "cudnnGetPooling2dForwardOutputDim",
          new Class<?>[] {poolClass, dnn.tensorClass, a, a, a, a},
          pd, xd, dims[0], dims[1], dims[2], dims[3]);
      int[] got = {dims[0][0], dims[1][0], dims[2][0], dims[3][0]};
      if (!Arrays.equals(got, y)) {
        throw new IllegalStateException(
            "cuDNN makes the pooling of "
                + Arrays.toString(x)
                + " an output of "
                + Arrays.toString(got)
                + ", not "
                + Arrays.toString(y));
      }
      dnn.tensor(yd, y[0], y[1], y[2], y[3]);
      return new Op(kind, pd, xd, yd);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("cuDNN's pooling descriptors failed", e);
    }
  }

  /**
   * The softmax ({@code log}: log-softmax) over axis 1 of {@code shape} {@code [A, D, ...]}, as
   * cuDNN's over the channels of {@code [A, D, B, 1]}, B the product of the axes after D.
   */
  Op softmax(boolean log, int[] shape) {
    int b = 1;
    for (int k = 2; k < shape.length; k++) {
      b *= shape[k];
    }
    try {
      Object d = dnn.descriptor(dnn.tensorClass, "Tensor");
      dnn.tensor(d, shape[0], shape[1], b, 1);
      return new Op(log ? LOG_SOFTMAX : SOFTMAX, null, d, d);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("cuDNN's softmax descriptor failed", e);
    }
  }

  /** The cross-channel LRN of x {@code [N, C, H, W]} (an odd {@code size}). */
  Op lrn(int[] x, int size, double alpha, double beta, double k) {
    Class<?> d = double.class;
    try {
      Object ld = dnn.descriptor(lrnClass, "LRN");
      Object xd = dnn.descriptor(dnn.tensorClass, "Tensor");
      dnn.call(
          "cudnnSetLRNDescriptor",
          new Class<?>[] {lrnClass, int.class, d, d, d},
          ld, size, alpha, beta, k);
      dnn.tensor(xd, x[0], x[1], x[2], x[3]);
      return new Op(LRN, ld, xd, xd);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("cuDNN's LRN descriptors failed", e);
    }
  }

  /** {@code y = o(x)} at device addresses. */
  void forward(Op o, long y, long x) {
    int status;
    Object h = dnn.handle;
    Object one = dnn.one;
    Object zero = dnn.zero;
    try {
      dnn.setAddress.invokeExact(first, x);
      dnn.setAddress.invokeExact(out, y);
      if (o.kind == MAX_POOL || o.kind == AVG_POOL) {
        status = (int) poolForward.invokeExact(h, o.op, one, o.x, first, zero, o.y, out);
      } else if (o.kind == LRN) {
        int mode = LRN_CROSS_CHANNEL;
        status = (int) lrnForward.invokeExact(h, o.op, mode, one, o.x, first, zero, o.y, out);
      } else {
        int algo = o.kind == LOG_SOFTMAX ? SOFTMAX_LOG : SOFTMAX_ACCURATE;
        int mode = SOFTMAX_CHANNEL;
        status = (int) softmaxForward.invokeExact(h, algo, mode, one, o.x, first, zero, o.y, out);
      }
    } catch (Throwable e) {
      throw new IllegalStateException(FORWARDS[o.kind] + " failed", e);
    }
    CudaDnn.check(FORWARDS[o.kind], status);
  }

  /**
   * {@code dx} of {@code o} at device addresses, from x, y and dy (softmax reads y and dy; average
   * pooling dy alone: x and y may be anything of their size).
   */
  void backward(Op o, long dx, long x, long y, long dy) {
    int status;
    Object h = dnn.handle;
    Object one = dnn.one;
    Object zero = dnn.zero;
    try {
      dnn.setAddress.invokeExact(first, y);
      dnn.setAddress.invokeExact(second, dy);
      dnn.setAddress.invokeExact(third, x);
      dnn.setAddress.invokeExact(out, dx);
      if (o.kind == MAX_POOL || o.kind == AVG_POOL) {
        status =
            (int)
                poolBackward.invokeExact(
                    h, o.op, one, o.y, first, o.y, second, o.x, third, zero, o.x, out);
      } else if (o.kind == LRN) {
        int mode = LRN_CROSS_CHANNEL;
        status =
            (int)
                lrnBackward.invokeExact(
                    h, o.op, mode, one, o.y, first, o.y, second, o.x, third, zero, o.x, out);
      } else {
        int algo = o.kind == LOG_SOFTMAX ? SOFTMAX_LOG : SOFTMAX_ACCURATE;
        int mode = SOFTMAX_CHANNEL;
        status =
            (int)
                softmaxBackward.invokeExact(
                    h, algo, mode, one, o.y, first, o.y, second, zero, o.x, out);
      }
    } catch (Throwable e) {
      throw new IllegalStateException(BACKWARDS[o.kind] + " failed", e);
    }
    CudaDnn.check(BACKWARDS[o.kind], status);
  }
}
