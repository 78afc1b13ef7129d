package deepdsl.runtime;

import java.io.IOException;
import java.lang.invoke.MethodHandle;
import java.lang.reflect.Field;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * The CUDA device's matrix products (linear layers, matmuls, batched matmuls) through cuBLAS, reached
 * through JavaCPP's CUDA presets ({@code org.bytedeco:cuda}, {@code org.bytedeco:javacpp}, each with
 * its natives jar). JCuda keeps the driver API, NVRTC and our kernels; cuBLAS works on the same
 * memory through raw device addresses ({@link CudaMemory.DevicePointer}).
 *
 * <p>This is the only class that names a JavaCPP class, and it names them as strings: it compiles
 * without their jars, and a program run without them loses only this class's constructor, which
 * says what is missing. {@code --device cpu} never loads it.
 *
 * <p>cuBLAS runs on the runtime API's primary context of GPU 0, which {@link CudaDevice} has
 * retained and made current, and on the legacy default stream, the one our kernels are launched on,
 * so its products are ordered with them. The tensors are row-major and cuBLAS is column-major: a
 * row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, so each call passes the
 * operands swapped, with no copy. A device address is handed to JavaCPP as a {@code FloatPointer}
 * at address 0 whose position is the address in floats (JavaCPP passes {@code address + 4 *
 * position} to C): public API, no allocation per call.
 */
final class CudaBlas implements AutoCloseable {
  /** What to put on the class path for cuBLAS, for the error that says it is missing. */
  static final String JARS =
      "the jars of org.bytedeco:cuda:13.1-9.19-1.5.13 and org.bytedeco:javacpp:1.5.13, each with its"
          + " linux-x86_64 natives jar (`deepdsl compile --maven` writes a pom whose profile cuda13, or"
          + " cuda12 for CUDA 12, brings them)";

  /** Where the libraries come from, for the error that says one is missing. */
  static final String LIBRARIES =
      "cuBLAS 13 (libcublas.so.13, libcublasLt.so.13, libcudart.so.13: `pip install nvidia-cublas"
          + " nvidia-cuda-runtime` or the CUDA 13 toolkit) on LD_LIBRARY_PATH, or"
          + " -Dorg.bytedeco.javacpp.pathsFirst=true -Djava.library.path=THEIR_FOLDER";

  private static final int OP_N = 0;
  private static final int OP_T = 1;
  private static final Pattern MISSING =
      Pattern.compile("(lib[\\w.+-]+\\.so[\\w.]*): cannot open shared");

  /** cublasSgemm_v2(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc). */
  private final MethodHandle sgemm;

  /** cublasSgemmStridedBatched(handle, ..., A, lda, strideA, B, ldb, strideB, beta, C, ldc, strideC, n). */
  private final MethodHandle batched;

  /**
   * cublasGemmEx and cublasGemmStridedBatchedEx (--precision bf16: CUDA_R_16BF A and B, C as the plan
   * stores it, CUBLAS_COMPUTE_32F), their arguments as SGEMM's with each matrix's type after it.
   */
  private final MethodHandle gemmEx;

  private final MethodHandle batchedEx;

  /** FloatPointer.position(long). */
  private final MethodHandle position;

  /** BytePointer.position(long). */
  private final MethodHandle bytePosition;

  private final MethodHandle destroy;
  private final Object handle;
  // alpha 1 and beta 0 in direct buffers, which JavaCPP wraps without allocating (its own allocations count
  // against its limit on the process's memory); the buffers are kept here, as the pointers do not hold them
  private final FloatBuffer ones = scalar(1f);
  private final FloatBuffer zeros = scalar(0f);
  private final Object one;
  private final Object zero;
  // the operands of one call: FloatPointers at address 0, positioned at the device addresses
  private final Object left;
  private final Object right;
  private final Object out;
  // the Ex calls' operands: their parameters are void*, to which JavaCPP adds the position in bytes, so
  // BytePointers at address 0 positioned at the device addresses
  private final Object exLeft;
  private final Object exRight;
  private final Object exOut;
  private final String version;

