package deepdsl.runtime;

import static deepdsl.runtime.CpuSupport.*;
import static deepdsl.runtime.CpuConvolution.*;
import static deepdsl.runtime.GemmOperands.*;

import java.util.Arrays;

/** The SGEMM and the dense layers and matrix products of {@link CpuDevice}. */
public final class CpuGemm {
  private CpuGemm() {}

  // ---- SGEMM ----

  /** Columns of C (and of B) per block: two rows of C stay in L1. */
  static final int GEMM_NC = 512;

  /** Column blocks narrower than this go through {@link #sweepNarrow}. */
  static final int NARROW = 128;

  /** Rows of B per block: a GEMM_KC x GEMM_NC panel of B (512 KiB) stays in L2. */
  static final int GEMM_KC = 256;

  /**
   * B given as {@link Rows} that start at column 0 serves as the panel itself, without a copy, when
   * it has at most this many columns (GEMM_KC of its rows, 1 MiB, then still fit in L2).
   */
  static final int GEMM_DIRECT = 1024;

  /**
   * C = A B (or C += A B when {@code accumulate}) for an m x k matrix A, a k x n matrix B and an m
   * x n matrix C with unit column stride, on the calling thread.
   *
   * <p>Each GEMM_KC x GEMM_NC block of B is copied into the thread's panel, one array per row, and
   * swept by two rows of C at a time ({@link #sweep}), four terms of the inner product per pass.
   * Every array in that inner loop is indexed from 0 by the loop variable alone, which is what the
   * JIT needs to vectorise it: it does not vectorise a store and a load whose offsets differ. B
   * held as {@link Rows} from column 0 is already in that form and, up to GEMM_DIRECT columns, is
   * swept in place. Where {@link Blas} has OpenBLAS, the product is OpenBLAS's instead.
   */
  static void gemm(int m, int n, int k, Mat x, Right y, Mat z, boolean accumulate) {
    Blas.Gemm blas = Blas.gemm();
    if (blas != null && blas.gemm(m, n, k, x, y, z, accumulate)) {
      return;
    }
    float[] c = z.a();
    int cOff = z.off();
    int ldc = z.rowStride();
    if (k == 0) {
      if (!accumulate) {
        for (int i = 0; i < m; i++) {
          Arrays.fill(c, cOff + i * ldc, cOff + i * ldc + n, 0f);
        }
      }
      return;
    }
    Rows direct = y instanceof Rows r && r.col0() == 0 && n <= GEMM_DIRECT ? r : null;
    float[][] panel = direct != null ? direct.rows() : SCRATCH.get().panel;
    int columns = direct != null ? n : evenBlock(n, GEMM_NC);
    int rows = evenBlock(k, GEMM_KC);
    for (int j0 = 0; j0 < n; j0 += columns) {
      int w = Math.min(columns, n - j0);
      for (int p0 = 0; p0 < k; p0 += rows) {
        int depth = Math.min(rows, k - p0);
        int first = direct != null ? direct.row0() + p0 : 0; // the panel row of B's row p0
        if (direct == null) {
          y.from(p0, j0).copy(panel, depth, w);
        }
        boolean fresh = p0 == 0 && !accumulate;
        if (w < NARROW) {
          sweepNarrow(m, x, p0, c, cOff + j0, ldc, panel, first, depth, w, fresh);
        } else {
          sweep(m, x, p0, c, cOff + j0, ldc, panel, first, depth, w, fresh);
        }
      }
    }
  }

