package deepdsl.runtime;

import static deepdsl.runtime.CpuSupport.*;
import static deepdsl.runtime.CpuGemm.*;
import static deepdsl.runtime.CpuConvolution.*;

import java.util.Arrays;

/** Local response normalisation and layer norm's rows, for {@link CpuDevice}. */
public final class CpuNormalisation {
  private CpuNormalisation() {}

  // ---- layer norm's rows ----

  /**
   * out = (x - mean) / sqrt(var + eps) for each row of x [R, D], its mean and biased variance over
   * the row (the variance of the centred row, as the NumPy runner computes it). The rows run on the
   * threads, each whole on one, so the result does not depend on the split.
   */
  public static void layer_norm_rows(Buf out, Buf x, float eps) {
    int rows = x.dim(0);
    int d = x.dim(1);
    float[] xa = x.a;
    float[] o = out.a;
    Parallel.range(
        rows,
        5L * rows * d,
        (lo, hi) -> {
          for (int r = lo; r < hi; r++) {
            int xi = x.off + r * d;
            int oi = out.off + r * d;
            float mean = sum(xa, xi, d) / d;
            float rs = inverseDeviation(xa, xi, d, mean, eps);
            for (int j = 0; j < d; j++) {
              o[oi + j] = (xa[xi + j] - mean) * rs;
            }
          }
        });
  }

  /**
   * out = d {@link #layer_norm_rows} / d x given g = dy: per row rs (g - mean(g) - y mean(g y)), with
   * y the row normalised and rs its 1 / sqrt(var + eps), both recomputed from x.
   */
  public static void layer_norm_rows_backward(Buf out, Buf x, Buf g, float eps) {
    int rows = x.dim(0);
    int d = x.dim(1);
    float[] xa = x.a;
    float[] ga = g.a;
    float[] o = out.a;
    Parallel.range(
        rows,
        11L * rows * d,
        (lo, hi) -> {
          for (int r = lo; r < hi; r++) {
            int xi = x.off + r * d;
            int gi = g.off + r * d;
            int oi = out.off + r * d;
            float mean = sum(xa, xi, d) / d;
            float rs = inverseDeviation(xa, xi, d, mean, eps);
            float meanG = sum(ga, gi, d) / d;
            float meanGy = centredDot(ga, gi, xa, xi, d, mean) * rs / d;
            for (int j = 0; j < d; j++) {
              o[oi + j] = rs * (ga[gi + j] - meanG - (xa[xi + j] - mean) * rs * meanGy);
            }
          }
        });
  }

  // ---- batch norm ----

  /**
   * out = gamma (x - mean) / sqrt(var + eps) + beta per channel c of x [N, C, ...], the statistics
   * given; each channel's planes on the threads (an element's result does not depend on the split).
   */
  public static void bn_train_apply(Buf out, Buf x, Buf mean, Buf var, Buf gamma, Buf beta, float eps) {
    int images = x.dim(0);
    int channels = x.dim(1);
    int plane = x.numel() / (images * channels);
    Parallel.range(
        images * channels,
        4L * x.numel(),
        (lo, hi) -> {
          for (int p = lo; p < hi; p++) {
            int c = p % channels;
            float mu = mean.a[mean.off + c];
            float scale = gamma.a[gamma.off + c] / (float) Math.sqrt(var.a[var.off + c] + eps);
            float shift = beta.a[beta.off + c];
            int xi = x.off + p * plane;
            int oi = out.off + p * plane;
            for (int j = 0; j < plane; j++) {
              out.a[oi + j] = (x.a[xi + j] - mu) * scale + shift;
            }
          }
        });
  }

