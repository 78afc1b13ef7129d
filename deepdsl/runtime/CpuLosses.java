package deepdsl.runtime;

import static deepdsl.runtime.CpuSupport.*;
import static deepdsl.runtime.CpuGemm.*;
import static deepdsl.runtime.GemmOperands.*;
import static deepdsl.runtime.CpuConvolution.*;

import java.util.Arrays;

/** Softmax and the losses of {@link CpuDevice}. */
public final class CpuLosses {
  private CpuLosses() {}

  // ---- softmax and the losses (rows are axis 1 of [N, K]) ----

  /**
   * out[N, K] = exp(x - max) / sum exp(x - max), per row of x[N, K]: attention's softmax with scale
   * 1 and no mask ({@link CpuAttention#masked_softmax}: the rows on the threads, a group of rows'
   * exponentials in one vectorised loop, within 4e-6 relative).
   */
  public static void softmax(Buf out, Buf x) {
    CpuAttention.masked_softmax(out, x, 1f, false, 1);
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
    // rows on the threads: attention's are many and short ([N * heads * T, T])
    Parallel.range(rows, 4L * rows * cols, (lo, hi) -> softmaxBackwardRows(out, y, g, lo, hi));
  }

  private static void softmaxBackwardRows(Buf out, Buf y, Buf g, int lo, int hi) {
    int cols = y.dim(1);
    for (int r = lo; r < hi; r++) {
      int yi = y.off + r * cols;
      int gi = g.off + r * cols;
      // four partial sums: independent additions, not one chain waiting on each
      double dot0 = 0;
      double dot1 = 0;
      double dot2 = 0;
      double dot3 = 0;
      int j = 0;
      for (; j + 3 < cols; j += 4) {
        dot0 += g.a[gi + j] * y.a[yi + j];
        dot1 += g.a[gi + j + 1] * y.a[yi + j + 1];
        dot2 += g.a[gi + j + 2] * y.a[yi + j + 2];
        dot3 += g.a[gi + j + 3] * y.a[yi + j + 3];
      }
      for (; j < cols; j++) {
        dot0 += g.a[gi + j] * y.a[yi + j];
      }
      float d = (float) ((dot0 + dot1) + (dot2 + dot3));
      for (j = 0; j < cols; j++) {
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
   * out (scalar) = the mean over rows of -log softmax(x)[label], for scores x[N, K] and labels[N]
   * (or x[N, T, K] and labels[N, T]: every position a row).
   */
  public static void softmax_cross_entropy(Buf out, Buf x, Buf labels) {
    int cols = x.dim(x.shape.length - 1);
    int rows = x.numel() / cols;
    // each chunk's sum, then the chunks' in order: the same bits on any number of threads
    int chunks = (rows + LOSS_CHUNK - 1) / LOSS_CHUNK;
    double[] partial = new double[chunks];
    Parallel.range(
        chunks,
        8L * rows * cols,
        (lo, hi) -> {
          float[][] scratch = CpuAttention.SCRATCH.get();
          float[] e = new float[cols];
          for (int c = lo; c < hi; c++) {
            double sum = 0;
            for (int r = c * LOSS_CHUNK; r < Math.min(rows, (c + 1) * LOSS_CHUNK); r++) {
              int in = x.off + r * cols;
              float max = CpuAttention.rowMax(x.a, in, cols);
              CpuAttention.exps(x.a, in, 1f, max, e, 0, cols, scratch);
              int label = (int) labels.a[labels.off + r];
              sum += Math.log(CpuAttention.rowSum(e, 0, cols)) - (x.a[in + label] - max);
            }
            partial[c] = sum;
          }
        });
    double total = 0;
    for (double p : partial) {
      total += p;
    }
    out.a[out.off] = (float) (total / rows);
  }

  /** Rows a chunk of the loss sums before the chunks are added, in order. */
  private static final int LOSS_CHUNK = 32;

  /**
   * out[N, K] = (softmax(x) - onehot(labels)) * g / N, for scores x[N, K], labels[N] and scalar g.
   */
  public static void softmax_cross_entropy_backward(Buf out, Buf x, Buf labels, Buf g) {
    int cols = x.dim(x.shape.length - 1);
    int rows = x.numel() / cols;
    softmax(new Buf(out.a, out.off, rows, cols), new Buf(x.a, x.off, rows, cols));
    float scale = g.a[g.off] / rows;
    Parallel.range(
        rows,
        2L * rows * cols,
        (lo, hi) -> {
          for (int r = lo; r < hi; r++) {
            int o = out.off + r * cols;
            out.a[o + (int) labels.a[labels.off + r]] -= 1f;
            for (int j = 0; j < cols; j++) {
              out.a[o + j] *= scale;
            }
          }
        });
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

  static float rowMax(float[] a, int from, int n) {
    float max = Float.NEGATIVE_INFINITY;
    for (int j = 0; j < n; j++) {
      max = Math.max(max, a[from + j]);
    }
    return max;
  }

  static double sumExp(float[] a, int from, int n, float max) {
    double sum = 0;
    for (int j = 0; j < n; j++) {
      sum += (float) Math.exp(a[from + j] - max);
    }
    return sum;
  }

  static int rowArgmax(float[] a, int from, int n) {
    int best = 0;
    for (int j = 1; j < n && !Float.isNaN(a[from + best]); j++) {
      float v = a[from + j];
      if (v > a[from + best] || Float.isNaN(v)) {
        best = j;
      }
    }
    return best;
  }

}
