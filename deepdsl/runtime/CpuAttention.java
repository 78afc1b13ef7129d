package deepdsl.runtime;

/**
 * Attention's softmax of {@link CpuDevice}: the registry op {@code masked_softmax}, which the optimiser makes
 * of {@code softmax(mask(scale * scores))} so that neither the scaled nor the masked scores are
 * stored.
 */
public final class CpuAttention {
  private CpuAttention() {}

  /**
   * out[R, T] = softmax over each row of scale * x[R, T]; with {@code causal}, the elements j &gt;
   * r mod period of row r are -inf (weight 0): query i = r mod period sees keys 0..i.
   */
  public static void masked_softmax(Buf out, Buf x, float scale, boolean causal, int period) {
    int rows = x.dim(0);
    int cols = x.dim(1);
    // rows on the threads: attention's are many and short ([N * heads * T, T])
    Parallel.range(rows, 8L * rows * cols, (lo, hi) -> maskedRows(out, x, scale, causal, period, lo, hi));
  }

  /**
   * Rows [lo, hi) of the masked softmax, a group of rows at a time: their seen elements, scaled and
   * shifted by their row's maximum, side by side in one array, so that the exponentials run as one
   * long loop ({@link #expsInPlace}). One row at a time, those loops were a row long (64 at T = 64),
   * shorter than C2's unrolled vector loop, so they ran mostly scalar: 30% slower.
   */
  private static void maskedRows(
      Buf out, Buf x, float scale, boolean causal, int period, int lo, int hi) {
    int cols = x.dim(1);
    float[][] scratch = SCRATCH.get(); // once a piece: a ThreadLocal lookup a row cost 6% of gpt_tiny's step
    if (cols > GROUP) { // a row longer than a group: arrays of a row, for this piece
      scratch = new float[][] {new float[cols], new float[cols], new float[cols]};
    }
    float[] t = scratch[0];
    int group = Math.max(1, GROUP / cols);
    for (int first = lo; first < hi; first += group) {
      int last = Math.min(hi, first + group);
      int n = 0;
      for (int r = first; r < last; r++) {
        int in = x.off + r * cols;
        int seen = causal ? Math.min(cols, r % period + 1) : cols;
        float max = Float.NEGATIVE_INFINITY;
        if (scale > 0f) {
          max = rowMax(x.a, in, seen) * scale;
        } else {
          for (int j = 0; j < seen; j++) {
            max = Math.max(max, x.a[in + j] * scale);
          }
        }
        for (int j = 0; j < seen; j++) {
          t[n + j] = x.a[in + j] * scale - max;
        }
        n += seen;
      }
      expsInPlace(t, n, scratch);
      n = 0;
      for (int r = first; r < last; r++) {
        int o = out.off + r * cols;
        int seen = causal ? Math.min(cols, r % period + 1) : cols;
        float inverse = 1f / rowSum(t, n, seen); // a product an element, not a division
        for (int j = 0; j < seen; j++) {
          out.a[o + j] = t[n + j] * inverse;
        }
        for (int j = seen; j < cols; j++) {
          out.a[o + j] = 0f;
        }
        n += seen;
      }
    }
  }

  /** The elements of a group of rows (their seen ones) whose exponentials run as one loop. */
  private static final int GROUP = 2048;

  /**
   * t[j] = exp(t[j]) for j &lt; n, every t[j] at most 0, as {@link #exps} computes it, in loops over
   * the scratch arrays at one index (C2 vectorises no loop that reads one array at an offset and
   * writes another that might be the same).
   */
  private static void expsInPlace(float[] t, int n, float[][] scratch) {
    float[] r = scratch[1];
    float[] f = scratch[2];
    for (int j = 0; j < n; j++) {
      float y = Math.max(t[j] * 1.442695f, -127f);
      float k = (y + 12582912f) - 12582912f;
      r[j] = k;
      f[j] = y - k;
    }
    twoToThe(r, f, n);
    System.arraycopy(f, 0, t, 0, n);
  }

  private static final int BLOCK = 256;

  /** A thread's work arrays: the masked softmax's group of rows, and two for the exponentials. */
  static final ThreadLocal<float[][]> SCRATCH =
      ThreadLocal.withInitial(() -> new float[][] {new float[GROUP], new float[GROUP], new float[GROUP]});

