package deepdsl.runtime;

import deepdsl.runtime.GemmOperands.Columns;
import deepdsl.runtime.GemmOperands.Direct;
import deepdsl.runtime.GemmOperands.Mat;
import deepdsl.runtime.GemmOperands.Planes;
import deepdsl.runtime.GemmOperands.Right;
import deepdsl.runtime.GemmOperands.Rows;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;

/**
 * {@link CpuGemm#gemm}'s products through OpenBLAS's {@code cblas_sgemm}, reached through JavaCPP's
 * presets ({@code org.bytedeco:openblas}, {@code org.bytedeco:javacpp}, each with its natives jar).
 *
 * <p>This is the only class that names a JavaCPP or OpenBLAS class, and it names them as strings:
 * it compiles without their jars, and a program run without them loses only this class's
 * constructor, which says what is missing ({@link Blas} then takes the Java SGEMM or reports it).
 *
 * <p>The tensors are Java arrays, which JavaCPP passes to C by copying the whole array (the arena:
 * hundreds of MB for one product), so each operand's elements are copied into a direct buffer of the
 * calling thread instead, compactly (leading dimension = its width), and C's back. A transposed
 * view ({@code rowStride == 1}) is copied as the row-major matrix it views and passed as {@code
 * CblasTrans}; an im2col matrix ({@link Rows}, or its transpose {@link Columns}) a row at a time,
 * and image planes ({@link Planes}, a pointwise convolution's operand) a plane's run at a time. The
 * convolutions build their im2col columns in a direct buffer of the calling thread ({@link
 * #columns}) instead, and that operand ({@link Direct}) is read where it lies: one copy of the
 * columns fewer, and the threads that split the product share it rather than each copying all of it
 * (ResNet-50 at batch 8, 64x64, two threads: 176 against 180 ms a step, means of four runs).
 * OpenBLAS runs on one thread per call: the runtime's parallel loops call it from each of their
 * {@link Parallel#THREADS} threads, on pieces fixed by the sizes and the thread count, as they do
 * the Java SGEMM.
 */
final class OpenBlasGemm implements Blas.Gemm {
  private static final int ROW_MAJOR = 101;
  private static final int NO_TRANS = 111;
  private static final int TRANS = 112;

  /** cblas_sgemm(order, transA, transB, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc). */
  private final MethodHandle sgemm;

  private final String version;

  /** One thread's operand buffers, grown as needed. */
  private static final class Buffers {
    FloatBuffer a = direct(0);
    FloatBuffer b = direct(0);
    FloatBuffer c = direct(0);
    /** The im2col columns the thread's convolution builds for the products to read in place. */
    FloatBuffer columns = direct(0);
  }

  private static final ThreadLocal<Buffers> BUFFERS = ThreadLocal.withInitial(Buffers::new);

  /**
   * Loads OpenBLAS (JavaCPP extracts its natives on first use) and sets it to one thread per call.
   *
   * @throws ReflectiveOperationException or {@link LinkageError} when the classes or natives are
   *     missing
   */
  OpenBlasGemm() throws ReflectiveOperationException {
    ClassLoader loader = OpenBlasGemm.class.getClassLoader();
    // initialising the class loads its natives (Loader.load in its static block)
    Class<?> blas = Class.forName("org.bytedeco.openblas.global.openblas_nolapack", true, loader);
    Class<?> fb = FloatBuffer.class;
    MethodType type =
        MethodType.methodType(
            void.class,
            new Class<?>[] {
              int.class, int.class, int.class, int.class, int.class, int.class, float.class, fb,
              int.class, fb, int.class, float.class, fb, int.class
            });
    sgemm = MethodHandles.publicLookup().findStatic(blas, "cblas_sgemm", type);
    Class.forName("org.bytedeco.openblas.presets.openblas_nolapack", true, loader)
        .getMethod("blas_set_num_threads", int.class)
        .invoke(null, 1);
    Object v =
        Class.forName("org.bytedeco.javacpp.Loader", true, loader)
            .getMethod("getVersion", String.class, String.class)
            .invoke(null, "org.bytedeco", "openblas");
    version = v == null ? "" : " " + String.valueOf(v).replaceFirst("-.*", "");
  }

  @Override
  public String description() {
    return "OpenBLAS" + version;
  }

  @Override
  public FloatBuffer columns(int floats) {
    Buffers buf = BUFFERS.get();
    try {
      return buf.columns = atLeast(buf.columns, floats);
    } catch (OutOfMemoryError full) { // direct memory is capped: the columns go in arrays
      return null;
    }
  }