  /**
   * Rows 0 to m of C (from {@code cOff}, {@code w} columns) plus or instead of (when {@code fresh})
   * rows 0 to m of A, columns {@code p0} to {@code p0 + depth}, times panel rows {@code first} to
   * {@code first + depth}: two rows of C at a time through two row buffers, four terms of the inner
   * product per pass.
   */
  static void sweep(
      int m,
      Mat x,
      int p0,
      float[] c,
      int cOff,
      int ldc,
      float[][] panel,
      int first,
      int depth,
      int w,
      boolean fresh) {
    // NOTE: the row buffers must be allocated here, not kept in the scratch or passed in: the JIT
    // vectorises the inner loop only when it can tell the arrays it stores to from the panel rows
    // it loads, which it can for arrays allocated in this method (about 5x faster on JDK 17)
    float[] t0 = new float[w];
    float[] t1 = new float[w];
    float[] a = x.a();
    int aOff = x.off();
    int aRowStride = x.rowStride();
    int aColStride = x.colStride();
    int i = 0;
    for (; i + 1 < m; i += 2) {
      int c0 = cOff + i * ldc;
      int c1 = c0 + ldc;
      loadRow(t0, c, c0, w, fresh);
      loadRow(t1, c, c1, w, fresh);
      int a0 = aOff + i * aRowStride + p0 * aColStride;
      int a1 = a0 + aRowStride;
      int p = 0;
      for (; p + 3 < depth; p += 4) {
        int q0 = p * aColStride;
        int q1 = q0 + aColStride;
        int q2 = q1 + aColStride;
        int q3 = q2 + aColStride;
        float x0 = a[a0 + q0];
        float x1 = a[a0 + q1];
        float x2 = a[a0 + q2];
        float x3 = a[a0 + q3];
        float y0 = a[a1 + q0];
        float y1 = a[a1 + q1];
        float y2 = a[a1 + q2];
        float y3 = a[a1 + q3];
        float[] r0 = panel[first + p];
        float[] r1 = panel[first + p + 1];
        float[] r2 = panel[first + p + 2];
        float[] r3 = panel[first + p + 3];
        for (int j = 0; j < w; j++) {
          float v0 = r0[j];
          float v1 = r1[j];
          float v2 = r2[j];
          float v3 = r3[j];
          t0[j] += x0 * v0 + x1 * v1 + x2 * v2 + x3 * v3;
          t1[j] += y0 * v0 + y1 * v1 + y2 * v2 + y3 * v3;
        }
      }
      for (; p < depth; p++) {
        float x0 = a[a0 + p * aColStride];
        float y0 = a[a1 + p * aColStride];
        float[] r0 = panel[first + p];
        for (int j = 0; j < w; j++) {
          float v0 = r0[j];
          t0[j] += x0 * v0;
          t1[j] += y0 * v0;
        }
      }
      System.arraycopy(t0, 0, c, c0, w);
      System.arraycopy(t1, 0, c, c1, w);
    }
    if (i < m) {
      int c0 = cOff + i * ldc;
      loadRow(t0, c, c0, w, fresh);
      int a0 = aOff + i * aRowStride + p0 * aColStride;
      for (int p = 0; p < depth; p++) {
        float x0 = a[a0 + p * aColStride];
        float[] r0 = panel[first + p];
        for (int j = 0; j < w; j++) {
          t0[j] += x0 * r0[j];
        }
      }
      System.arraycopy(t0, 0, c, c0, w);
    }
  }

