package deepdsl.runtime;

import java.nio.FloatBuffer;

/**
 * The operands of {@link CpuGemm#gemm}: a matrix view ({@link Mat}) and the right operands B it
 * reads without copying them first, each able to copy a panel of itself: rows held as arrays
 * ({@link Rows}, {@link Columns}, the convolutions' im2col matrices), image planes ({@link Planes})
 * and a direct buffer ({@link Direct}, the columns OpenBLAS reads in place).
 */
final class GemmOperands {
  private GemmOperands() {}

  /** The right operand B of a product: a {@link Mat} view or {@link Rows}. */
  sealed interface Right permits Mat, Rows, Columns, Planes, Direct {
    /** The operand whose element (0, 0) is this one's (i, j). */
    Right from(int i, int j);

    /** panel[p][j] = B(p, j) for p < depth, j < w. */
    void copy(float[][] panel, int depth, int w);
  }

  /**
   * A matrix held as one array per row: element (i, j) is {@code rows[row0 + i][col0 + j]}. The
   * convolutions build their im2col matrices so, for {@link CpuGemm#gemm} to use as its panel directly.
   */
  record Rows(float[][] rows, int row0, int col0) implements Right {
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
   * The transpose of a {@link Rows} matrix: element (i, j) is {@code rows[row0 + j][col0 + i]}. A
   * filter gradient on OpenBLAS reads the forward im2col columns so, passed as {@code CblasTrans}.
   */
  record Columns(float[][] rows, int row0, int col0) implements Right {
    @Override
    public Columns from(int i, int j) {
      return new Columns(rows, row0 + j, col0 + i);
    }

    @Override
    public void copy(float[][] panel, int depth, int w) {
      for (int j = 0; j < w; j++) {
        float[] row = rows[row0 + j];
        for (int p = 0; p < depth; p++) {
          panel[p][j] = row[col0 + p];
        }
      }
    }
  }

  /**
   * A row-major matrix in a direct buffer, rows {@code ld} apart, or ({@code transposed}) its
   * transpose: element (i, j) is {@code buf[(row0 + i) * ld + col0 + j]}, transposed {@code
   * buf[(row0 + j) * ld + col0 + i]}. The convolutions build their im2col matrices so where the
   * native SGEMM can read them in place ({@link Blas.Gemm#columns}).
   */
  record Direct(FloatBuffer buf, int ld, int row0, int col0, boolean transposed) implements Right {
    @Override
    public Direct from(int i, int j) {
      return transposed
          ? new Direct(buf, ld, row0 + j, col0 + i, true)
          : new Direct(buf, ld, row0 + i, col0 + j, false);
    }

    @Override
    public void copy(float[][] panel, int depth, int w) {
      for (int p = 0; p < depth; p++) {
        if (!transposed) {
          buf.get((row0 + p) * ld + col0, panel[p], 0, w);
        } else {
          for (int j = 0; j < w; j++) {
            panel[p][j] = buf.get((row0 + j) * ld + col0 + p);
          }
        }
      }
    }
  }

  /**
   * The channel planes of a few consecutive images [batch, C, P] (P pixels per plane, images
   * {@code image} elements apart, from {@code a[off]}) seen as the matrix [C, batch * P] whose
   * column b * P + pixel is image b's pixel, or ({@code transposed}) as its transpose [batch * P,
   * C]; element (i, j) is that matrix's (row0 + i, col0 + j). A pointwise (1x1, stride 1, no
   * padding) convolution's im2col matrix is this matrix itself, so it needs no im2col copy.
   */
  record Planes(float[] a, int off, int pixels, int image, int row0, int col0, boolean transposed)
      implements Right {
    /** The [C, batch * P] matrix of the planes at {@code a[off]}. */
    static Planes of(float[] a, int off, int pixels, int image) {
      return new Planes(a, off, pixels, image, 0, 0, false);
    }

    /** The transposed matrix. */
    Planes t() {
      return new Planes(a, off, pixels, image, col0, row0, !transposed);
    }

    @Override
    public Planes from(int i, int j) {
      return new Planes(a, off, pixels, image, row0 + i, col0 + j, transposed);
    }

    /**
     * The index in {@code a} of element (channel, column) of the untransposed [C, batch * P]
     * matrix, counted from its own (0, 0).
     */
    int at(int channel, int column) {
      return off + column / pixels * image + channel * pixels + column % pixels;
    }

    /**
     * to[at + j] = untransposed element (channel, column + j) for j < length, a plane's run at a
     * time (channel and column counted from the matrix's own (0, 0)).
     */
    void put(int channel, int column, int length, float[] to, int at) {
      for (int done = 0; done < length; ) {
        int run = Math.min(length - done, pixels - (column + done) % pixels);
        System.arraycopy(a, at(channel, column + done), to, at + done, run);
        done += run;
      }
    }

    @Override
    public void copy(float[][] panel, int depth, int w) {
      if (!transposed) {
        for (int p = 0; p < depth; p++) {
          put(row0 + p, col0, w, panel[p], 0);
        }
      } else { // panel[p][j] = plane element (col0 + j, row0 + p): a gather, pixels apart
        for (int p = 0; p < depth; p++) {
          float[] to = panel[p];
          int from = at(col0, row0 + p);
          for (int j = 0; j < w; j++, from += pixels) {
            to[j] = a[from];
          }
        }
      }
    }
  }

  /**
   * A matrix view: element (i, j) is {@code a[off + i * rowStride + j * colStride]}, so that a
   * transposed or offset matrix is a view too.
   */
  record Mat(float[] a, int off, int rowStride, int colStride) implements Right {
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
}
