package deepdsl.runtime;

import static deepdsl.runtime.CpuSupport.*;
import static deepdsl.runtime.CpuGemm.*;
import static deepdsl.runtime.CpuConvolution.*;
import static deepdsl.runtime.Im2col.*;

import java.util.Arrays;

/** The pooling kernels of {@link CpuDevice}. */
public final class CpuPooling {
  private CpuPooling() {}

  // ---- pooling ----

  /**
   * The geometry of one pooling: input planes H x W, output planes OH x OW. The kernels walk the
   * window offsets (i, j) in row-major order, each over a whole output row, as the NumPy kernels
   * do.
   */
  static final class PoolShape {
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
      return CpuSupport.workers(planes, (long) oh * ow * kh * kw);
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
  static void maxPoolPairs(PoolShape s, Buf out, Buf x, int lo, int hi) {
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
  static void maxPoolPairsBackward(
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

}