  /**
   * {@link #sweep} for blocks narrower than {@link #NARROW} columns, the same code in a method of
   * its own. The JIT shapes a loop by the trip counts it has seen, and one method serving both a
   * convolution's 25-column filter gradient and 512-column products was tuned for neither: this
   * copy takes LeNet's first filter gradient from 1.9 to 1.3 ms a step on two threads and leaves
   * the wide products at their own speed.
   */
  static void sweepNarrow(
      int m,
      Mat x,
      int p0,
      float[] c,
      int cOff,
      int ldc,
      float[][] panel,
      int first,
      int depth,
      int w,
      boolean fresh) {
    // NOTE: the row buffers must be allocated here, not kept in the scratch or passed in: the JIT
    // vectorises the inner loop only when it can tell the arrays it stores to from the panel rows
    // it loads, which it can for arrays allocated in this method (about 5x faster on JDK 17)
    float[] t0 = new float[w];
    float[] t1 = new float[w];
    float[] a = x.a();
    int aOff = x.off();
    int aRowStride = x.rowStride();
    int aColStride = x.colStride();
    int i = 0;
    for (; i + 1 < m; i += 2) {
      int c0 = cOff + i * ldc;
      int c1 = c0 + ldc;
      loadRow(t0, c, c0, w, fresh);
      loadRow(t1, c, c1, w, fresh);
      int a0 = aOff + i * aRowStride + p0 * aColStride;
      int a1 = a0 + aRowStride;
      int p = 0;
      for (; p + 3 < depth; p += 4) {
        int q0 = p * aColStride;
        int q1 = q0 + aColStride;
        int q2 = q1 + aColStride;
        int q3 = q2 + aColStride;
        float x0 = a[a0 + q0];
        float x1 = a[a0 + q1];
        float x2 = a[a0 + q2];
        float x3 = a[a0 + q3];
        float y0 = a[a1 + q0];
        float y1 = a[a1 + q1];
        float y2 = a[a1 + q2];
        float y3 = a[a1 + q3];
        float[] r0 = panel[first + p];
        float[] r1 = panel[first + p + 1];
        float[] r2 = panel[first + p + 2];
        float[] r3 = panel[first + p + 3];
        for (int j = 0; j < w; j++) {
          float v0 = r0[j];
          float v1 = r1[j];
          float v2 = r2[j];
          float v3 = r3[j];
          t0[j] += x0 * v0 + x1 * v1 + x2 * v2 + x3 * v3;
          t1[j] += y0 * v0 + y1 * v1 + y2 * v2 + y3 * v3;
        }
      }
      for (; p < depth; p++) {
        float x0 = a[a0 + p * aColStride];
        float y0 = a[a1 + p * aColStride];
        float[] r0 = panel[first + p];
        for (int j = 0; j < w; j++) {
          float v0 = r0[j];
          t0[j] += x0 * v0;
          t1[j] += y0 * v0;
        }
      }
      System.arraycopy(t0, 0, c, c0, w);
      System.arraycopy(t1, 0, c, c1, w);
    }
    if (i < m) {
      int c0 = cOff + i * ldc;
      loadRow(t0, c, c0, w, fresh);
      int a0 = aOff + i * aRowStride + p0 * aColStride;
      for (int p = 0; p < depth; p++) {
        float x0 = a[a0 + p * aColStride];
        float[] r0 = panel[first + p];
        for (int j = 0; j < w; j++) {
          t0[j] += x0 * r0[j];
        }
      }
      System.arraycopy(t0, 0, c, c0, w);
    }
  }

  /**
   * The size of the blocks that cut {@code size} into as few blocks of at most {@code most} as
   * possible, of about equal size (a multiple of 16, a vector of floats, where that fits): 576
   * columns become two blocks of 288 rather than 512 and a narrow 64.
   */
  static int evenBlock(int size, int most) {
    int blocks = (size + most - 1) / most;
    int even = (size + blocks - 1) / blocks;
    return Math.min(most, (even + 15) / 16 * 16);
  }

  static void loadRow(float[] row, float[] c, int from, int w, boolean fresh) {
    if (fresh) {
      Arrays.fill(row, 0, w, 0f);
    } else {
      System.arraycopy(c, from, row, 0, w);
    }
  }

