package deepdsl.runtime;

import static deepdsl.runtime.CpuSupport.*;
import static deepdsl.runtime.CpuGemm.*;
import static deepdsl.runtime.CpuConvolution.*;

import java.util.Arrays;

/** Local response normalisation, for {@link CpuOps}. */
final class CpuNormalisation {
  private CpuNormalisation() {}

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
