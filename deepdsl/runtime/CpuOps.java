package deepdsl.runtime;

import java.util.Arrays;

/**
 * The CPU kernels of the registry ops that have no index form: one {@code public static void}
 * method per op, named exactly as the op, taking the output first, then the statement's inputs in
 * order, then the op's attributes in alphabetical order of their names (tuples as {@code int[]}).
 * Each computes what the op's NumPy kernel in {@code deepdsl/ops/*.py} computes, in float32, to
 * about 1e-5 relative.
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
 * cache-blocked SGEMM ({@link #gemm}) that accumulates in float; a transposed operand is read
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
 *       at most 1024 floats, see the note in {@link #sweep});
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
public final class CpuOps {
  private CpuOps() {}

  // ---- threads ----

  private static final int THREADS = Parallel.THREADS;

  /** Below this many element operations a kernel does not hand work to other threads. */
  private static final long PARALLEL_WORK = 1 << 15;

  /**
   * Pieces per thread of a loop over images or planes, so that a thread slowed down elsewhere
   * delays little.
   */
  private static final int PIECES_PER_WORKER = 4;

  /** How many threads to run {@code items} items costing {@code workPerItem} operations each on. */
  private static int workers(int items, long workPerItem) {
    if (THREADS == 1 || Parallel.inLoop() || items < 2 || items * workPerItem < PARALLEL_WORK) {
      return 1;
    }
    return Math.min(THREADS, items);
  }

  /**
   * The number of pieces {@link #parallel} cuts {@code items} items into for {@code workers}
   * threads.
   */
  private static int pieces(int items, int workers, int piecesPerWorker) {
    return workers <= 1 ? 1 : Math.min(items, workers * piecesPerWorker);
  }

  /**
   * Runs {@code body} over {@code [0, items)} on {@code workers} threads (see {@link
   * Parallel#run}), cut into {@link #pieces}{@code (items, workers, piecesPerWorker)} contiguous
   * pieces. The pieces depend on the sizes and the thread count only, not on which thread takes
   * which, so a kernel that keeps a partial result per piece and adds them in piece order gives the
   * same bits on every run.
   */
  private static void parallel(int items, int workers, int piecesPerWorker, Parallel.Piece body) {
    Parallel.run(items, workers, pieces(items, workers, piecesPerWorker), body);
  }

  // ---- scratch ----

  /** One thread's reusable work arrays (see the class comment for their sizes). */
  private static final class Scratch {
    final float[][] panel = new float[GEMM_KC][GEMM_NC];
    float[] cols = new float[0];
    float[][] rows = new float[0][0];
    float[] products = new float[0];
    float[] partials = new float[0];
  }

  private static final ThreadLocal<Scratch> SCRATCH = ThreadLocal.withInitial(Scratch::new);

  private static float[] atLeast(float[] have, int size) {
    return have.length >= size ? have : new float[size];
  }

  /**
   * The thread's row arrays, grown to at least {@code count} rows of at least {@code length}. Each
   * row grows on its own, so that many short rows (a large image's pixels) and a few long ones (a
   * deep layer's windows) do not make a rectangle of the most rows by the longest.
   */
  private static float[][] rows(Scratch scratch, int count, int length) {
    float[][] have = scratch.rows;
    if (have.length < count) {
      have = scratch.rows = Arrays.copyOf(have, count);
    }
    for (int i = 0; i < count; i++) {
      if (have[i] == null || have[i].length < length) {
        have[i] = new float[length];
      }
    }
    return have;
  }

  // ---- SGEMM ----

  /** Columns of C (and of B) per block: two rows of C stay in L1. */
  private static final int GEMM_NC = 512;

  /** Column blocks narrower than this go through {@link #sweepNarrow}. */
  private static final int NARROW = 128;

  /** Rows of B per block: a GEMM_KC x GEMM_NC panel of B (512 KiB) stays in L2. */
  private static final int GEMM_KC = 256;

  /**
   * B given as {@link Rows} that start at column 0 serves as the panel itself, without a copy, when
   * it has at most this many columns (GEMM_KC of its rows, 1 MiB, then still fit in L2).
   */
  private static final int GEMM_DIRECT = 1024;

  /** The right operand B of a product: a {@link Mat} view or {@link Rows}. */
  private sealed interface Right permits Mat, Rows {
    /** The operand whose element (0, 0) is this one's (i, j). */
    Right from(int i, int j);

    /** panel[p][j] = B(p, j) for p < depth, j < w. */
    void copy(float[][] panel, int depth, int w);
  }

  /**
   * A matrix held as one array per row: element (i, j) is {@code rows[row0 + i][col0 + j]}. The
   * convolutions build their im2col matrices so, for {@link #gemm} to use as its panel directly.
   */
  private record Rows(float[][] rows, int row0, int col0) implements Right {
    @Override
    public Rows from(int i, int j) {
      return new Rows(rows, row0 + i, col0 + j);
    }

    @Override
    public void copy(float[][] panel, int depth, int w) {
      for (int p = 0; p < depth; p++) {
        System.arraycopy(rows[row0 + p], col0, panel[p], 0, w);
      }
    }
  }

  /**
   * A matrix view: element (i, j) is {@code a[off + i * rowStride + j * colStride]}, so that a
   * transposed or offset matrix is a view too.
   */
  private record Mat(float[] a, int off, int rowStride, int colStride) implements Right {
    /** A row-major matrix at {@code off} with rows {@code ld} apart. */
    static Mat rows(float[] a, int off, int ld) {
      return new Mat(a, off, ld, 1);
    }

    /** The transposed matrix. */
    Mat t() {
      return new Mat(a, off, colStride, rowStride);
    }

    /** The view whose element (0, 0) is this one's (i, j). */
    @Override
    public Mat from(int i, int j) {
      return new Mat(a, off + i * rowStride + j * colStride, rowStride, colStride);
    }

    @Override
    public void copy(float[][] panel, int depth, int w) {
      if (colStride == 1) {
        for (int p = 0; p < depth; p++) {
          System.arraycopy(a, off + p * rowStride, panel[p], 0, w);
        }
      } else { // eight columns at a time, so that each panel row is written a cache line at once
        int j = 0;
        for (; j + 7 < w; j += 8) {
          for (int p = 0, q = off + j * colStride; p < depth; p++, q += rowStride) {
            float[] to = panel[p];
            to[j] = a[q];
            to[j + 1] = a[q + colStride];
            to[j + 2] = a[q + 2 * colStride];
            to[j + 3] = a[q + 3 * colStride];
            to[j + 4] = a[q + 4 * colStride];
            to[j + 5] = a[q + 5 * colStride];
            to[j + 6] = a[q + 6 * colStride];
            to[j + 7] = a[q + 7 * colStride];
          }
        }
        for (; j < w; j++) {
          for (int p = 0, q = off + j * colStride; p < depth; p++, q += rowStride) {
            panel[p][j] = a[q];
          }
        }
      }
    }
  }

  /**
   * C = A B (or C += A B when {@code accumulate}) for an m x k matrix A, a k x n matrix B and an m
   * x n matrix C with unit column stride, on the calling thread.
   *
   * <p>Each GEMM_KC x GEMM_NC block of B is copied into the thread's panel, one array per row, and
   * swept by two rows of C at a time ({@link #sweep}), four terms of the inner product per pass.
   * Every array in that inner loop is indexed from 0 by the loop variable alone, which is what the
   * JIT needs to vectorise it: it does not vectorise a store and a load whose offsets differ. B
   * held as {@link Rows} from column 0 is already in that form and, up to GEMM_DIRECT columns, is
   * swept in place.
   */
  private static void gemm(int m, int n, int k, Mat x, Right y, Mat z, boolean accumulate) {
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
  private static void sweep(
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
  private static void sweepNarrow(
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
  private static int evenBlock(int size, int most) {
    int blocks = (size + most - 1) / most;
    int even = (size + blocks - 1) / blocks;
    return Math.min(most, (even + 15) / 16 * 16);
  }

  private static void loadRow(float[] row, float[] c, int from, int w, boolean fresh) {
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
  private static void gemmParallel(
      int m, int n, int k, Mat a, Right b, Mat c, boolean accumulate) {
    long work = (long) m * n * k;
    int rowPairs = (m + 1) / 2;
    boolean gathered = b instanceof Mat right && right.colStride() != 1;
    if (rowPairs >= 4 * THREADS && !(gathered && n >= 2 * 64 * THREADS)) {
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
  private static void matmulInto(
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

  // ---- convolution ----

  /**
   * The geometry of one convolution: input [N, C, H, W], weight [F, C/G, KH, KW], output [N, F, OH,
   * OW].
   */
  private static final class ConvShape {
    final int n;
    final int c;
    final int h;
    final int w;
    final int f;
    final int kh;
    final int kw;
    final int sh;
    final int sw;
    final int ph;
    final int pw;
    final int groups;
    final int oh;
    final int ow;

    ConvShape(int[] in, int[] weight, int[] stride, int[] pad, int groups) {
      n = in[0];
      c = in[1];
      h = in[2];
      w = in[3];
      f = weight[0];
      kh = weight[2];
      kw = weight[3];
      sh = stride[0];
      sw = stride[1];
      ph = pad[0];
      pw = pad[1];
      this.groups = groups;
      oh = (h + 2 * ph - kh) / sh + 1;
      ow = (w + 2 * pw - kw) / sw + 1;
    }

    /** Output pixels per image. */
    int pixels() {
      return oh * ow;
    }

    /** Input elements per image. */
    int image() {
      return c * h * w;
    }

    /** Rows of the im2col matrix: C*kh*kw, in (c, i, j) order. */
    int colRows() {
      return c * kh * kw;
    }

    /** Rows of one group's block of the im2col matrix: (C/G)*kh*kw. */
    int groupRows() {
      return colRows() / groups;
    }

    /** Output channels per group. */
    int groupFilters() {
      return f / groups;
    }

    /** Multiply-adds per image. */
    long work() {
      return (long) f * groupRows() * pixels();
    }

    /**
     * Images per matrix product, so that its rows (batch x OH*OW) are long enough to vectorise
     * well: at least one, at most {@code available}.
     */
    int batch(int available) {
      return Math.max(1, Math.min(available, (GEMM_NC + pixels() - 1) / pixels()));
    }
  }

  /**
   * out[N, F, OH, OW] = the cross-correlation of x[N, C, H, W] with w[F, C/groups, kh, kw],
   * zero-padded by pad (ph, pw), with stride (sh, sw); output channel block g sees input channel
   * block g only.
   *
   * <p>A few images at a time (see {@link ConvShape#batch}): their im2col columns side by side, one
   * matrix product per group, and the product's rows copied to the images' output planes.
   */
  public static void conv2d(Buf out, Buf x, Buf w, int groups, int[] pad, int[] stride) {
    ConvShape s = new ConvShape(x.shape, w.shape, stride, pad, groups);
    int pixels = s.pixels();
    int fg = s.groupFilters();
    int kg = s.groupRows();
    int workers = s.n >= THREADS ? workers(s.n, s.work()) : 1;
    parallel(
        s.n,
        workers,
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          Scratch scratch = SCRATCH.get();
          for (int n0 = lo; n0 < hi; ) {
            int batch = s.batch(hi - n0);
            int width = batch * pixels;
            float[][] cols = rows(scratch, s.colRows(), width);
            for (int b = 0; b < batch; b++) {
              im2col(s, x.a, x.off + (n0 + b) * s.image(), cols, b * pixels);
            }
            // one image writes its output plane directly; a batch goes through the products array
            float[] prod = out.a;
            int prodOff = out.off + n0 * s.f * pixels;
            if (batch > 1) {
              scratch.products = atLeast(scratch.products, s.f * width);
              prod = scratch.products;
              prodOff = 0;
            }
            for (int g = 0; g < groups; g++) { // out_g = W_g cols_g
              Mat weights = Mat.rows(w.a, w.off + g * fg * kg, kg);
              Rows columns = new Rows(cols, g * kg, 0);
              Mat products = Mat.rows(prod, prodOff + g * fg * width, width);
              gemmParallel(fg, width, kg, weights, columns, products, false);
            }
            if (batch > 1) {
              for (int b = 0; b < batch; b++) {
                for (int f = 0; f < s.f; f++) {
                  System.arraycopy(
                      prod,
                      f * width + b * pixels,
                      out.a,
                      out.off + ((n0 + b) * s.f + f) * pixels,
                      pixels);
                }
              }
            }
            n0 += batch;
          }
        });
  }

  /**
   * out[N, C, H, W] (in_shape) = d conv2d / d x given g = d out [N, F, OH, OW] and w[F, C/groups,
   * kh, kw]: the transposed columns g_g^T W_g (one row of C*kh*kw per output pixel), a few images
   * at a time as in {@link #conv2d}, added back onto the window positions they came from ({@link
   * #rowsToImage}).
   */
  public static void conv2d_backward_data(
      Buf out, Buf g, Buf w, int groups, int[] inShape, int[] pad, int[] stride) {
    ConvShape s = new ConvShape(inShape, w.shape, stride, pad, groups);
    int pixels = s.pixels();
    int fg = s.groupFilters();
    int kg = s.groupRows();
    int workers = s.n >= THREADS ? workers(s.n, s.work()) : 1;
    parallel(
        s.n,
        workers,
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          Scratch scratch = SCRATCH.get();
          for (int n0 = lo; n0 < hi; ) {
            int batch = s.batch(hi - n0);
            int width = batch * pixels;
            // the gradient planes of the batch side by side, [F, batch * OH*OW]: one image's are g's
            float[] grad = g.a;
            int gradOff = g.off + n0 * s.f * pixels;
            if (batch > 1) {
              scratch.products = atLeast(scratch.products, s.f * width);
              grad = scratch.products;
              gradOff = 0;
              gatherPlanes(s, g.a, g.off, n0, batch, grad);
            }
            scratch.cols = atLeast(scratch.cols, width * s.colRows());
            float[] rows = scratch.cols;
            for (int grp = 0; grp < groups; grp++) { // rows_g = g_g^T W_g
              Mat grads = Mat.rows(grad, gradOff + grp * fg * width, width).t();
              Mat weights = Mat.rows(w.a, w.off + grp * fg * kg, kg);
              Mat columns = Mat.rows(rows, grp * kg, s.colRows());
              gemmParallel(width, kg, fg, grads, weights, columns, false);
            }
            for (int b = 0; b < batch; b++) {
              rowsToImage(s, rows, b * pixels, out.a, out.off + (n0 + b) * s.image());
            }
            n0 += batch;
          }
        });
  }

  /**
   * out[F, C/groups, kh, kw] (w_shape) = d conv2d / d w given x[N, C, H, W] and g = d out [N, F,
   * OH, OW]: the sum over images of g_g times the im2col columns of x, a few images per product as
   * in {@link #conv2d}. The columns are built transposed (one row per output pixel, see {@link
   * #im2colRows}), so that the product's long dimension is C*kh*kw and B is read row by row. When
   * images run in parallel, piece p of the batch sums its images into partial gradient p (piece 0's
   * is {@code out}) and the partials are added to {@code out} in piece order.
   */
  public static void conv2d_backward_filter(
      Buf out, Buf x, Buf g, int groups, int[] pad, int[] stride, int[] wShape) {
    ConvShape s = new ConvShape(x.shape, wShape, stride, pad, groups);
    int pixels = s.pixels();
    int fg = s.groupFilters();
    int kg = s.groupRows();
    int size = s.f * kg;
    int workers = s.n >= THREADS ? workers(s.n, s.work()) : 1;
    int pieces = pieces(s.n, workers, PIECES_PER_WORKER);
    Scratch caller = SCRATCH.get();
    caller.partials = atLeast(caller.partials, (pieces - 1) * size);
    float[] partials = caller.partials;
    Arrays.fill(out.a, out.off, out.off + size, 0f);
    Arrays.fill(partials, 0, (pieces - 1) * size, 0f);
    parallel(
        s.n,
        workers,
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          float[] dw = piece == 0 ? out.a : partials;
          int dwOff = piece == 0 ? out.off : (piece - 1) * size;
          Scratch scratch = SCRATCH.get();
          for (int n0 = lo; n0 < hi; ) {
            int batch = s.batch(hi - n0);
            int width = batch * pixels;
            float[][] rows = rows(scratch, width, s.colRows());
            for (int b = 0; b < batch; b++) {
              im2colRows(s, x.a, x.off + (n0 + b) * s.image(), rows, b * pixels);
            }
            float[] grad = g.a;
            int gradOff = g.off + n0 * s.f * pixels;
            if (batch > 1) {
              scratch.products = atLeast(scratch.products, s.f * width);
              grad = scratch.products;
              gradOff = 0;
              gatherPlanes(s, g.a, g.off, n0, batch, grad);
            }
            for (int grp = 0; grp < groups; grp++) { // dw_g += g_g rows_g
              Mat grads = Mat.rows(grad, gradOff + grp * fg * width, width);
              Rows columns = new Rows(rows, 0, grp * kg);
              Mat filters = Mat.rows(dw, dwOff + grp * fg * kg, kg);
              gemm(fg, kg, width, grads, columns, filters, true);
            }
            n0 += batch;
          }
        });
    for (int p = 1; p < pieces; p++) {
      int from = (p - 1) * size;
      for (int i = 0; i < size; i++) {
        out.a[out.off + i] += partials[from + i];
      }
    }
  }

  /**
   * The output-gradient planes of images n0 .. n0 + batch - 1 side by side: grad[f, b * OH*OW +
   * pixel] = g[n0 + b, f, pixel].
   */
  private static void gatherPlanes(
      ConvShape s, float[] g, int gOff, int n0, int batch, float[] grad) {
    int pixels = s.pixels();
    int width = batch * pixels;
    for (int b = 0; b < batch; b++) {
      for (int f = 0; f < s.f; f++) {
        System.arraycopy(
            g, gOff + ((n0 + b) * s.f + f) * pixels, grad, f * width + b * pixels, pixels);
      }
    }
  }

  /**
   * One image's im2col columns transposed, one row of C*kh*kw per output pixel, from row {@code
   * row}: rows[row + oy * OW + ox][(ch * kh + i) * kw + j] = x[ch, oy*sh - ph + i, ox*sw - pw +
   * j], zero outside the image. Each pixel's row is written front to back, a window row at a time.
   */
  private static void im2colRows(ConvShape s, float[] x, int xOff, float[][] rows, int row) {
    for (int oy = 0; oy < s.oh; oy++) {
      for (int ox = 0; ox < s.ow; ox++) {
        float[] to = rows[row + oy * s.ow + ox];
        int ix = ox * s.sw - s.pw;
        boolean inside = ix >= 0 && ix + s.kw <= s.w;
        int at = 0;
        for (int ch = 0; ch < s.c; ch++) {
          for (int i = 0; i < s.kh; i++, at += s.kw) {
            int iy = oy * s.sh - s.ph + i;
            if (iy < 0 || iy >= s.h) {
              Arrays.fill(to, at, at + s.kw, 0f);
              continue;
            }
            int line = xOff + (ch * s.h + iy) * s.w;
            if (inside) {
              copyShort(x, line + ix, to, at, s.kw);
            } else {
              for (int j = 0; j < s.kw; j++) {
                to[at + j] = ix + j >= 0 && ix + j < s.w ? x[line + ix + j] : 0f;
              }
            }
          }
        }
      }
    }
  }

  /**
   * to[at .. at + length) = from[src .. src + length): straight-line code for the short runs of a
   * convolution window's row or of a small image's row (twice as fast as a loop or
   * System.arraycopy for five elements, a fifth faster than System.arraycopy for eight).
   */
  private static void copyShort(float[] from, int src, float[] to, int at, int length) {
    switch (length) {
      case 8:
        to[at + 7] = from[src + 7];
      // fall through
      case 7:
        to[at + 6] = from[src + 6];
      // fall through
      case 6:
        to[at + 5] = from[src + 5];
      // fall through
      case 5:
        to[at + 4] = from[src + 4];
      // fall through
      case 4:
        to[at + 3] = from[src + 3];
      // fall through
      case 3:
        to[at + 2] = from[src + 2];
      // fall through
      case 2:
        to[at + 1] = from[src + 1];
      // fall through
      case 1:
        to[at] = from[src];
        break;
      default:
        System.arraycopy(from, src, to, at, length);
    }
  }

  /**
   * One image's im2col columns, written from column {@code col} of the rows: cols[(ch * kh + i) *
   * kw + j][col + oy * OW + ox] = x[ch, oy*sh - ph + i, ox*sw - pw + j], zero outside the image.
   */
  private static void im2col(ConvShape s, float[] x, int xOff, float[][] cols, int col) {
    int row = 0;
    for (int ch = 0; ch < s.c; ch++) {
      int plane = xOff + ch * s.h * s.w;
      for (int i = 0; i < s.kh; i++) {
        for (int j = 0; j < s.kw; j++, row++) {
          float[] line = cols[row];
          int to = col;
          // the columns ox whose input column ox*sw - pw + j lies inside [0, W)
          int oxLo = Math.min(s.ow, firstInside(j - s.pw, s.sw));
          int oxHi = Math.max(oxLo, Math.min(s.ow, lastInside(j - s.pw, s.sw, s.w) + 1));
          for (int oy = 0; oy < s.oh; oy++, to += s.ow) {
            int iy = oy * s.sh - s.ph + i;
            if (iy < 0 || iy >= s.h) {
              Arrays.fill(line, to, to + s.ow, 0f);
              continue;
            }
            int from = plane + iy * s.w - s.pw + j;
            if (oxLo > 0) {
              Arrays.fill(line, to, to + oxLo, 0f);
            }
            if (s.sw == 1) {
              copyShort(x, from + oxLo, line, to + oxLo, oxHi - oxLo);
            } else {
              for (int ox = oxLo; ox < oxHi; ox++) {
                line[to + ox] = x[from + ox * s.sw];
              }
            }
            if (oxHi < s.ow) {
              Arrays.fill(line, to + oxHi, to + s.ow, 0f);
            }
          }
        }
      }
    }
  }

  /**
   * The adjoint of {@link #im2colRows} for one image: dx[ch, iy, ix] = the sum of the elements of
   * the pixel rows (from row {@code row} of rows of C*kh*kw in {@code rows}) that read x[ch, iy,
   * ix]. Each pixel's row is added a window row at a time.
   */
  private static void rowsToImage(ConvShape s, float[] rows, int row, float[] dx, int dxOff) {
    Arrays.fill(dx, dxOff, dxOff + s.image(), 0f);
    int length = s.colRows();
    for (int oy = 0; oy < s.oh; oy++) {
      for (int ox = 0; ox < s.ow; ox++) {
        int from = (row + oy * s.ow + ox) * length;
        int ix = ox * s.sw - s.pw;
        boolean inside = ix >= 0 && ix + s.kw <= s.w;
        for (int ch = 0; ch < s.c; ch++) {
          for (int i = 0; i < s.kh; i++, from += s.kw) {
            int iy = oy * s.sh - s.ph + i;
            if (iy < 0 || iy >= s.h) {
              continue;
            }
            int line = dxOff + (ch * s.h + iy) * s.w;
            if (inside) {
              addShort(rows, from, dx, line + ix, s.kw);
            } else {
              for (int j = Math.max(0, -ix); j < Math.min(s.kw, s.w - ix); j++) {
                dx[line + ix + j] += rows[from + j];
              }
            }
          }
        }
      }
    }
  }

  /** to[at .. at + length) += from[src .. src + length), straight-line as in {@link #copyShort}. */
  private static void addShort(float[] from, int src, float[] to, int at, int length) {
    switch (length) {
      case 8:
        to[at + 7] += from[src + 7];
      // fall through
      case 7:
        to[at + 6] += from[src + 6];
      // fall through
      case 6:
        to[at + 5] += from[src + 5];
      // fall through
      case 5:
        to[at + 4] += from[src + 4];
      // fall through
      case 4:
        to[at + 3] += from[src + 3];
      // fall through
      case 3:
        to[at + 2] += from[src + 2];
      // fall through
      case 2:
        to[at + 1] += from[src + 1];
      // fall through
      case 1:
        to[at] += from[src];
        break;
      default:
        for (int j = 0; j < length; j++) {
          to[at + j] += from[src + j];
        }
    }
  }

  /** The smallest o >= 0 with o * stride + shift >= 0. */
  private static int firstInside(int shift, int stride) {
    return shift >= 0 ? 0 : (-shift + stride - 1) / stride;
  }

  /** The largest o with o * stride + shift < size (may be negative). */
  private static int lastInside(int shift, int stride, int size) {
    return Math.floorDiv(size - 1 - shift, stride);
  }

  // ---- pooling ----

  /**
   * The geometry of one pooling: input planes H x W, output planes OH x OW. The kernels walk the
   * window offsets (i, j) in row-major order, each over a whole output row, as the NumPy kernels
   * do.
   */
  private static final class PoolShape {
    final int planes;
    final int h;
    final int w;
    final int oh;
    final int ow;
    final int kh;
    final int kw;
    final int sh;
    final int sw;
    final int ph;
    final int pw;

    PoolShape(int[] in, int[] kernel, int[] stride, int[] pad) {
      planes = in[0] * in[1];
      h = in[2];
      w = in[3];
      kh = kernel[0];
      kw = kernel[1];
      sh = stride[0];
      sw = stride[1];
      ph = pad[0];
      pw = pad[1];
      oh = (h + 2 * ph - kh) / sh + 1;
      ow = (w + 2 * pw - kw) / sw + 1;
    }

    int workers() {
      return CpuOps.workers(planes, (long) oh * ow * kh * kw);
    }

    /**
     * Whether the windows are 2 x 2 at stride 2 without padding: the common case, which has its own
     * loops.
     */
    boolean pairs() {
      return kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0;
    }

    /** The input row that window row i of output row oy reads, or -1 where that is padding. */
    int inputRow(int oy, int i) {
      int iy = oy * sh - ph + i;
      return iy >= 0 && iy < h ? iy : -1;
    }

    /** The first output column whose window column j lies inside the input. */
    int firstColumn(int j) {
      return Math.min(ow, firstInside(j - pw, sw));
    }

    /** One past the last output column whose window column j lies inside the input. */
    int endColumn(int j) {
      return Math.max(firstColumn(j), Math.min(ow, lastInside(j - pw, sw, w) + 1));
    }
  }

  /**
   * out[N, C, OH, OW] = the maximum of each kh x kw window of x[N, C, H, W] at stride (sh, sw),
   * padded by (ph, pw) with -infinity (so padding never wins); NaN propagates.
   */
  public static void max_pool2d(Buf out, Buf x, int[] kernel, int[] pad, int[] stride) {
    PoolShape s = new PoolShape(x.shape, kernel, stride, pad);
    if (s.pairs()) {
      parallel(
          s.planes,
          s.workers(),
          PIECES_PER_WORKER,
          (piece, lo, hi) -> maxPoolPairs(s, out, x, lo, hi));
      return;
    }
    parallel(
        s.planes,
        s.workers(),
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          for (int pl = lo; pl < hi; pl++) {
            for (int oy = 0; oy < s.oh; oy++) {
              int o = out.off + (pl * s.oh + oy) * s.ow;
              Arrays.fill(out.a, o, o + s.ow, Float.NEGATIVE_INFINITY);
              for (int i = 0; i < s.kh; i++) {
                int iy = s.inputRow(oy, i);
                if (iy < 0) {
                  continue;
                }
                for (int j = 0; j < s.kw; j++) {
                  int in = x.off + (pl * s.h + iy) * s.w + j - s.pw;
                  for (int ox = s.firstColumn(j), end = s.endColumn(j); ox < end; ox++) {
                    out.a[o + ox] = Math.max(out.a[o + ox], x.a[in + ox * s.sw]);
                  }
                }
              }
            }
          }
        });
  }

  /**
   * out[N, C, H, W] = d max_pool2d / d x given x, y = max_pool2d(x) and g = d y: each g goes to the
   * first element of its window (row-major) equal to its y; overlapping windows add up.
   */
  public static void max_pool2d_backward(
      Buf out, Buf x, Buf y, Buf g, int[] kernel, int[] pad, int[] stride) {
    PoolShape s = new PoolShape(x.shape, kernel, stride, pad);
    if (s.pairs()) {
      parallel(
          s.planes,
          s.workers(),
          PIECES_PER_WORKER,
          (piece, lo, hi) -> maxPoolPairsBackward(s, out, x, y, g, lo, hi));
      return;
    }
    parallel(
        s.planes,
        s.workers(),
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          for (int pl = lo; pl < hi; pl++) {
            int plane = pl * s.h * s.w;
            Arrays.fill(out.a, out.off + plane, out.off + plane + s.h * s.w, 0f);
            int o = pl * s.oh * s.ow;
            for (int oy = 0; oy < s.oh; oy++) {
              int iyLo = Math.max(0, oy * s.sh - s.ph);
              int iyHi = Math.min(s.h, oy * s.sh - s.ph + s.kh);
              for (int ox = 0; ox < s.ow; ox++, o++) {
                int ixLo = Math.max(0, ox * s.sw - s.pw);
                int ixHi = Math.min(s.w, ox * s.sw - s.pw + s.kw);
                float max = y.a[y.off + o];
                // the window scanned backwards, so that the first match in row-major order is the
                // one kept
                int first = -1;
                for (int iy = iyHi - 1; iy >= iyLo; iy--) {
                  for (int at = plane + iy * s.w + ixHi - 1, end = at - (ixHi - ixLo);
                      at > end;
                      at--) {
                    first = x.a[x.off + at] == max ? at : first;
                  }
                }
                if (first >= 0) {
                  out.a[out.off + first] += g.a[g.off + o];
                }
              }
            }
          }
        });
  }

  /** {@link #max_pool2d} of planes lo .. hi - 1 for 2 x 2 windows at stride 2 without padding. */
  private static void maxPoolPairs(PoolShape s, Buf out, Buf x, int lo, int hi) {
    float[] a = x.a;
    int w = s.w;
    for (int pl = lo; pl < hi; pl++) {
      for (int oy = 0; oy < s.oh; oy++) {
        int in = x.off + (pl * s.h + 2 * oy) * w;
        int o = out.off + (pl * s.oh + oy) * s.ow;
        for (int ox = 0; ox < s.ow; ox++) {
          int at = in + 2 * ox;
          out.a[o + ox] = Math.max(Math.max(a[at], a[at + 1]), Math.max(a[at + w], a[at + w + 1]));
        }
      }
    }
  }

  /**
   * {@link #max_pool2d_backward} of planes lo .. hi - 1 for 2 x 2 windows at stride 2 without
   * padding: the windows do not overlap, so each input element is written once, g where it is the
   * window's first maximum, else 0.
   */
  private static void maxPoolPairsBackward(
      PoolShape s, Buf out, Buf x, Buf y, Buf g, int lo, int hi) {
    float[] a = x.a;
    float[] d = out.a;
    int w = s.w;
    int shift = out.off - x.off;
    for (int pl = lo; pl < hi; pl++) {
      if (2 * s.oh != s.h || 2 * s.ow != w) { // the last row or column is in no window
        Arrays.fill(d, out.off + pl * s.h * w, out.off + (pl + 1) * s.h * w, 0f);
      }
      for (int oy = 0; oy < s.oh; oy++) {
        int in = x.off + (pl * s.h + 2 * oy) * w;
        int o = (pl * s.oh + oy) * s.ow;
        for (int ox = 0; ox < s.ow; ox++) {
          int at = in + 2 * ox;
          float max = y.a[y.off + o + ox];
          float grad = g.a[g.off + o + ox];
          // the offset in the window of its first maximum (row-major), selected without branches
          int first = a[at + w + 1] == max ? w + 1 : -1;
          first = a[at + w] == max ? w : first;
          first = a[at + 1] == max ? 1 : first;
          first = a[at] == max ? 0 : first;
          d[shift + at] = 0f;
          d[shift + at + 1] = 0f;
          d[shift + at + w] = 0f;
          d[shift + at + w + 1] = 0f;
          if (first >= 0) {
            d[shift + at + first] = grad;
          }
        }
      }
    }
  }

  /**
   * out[N, C, OH, OW] = the sum of each kh x kw window of x[N, C, H, W] at stride (sh, sw), padded
   * by (ph, pw) with zeros, divided by kh*kw (padding counts in the divisor).
   */
  public static void avg_pool2d(Buf out, Buf x, int[] kernel, int[] pad, int[] stride) {
    PoolShape s = new PoolShape(x.shape, kernel, stride, pad);
    float window = s.kh * s.kw;
    parallel(
        s.planes,
        s.workers(),
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          for (int pl = lo; pl < hi; pl++) {
            for (int oy = 0; oy < s.oh; oy++) {
              int o = out.off + (pl * s.oh + oy) * s.ow;
              Arrays.fill(out.a, o, o + s.ow, 0f);
              for (int i = 0; i < s.kh; i++) {
                int iy = s.inputRow(oy, i);
                if (iy < 0) {
                  continue;
                }
                for (int j = 0; j < s.kw; j++) {
                  int in = x.off + (pl * s.h + iy) * s.w + j - s.pw;
                  for (int ox = s.firstColumn(j), end = s.endColumn(j); ox < end; ox++) {
                    out.a[o + ox] += x.a[in + ox * s.sw];
                  }
                }
              }
              for (int ox = 0; ox < s.ow; ox++) {
                out.a[o + ox] /= window;
              }
            }
          }
        });
  }

  /**
   * out[N, C, H, W] (in_shape) = d avg_pool2d / d x given g = d out: g / (kh*kw) added to every
   * input element of its window.
   */
  public static void avg_pool2d_backward(
      Buf out, Buf g, int[] inShape, int[] kernel, int[] pad, int[] stride) {
    PoolShape s = new PoolShape(inShape, kernel, stride, pad);
    float window = s.kh * s.kw;
    parallel(
        s.planes,
        s.workers(),
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          for (int pl = lo; pl < hi; pl++) {
            Arrays.fill(out.a, out.off + pl * s.h * s.w, out.off + (pl + 1) * s.h * s.w, 0f);
            for (int oy = 0; oy < s.oh; oy++) {
              int o = g.off + (pl * s.oh + oy) * s.ow;
              for (int i = 0; i < s.kh; i++) {
                int iy = s.inputRow(oy, i);
                if (iy < 0) {
                  continue;
                }
                for (int j = 0; j < s.kw; j++) {
                  int at = out.off + (pl * s.h + iy) * s.w + j - s.pw;
                  for (int ox = s.firstColumn(j), end = s.endColumn(j); ox < end; ox++) {
                    out.a[at + ox * s.sw] += g.a[o + ox] / window;
                  }
                }
              }
            }
          }
        });
  }

  /** out[N, C, 1, 1] = the mean of each H x W plane of x[N, C, H, W]. */
  public static void global_avg_pool(Buf out, Buf x) {
    int planes = x.dim(0) * x.dim(1);
    int size = x.dim(2) * x.dim(3);
    int workers = workers(planes, size);
    parallel(
        planes,
        workers,
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          for (int pl = lo; pl < hi; pl++) {
            int in = x.off + pl * size;
            double sum = 0;
            for (int i = 0; i < size; i++) {
              sum += x.a[in + i];
            }
            out.a[out.off + pl] = (float) (sum / size);
          }
        });
  }

  /** out[N, C, H, W] (in_shape) = g[N, C, 1, 1] / (H*W), spread over each plane. */
  public static void global_avg_pool_backward(Buf out, Buf g, int[] inShape) {
    int planes = inShape[0] * inShape[1];
    int size = inShape[2] * inShape[3];
    for (int pl = 0; pl < planes; pl++) {
      int to = out.off + pl * size;
      Arrays.fill(out.a, to, to + size, g.a[g.off + pl] / size);
    }
  }

  // ---- local response normalisation ----

  /**
   * out = x * d^-beta for x[N, C, H, W], where d = k + alpha/size * (the sum of x^2 over channels c
   * - size/2 .. c + (size-1)/2, those that exist).
   */
  public static void lrn(Buf out, Buf x, float alpha, float beta, float k, int size) {
    int channels = x.dim(1);
    int plane = x.dim(2) * x.dim(3);
    int image = channels * plane;
    float scale = (float) ((double) alpha / size);
    int workers = workers(x.dim(0), (long) image * (size + 2));
    parallel(
        x.dim(0),
        workers,
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          for (int n = lo; n < hi; n++) {
            int in = x.off + n * image;
            int o = out.off + n * image;
            windowSum(x.a, in, true, channels, plane, size / 2, (size - 1) / 2, out.a, o);
            for (int i = 0; i < image; i++) {
              float d = k + scale * out.a[o + i];
              out.a[o + i] = x.a[in + i] * (float) Math.pow(d, -beta);
            }
          }
        });
  }

  /**
   * out = d lrn / d x given x, y = lrn(x) and g = d y (all [N, C, H, W]): g d^-beta - 2 alpha beta
   * / size * x * (the sum of g y / d over the channels whose window holds this one).
   */
  public static void lrn_backward(
      Buf out, Buf x, Buf y, Buf g, float alpha, float beta, float k, int size) {
    int channels = x.dim(1);
    int plane = x.dim(2) * x.dim(3);
    int image = channels * plane;
    float scale = (float) ((double) alpha / size);
    float coef = (float) (2.0 * alpha * beta / size);
    int workers = workers(x.dim(0), (long) image * (2 * size + 6));
    parallel(
        x.dim(0),
        workers,
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          Scratch scratch = SCRATCH.get();
          scratch.cols = atLeast(scratch.cols, image);
          scratch.products = atLeast(scratch.products, image);
          float[] den = scratch.cols;
          float[] term = scratch.products;
          for (int n = lo; n < hi; n++) {
            int in = n * image;
            windowSum(x.a, x.off + in, true, channels, plane, size / 2, (size - 1) / 2, den, 0);
            for (int i = 0; i < image; i++) {
              den[i] = k + scale * den[i];
              term[i] = g.a[g.off + in + i] * y.a[y.off + in + i] / den[i];
            }
            int o = out.off + in;
            windowSum(term, 0, false, channels, plane, (size - 1) / 2, size / 2, out.a, o);
            for (int i = 0; i < image; i++) {
              float gx = g.a[g.off + in + i] * (float) Math.pow(den[i], -beta);
              out.a[o + i] = gx - coef * x.a[x.off + in + i] * out.a[o + i];
            }
          }
        });
  }

  /**
   * dst[c] = the sum of v[c'] (or v[c']^2 when {@code square}) over channels c' = c - before .. c +
   * after that exist, for one image of {@code channels} planes of {@code plane} elements.
   */
  private static void windowSum(
      float[] v,
      int vOff,
      boolean square,
      int channels,
      int plane,
      int before,
      int after,
      float[] dst,
      int dstOff) {
    for (int c = 0; c < channels; c++) {
      int to = dstOff + c * plane;
      Arrays.fill(dst, to, to + plane, 0f);
      for (int src = Math.max(0, c - before); src <= Math.min(channels - 1, c + after); src++) {
        int from = vOff + src * plane;
        if (square) {
          for (int i = 0; i < plane; i++) {
            dst[to + i] += v[from + i] * v[from + i];
          }
        } else {
          for (int i = 0; i < plane; i++) {
            dst[to + i] += v[from + i];
          }
        }
      }
    }
  }

  // ---- softmax and the losses (rows are axis 1 of [N, K]) ----

  /** out[N, K] = exp(x - max) / sum exp(x - max), per row of x[N, K]. */
  public static void softmax(Buf out, Buf x) {
    int rows = x.dim(0);
    int cols = x.dim(1);
    for (int r = 0; r < rows; r++) {
      int in = x.off + r * cols;
      int o = out.off + r * cols;
      float max = rowMax(x.a, in, cols);
      double sum = 0;
      for (int j = 0; j < cols; j++) {
        float e = (float) Math.exp(x.a[in + j] - max);
        out.a[o + j] = e;
        sum += e;
      }
      float total = (float) sum;
      for (int j = 0; j < cols; j++) {
        out.a[o + j] /= total;
      }
    }
  }

  /** out[N, K] = x - max - log sum exp(x - max), per row of x[N, K]. */
  public static void log_softmax(Buf out, Buf x) {
    int rows = x.dim(0);
    int cols = x.dim(1);
    for (int r = 0; r < rows; r++) {
      int in = x.off + r * cols;
      int o = out.off + r * cols;
      float max = rowMax(x.a, in, cols);
      float log = (float) Math.log(sumExp(x.a, in, cols, max));
      for (int j = 0; j < cols; j++) {
        out.a[o + j] = (x.a[in + j] - max) - log;
      }
    }
  }

  /** out[N, K] = y * (g - sum(g * y)) per row, for y = softmax(x) and g = d y. */
  public static void softmax_backward(Buf out, Buf y, Buf g) {
    int rows = y.dim(0);
    int cols = y.dim(1);
    for (int r = 0; r < rows; r++) {
      int yi = y.off + r * cols;
      int gi = g.off + r * cols;
      double dot = 0;
      for (int j = 0; j < cols; j++) {
        dot += g.a[gi + j] * y.a[yi + j];
      }
      float d = (float) dot;
      for (int j = 0; j < cols; j++) {
        out.a[out.off + r * cols + j] = y.a[yi + j] * (g.a[gi + j] - d);
      }
    }
  }

  /** out[N, K] = g - exp(y) * sum(g) per row, for y = log_softmax(x) and g = d y. */
  public static void log_softmax_backward(Buf out, Buf y, Buf g) {
    int rows = y.dim(0);
    int cols = y.dim(1);
    for (int r = 0; r < rows; r++) {
      int yi = y.off + r * cols;
      int gi = g.off + r * cols;
      double sum = 0;
      for (int j = 0; j < cols; j++) {
        sum += g.a[gi + j];
      }
      float s = (float) sum;
      for (int j = 0; j < cols; j++) {
        out.a[out.off + r * cols + j] = g.a[gi + j] - (float) Math.exp(y.a[yi + j]) * s;
      }
    }
  }

  /**
   * out (scalar) = the mean over rows of -log softmax(x)[label], for scores x[N, K] and labels[N].
   */
  public static void softmax_cross_entropy(Buf out, Buf x, Buf labels) {
    int rows = x.dim(0);
    int cols = x.dim(1);
    double total = 0;
    for (int r = 0; r < rows; r++) {
      int in = x.off + r * cols;
      float max = rowMax(x.a, in, cols);
      int label = (int) labels.a[labels.off + r];
      total += Math.log(sumExp(x.a, in, cols, max)) - (x.a[in + label] - max);
    }
    out.a[out.off] = (float) (total / rows);
  }

  /**
   * out[N, K] = (softmax(x) - onehot(labels)) * g / N, for scores x[N, K], labels[N] and scalar g.
   */
  public static void softmax_cross_entropy_backward(Buf out, Buf x, Buf labels, Buf g) {
    softmax(out, x);
    int rows = x.dim(0);
    int cols = x.dim(1);
    float scale = g.a[g.off] / rows;
    for (int r = 0; r < rows; r++) {
      int o = out.off + r * cols;
      out.a[o + (int) labels.a[labels.off + r]] -= 1f;
      for (int j = 0; j < cols; j++) {
        out.a[o + j] *= scale;
      }
    }
  }

  /**
   * out (scalar) = the mean over rows of -log p[label], for probabilities p[N, K] and labels[N].
   */
  public static void cross_entropy(Buf out, Buf p, Buf labels) {
    int rows = p.dim(0);
    int cols = p.dim(1);
    double total = 0;
    for (int r = 0; r < rows; r++) {
      total -= Math.log(p.a[p.off + r * cols + (int) labels.a[labels.off + r]]);
    }
    out.a[out.off] = (float) (total / rows);
  }

  /**
   * out[N, K] = -g / (p N) at each row's label and 0 elsewhere, for p[N, K], labels[N] and scalar
   * g.
   */
  public static void cross_entropy_backward(Buf out, Buf p, Buf labels, Buf g) {
    int rows = p.dim(0);
    int cols = p.dim(1);
    Arrays.fill(out.a, out.off, out.off + rows * cols, 0f);
    float gv = g.a[g.off];
    for (int r = 0; r < rows; r++) {
      int at = r * cols + (int) labels.a[labels.off + r];
      out.a[out.off + at] = -gv / (p.a[p.off + at] * rows);
    }
  }

  /** out (scalar) = the mean of (a - b)^2 over every element of a and b (one shape). */
  public static void mse(Buf out, Buf a, Buf b) {
    int n = a.numel();
    double sum = 0;
    for (int i = 0; i < n; i++) {
      float d = a.a[a.off + i] - b.a[b.off + i];
      sum += d * d;
    }
    out.a[out.off] = (float) (sum / n);
  }

  /**
   * out[N] = the index of the first largest score of each row of x[N, K] (a NaN counts as largest).
   */
  public static void argmax(Buf out, Buf x) {
    int rows = x.dim(0);
    int cols = x.dim(1);
    for (int r = 0; r < rows; r++) {
      out.a[out.off + r] = rowArgmax(x.a, x.off + r * cols, cols);
    }
  }

  /**
   * out (scalar) = the fraction of rows of x[N, K] whose argmax equals the row's label in
   * labels[N].
   */
  public static void accuracy(Buf out, Buf x, Buf labels) {
    int rows = x.dim(0);
    int cols = x.dim(1);
    int hits = 0;
    for (int r = 0; r < rows; r++) {
      if (rowArgmax(x.a, x.off + r * cols, cols) == labels.a[labels.off + r]) {
        hits++;
      }
    }
    out.a[out.off] = (float) ((double) hits / rows);
  }

  private static float rowMax(float[] a, int from, int n) {
    float max = Float.NEGATIVE_INFINITY;
    for (int j = 0; j < n; j++) {
      max = Math.max(max, a[from + j]);
    }
    return max;
  }

  private static double sumExp(float[] a, int from, int n, float max) {
    double sum = 0;
    for (int j = 0; j < n; j++) {
      sum += (float) Math.exp(a[from + j] - max);
    }
    return sum;
  }

  private static int rowArgmax(float[] a, int from, int n) {
    int best = 0;
    for (int j = 1; j < n && !Float.isNaN(a[from + best]); j++) {
      float v = a[from + j];
      if (v > a[from + best] || Float.isNaN(v)) {
        best = j;
      }
    }
    return best;
  }

  // ---- shape ops ----

  /** out = the inputs joined along {@code axis}; every other dimension agrees. */
  public static void concat(Buf out, Buf[] ins, int axis) {
    int outer = prefix(out.shape, axis);
    int inner = suffix(out.shape, axis + 1);
    int outRow = out.dim(axis) * inner;
    int at = 0;
    for (Buf in : ins) {
      int row = in.dim(axis) * inner;
      for (int o = 0; o < outer; o++) {
        System.arraycopy(in.a, in.off + o * row, out.a, out.off + o * outRow + at, row);
      }
      at += row;
    }
  }

  /** out = x[..., start:stop, ...] along {@code axis}. */
  public static void slice(Buf out, Buf x, int axis, int start, int stop) {
    int outer = prefix(x.shape, axis);
    int inner = suffix(x.shape, axis + 1);
    int inRow = x.dim(axis) * inner;
    int row = (stop - start) * inner;
    for (int o = 0; o < outer; o++) {
      System.arraycopy(x.a, x.off + o * inRow + start * inner, out.a, out.off + o * row, row);
    }
  }

  /**
   * out = zeros with {@code size} entries along {@code axis}, x placed from {@code start} along it.
   */
  public static void pad_axis(Buf out, Buf x, int axis, int size, int start) {
    Arrays.fill(out.a, out.off, out.off + out.numel(), 0f);
    int outer = prefix(x.shape, axis);
    int inner = suffix(x.shape, axis + 1);
    int row = x.dim(axis) * inner;
    int outRow = size * inner;
    for (int o = 0; o < outer; o++) {
      System.arraycopy(x.a, x.off + o * row, out.a, out.off + o * outRow + start * inner, row);
    }
  }

  /** out = x summed over {@code axes}; the other axes stay, in order. */
  public static void sum_axes(Buf out, Buf x, int[] axes) {
    int rank = x.shape.length;
    Arrays.fill(out.a, out.off, out.off + out.numel(), 0f);
    if (rank == 0) {
      out.a[out.off] = x.a[x.off];
      return;
    }
    boolean[] summed = new boolean[rank];
    for (int axis : axes) {
      summed[axis] = true;
    }
    int[] outStride = new int[rank]; // per input axis; 0 along a summed axis
    for (int d = rank - 1, stride = 1; d >= 0; d--) {
      if (!summed[d]) {
        outStride[d] = stride;
        stride *= x.shape[d];
      }
    }
    int last = x.shape[rank - 1];
    int rows = last == 0 ? 0 : x.numel() / last;
    int[] index = new int[rank];
    int o = out.off;
    for (int r = 0, in = x.off; r < rows; r++, in += last) {
      if (summed[rank - 1]) {
        float sum = 0f;
        for (int j = 0; j < last; j++) {
          sum += x.a[in + j];
        }
        out.a[o] += sum;
      } else {
        for (int j = 0; j < last; j++) {
          out.a[o + j] += x.a[in + j];
        }
      }
      for (int d = rank - 2; d >= 0; d--) { // next row: advance the index over axes 0 .. rank-2
        o += outStride[d];
        if (++index[d] < x.shape[d]) {
          break;
        }
        o -= outStride[d] * x.shape[d];
        index[d] = 0;
      }
    }
  }

  /** out = x with its axes permuted: output axis i is input axis perm[i]. */
  public static void transpose(Buf out, Buf x, int[] perm) {
    int rank = x.shape.length;
    if (rank == 0) {
      out.a[out.off] = x.a[x.off];
      return;
    }
    int[] inStride = new int[rank]; // per input axis
    for (int d = rank - 1, stride = 1; d >= 0; d--) {
      inStride[d] = stride;
      stride *= x.shape[d];
    }
    int[] step = new int[rank]; // per output axis: the input stride it walks
    for (int d = 0; d < rank; d++) {
      step[d] = inStride[perm[d]];
    }
    int last = out.shape[rank - 1];
    int inner = step[rank - 1];
    int rows = last == 0 ? 0 : out.numel() / last;
    int[] index = new int[rank];
    int in = x.off;
    for (int r = 0, o = out.off; r < rows; r++, o += last) {
      for (int j = 0; j < last; j++) {
        out.a[o + j] = x.a[in + j * inner];
      }
      for (int d = rank - 2; d >= 0; d--) {
        in += step[d];
        if (++index[d] < out.shape[d]) {
          break;
        }
        in -= step[d] * out.shape[d];
        index[d] = 0;
      }
    }
  }

  private static int prefix(int[] shape, int end) {
    int n = 1;
    for (int d = 0; d < end; d++) {
      n *= shape[d];
    }
    return n;
  }

  private static int suffix(int[] shape, int start) {
    int n = 1;
    for (int d = start; d < shape.length; d++) {
      n *= shape[d];
    }
    return n;
  }

  // ---- randomness ----

  /**
   * out (attrs shape) = the inverted-dropout mask of {@code site} at {@code step}: 1 / (1 - p)
   * where kept, else 0, bit-identical to the NumPy kernel (see {@link Rng#dropoutMask}).
   */
  public static void dropout_mask(Buf out, long step, float p, long seed, String site) {
    Rng.dropoutMask(out, step, p, seed, site);
  }
}
