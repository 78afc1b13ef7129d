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
 * The CUDA device's convolutions (forward, backward-data, backward-filter) through cuDNN 9's legacy
 * calls, reached through JavaCPP's CUDA presets ({@code org.bytedeco.cuda.global.cudnn}) as {@link
 * CudaBlas} reaches cuBLAS: by name, so that it compiles without their jars; its pooling, softmax
 * and LRN through {@link CudaDnnOps} ({@link #ops}), on the same handle.
 *
 * <p>Each convolution of the step gets its descriptors and its algorithm once, at its first call
 * (the first step, never captured), within the workspace limit: the fastest that {@code
 * cudnnFind...AlgorithmEx} times on the call's own buffers and a temporary scratch ({@link #find}),
 * a precise one (outside the FFT and non-fused Winograd families) where any fits, deterministic or
 * not; or under {@code --deterministic} the first algorithm that the call's {@code _v7} query
 * proposes (cuDNN's heuristic order), preferring a deterministic, precise one ({@link #prepare});
 * both the Python runner's rules (deepdsl/backends/cuda/cudnn.py). Find synchronises, so it never
 * runs while a step is captured. {@link CudaDevice} gives the chosen algorithm its scratch. Math is
 * {@code CUDNN_FMA_MATH}:
 * float32 without TF32. The handle works on the device's stream, so a captured step records its
 * calls. The workspace limit is per convolution and beyond the arena, as on the CPU device (the Java
 * program does not take the plan's per-statement workspace); the device allocates the largest
 * scratch a chosen algorithm needs, once, and its measured GPU memory counts it.
 *
 * <p>Every descriptor is made once, by its call's first use, and destroyed at {@link #close}. A
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
  // the timing queries: each algorithm run on the given buffers and scratch
  private static final String[] FINDS = {
    "cudnnFindConvolutionForwardAlgorithmEx",
    "cudnnFindConvolutionBackwardDataAlgorithmEx",
    "cudnnFindConvolutionBackwardFilterAlgorithmEx"
  };
  // each call's algorithms by number (cudnn_cnn.h), as the Python runner names them
  private static final String[][] NAMES = {
    {
      "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING", "WINOGRAD",
      "WINOGRAD_NONFUSED"
    },
    {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"},
    {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"}
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
  private static final int BFLOAT16 = 9; // CUDNN_DATA_BFLOAT16 (--precision bf16)
  private static final int CROSS_CORRELATION = 1;
  private static final int FMA_MATH = 3;
  private static final int TENSOR_OP_MATH = 1; // --precision tf32: TF32 tensor cores for float32
  private int math = FMA_MATH; // the convolutions' math type (setTf32)
  private static final int DETERMINISTIC = 1;
  /** A convolution ready to run: its descriptors, its algorithm and the scratch that needs. */
  static final class Conv {
    final int kind;
    final Object x; // forward and filter: x; data: dx
    final Object w; // the filter (or dw)
    final Object conv;
    final Object y; // y or dy
    final int algo;
    final long workspace;
    final float time; // what Find measured, in ms; NaN: the heuristic's choice
    final String shape; // x, w, y (forward terms), pad, stride, dilation, groups: as the Python runner says

    Conv(
        int kind, Object x, Object w, Object conv, Object y, int algo, long workspace, float time,
        String shape) {
      this.kind = kind;
      this.x = x;
      this.w = w;
      this.conv = conv;
      this.y = y;
      this.algo = algo;
      this.workspace = workspace;
      this.time = time;
      this.shape = shape;
    }

    String call() {
      return CALLS[kind];
    }

    String algorithm() {
      return algo < NAMES[kind].length ? NAMES[kind][algo] : String.valueOf(algo);
    }

    /** This convolution as an object of the --json list (gpu_convolutions). */
    String json() {
      return "{\"call\": \""
          + call()
          + "\", \"shape\": \""
          + shape
          + "\", \"algorithm\": \""
          + algorithm()
          + "\", \"workspace_bytes\": "
          + workspace
          + ", \"scratch\": true, \"time_ms\": "
          + (Float.isNaN(time) ? "null" : String.valueOf(time))
          + "}";
    }
  }

  /** A temporary scratch for Find: the address of at least {@code bytes} bytes. */
  interface Trial {
    long scratch(long bytes);
  }

  private final Class<?> cudnn;
  final Class<?> contextClass;
  final Class<?> tensorClass;
  private final Class<?> filterClass;
  private final Class<?> convClass;
  private final ClassLoader loader;
  private final MethodHandle[] calls = new MethodHandle[3];
  // every descriptor made, with its destroy call, destroyed at close in reverse
  private final List<Object[]> descriptors = new ArrayList<>();
  final MethodHandle setAddress; // Pointer.address = long, as (Object, long)void
  private final MethodHandle destroy;
  final Object handle;
  private final FloatBuffer ones = scalar(1f); // kept here: the pointers do not hold them
  private final FloatBuffer zeros = scalar(0f);
  final Object one;
  final Object zero;
  private final Object first; // the operands of one call: Pointers whose address is set
  private final Object second;
  private final Object out;
  private final Object scratch;
  private final String version;
  /** The pooling, batch-norm, softmax and LRN calls. */
  final CudaDnnOps ops;

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
    out = pointer.getConstructor().newInstance();
    scratch = pointer.getConstructor().newInstance();
    ops = new CudaDnnOps(this);
  }

  Class<?> type(String name) throws ClassNotFoundException {
    return Class.forName("org.bytedeco.cuda." + name, true, loader);
  }

  private static FloatBuffer scalar(float v) {
    return ByteBuffer.allocateDirect(4).order(ByteOrder.nativeOrder()).asFloatBuffer().put(0, v);
  }

  /** The cuDNN call {@code name} of {@code params}, returning its status, its objects erased. */
  MethodHandle handle(String name, Class<?>... params) throws ReflectiveOperationException {
    MethodType t = MethodType.methodType(int.class, params);
    return erased(MethodHandles.publicLookup().findStatic(cudnn, name, t));
  }

  /** A JavaCPP {@code Pointer} whose address {@link #setAddress} sets. */
  Object pointer() throws ReflectiveOperationException {
    Class<?> pointer = Class.forName("org.bytedeco.javacpp.Pointer", true, loader);
    return pointer.getConstructor().newInstance();
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

  static void check(String call, Object status) {
    if ((Integer) status != 0) {
      throw new IllegalStateException(call + " returned cuDNN status " + status);
    }
  }

  /** The convolutions described from now on in CUDNN_TENSOR_OP_MATH (--precision tf32). */
  void setTf32() {
    math = TENSOR_OP_MATH;
  }

  /** The library, its version and the file it was loaded from, for the device line. */
  String description() {
    return "cuDNN " + version + CudaBlas.loadedFrom("libcudnn_graph.so");
  }

  Object call(String name, Class<?>[] types, Object... args) {
    try {
      Object status = cudnn.getMethod(name, types).invoke(null, args);
      check(name, status);
      return status;
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException(name + " failed", e);
    }
  }

  /** A new descriptor of {@code kind} ({@code Tensor}, {@code LRN}, ...), destroyed at close. */
  Object descriptor(Class<?> type, String kind) throws ReflectiveOperationException {
    Object d = type.getConstructor().newInstance();
    call("cudnnCreate" + kind + "Descriptor", new Class<?>[] {type}, d);
    descriptors.add(new Object[] {"cudnnDestroy" + kind + "Descriptor", type, d});
    return d;
  }

  /** Sets {@code d} to a float32 NCHW tensor of {@code [n, c, h, w]}. */
  void tensor(Object d, int n, int c, int h, int w) {
    tensor(d, FLOAT, n, c, h, w);
  }

  /** Sets {@code d} to an NCHW tensor of {@code [n, c, h, w]} of {@code type} (FLOAT, BFLOAT16). */
  void tensor(Object d, int type, int n, int c, int h, int w) {
    Class<?> i = int.class;
    call(
        "cudnnSetTensor4dDescriptor",
        new Class<?>[] {tensorClass, i, i, i, i, i, i},
        d, NCHW, type, n, c, h, w);
  }

  /**
   * The convolution {@code kind} (FORWARD, DATA, FILTER) of x {@code [N, C, H, W]} by the filter
   * {@code w} into y: its descriptors and the first algorithm of cuDNN's order (a deterministic,
   * precise one first) whose scratch is at most {@code limit} bytes.
   */
  Conv prepare(
      int kind, int[] x, int[] w, int[] y, int[] pad, int[] stride, int[] dilation, int groups,
      long limit, boolean bf16) {
    return choose(kind, x, w, y, pad, stride, dilation, groups, limit, 0, 0, 0, null, bf16);
  }

  /**
   * As {@link #prepare}, the algorithm the fastest that {@code cudnnFind...AlgorithmEx} times on
   * the call's output {@code result} and inputs {@code a} and {@code b} (device addresses, the
   * statement's order: forward x, w; data dy, w; filter x, dy), given the most scratch any listed
   * algorithm needs within {@code limit}, from {@code trial}. Find writes arbitrary values to the
   * output and the scratch, so neither may hold anything live.
   */
  Conv find(
      int kind, int[] x, int[] w, int[] y, int[] pad, int[] stride, int[] dilation, int groups,
      long limit, long result, long a, long b, Trial trial, boolean bf16) {
    return choose(kind, x, w, y, pad, stride, dilation, groups, limit, result, a, b, trial, bf16);
  }

  /**
   * {@code bf16} (--precision bf16): x, w and y are bf16, CUDNN_DATA_BFLOAT16 tensor and filter
   * descriptors and a CUDNN_DATA_FLOAT convolution descriptor (cuDNN's PSEUDO_BFLOAT16 configuration:
   * float32 compute, the result rounded once) in CUDNN_TENSOR_OP_MATH, as the PyCUDA runner's cudnn.py.
   */
  private Conv choose(
      int kind, int[] x, int[] w, int[] y, int[] pad, int[] stride, int[] dilation, int groups,
      long limit, long result, long a, long b, Trial trial, boolean bf16) {
    Class<?> i = int.class;
    int data = bf16 ? BFLOAT16 : FLOAT;
    try {
      Object xd = descriptor(tensorClass, "Tensor");
      Object wd = descriptor(filterClass, "Filter");
      Object cd = descriptor(convClass, "Convolution");
      Object yd = descriptor(tensorClass, "Tensor");
      tensor(xd, data, x[0], x[1], x[2], x[3]);
      call(
          "cudnnSetFilter4dDescriptor",
          new Class<?>[] {filterClass, i, i, i, i, i, i},
          wd, data, NCHW, w[0], w[1], w[2], w[3]);
      call(
          "cudnnSetConvolution2dDescriptor",
          new Class<?>[] {convClass, i, i, i, i, i, i, i, i},
          cd, pad[0], pad[1], stride[0], stride[1], dilation[0], dilation[1], CROSS_CORRELATION,
          FLOAT);
      call("cudnnSetConvolutionGroupCount", new Class<?>[] {convClass, i}, cd, groups);
      call(
          "cudnnSetConvolutionMathType", new Class<?>[] {convClass, i}, cd, bf16 ? TENSOR_OP_MATH : math);
      tensor(yd, data, y[0], y[1], y[2], y[3]);
      String shape =
          "x " + Arrays.toString(x) + " w " + Arrays.toString(w) + " y " + Arrays.toString(y)
              + " pad " + Arrays.toString(pad) + " stride " + Arrays.toString(stride)
              + " dilation " + Arrays.toString(dilation) + " groups " + groups;
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
      if (trial != null) {
        long room = 0;
        for (int k = 0; k < count[0]; k++) {
          Object p = at.invoke(perf, (long) k);
          if ((Integer) perfClass.getMethod("status").invoke(p) == 0) {
            room = Math.max(room, (Long) perfClass.getMethod("memory").invoke(p));
          }
        }
        room = Math.min(room, limit);
        // Find's operands: forward (x, w -> y), data (w, dy -> dx), filter (x, dy -> dw); the
        // statement's inputs are forward (x, w), data (dy, w), filter (x, dy)
        long[] at3 =
            kind == FORWARD
                ? new long[] {a, b, result}
                : kind == DATA ? new long[] {b, a, result} : new long[] {a, b, result};
        Object[] pointers = {pointer(), pointer(), pointer(), pointer()};
        for (int k = 0; k < 3; k++) {
          setAddress.invokeExact(pointers[k], at3[k]);
        }
        setAddress.invokeExact(pointers[3], room > 0 ? trial.scratch(room) : 0L);
        Class<?> ptr = pointers[0].getClass();
        Class<?>[] findTypes = {
          contextClass, operands[0].getClass(), ptr, operands[1].getClass(), ptr, convClass,
          operands[3].getClass(), ptr, i, int[].class, perfClass, ptr, long.class
        };
        Object found = perfClass.getConstructor(long.class).newInstance((long) n);
        call(
            FINDS[kind], findTypes, handle, operands[0], pointers[0], operands[1], pointers[1], cd,
            operands[3], pointers[2], n, count, found, pointers[3], room);
        int best = -1;
        long bestMemory = 0;
        float bestTime = 0;
        boolean bestPrecise = false;
        for (int k = 0; k < count[0]; k++) { // fastest first: the first precise one, else the first
          Object p = at.invoke(found, (long) k);
          int algo = (Integer) perfClass.getMethod("algo").invoke(p);
          int status = (Integer) perfClass.getMethod("status").invoke(p);
          long memory = (Long) perfClass.getMethod("memory").invoke(p);
          float time = (Float) perfClass.getMethod("time").invoke(p);
          boolean good = precise(kind, algo);
          boolean better =
              best < 0 || good && !bestPrecise || good == bestPrecise && time < bestTime;
          if (status == 0 && memory <= room && time >= 0 && better) {
            best = algo;
            bestMemory = memory;
            bestTime = time;
            bestPrecise = good;
          }
        }
        if (best < 0) {
          throw new IllegalStateException(
              "cuDNN finds no algorithm for " + CALLS[kind] + " within " + room + " bytes");
        }
        return new Conv(kind, xd, wd, cd, yd, best, bestMemory, bestTime, shape);
      }
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
      return new Conv(kind, xd, wd, cd, yd, best, bestMemory, Float.NaN, shape);
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("cuDNN's descriptors for " + CALLS[kind] + " failed", e);
    } catch (IllegalStateException e) {
      throw e;
    } catch (Throwable e) {
      throw new IllegalStateException("cuDNN's algorithm search for " + CALLS[kind] + " failed", e);
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