  /**
   * out[o + j] = exp(x[from + j] * scale - shift) for j &lt; n, where every argument is at most 0
   * (shift is the largest x * scale), in three small loops that the JIT vectorises (Math.exp keeps a
   * loop scalar): e^y = 2^r 2^f with r = round(y log2 e), |f| &lt;= 1/2, 2^f by its Taylor
   * polynomial of degree 7 (within 6e-9 relative), 2^r from its exponent bits. Within 4e-6 relative
   * of Math.exp (the rounding of y log2 e, the most near e^-88); 0 below about e^-88. About 3 ns an
   * element on rows of 64, against 13 for Math.exp, on JDK 17. {@code scratch}: {@link #SCRATCH}'s
   * arrays, fetched by the caller once for many rows.
   */
  static void exps(
      float[] x, int from, float scale, float shift, float[] out, int o, int n, float[][] scratch) {
    float[] r = scratch[1];
    float[] f = scratch[2];
    for (int b = 0; b < n; b += BLOCK) {
      int m = Math.min(BLOCK, n - b);
      for (int j = 0; j < m; j++) { // 12582912 = 1.5 * 2^23: adding and taking it away rounds to an integer
        float t = Math.max((x[from + b + j] * scale - shift) * 1.442695f, -127f);
        float k = (t + 12582912f) - 12582912f;
        r[j] = k;
        f[j] = t - k;
      }
      twoToThe(r, f, m);
      System.arraycopy(f, 0, out, o + b, m);
    }
  }

  /**
   * f[j] = 2^(r[j] + f[j]) for j &lt; m, r[j] an integer in [-127, 0] and |f[j]| &lt;= 1/2: 2^f by
   * its Taylor polynomial of degree 7 (e^(f ln 2), within 6e-9 relative), 2^r from its exponent
   * bits (r + 127; 0 for r = -127).
   */
  private static void twoToThe(float[] r, float[] f, int m) {
    for (int j = 0; j < m; j++) {
      float z = f[j];
      float p = 1.5252734e-5f;
      p = p * z + 1.5403530e-4f;
      p = p * z + 1.3333558e-3f;
      p = p * z + 9.6181291e-3f;
      p = p * z + 5.5504109e-2f;
      p = p * z + 2.4022651e-1f;
      p = p * z + 6.9314718e-1f;
      f[j] = p * z + 1f;
    }
    for (int j = 0; j < m; j++) {
      f[j] *= Float.intBitsToFloat(((int) r[j] + 127) << 23);
    }
  }

  /** a[from] + ... + a[from + n - 1] in double, in four running sums instead of one chain. */
  static float rowSum(float[] a, int from, int n) {
    double s0 = 0;
    double s1 = 0;
    double s2 = 0;
    double s3 = 0;
    int j = 0;
    for (; j + 3 < n; j += 4) {
      s0 += a[from + j];
      s1 += a[from + j + 1];
      s2 += a[from + j + 2];
      s3 += a[from + j + 3];
    }
    for (; j < n; j++) {
      s0 += a[from + j];
    }
    return (float) ((s0 + s1) + (s2 + s3));
  }

  /**
   * The largest of a[from], ..., a[from + n - 1], in four running maxima instead of one chain. With
   * a positive scale, max(x * scale) is max(x) * scale exactly: rounding a product is monotonic.
   */
  static float rowMax(float[] a, int from, int n) {
    float m0 = Float.NEGATIVE_INFINITY;
    float m1 = Float.NEGATIVE_INFINITY;
    float m2 = Float.NEGATIVE_INFINITY;
    float m3 = Float.NEGATIVE_INFINITY;
    int j = 0;
    for (; j + 3 < n; j += 4) {
      m0 = Math.max(m0, a[from + j]);
      m1 = Math.max(m1, a[from + j + 1]);
      m2 = Math.max(m2, a[from + j + 2]);
      m3 = Math.max(m3, a[from + j + 3]);
    }
    for (; j < n; j++) {
      m0 = Math.max(m0, a[from + j]);
    }
    return Math.max(Math.max(m0, m1), Math.max(m2, m3));
  }
}