  @Override
  public boolean gemm(int m, int n, int k, Mat x, Right y, Mat z, boolean accumulate) {
    boolean aTrans = x.colStride() != 1;
    if (m == 0 || n == 0 || k == 0 || z.colStride() != 1 || (aTrans && x.rowStride() != 1)) {
      return false;
    }
    boolean bTrans =
        y instanceof Mat my && my.colStride() != 1
            || y instanceof Planes pl && pl.transposed()
            || y instanceof Columns
            || y instanceof Direct d && d.transposed();
    if (bTrans && y instanceof Mat my && my.rowStride() != 1) {
      return false;
    }
    Buffers buf = BUFFERS.get();
    FloatBuffer a;
    FloatBuffer b;
    FloatBuffer c;
    int ldb = bTrans ? k : n;
    try {
      a = buf.a = atLeast(buf.a, m * k);
      if (y instanceof Direct d) { // read where it lies
        b = inPlace(d, bTrans ? n : k, bTrans ? k : n);
        ldb = d.ld();
      } else {
        b = buf.b = atLeast(buf.b, k * n);
      }
      c = buf.c = atLeast(buf.c, m * n);
    } catch (OutOfMemoryError full) { // direct memory is capped (-XX:MaxDirectMemorySize): the Java SGEMM does it
      return false;
    }
    // A as stored: m x k, or for a transposed view the k x m matrix it views
    if (aTrans) {
      copyIn(a, x.a(), x.off(), x.colStride(), k, m);
    } else {
      copyIn(a, x.a(), x.off(), x.rowStride(), m, k);
    }
    if (!(y instanceof Direct)) {
      copyRight(b, y, k, n, bTrans);
    }
    if (accumulate) {
      copyIn(c, z.a(), z.off(), z.rowStride(), m, n);
    }
    try {
      sgemm.invokeExact(
          ROW_MAJOR,
          aTrans ? TRANS : NO_TRANS,
          bTrans ? TRANS : NO_TRANS,
          m,
          n,
          k,
          1f,
          a,
          aTrans ? m : k,
          b,
          ldb,
          accumulate ? 1f : 0f,
          c,
          n);
    } catch (Throwable e) {
      throw new IllegalStateException("cblas_sgemm failed", e);
    }
    float[] out = z.a();
    int ldc = z.rowStride();
    if (ldc == n) {
      c.get(0, out, z.off(), m * n);
    } else {
      for (int i = 0; i < m; i++) {
        c.get(i * n, out, z.off() + i * ldc, n);
      }
    }
    return true;
  }

  /** b[0 .. k*n) = the right operand y (k x n), compactly: as stored, or transposed (n x k). */
  private static void copyRight(FloatBuffer b, Right y, int k, int n, boolean bTrans) {
    if (y instanceof Planes pl) { // the k x n (transposed: n x k) plane matrix, a run at a time
      int rows = bTrans ? n : k;
      int cols = bTrans ? k : n;
      int row0 = bTrans ? pl.col0() : pl.row0();
      int col0 = bTrans ? pl.row0() : pl.col0();
      for (int p = 0; p < rows; p++) {
        for (int done = 0; done < cols; ) {
          int column = col0 + done;
          int run = Math.min(cols - done, pl.pixels() - column % pl.pixels());
          b.put(p * cols + done, pl.a(), pl.at(row0 + p, column), run);
          done += run;
        }
      }
    } else if (y instanceof Columns cs) { // the n x k Rows matrix it transposes, a row at a time
      for (int q = 0; q < n; q++) {
        b.put(q * k, cs.rows()[cs.row0() + q], cs.col0(), k);
      }
    } else if (y instanceof Rows r) {
      for (int p = 0; p < k; p++) {
        b.put(p * n, r.rows()[r.row0() + p], r.col0(), n);
      }
    } else if (bTrans) {
      Mat my = (Mat) y;
      copyIn(b, my.a(), my.off(), my.colStride(), n, k);
    } else {
      Mat my = (Mat) y;
      copyIn(b, my.a(), my.off(), my.rowStride(), k, n);
    }
  }

  /**
   * The rows x cols matrix stored in d from its (0, 0), as stored (for a transposed view, the matrix
   * it views).
   */
  private static FloatBuffer inPlace(Direct d, int rows, int cols) {
    int first = d.row0() * d.ld() + d.col0();
    return d.buf().slice(first, (rows - 1) * d.ld() + cols);
  }

  /** to[0 .. rows*cols) = the rows x cols matrix at {@code from[off]} with rows {@code ld} apart. */
  private static void copyIn(FloatBuffer to, float[] from, int off, int ld, int rows, int cols) {
    if (ld == cols) {
      to.put(0, from, off, rows * cols);
      return;
    }
    for (int i = 0; i < rows; i++) {
      to.put(i * cols, from, off + i * ld, cols);
    }
  }

  private static FloatBuffer atLeast(FloatBuffer have, int size) {
    return have.capacity() >= size ? have : direct(Math.max(size, have.capacity() + have.capacity() / 2));
  }

  private static FloatBuffer direct(int floats) {
    return ByteBuffer.allocateDirect(4 * floats).order(ByteOrder.nativeOrder()).asFloatBuffer();
  }
}