  /**
   * Loads cuBLAS through the presets (JavaCPP extracts its bindings on first use) and creates the
   * handle, on the context current on this thread, its calls on the stream at {@code stream} (a
   * driver API {@code CUstream}).
   *
   * @throws Device.Unavailable when the jars or the libraries are missing: which, and how to get them
   */
  static CudaBlas open(long stream) {
    try {
      return new CudaBlas(stream);
    } catch (ClassNotFoundException | NoClassDefFoundError e) {
      String text = String.valueOf(e.getMessage());
      if (e instanceof NoClassDefFoundError && text.startsWith("Could not initialize")) {
        throw new Device.Unavailable("cuBLAS did not load the first time it was tried (" + text + ")");
      }
      throw new Device.Unavailable(
          "the JavaCPP CUDA classes are not on the class path (no " + text + "): add " + JARS);
    } catch (IllegalStateException e) { // loaded, but no handle: the runtime API found no GPU
      throw new Device.Unavailable("cuBLAS loaded but did not start (" + e.getMessage() + ")");
    } catch (ReflectiveOperationException | LinkageError | RuntimeException e) {
      throw new Device.Unavailable("cuBLAS does not load (" + reason(e) + "): it needs " + LIBRARIES);
    }
  }

  /** The library a link error misses, else the first line of the innermost error. */
  static String reason(Throwable e) {
    Throwable inner = e;
    for (Throwable t = e; t != null; t = t.getCause()) {
      Matcher m = MISSING.matcher(String.valueOf(t.getMessage()));
      if (m.find()) {
        return m.group(1) + " not found";
      }
      inner = t;
    }
    String text = String.valueOf(inner.getMessage());
    return inner.getClass().getSimpleName() + ": " + text.lines().findFirst().orElse(text);
  }

  private CudaBlas(long streamAddress) throws ReflectiveOperationException {
    ClassLoader loader = CudaBlas.class.getClassLoader();
    // initialising the class loads its natives and the libraries they link (Loader.load)
    Class<?> cublas = Class.forName("org.bytedeco.cuda.global.cublas", true, loader);
    Class<?> context = Class.forName("org.bytedeco.cuda.cublas.cublasContext", true, loader);
    Class<?> stream = Class.forName("org.bytedeco.cuda.cudart.CUstream_st", true, loader);
    Class<?> fp = Class.forName("org.bytedeco.javacpp.FloatPointer", true, loader);
    MethodHandles.Lookup lookup = MethodHandles.publicLookup();
    Class<?> i = int.class;
    Class<?> l = long.class;
    sgemm =
        erased(
            lookup.findStatic(
                cublas,
                "cublasSgemm_v2",
                MethodType.methodType(i, context, i, i, i, i, i, fp, fp, i, fp, i, fp, fp, i)));
    batched =
        erased(
            lookup.findStatic(
                cublas,
                "cublasSgemmStridedBatched",
                MethodType.methodType(
                    i, context, i, i, i, i, i, fp, fp, i, l, fp, i, l, fp, fp, i, l, i)));
    Class<?> p = Class.forName("org.bytedeco.javacpp.Pointer", true, loader);
    gemmEx =
        erased(
            lookup.findStatic(
                cublas,
                "cublasGemmEx",
                MethodType.methodType(i, context, i, i, i, i, i, p, p, i, i, p, i, i, p, p, i, i, i, i)));
    batchedEx =
        erased(
            lookup.findStatic(
                cublas,
                "cublasGemmStridedBatchedEx",
                MethodType.methodType(
                    i, context, i, i, i, i, i, p, p, i, i, l, p, i, i, l, p, p, i, i, l, i, i, i)));
    position = erased(lookup.findVirtual(fp, "position", MethodType.methodType(fp, l)));
    Class<?> bp = Class.forName("org.bytedeco.javacpp.BytePointer", true, loader);
    bytePosition = erased(lookup.findVirtual(bp, "position", MethodType.methodType(bp, l)));
    destroy = lookup.findStatic(cublas, "cublasDestroy_v2", MethodType.methodType(i, context));
    Object h = context.getConstructor().newInstance();
    check("cublasCreate_v2", cublas.getMethod("cublasCreate_v2", context).invoke(null, h));
    handle = h;
    // CudaDevice's stream, as a CUstream_st at its address (JavaCPP keeps the address protected)
    Object on = stream.getConstructor().newInstance();
    Field address = Class.forName("org.bytedeco.javacpp.Pointer", true, loader).getDeclaredField("address");
    address.setAccessible(true);
    address.setLong(on, streamAddress);
    check(
        "cublasSetStream_v2",
        cublas.getMethod("cublasSetStream_v2", context, stream).invoke(null, h, on));
    int[] v = {0};
    check(
        "cublasGetVersion_v2",
        cublas.getMethod("cublasGetVersion_v2", context, int[].class).invoke(null, h, v));
    version = v[0] / 10000 + "." + v[0] / 100 % 100 + "." + v[0] % 100;
    one = fp.getConstructor(FloatBuffer.class).newInstance(ones);
    zero = fp.getConstructor(FloatBuffer.class).newInstance(zeros);
    left = fp.getConstructor().newInstance();
    right = fp.getConstructor().newInstance();
    out = fp.getConstructor().newInstance();
    exLeft = bp.getConstructor().newInstance();
    exRight = bp.getConstructor().newInstance();
    exOut = bp.getConstructor().newInstance();
  }

