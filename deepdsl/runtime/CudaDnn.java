package deepdsl.runtime;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * The CUDA device's convolutions (forward, backward-data, backward-filter), pooling, softmax and LRN
 * (forward and backward) through cuDNN 9's legacy calls, reached through JavaCPP's CUDA presets
 * ({@code org.bytedeco.cuda.global.cudnn}) as {@link CudaBlas} reaches cuBLAS: by name, so that it
 * compiles without their jars.
 *
 * <p>Each convolution of the step gets its descriptors and its algorithm once, at its first call
 * (the first step, never captured): the first algorithm that the call's {@code _v7} query proposes
 * (cuDNN's heuristic order), preferring a deterministic one outside the FFT and non-fused Winograd
 * families (the Python runner's rule, deepdsl/backends/cuda/cudnn.py), whose scratch fits the
 * workspace limit; {@link CudaDevice} gives it that scratch. Math is {@code CUDNN_FMA_MATH}:
 * float32 without TF32. The handle works on the device's stream, so a captured step records its
 * calls. The workspace limit is per convolution and beyond the arena, as on the CPU device (the Java
 * program does not take the plan's per-statement workspace); the device allocates the largest
 * scratch a chosen algorithm needs, once, and its measured GPU memory counts it.
 *
 * <p>Pooling, softmax and LRN ({@link Op}) take the Python runner's modes
 * (deepdsl/backends/cuda/cudnn.py): max pooling is {@code CUDNN_POOLING_MAX_DETERMINISTIC} with NaN
 * propagated; where a window holds tied maxima our kernels send its gradient to the first in
 * row-major order, and cuDNN does not document which it picks, so on ties the two may differ in
 * where (not how much) gradient goes. Average pooling counts the padding ({@code
 * CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING}); its backward reads neither X nor Y, which it is
 * given as dX and dY. Softmax is {@code CUDNN_SOFTMAX_ACCURATE} or {@code _LOG} over the channels
 * ({@code CUDNN_SOFTMAX_MODE_CHANNEL}) of {@code [A, D, B, 1]}: axis 1 of {@code [A, D, ...]}, as
 * our kernel. LRN is the cross-channel one, whose window is ours for odd sizes only.
 *
 * <p>Every descriptor is made once, by the call's first use, and destroyed at {@link #close}. A
 * device address goes to cuDNN as a plain JavaCPP {@code Pointer} whose address field is set (a
 * {@code void*} parameter: no position arithmetic, no allocation per call).
 */
final class CudaDnn implements AutoCloseable {
  /** Where the libraries come from, for the error that says one is missing. */
  static final String LIBRARIES =
      "cuDNN 9 (libcudnn.so.9 and libcudnn_graph, _ops, _cnn and _adv .so.9: `pip install"
          + " nvidia-cudnn-cu13` or NVIDIA's cuDNN 9 for CUDA 13) on LD_LIBRARY_PATH, or"
          + " -Dorg.bytedeco.javacpp.pathsFirst=true -Djava.library.path=THEIR_FOLDER";

  static final int FORWARD = 0;
  static final int DATA = 1;
  static final int FILTER = 2;
  private static final String[] CALLS = {
    "cudnnConvolutionForward", "cudnnConvolutionBackwardData", "cudnnConvolutionBackwardFilter"
  };
  private static final String[] QUERIES = {
    "cudnnGetConvolutionForwardAlgorithm_v7",
    "cudnnGetConvolutionBackwardDataAlgorithm_v7",
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7"
  };
  private static final String[] PERFS = {
    "cudnnConvolutionFwdAlgoPerf_t", "cudnnConvolutionBwdDataAlgoPerf_t",
    "cudnnConvolutionBwdFilterAlgoPerf_t"
  };
  // the algorithms each call has (cudnn_cnn.h), and those that lose float32 precision (FFT,
  // FFT_TILING, WINOGRAD_NONFUSED)
  private static final int[] ALGORITHMS = {8, 6, 7};
  private static final int[][] IMPRECISE = {{4, 5, 7}, {2, 3, 5}, {2, 5, 6}};
  private static final int NCHW = 0;
  private static final int FLOAT = 0;
  private static final int CROSS_CORRELATION = 1;
  private static final int FMA_MATH = 3;
  private static final int DETERMINISTIC = 1;
  private static final int MAX_DETERMINISTIC = 3;
  private static final int AVERAGE_INCLUDE_PADDING = 1;
  private static final int PROPAGATE_NAN = 1;
  private static final int SOFTMAX_ACCURATE = 1;
  private static final int SOFTMAX_LOG = 2;
  private static final int SOFTMAX_CHANNEL = 1;
  private static final int LRN_CROSS_CHANNEL = 0;

  static final int MAX_POOL = 0;
  static final int AVG_POOL = 1;
  static final int SOFTMAX = 2;
  static final int LOG_SOFTMAX = 3;
  static final int LRN = 4;
  private static final String[] FORWARDS = {
    "cudnnPoolingForward", "cudnnPoolingForward", "cudnnSoftmaxForward", "cudnnSoftmaxForward",
    "cudnnLRNCrossChannelForward"
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
    final Object op; // the pooling or LRN descriptor; softmax: null
    final Object x; // x and dx
    final Object y; // y and dy

    Op(int kind, Object op, Object x, Object y) {
      this.kind = kind;
      this.op = op;
      this.x = x;
      this.y = y;
    }
  }

  /** A convolution ready to run: its descriptors, its algorithm and the scratch that needs. */
  static final class Conv {
    final int kind;
    final Object x; // forward and filter: x; data: dx
    final Object w; // the filter (or dw)
    final Object conv;
    final Object y; // y or dy
    final int algo;
    final long workspace;

    Conv(int kind, Object x, Object w, Object conv, Object y, int algo, long workspace) {
      this.kind = kind;
      this.x = x;
      this.w = w;
      this.conv = conv;
      this.y = y;
      this.algo = algo;
      this.workspace = workspace;
    }
  }

  private final Class<?> cudnn;
  private final Class<?> contextClass;
  private final Class<?> tensorClass;
  private final Class<?> filterClass;
  private final Class<?> convClass;
  private final ClassLoader loader;
  private final MethodHandle[] calls = new MethodHandle[3];
  private final MethodHandle poolForward;
  private final MethodHandle poolBackward;
  private final MethodHandle softmaxForward;
  private final MethodHandle softmaxBackward;
  private final MethodHandle lrnForward;
  private final MethodHandle lrnBackward;
  private final Class<?> poolClass;
  private final Class<?> lrnClass;
  // every descriptor made, with its destroy call, destroyed at close in reverse
  private final List<Object[]> descriptors = new ArrayList<>();
  private final MethodHandle setAddress; // Pointer.address = long
  private final MethodHandle destroy;
  private final Object handle;
  private final FloatBuffer ones = scalar(1f); // kept here: the pointers do not hold them
  private final FloatBuffer zeros = scalar(0f);
  private final Object one;
  private final Object zero;
  private final Object first; // the operands of one call: Pointers whose address is set
  private final Object second;
  private final Object third;
  private final Object out;
  private final Object scratch;
  private final String version;

  /**
   * Loads cuDNN through the presets and creates the handle on the context current on this thread,
   * its calls on the stream at {@code stream} (a driver API {@code CUstream}).
   *
   * @throws Device.Unavailable when the jars or the libraries are missing: which, and how to get
   *     them
   */
  static CudaDnn open(long stream) {
    try {
      return new CudaDnn(stream);
    } catch (ClassNotFoundException | NoClassDefFoundError e) {
      String text = String.valueOf(e.getMessage());
      if (e instanceof NoClassDefFoundError && text.startsWith("Could not initialize")) {
        throw new Device.Unavailable(
            "cuDNN did not load the first time it was tried (" + text + ")");
      }
      throw new Device.Unavailable(
          "the JavaCPP CUDA classes are not on the class path (no "
              + text
              + "): add "
              + CudaBlas.JARS);
    } catch (IllegalStateException e) {
      throw new Device.Unavailable("cuDNN loaded but did not start (" + e.getMessage() + ")");
    } catch (ReflectiveOperationException | LinkageError | RuntimeException e) {
      throw new Device.Unavailable(
          "cuDNN does not load (" + CudaBlas.reason(e) + "): it needs " + LIBRARIES);
    }
  }

  private CudaDnn(long streamAddress) throws ReflectiveOperationException {
    loader = CudaDnn.class.getClassLoader();
    cudnn = Class.forName("org.bytedeco.cuda.global.cudnn", true, loader); // loads the natives
    contextClass = type("cudnn.cudnnContext");
    tensorClass = type("cudnn.cudnnTensorStruct");
    filterClass = type("cudnn.cudnnFilterStruct");
    convClass = type("cudnn.cudnnConvolutionStruct");
    poolClass = type("cudnn.cudnnPoolingStruct");
    lrnClass = type("cudnn.cudnnLRNStruct");
    Class<?> stream = type("cudart.CUstream_st");
    Class<?> pointer = Class.forName("org.bytedeco.javacpp.Pointer", true, loader);
    Class<?> fp = Class.forName("org.bytedeco.javacpp.FloatPointer", true, loader);
    MethodHandles.Lookup lookup = MethodHandles.publicLookup();
    Class<?> i = int.class;
    Class<?> l = long.class;
    Class<?>[][] operands = {
      {tensorClass, filterClass, tensorClass},
      {filterClass, tensorClass, tensorClass},
      {tensorClass, tensorClass, filterClass}
    };
    for (int k = 0; k < 3; k++) {
      Class<?>[] o = operands[k];
      MethodType t =
          MethodType.methodType(
              i, contextClass, pointer, o[0], pointer, o[1], pointer, convClass, i, pointer, l,
              pointer, o[2], pointer);
      calls[k] = erased(lookup.findStatic(cudnn, CALLS[k], t));
    }
    Class<?> t = tensorClass;
    Class<?> p = pointer;
    Class<?> c = contextClass;
    poolForward = handle(lookup, "cudnnPoolingForward", c, poolClass, p, t, p, p, t, p);
    poolBackward =
        handle(lookup, "cudnnPoolingBackward", c, poolClass, p, t, p, t, p, t, p, p, t, p);
    softmaxForward = handle(lookup, "cudnnSoftmaxForward", c, i, i, p, t, p, p, t, p);
    softmaxBackward = handle(lookup, "cudnnSoftmaxBackward", c, i, i, p, t, p, t, p, p, t, p);
    lrnForward = handle(lookup, "cudnnLRNCrossChannelForward", c, lrnClass, i, p, t, p, p, t, p);
    lrnBackward =
        handle(
            lookup, "cudnnLRNCrossChannelBackward", c, lrnClass, i, p, t, p, t, p, t, p, p, t, p);
    Field address = pointer.getDeclaredField("address");
    address.setAccessible(true);
    setAddress = MethodHandles.lookup().unreflectSetter(address).asType(
        MethodType.methodType(void.class, Object.class, long.class));
    destroy = lookup.findStatic(cudnn, "cudnnDestroy", MethodType.methodType(i, contextClass));
    Object h = contextClass.getConstructor().newInstance();
    check("cudnnCreate", cudnn.getMethod("cudnnCreate", contextClass).invoke(null, h));
    handle = h;
    Object on = stream.getConstructor().newInstance();
    address.setLong(on, streamAddress);
    check(
        "cudnnSetStream",
        cudnn.getMethod("cudnnSetStream", contextClass, stream).invoke(null, h, on));
    long v = (Long) cudnn.getMethod("cudnnGetVersion").invoke(null);
    version = v / 10000 + "." + v % 10000 / 100 + "." + v % 100;
    one = fp.getConstructor(FloatBuffer.class).newInstance(ones);
    zero = fp.getConstructor(FloatBuffer.class).newInstance(zeros);
    first = pointer.getConstructor().newInstance();
    second = pointer.getConstructor().newInstance();
    third = pointer.getConstructor().newInstance();
    out = pointer.getConstructor().newInstance();
    scratch = pointer.getConstructor().newInstance();
  }

  private Class<?> type(String name) throws ClassNotFoundException {
    return Class.forName("org.bytedeco.cuda." + name, true, loader);
  }

  private static FloatBuffer scalar(float v) {
    return ByteBuffer.allocateDirect(4).order(ByteOrder.nativeOrder()).asFloatBuffer().put(0, v);
  }

  private MethodHandle handle(MethodHandles.Lookup lookup, String name, Class<?>... params)
      throws ReflectiveOperationException {
    return erased(lookup.findStatic(cudnn, name, MethodType.methodType(int.class, params)));
  }

  private static MethodHandle erased(MethodHandle h) {
    MethodType t = h.type();
    for (int k = 0; k < t.parameterCount(); k++) {
      if (!t.parameterType(k).isPrimitive()) {
        t = t.changeParameterType(k, Object.class);
      }
    }
    return h.asType(t);
  }

  private static void check(String call, Object status) {
    if ((Integer) status != 0) {
      throw new IllegalStateException(call + " returned cuDNN status " + status);
    }
  }

  /** The library, its version and the file it was loaded from, for the device line. */
  String description() {
    return "cuDNN " + version + CudaBlas.loadedFrom("libcudnn_graph.so");
  }

  private Object call(String name, Class<?>[] types, Object... args) {
    try {
      Object status = cudnn.getMethod(name, types).invoke(null, args);
      check(name, status);
      return status;
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException(name + " failed", e);
    }
  }

  private Object descriptor(Class<?> type, String kind) throws ReflectiveOperationException {
    Object d = type.getConstructor().newInstance();
    call("cudnnCreate" + kind + "Descriptor", new Class<?>[] {type}, d);
    descriptors.add(new Object[] {"cudnnDestroy" + kind + "Descriptor", type, d});
    return d;
  }

  private void tensor(Object d, int n, int c, int h, int w) {
    Class<?> i = int.class;
    call(
        "cudnnSetTensor4dDescriptor",
        new Class<?>[] {tensorClass, i, i, i, i, i, i},
        d, NCHW, FLOAT, n, c, h, w);
  }

  /**
   * The convolution {@code kind} (FORWARD, DATA, FILTER) of x {@code [N, C, H, W]} by the filter
   * {@code w} into y: its descriptors and the first algorithm of cuDNN's order (a deterministic,
   * precise one first) whose scratch is at most {@code limit} bytes.
   */
  Conv prepare(
      int kind, int[] x, int[] w, int[] y, int[] pad, int[] stride, int groups, long limit) {
    Class<?> i = int.class;
    try {
      Object xd = descriptor(tensorClass, "Tensor");
      Object wd = descriptor(filterClass, "Filter");
      Object cd = descriptor(convClass, "Convolution");
      Object yd = descriptor(tensorClass, "Tensor");
      tensor(xd, x[0], x[1], x[2], x[3]);
      call(
          "cudnnSetFilter4dDescriptor",
          new Class<?>[] {filterClass, i, i, i, i, i, i},
          wd, FLOAT, NCHW, w[0], w[1], w[2], w[3]);
      call(
          "cudnnSetConvolution2dDescriptor",
          new Class<?>[] {convClass, i, i, i, i, i, i, i, i},
          cd, pad[0], pad[1], stride[0], stride[1], 1, 1, CROSS_CORRELATION, FLOAT);
      call("cudnnSetConvolutionGroupCount", new Class<?>[] {convClass, i}, cd, groups);
      call("cudnnSetConvolutionMathType", new Class<?>[] {convClass, i}, cd, FMA_MATH);
      tensor(yd, y[0], y[1], y[2], y[3]);
      int n = ALGORITHMS[kind];
      Class<?> perfClass = type("cudnn." + PERFS[kind]);
      Object perf = perfClass.getConstructor(long.class).newInstance((long) n);
      int[] count = {0};
      // the query's descriptors: forward (x, w, conv, y), data (w, dy, conv, dx), filter (x, dy,
      // conv, dw)
      Object[] operands =
          kind == FORWARD
              ? new Object[] {xd, wd, cd, yd}
              : kind == DATA ? new Object[] {wd, yd, cd, xd} : new Object[] {xd, yd, cd, wd};
      Class<?>[] types = {
        contextClass, operands[0].getClass(), operands[1].getClass(), convClass,
        operands[3].getClass(), i, int[].class, perfClass
      };
      call(QUERIES[kind], types, handle, operands[0], operands[1], cd, operands[3], n, count, perf);
      Method at = perfClass.getMethod("position", long.class);
      int best = -1;
      long bestMemory = 0;
      boolean bestGood = false;
      for (int k = 0; k < count[0]; k++) {
        Object p = at.invoke(perf, (long) k);
        int algo = (Integer) perfClass.getMethod("algo").invoke(p);
        int status = (Integer) perfClass.getMethod("status").invoke(p);
        long memory = (Long) perfClass.getMethod("memory").invoke(p);
        boolean good =
            (Integer) perfClass.getMethod("determinism").invoke(p) == DETERMINISTIC
                && precise(kind, algo);
        if (status == 0 && memory <= limit && (best < 0 || good && !bestGood)) {
          best = algo;
          bestMemory = memory;
          bestGood = good;
        }
      }
      if (best < 0) {
        throw new IllegalStateException(
            "cuDNN proposes no algorithm for " + CALLS[kind] + " within " + limit + " bytes");
      }
      return new Conv(kind, xd, wd, cd, yd, best, bestMemory);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("cuDNN's descriptors for " + CALLS[kind] + " failed", e);
    }
  }

  private static boolean precise(int kind, int algo) {
    if (algo >= ALGORITHMS[kind]) {
      return false;
    }
    for (int a : IMPRECISE[kind]) {
      if (a == algo) {
        return false;
      }
    }
    return true;
  }

  /**
   * {@code c} at device addresses: into {@code result} from the statement's inputs {@code a} and
   * {@code b} (forward x, w; data dy, w; filter x, dy), with {@code c.workspace} bytes at {@code
   * workspace}.
   */
  void run(Conv c, long result, long a, long b, long workspace) {
    int status;
    try {
      Object d1;
      Object d2;
      Object d3;
      if (c.kind == FORWARD) { // (x, w) -> y
        d1 = c.x;
        d2 = c.w;
        d3 = c.y;
        setAddress.invokeExact(first, a);
        setAddress.invokeExact(second, b);
      } else if (c.kind == DATA) { // (w, dy) -> dx
        d1 = c.w;
        d2 = c.y;
        d3 = c.x;
        setAddress.invokeExact(first, b);
        setAddress.invokeExact(second, a);
      } else { // (x, dy) -> dw
        d1 = c.x;
        d2 = c.y;
        d3 = c.w;
        setAddress.invokeExact(first, a);
        setAddress.invokeExact(second, b);
      }
      setAddress.invokeExact(out, result);
      setAddress.invokeExact(scratch, c.workspace == 0 ? 0L : workspace);
      status =
          (int)
              calls[c.kind].invokeExact(
                  handle, one, d1, first, d2, second, c.conv, c.algo, scratch, c.workspace, zero,
                  d3, out);
    } catch (Throwable e) {
      throw new IllegalStateException(CALLS[c.kind] + " failed", e);
    }
    if (status != 0) {
      throw new IllegalStateException(CALLS[c.kind] + " returned cuDNN status " + status);
    }
  }

  /**
   * The pooling {@code kind} ({@code MAX_POOL} or {@code AVG_POOL}) of x {@code [N, C, H, W]} into
   * y: its descriptors, y checked against cuDNN's own output size.
   */
  Op pooling(int kind, int[] x, int[] y, int[] kernel, int[] pad, int[] stride) {
    Class<?> i = int.class;
    try {
      Object pd = descriptor(poolClass, "Pooling");
      Object xd = descriptor(tensorClass, "Tensor");
      Object yd = descriptor(tensorClass, "Tensor");
      int mode = kind == MAX_POOL ? MAX_DETERMINISTIC : AVERAGE_INCLUDE_PADDING;
      call(
          "cudnnSetPooling2dDescriptor",
          new Class<?>[] {poolClass, i, i, i, i, i, i, i, i},
          pd, mode, PROPAGATE_NAN, kernel[0], kernel[1], pad[0], pad[1], stride[0], stride[1]);
      tensor(xd, x[0], x[1], x[2], x[3]);
      int[][] dims = {{0}, {0}, {0}, {0}};
      Class<?> a = int[].class;
      call(
          "cudnnGetPooling2dForwardOutputDim",
          new Class<?>[] {poolClass, tensorClass, a, a, a, a},
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
      tensor(yd, y[0], y[1], y[2], y[3]);
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
      Object d = descriptor(tensorClass, "Tensor");
      tensor(d, shape[0], shape[1], b, 1);
      return new Op(log ? LOG_SOFTMAX : SOFTMAX, null, d, d);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("cuDNN's softmax descriptor failed", e);
    }
  }

  /** The cross-channel LRN of x {@code [N, C, H, W]} (an odd {@code size}). */
  Op lrn(int[] x, int size, double alpha, double beta, double k) {
    Class<?> d = double.class;
    try {
      Object ld = descriptor(lrnClass, "LRN");
      Object xd = descriptor(tensorClass, "Tensor");
      call(
          "cudnnSetLRNDescriptor",
          new Class<?>[] {lrnClass, int.class, d, d, d},
          ld, size, alpha, beta, k);
      tensor(xd, x[0], x[1], x[2], x[3]);
      return new Op(LRN, ld, xd, xd);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("cuDNN's LRN descriptors failed", e);
    }
  }

  /** {@code y = o(x)} at device addresses. */
  void forward(Op o, long y, long x) {
    int status;
    try {
      setAddress.invokeExact(first, x);
      setAddress.invokeExact(out, y);
      if (o.kind == MAX_POOL || o.kind == AVG_POOL) {
        status = (int) poolForward.invokeExact(handle, o.op, one, o.x, first, zero, o.y, out);
      } else if (o.kind == LRN) {
        status =
            (int)
                lrnForward.invokeExact(
                    handle, o.op, LRN_CROSS_CHANNEL, one, o.x, first, zero, o.y, out);
      } else {
        int algo = o.kind == LOG_SOFTMAX ? SOFTMAX_LOG : SOFTMAX_ACCURATE;
        status =
            (int)
                softmaxForward.invokeExact(
                    handle, algo, SOFTMAX_CHANNEL, one, o.x, first, zero, o.y, out);
      }
    } catch (Throwable e) {
      throw new IllegalStateException(FORWARDS[o.kind] + " failed", e);
    }
    check(FORWARDS[o.kind], status);
  }

  /**
   * {@code dx} of {@code o} at device addresses, from x, y and dy (softmax reads y and dy; average
   * pooling dy alone: x and y may be anything of their size).
   */
  void backward(Op o, long dx, long x, long y, long dy) {
    int status;
    try {
      setAddress.invokeExact(first, y);
      setAddress.invokeExact(second, dy);
      setAddress.invokeExact(third, x);
      setAddress.invokeExact(out, dx);
      if (o.kind == MAX_POOL || o.kind == AVG_POOL) {
        status =
            (int)
                poolBackward.invokeExact(
                    handle, o.op, one, o.y, first, o.y, second, o.x, third, zero, o.x, out);
      } else if (o.kind == LRN) {
        status =
            (int)
                lrnBackward.invokeExact(
                    handle, o.op, LRN_CROSS_CHANNEL, one, o.y, first, o.y, second, o.x, third,
                    zero, o.x, out);
      } else {
        int algo = o.kind == LOG_SOFTMAX ? SOFTMAX_LOG : SOFTMAX_ACCURATE;
        status =
            (int)
                softmaxBackward.invokeExact(
                    handle, algo, SOFTMAX_CHANNEL, one, o.y, first, o.y, second, zero, o.x, out);
      }
    } catch (Throwable e) {
      throw new IllegalStateException(BACKWARDS[o.kind] + " failed", e);
    }
    check(BACKWARDS[o.kind], status);
  }

  /** Destroys every descriptor made, then the handle. */
  @Override
  public void close() {
    for (int k = descriptors.size() - 1; k >= 0; k--) {
      Object[] d = descriptors.get(k);
      try {
        cudnn.getMethod((String) d[0], (Class<?>) d[1]).invoke(null, d[2]);
      } catch (ReflectiveOperationException e) {
        throw new IllegalStateException(d[0] + " failed", e);
      }
    }
    descriptors.clear();
    try {
      int unused = (int) destroy.invoke(handle);
    } catch (Throwable e) {
      throw new IllegalStateException("cudnnDestroy failed", e);
    }
  }
}
