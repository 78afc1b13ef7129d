package deepdsl.runtime;

import static deepdsl.runtime.CpuConvolution.*;
import static deepdsl.runtime.CpuSupport.*;

import java.nio.FloatBuffer;
import java.util.Arrays;

/**
 * The layout moves of {@link CpuConvolution}: im2col (an image's windows as the columns, or their
 * transpose, of a matrix product; into arrays or a direct buffer OpenBLAS reads in place), its
 * inverse that adds columns back into images, and the window bounds they share (pooling's too).
 */
final class Im2col {
  private Im2col() {}

  /**
   * One image's im2col columns transposed, one row of C*kh*kw per output pixel, from row {@code
   * row}: rows[row + oy * OW + ox][(ch * kh + i) * kw + j] = x[ch, oy*sh - ph + i*dh, ox*sw - pw +
   * j*dw], zero outside the image. Each pixel's row is written front to back, a window row at a time.
   */
  static void im2colRows(ConvShape s, float[] x, int xOff, float[][] rows, int row) {
    for (int oy = 0; oy < s.oh; oy++) {
      for (int ox = 0; ox < s.ow; ox++) {
        float[] to = rows[row + oy * s.ow + ox];
        int ix = ox * s.sw - s.pw;
        boolean inside = s.dw == 1 && ix >= 0 && ix + s.kw <= s.w;
        int at = 0;
        for (int ch = 0; ch < s.c; ch++) {
          for (int i = 0; i < s.kh; i++, at += s.kw) {
            int iy = oy * s.sh + s.rowShift(i);
            if (iy < 0 || iy >= s.h) {
              Arrays.fill(to, at, at + s.kw, 0f);
              continue;
            }
            int line = xOff + (ch * s.h + iy) * s.w;
            if (inside) {
              copyShort(x, line + ix, to, at, s.kw);
            } else {
              for (int j = 0, u = ix; j < s.kw; j++, u += s.dw) {
                to[at + j] = u >= 0 && u < s.w ? x[line + u] : 0f;
              }
            }
          }
        }
      }
    }
  }

  /**
   * to[at .. at + length) = from[src .. src + length): straight-line code for the short runs of a
   * convolution window's row or of a small image's row (twice as fast as a loop or
   * System.arraycopy for five elements, a fifth faster than System.arraycopy for eight).
   */
  static void copyShort(float[] from, int src, float[] to, int at, int length) {
    switch (length) {
      case 8:
        to[at + 7] = from[src + 7];
      // fall through
      case 7:
        to[at + 6] = from[src + 6];
      // fall through
      case 6:
        to[at + 5] = from[src + 5];
      // fall through
      case 5:
        to[at + 4] = from[src + 4];
      // fall through
      case 4:
        to[at + 3] = from[src + 3];
      // fall through
      case 3:
        to[at + 2] = from[src + 2];
      // fall through
      case 2:
        to[at + 1] = from[src + 1];
      // fall through
      case 1:
        to[at] = from[src];
        break;
      default:
        System.arraycopy(from, src, to, at, length);
    }
  }

  /**
   * The im2col columns of the {@code batch} images at {@code x[xOff]} side by side:
   * cols[(ch * kh + i) * kw + j][b * OH*OW + oy * OW + ox] = x[b, ch, oy*sh - ph + i*dh, ox*sw - pw
   * + j*dw], zero outside the image. Each row is written whole, front to back, the channels' rows on the
   * threads: every row is its own array, so no two threads write one cache line. Built image by
   * image instead, the two threads shared the lines of every row: on ResNet-50's 3x3 convolutions
   * at batch 8 that took 1.7-4x as long (2x2 images: 282 against 163 us; 8x8: 427 against 103).
   */
  static void im2col(ConvShape s, float[] x, int xOff, int batch, float[][] cols) {
    int window = s.kh * s.kw;
    parallel(
        s.c,
        workers(s.c, (long) window * batch * s.pixels()),
        1,
        (piece, lo, hi) -> {
          for (int row = lo * window; row < hi * window; row++) {
            im2colRow(s, x, xOff, batch, row, cols[row]);
          }
        });
  }

  /**
   * {@link #im2col} into the direct buffer {@code cols} (rows of batch * OH*OW floats) that the
   * native SGEMM reads in place: each row built in the thread's array, then put in whole.
   */
  static void im2col(ConvShape s, float[] x, int xOff, int batch, FloatBuffer cols) {
    int window = s.kh * s.kw;
    int width = batch * s.pixels();
    parallel(
        s.c,
        workers(s.c, (long) window * width),
        1,
        (piece, lo, hi) -> {
          Scratch scratch = SCRATCH.get();
          float[] line = scratch.line = atLeast(scratch.line, width);
          for (int row = lo * window; row < hi * window; row++) {
            im2colRow(s, x, xOff, batch, row, line);
            cols.put(row * width, line, 0, width);
          }
        });
  }

  /**
   * The calling thread's direct buffer of at least {@code floats} floats for im2col columns that
   * the native SGEMM reads in place; null on the Java SGEMM, or where direct memory ran out.
   */
  static FloatBuffer nativeColumns(int floats) {
    Blas.Gemm gemm = Blas.gemm();
    return gemm == null ? null : gemm.columns(floats);
  }