  /**
   * out = d bn_train_apply / d x: per channel c of x [N, C, ...], over its M = N * plane values,
   * gamma r (g - sum(g) / M - xh sum(g xh) / M) with r = 1 / sqrt(var + eps) given ({@code invstd},
   * the registry's bn_invstd) and xh = (x - mean) r, the two sums given (the shift's and the scale's
   * gradients): one pass. The image planes run on the threads.
   */
  public static void bn_train_backward(
      Buf out, Buf x, Buf g, Buf mean, Buf invstd, Buf gamma, Buf gammaGrad, Buf betaGrad, float eps) {
    int images = x.dim(0);
    int channels = x.dim(1);
    int plane = x.numel() / (images * channels);
    float m = (float) images * plane;
    float[] xa = x.a;
    float[] ga = g.a;
    float[] o = out.a;
    Parallel.range(
        images * channels,
        6L * x.numel(),
        (lo, hi) -> {
          for (int p = lo; p < hi; p++) {
            int c = p % channels;
            float mu = mean.a[mean.off + c];
            float rs = invstd.a[invstd.off + c];
            float meanG = betaGrad.a[betaGrad.off + c] / m;
            float scale = gamma.a[gamma.off + c] * rs;
            float slope = rs * gammaGrad.a[gammaGrad.off + c] / m; // xh sum(g xh) / M = (x - mu) slope
            int xi = x.off + p * plane;
            int gi = g.off + p * plane;
            int oi = out.off + p * plane;
            for (int j = 0; j < plane; j++) {
              o[oi + j] = scale * (ga[gi + j] - meanG - (xa[xi + j] - mu) * slope);
            }
          }
        });
  }

  /** 1 / sqrt(var + eps) of the n values at a[at], their mean given: the biased variance. */
  private static float inverseDeviation(float[] a, int at, int n, float mean, float eps) {
    return 1f / (float) Math.sqrt(centredSquares(a, at, n, mean) / n + eps);
  }

  /** a[at] + ... + a[at + n - 1], in four running sums (independent chains the CPU overlaps). */
  private static float sum(float[] a, int at, int n) {
    float s0 = 0f;
    float s1 = 0f;
    float s2 = 0f;
    float s3 = 0f;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      s0 += a[at + j];
      s1 += a[at + j + 1];
      s2 += a[at + j + 2];
      s3 += a[at + j + 3];
    }
    for (; j < n; j++) {
      s0 += a[at + j];
    }
    return (s0 + s1) + (s2 + s3);
  }

  /** The sum of (a[at + j] - mean)^2 over j in [0, n), as {@link #sum}. */
  private static float centredSquares(float[] a, int at, int n, float mean) {
    float s0 = 0f;
    float s1 = 0f;
    float s2 = 0f;
    float s3 = 0f;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      float c0 = a[at + j] - mean;
      float c1 = a[at + j + 1] - mean;
      float c2 = a[at + j + 2] - mean;
      float c3 = a[at + j + 3] - mean;
      s0 += c0 * c0;
      s1 += c1 * c1;
      s2 += c2 * c2;
      s3 += c3 * c3;
    }
    for (; j < n; j++) {
      float c = a[at + j] - mean;
      s0 += c * c;
    }
    return (s0 + s1) + (s2 + s3);
  }

  /** The sum of g[gi + j] * (x[xi + j] - mean) over j in [0, n), as {@link #sum}. */
  private static float centredDot(float[] g, int gi, float[] x, int xi, int n, float mean) {
    float s0 = 0f;
    float s1 = 0f;
    float s2 = 0f;
    float s3 = 0f;
    int j = 0;
    for (; j + 4 <= n; j += 4) {
      s0 += g[gi + j] * (x[xi + j] - mean);
      s1 += g[gi + j + 1] * (x[xi + j + 1] - mean);
      s2 += g[gi + j + 2] * (x[xi + j + 2] - mean);
      s3 += g[gi + j + 3] * (x[xi + j + 3] - mean);
    }
    for (; j < n; j++) {
      s0 += g[gi + j] * (x[xi + j] - mean);
    }
    return (s0 + s1) + (s2 + s3);
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
  static void windowSum(
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

}
