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
      for (int j = 0; j < seen; j++) {
        max = Math.max(max, x.a[in + j] * scale);
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
}