  /**
   * {@link #gemm} split over the threads, by pairs of rows of C when there are enough, else by
   * column blocks of 64; on the calling thread alone when the product is small or the caller is
   * itself part of a parallel loop (a convolution's images, a batch of products). A transposed B
   * (a linear layer's weights) is split by columns whenever it has enough of them: each thread
   * gathers only its own columns into its panel, where a split by rows had every thread gather all
   * of B (LeNet's fc1 on two threads: 0.85 -> 0.45 ms with the copy of eight columns at a time).
   */
  static void gemmParallel(
      int m, int n, int k, Mat a, Right b, Mat c, boolean accumulate) {
    long work = (long) m * n * k;
    int rowPairs = (m + 1) / 2;
    boolean gathered = b instanceof Mat right && right.colStride() != 1;
    // a native SGEMM copies each piece's operands: a split by rows copies all of B once per thread, a
    // split by columns all of A, so the wider side is split (an early 3x3 convolution's 64 filters
    // against 512 pixels: by rows both threads copied the 1.2 MB of columns)
    boolean byColumns = Blas.gemm() != null && m < n && (n + 63) / 64 >= 2 * THREADS;
    if (!byColumns && rowPairs >= 4 * THREADS && !(gathered && n >= 2 * 64 * THREADS)) {
      int workers = workers(rowPairs, work / rowPairs);
      parallel(
          rowPairs,
          workers,
          1,
          (piece, lo, hi) -> {
            int i0 = 2 * lo;
            gemm(Math.min(m, 2 * hi) - i0, n, k, a.from(i0, 0), b, c.from(i0, 0), accumulate);
          });
    } else {
      int blocks = (n + 63) / 64;
      int workers = workers(blocks, work / blocks);
      parallel(
          blocks,
          workers,
          1,
          (piece, lo, hi) -> {
            int j0 = 64 * lo;
            gemm(m, Math.min(n, 64 * hi) - j0, k, a, b.from(0, j0), c.from(0, j0), accumulate);
          });
    }
  }

  /**
   * C = op(A) op(B) for row-major A (aRows x aCols at aOff), B (bRows x bCols at bOff) and C (at
   * cOff), op transposing where asked.
   */
  static void matmulInto(
      float[] a,
      int aOff,
      int aRows,
      int aCols,
      boolean transposeA,
      float[] b,
      int bOff,
      int bRows,
      int bCols,
      boolean transposeB,
      float[] c,
      int cOff) {
    Mat left = Mat.rows(a, aOff, aCols);
    Mat right = Mat.rows(b, bOff, bCols);
    int m = transposeA ? aCols : aRows;
    int k = transposeA ? aRows : aCols;
    int n = transposeB ? bRows : bCols;
    gemmParallel(
        m,
        n,
        k,
        transposeA ? left.t() : left,
        transposeB ? right.t() : right,
        Mat.rows(c, cOff, n),
        false);
  }

  // ---- dense layers and matrix products ----

  /** out[N, O] = x[N, D] W[O, D]^T. */
  public static void linear(Buf out, Buf x, Buf w) {
    matmulInto(
        x.a, x.off, x.dim(0), x.dim(1), false, w.a, w.off, w.dim(0), w.dim(1), true, out.a,
        out.off);
  }

  /**
   * out = op(a) op(b) for 2-D a and b, op transposing when {@code transposeA} / {@code transposeB}:
   * [M, K] x [K, N] -> [M, N]. The emitter passes false for an attribute the statement leaves out.
   */
  public static void matmul(Buf out, Buf a, Buf b, boolean transposeA, boolean transposeB) {
    matmulInto(
        a.a,
        a.off,
        a.dim(0),
        a.dim(1),
        transposeA,
        b.a,
        b.off,
        b.dim(0),
        b.dim(1),
        transposeB,
        out.a,
        out.off);
  }

  /**
   * out[i] = op(a[i]) op(b[i]) for each i of 3-D a and b with one batch size: [B, M, K] x [B, K, N]
   * -> [B, M, N]; op as in {@link #matmul}. Batches run in parallel when there are at least as many
   * as threads, else each product runs on all threads.
   */
  public static void batch_matmul(Buf out, Buf a, Buf b, boolean transposeA, boolean transposeB) {
    int batches = a.dim(0);
    int aRows = a.dim(1);
    int aCols = a.dim(2);
    int bRows = b.dim(1);
    int bCols = b.dim(2);
    int outSize = out.dim(1) * out.dim(2);
    int workers =
        batches >= THREADS ? workers(batches, (long) outSize * (transposeA ? aRows : aCols)) : 1;
    parallel(
        batches,
        workers,
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          for (int i = lo; i < hi; i++) {
            matmulInto(
                a.a,
                a.off + i * aRows * aCols,
                aRows,
                aCols,
                transposeA,
                b.a,
                b.off + i * bRows * bCols,
                bRows,
                bCols,
                transposeB,
                out.a,
                out.off + i * outSize);
          }
        });
  }

}