  /**
   * Row {@code row} = (ch * kh + i) * kw + j of {@link #im2col}. In a 'same' convolution (stride 1,
   * as wide as its input) the row of one image is x's plane ch shifted by a constant: its elements
   * inside the image are one run of the plane, copied at once, and the columns that ran over an
   * edge are zeroed after.
   */
  static void im2colRow(ConvShape s, float[] x, int xOff, int batch, int row, float[] line) {
    int i = row / s.kw % s.kh;
    int j = row % s.kw;
    int pixels = s.pixels();
    // the output columns ox whose input column ox*sw - pw + j*dw lies inside [0, W), the rows likewise
    int oxLo = Math.min(s.ow, firstInside(s.colShift(j), s.sw));
    int oxHi = Math.max(oxLo, Math.min(s.ow, lastInside(s.colShift(j), s.sw, s.w) + 1));
    int oyLo = Math.min(s.oh, firstInside(s.rowShift(i), s.sh));
    int oyHi = Math.max(oyLo, Math.min(s.oh, lastInside(s.rowShift(i), s.sh, s.h) + 1));
    if (oxLo == oxHi || oyLo == oyHi) {
      Arrays.fill(line, 0, batch * pixels, 0f);
      return;
    }
    boolean same = s.sh == 1 && s.sw == 1 && s.ow == s.w;
    int first = oyLo * s.ow + oxLo;
    int last = (oyHi - 1) * s.ow + oxHi;
    int plane = xOff + row / (s.kh * s.kw) * s.h * s.w;
    for (int b = 0, to = 0; b < batch; b++, to += pixels, plane += s.image()) {
      Arrays.fill(line, to, to + oyLo * s.ow, 0f);
      if (same) { // x[plane + q + shift] for the output pixel q = oy * OW + ox
        int shift = s.rowShift(i) * s.w + s.colShift(j);
        copyShort(x, plane + first + shift, line, to + first, last - first);
      }
      for (int oy = oyLo; oy < oyHi; oy++) {
        int at = to + oy * s.ow;
        for (int ox = 0; ox < oxLo; ox++) {
          line[at + ox] = 0f;
        }
        if (!same) {
          int from = plane + (oy * s.sh + s.rowShift(i)) * s.w + s.colShift(j);
          if (s.sw == 1) {
            copyShort(x, from + oxLo, line, at + oxLo, oxHi - oxLo);
          } else {
            for (int ox = oxLo; ox < oxHi; ox++) {
              line[at + ox] = x[from + ox * s.sw];
            }
          }
        }
        for (int ox = oxHi; ox < s.ow; ox++) {
          line[at + ox] = 0f;
        }
      }
      Arrays.fill(line, to + oyHi * s.ow, to + pixels, 0f);
    }
  }

  /**
   * The adjoint of {@link #im2colRows} for one image: dx[ch, iy, ix] = the sum of the elements of
   * the pixel rows (from row {@code row} of rows of C*kh*kw in {@code rows}) that read x[ch, iy,
   * ix]. Each pixel's row is added a window row at a time.
   */
  static void rowsToImage(ConvShape s, float[] rows, int row, float[] dx, int dxOff) {
    Arrays.fill(dx, dxOff, dxOff + s.image(), 0f);
    int length = s.colRows();
    for (int oy = 0; oy < s.oh; oy++) {
      for (int ox = 0; ox < s.ow; ox++) {
        int from = (row + oy * s.ow + ox) * length;
        int ix = ox * s.sw - s.pw;
        boolean inside = s.dw == 1 && ix >= 0 && ix + s.kw <= s.w;
        for (int ch = 0; ch < s.c; ch++) {
          for (int i = 0; i < s.kh; i++, from += s.kw) {
            int iy = oy * s.sh + s.rowShift(i);
            if (iy < 0 || iy >= s.h) {
              continue;
            }
            int line = dxOff + (ch * s.h + iy) * s.w;
            if (inside) {
              addShort(rows, from, dx, line + ix, s.kw);
            } else {
              for (int j = 0, u = ix; j < s.kw; j++, u += s.dw) {
                if (u >= 0 && u < s.w) {
                  dx[line + u] += rows[from + j];
                }
              }
            }
          }
        }
      }
    }
  }

  /** to[at .. at + length) += from[src .. src + length), straight-line as in {@link #copyShort}. */
  static void addShort(float[] from, int src, float[] to, int at, int length) {
    switch (length) {
      case 8:
        to[at + 7] += from[src + 7];
      // fall through
      case 7:
        to[at + 6] += from[src + 6];
      // fall through
      case 6:
        to[at + 5] += from[src + 5];
      // fall through
      case 5:
        to[at + 4] += from[src + 4];
      // fall through
      case 4:
        to[at + 3] += from[src + 3];
      // fall through
      case 3:
        to[at + 2] += from[src + 2];
      // fall through
      case 2:
        to[at + 1] += from[src + 1];
      // fall through
      case 1:
        to[at] += from[src];
        break;
      default:
        for (int j = 0; j < length; j++) {
          to[at + j] += from[src + j];
        }
    }
  }

  /** The smallest o >= 0 with o * stride + shift >= 0. */
  static int firstInside(int shift, int stride) {
    return shift >= 0 ? 0 : (-shift + stride - 1) / stride;
  }

  /** The largest o with o * stride + shift < size (may be negative). */
  static int lastInside(int shift, int stride, int size) {
    return Math.floorDiv(size - 1 - shift, stride);
  }
}