  private static FloatBuffer scalar(float v) {
    return ByteBuffer.allocateDirect(4).order(ByteOrder.nativeOrder()).asFloatBuffer().put(0, v);
  }

  /** {@code h} with every reference type as Object, so that it is called with invokeExact. */
  private static MethodHandle erased(MethodHandle h) {
    MethodType t = h.type();
    for (int k = 0; k < t.parameterCount(); k++) {
      if (!t.parameterType(k).isPrimitive()) {
        t = t.changeParameterType(k, Object.class);
      }
    }
    if (!t.returnType().isPrimitive()) {
      t = t.changeReturnType(Object.class);
    }
    return h.asType(t);
  }

  private static void check(String call, Object status) {
    if ((Integer) status != 0) {
      throw new IllegalStateException(call + " returned cuBLAS status " + status);
    }
  }

  /**
   * Every later GEMM in CUBLAS_TF32_TENSOR_OP_MATH (--precision tf32): float32 storage, TF32 tensor
   * core products, float32 accumulation.
   */
  void setTf32() {
    try {
      ClassLoader loader = CudaBlas.class.getClassLoader();
      Class<?> cublas = Class.forName("org.bytedeco.cuda.global.cublas", true, loader);
      Class<?> context = Class.forName("org.bytedeco.cuda.cublas.cublasContext", true, loader);
      check(
          "cublasSetMathMode",
          cublas.getMethod("cublasSetMathMode", context, int.class).invoke(null, handle, TF32_MATH));
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("cublasSetMathMode: " + e, e);
    }
  }

  /** CUBLAS_TF32_TENSOR_OP_MATH. */
  private static final int TF32_MATH = 3;

  /** The library, its version and the file it was loaded from, for the device line. */
  String description() {
    return "cuBLAS " + version + loadedFrom("libcublas.so");
  }

  /**
   * " (PATH)": the file of a shared library this process has mapped whose name starts with {@code
   * stem} (read from /proc/self/maps), so that the device line says which of several installed
   * copies was loaded; "" where that cannot be read.
   */
  static String loadedFrom(String stem) {
    try (Stream<String> maps = Files.lines(Path.of("/proc/self/maps"))) {
      return maps.map(line -> line.substring(line.lastIndexOf(' ') + 1))
          .filter(f -> f.startsWith("/") && f.substring(f.lastIndexOf('/') + 1).startsWith(stem))
          .findFirst()
          .map(f -> " (" + f + ")")
          .orElse("");
    } catch (IOException | RuntimeException e) {
      return "";
    }
  }

