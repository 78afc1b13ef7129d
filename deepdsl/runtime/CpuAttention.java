package deepdsl.runtime;

/**
 * Attention's softmax of {@link CpuOps}: the registry op {@code masked_softmax}, which the optimiser makes
 * of {@code softmax(mask(scale * scores))} so that neither the scaled nor the masked scores are
 * stored.
 */
final class CpuAttention {
  private CpuAttention() {}

  /**
   * out[R, T] = softmax over each row of scale * x[R, T]; with {@code causal}, the elements j &gt;
   * r mod period of row r are -inf (weight 0): query i = r mod period sees keys 0..i.
   */
  public static void masked_softmax(Buf out, Buf x, float scale, boolean causal, int period) {
    int rows = x.dim(0);
    int cols = x.dim(1);
    for (int r = 0; r < rows; r++) {
      int in = x.off + r * cols;
      int o = out.off + r * cols;
      int seen = causal ? Math.min(cols, r % period + 1) : cols;
      float max = Float.NEGATIVE_INFINITY;
      if (scale > 0f) {
        max = rowMax(x.a, in, seen) * scale;
      } else {
        for (int j = 0; j < seen; j++) {
          max = Math.max(max, x.a[in + j] * scale);
        }
      }
      double sum = 0;
      for (int j = 0; j < seen; j++) {
        float e = (float) Math.exp(x.a[in + j] * scale - max);
        out.a[o + j] = e;
        sum += e;
      }
      float total = (float) sum;
      for (int j = 0; j < seen; j++) {
        out.a[o + j] /= total;
      }
      for (int j = seen; j < cols; j++) {
        out.a[o + j] = 0f;
      }
    }
  }

  /**
   * The largest of a[from], ..., a[from + n - 1], in four running maxima instead of one chain. With
   * a positive scale, max(x * scale) is max(x) * scale exactly: rounding a product is monotonic.
   */
  private static float rowMax(float[] a, int from, int n) {
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
