package deepdsl.runtime;

import static deepdsl.runtime.CpuSupport.*;
import static deepdsl.runtime.CpuGemm.*;
import static deepdsl.runtime.CpuConvolution.*;

import java.util.Arrays;

/** The shape ops and the dropout mask of {@link CpuDevice}. */
public final class CpuShapes {
  private CpuShapes() {}

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

  static int prefix(int[] shape, int end) {
    int n = 1;
    for (int d = 0; d < end; d++) {
      n *= shape[d];
    }
    return n;
  }

  static int suffix(int[] shape, int start) {
    int n = 1;
    for (int d = start; d < shape.length; d++) {
      n *= shape[d];
    }
    return n;
  }
}