  /**
   * At device address {@code c}: {@code batch} row-major products C = op(A) op(B) of the m x k (or,
   * with {@code ta}, k x m) matrices at {@code a} and the k x n (n x k) ones at {@code b}, the
   * matrices of a batch one after the other, as our kernel dd_k_gemm computes them.
   */
  void gemm(long c, long a, long b, int batch, int m, int n, int k, boolean ta, boolean tb) {
    gemm(c, a, b, batch, m, n, k, ta, tb, false, false);
  }

  // cudaDataType_t and cublasComputeType_t / cublasGemmAlgo_t of the Ex calls
  private static final int R_32F = 0;
  private static final int R_16BF = 14;
  private static final int COMPUTE_32F = 68;
  private static final int GEMM_DEFAULT = -1;

  /**
   * As above; {@code bf16}: A and B are bf16 (--precision bf16), a cublasGemmEx (strided-batched
   * when batched) with CUDA_R_16BF operands and float32 compute, C bf16 where {@code bf16Result}
   * (rounded once), else float32, as the PyCUDA runner's (deepdsl/backends/cuda/cublas.py).
   */
  void gemm(long c, long a, long b, int batch, int m, int n, int k, boolean ta, boolean tb, boolean bf16,
      boolean bf16Result) {
    if (bf16Result && !bf16) {
      throw new IllegalStateException("a bf16 GEMM result needs bf16 operands (cublasGemmEx)");
    }
    int status;
    try {
      at(left, b); // column-major: C^T = op(B)^T op(A)^T
      at(right, a);
      at(out, c);
      int opLeft = tb ? OP_T : OP_N;
      int opRight = ta ? OP_T : OP_N;
      int lda = tb ? k : n;
      int ldb = ta ? m : k;
      int ab = R_16BF;
      int ct = bf16Result ? R_16BF : R_32F;
      if (bf16) {
        Object unused = (Object) bytePosition.invokeExact(exLeft, b);
        unused = (Object) bytePosition.invokeExact(exRight, a);
        unused = (Object) bytePosition.invokeExact(exOut, c);
      }
      if (bf16 && batch == 1) {
        status =
            (int)
                gemmEx.invokeExact(
                    handle, opLeft, opRight, n, m, k, one, exLeft, ab, lda, exRight, ab, ldb, zero,
                    exOut, ct, n, COMPUTE_32F, GEMM_DEFAULT);
      } else if (bf16) {
        status =
            (int)
                batchedEx.invokeExact(
                    handle, opLeft, opRight, n, m, k, one, exLeft, ab, lda, (long) k * n, exRight, ab,
                    ldb, (long) m * k, zero, exOut, ct, n, (long) m * n, batch, COMPUTE_32F,
                    GEMM_DEFAULT);
      } else if (batch == 1) {
        status =
            (int)
                sgemm.invokeExact(
                    handle, opLeft, opRight, n, m, k, one, left, lda, right, ldb, zero, out, n);
      } else {
        status =
            (int)
                batched.invokeExact(
                    handle, opLeft, opRight, n, m, k, one, left, lda, (long) k * n, right, ldb,
                    (long) m * k, zero, out, n, (long) m * n, batch);
      }
    } catch (Throwable e) {
      throw new IllegalStateException("cuBLAS " + (bf16 ? "GemmEx" : "SGEMM") + " failed", e);
    }
    if (status != 0) {
      throw new IllegalStateException(
          "cuBLAS " + (bf16 ? "GemmEx bf16" : "SGEMM") + " (" + batch + " x " + m + "x" + n + "x" + k + ") returned status " + status);
    }
  }

  private void at(Object pointer, long address) throws Throwable {
    if (address % 4 != 0) {
      throw new IllegalStateException("a float tensor at an unaligned device address " + address);
    }
    Object unused = (Object) position.invokeExact(pointer, address / 4);
  }

  @Override
  public void close() {
    try {
      int unused = (int) destroy.invoke(handle);
    } catch (Throwable e) {
      throw new IllegalStateException("cublasDestroy_v2 failed", e);
    }
  }
}
