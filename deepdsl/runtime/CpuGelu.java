package deepdsl.runtime;

/**
 * GELU and its gradient on the CPU, over a range of flat arrays: what the generated element-wise
 * kernels of {@code gelu} and {@code g * gelu'} compute (their index form, deepdsl/ops/elementwise.py:
 * Phi by Abramowitz and Stegun 7.1.26), written so that HotSpot's C2 vectorises it.
 *
 * <p>The kernel as one loop runs at 11 to 12 ns an element on JDK 17: C2 vectorises only loop
 * bodies it unrolls, those under {@code LoopUnrollLimit} (60 nodes), and {@code Math.exp} and the
 * sign's select each keep it scalar. Here each block of {@link #BLOCK} elements goes through small
 * loops over local arrays (which C2 can tell apart, where the kernel's buffers may alias): |x| /
 * sqrt 2; exp(-u^2) by a rational function of u^2 (degree 8 over 9, fitted to e^-y on [0, 88] by
 * least squares, within 1e-7 absolute; e^-88 is below float's normal range); the polynomial and the
 * result. About 4 ns an element in the same test, and within 5e-7 of the one-loop kernel.
 */
final class CpuGelu {
  private CpuGelu() {}

  static final int BLOCK = 256;

  private static final ThreadLocal<float[][]> SCRATCH =
      ThreadLocal.withInitial(() -> new float[4][BLOCK]);

  /** o[po + e] = gelu(x[px + e]) for e in [lo, hi). */
  static void forward(float[] o, int po, float[] x, int px, int lo, int hi) {
    float[][] s = SCRATCH.get();
    float[] v = s[0];
    float[] u = s[1];
    float[] ex = s[2];
    for (int b = lo; b < hi; b += BLOCK) {
      int m = Math.min(BLOCK, hi - b);
      System.arraycopy(x, px + b, v, 0, m);
      erfParts(v, u, ex, s[3], m);
      for (int j = 0; j < m; j++) { // x Phi(x) = x/2 + |x|/2 erf(|x| / sqrt 2)
        u[j] = 0.5f * v[j] + 0.5f * Math.abs(v[j]) * u[j];
      }
      System.arraycopy(u, 0, o, po + b, m);
    }
  }

  /**
   * o[po + r*cols + j] = gelu(x[px + r*cols + j] + bias[pb + j]) for the rows r in [lo, hi): each
   * row's sums into a local array, then {@link #forward} over it.
   */
  static void forwardBiased(
      float[] o, int po, float[] x, int px, float[] bias, int pb, int cols, int lo, int hi) {
    float[] row = ROW.get();
    if (row.length < cols) {
      row = new float[cols];
      ROW.set(row);
    }
    for (int r = lo; r < hi; r++) {
      int at = px + r * cols;
      for (int j = 0; j < cols; j++) {
        row[j] = x[at + j] + bias[pb + j];
      }
      forward(o, po + r * cols, row, 0, 0, cols);
    }
  }

  private static final ThreadLocal<float[]> ROW = ThreadLocal.withInitial(() -> new float[BLOCK]);

  /** o[po + e] = g[pg + e] * gelu'(x[px + e]) for e in [lo, hi): Phi(x) + x phi(x). */
  static void backward(float[] o, int po, float[] g, int pg, float[] x, int px, int lo, int hi) {
    float[][] s = SCRATCH.get();
    float[] v = s[0];
    float[] u = s[1];
    float[] ex = s[2];
    float[] gs = s[3];
    for (int b = lo; b < hi; b += BLOCK) {
      int m = Math.min(BLOCK, hi - b);
      System.arraycopy(x, px + b, v, 0, m);
      erfParts(v, u, ex, gs, m);
      System.arraycopy(g, pg + b, gs, 0, m);
      for (int j = 0; j < m; j++) { // phi(x) = exp(-x^2 / 2) / sqrt(2 pi), exp(-u^2) at u = |x| / sqrt 2
        u[j] = gs[j] * (0.5f + 0.5f * Math.copySign(u[j], v[j]) + v[j] * (0.3989423f * ex[j]));
      }
      System.arraycopy(u, 0, o, po + b, m);
    }
  }

  /**
   * For the m values of {@code v}: {@code erf} = erf(|v| / sqrt 2) (Abramowitz and Stegun 7.1.26)
   * and {@code ex} = exp(-v^2 / 2); {@code t} is scratch.
   */
  private static void erfParts(float[] v, float[] erf, float[] ex, float[] t, int m) {
    for (int j = 0; j < m; j++) {
      float a = 0.70710677f * Math.abs(v[j]);
      erf[j] = a;
      t[j] = Math.min(a * a, 88f) * 0.125f;
    }
    for (int j = 0; j < m; j++) { // the rational e^-y at y = 8 z: its numerator
      float z = t[j];
      float p = 2.979410237458069e-05f;
      p = p * z - 0.0010085818357765675f;
      p = p * z + 0.01414389256387949f;
      p = p * z - 0.10784564912319183f;
      p = p * z + 0.4929354190826416f;
      p = p * z - 1.396377682685852f;
      p = p * z + 2.4170761108398438f;
      p = p * z - 2.3578574657440186f;
      ex[j] = p * z + 1f;
    }
    for (int j = 0; j < m; j++) { // over its denominator
      float z = t[j];
      float q = 5.163089275360107f;
      q = q * z + 7.619883060455322f;
      q = q * z + 18.780303955078125f;
      q = q * z + 28.311002731323242f;
      q = q * z + 36.103946685791016f;
      q = q * z + 36.127479553222656f;
      q = q * z + 27.82233428955078f;
      q = q * z + 15.554210662841797f;
      q = q * z + 5.6421427726745605f;
      ex[j] /= q * z + 1f;
    }
    for (int j = 0; j < m; j++) { // 1 - t (a1 + t (a2 + ...)) exp(-u^2), t = 1 / (1 + p u)
      float c = 1f / (1f + 0.3275911f * erf[j]);
      float poly =
          c
              * (0.2548296f
                  + c * (-0.28449672f + c * (1.4214138f + c * (-1.4531521f + c * 1.0614054f))));
      erf[j] = 1f - poly * ex[j];
    }
  }
}
