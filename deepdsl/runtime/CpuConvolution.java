package deepdsl.runtime;

import static deepdsl.runtime.CpuSupport.*;
import static deepdsl.runtime.CpuGemm.*;
import static deepdsl.runtime.GemmOperands.*;
import static deepdsl.runtime.Im2col.*;

import java.nio.FloatBuffer;
import java.util.Arrays;
import java.util.function.IntConsumer;

/** The convolutions of {@link CpuDevice}: im2col + SGEMM, and their gradients. */
public final class CpuConvolution {
  private CpuConvolution() {}

  // ---- convolution ----

  /**
   * The geometry of one convolution: input [N, C, H, W], weight [F, C/G, KH, KW], output [N, F, OH,
   * OW]; tap (i, j) of the window at output (oy, ox) reads input (oy*sh - ph + i*dh, ox*sw - pw +
   * j*dw), dilation (dh, dw) being the gap between the taps.
   */
  static final class ConvShape {
    final int n;
    final int c;
    final int h;
    final int w;
    final int f;
    final int kh;
    final int kw;
    final int sh;
    final int sw;
    final int ph;
    final int pw;
    final int dh;
    final int dw;
    final int groups;
    final int oh;
    final int ow;

    ConvShape(int[] in, int[] weight, int[] stride, int[] pad, int[] dilation, int groups) {
      n = in[0];
      c = in[1];
      h = in[2];
      w = in[3];
      f = weight[0];
      kh = weight[2];
      kw = weight[3];
      sh = stride[0];
      sw = stride[1];
      ph = pad[0];
      pw = pad[1];
      dh = dilation[0];
      dw = dilation[1];
      this.groups = groups;
      oh = (h + 2 * ph - (kh - 1) * dh - 1) / sh + 1;
      ow = (w + 2 * pw - (kw - 1) * dw - 1) / sw + 1;
    }

    /** The input row of window row i at output row 0: i*dh - ph. */
    int rowShift(int i) {
      return i * dh - ph;
    }

    /** The input column of window column j at output column 0: j*dw - pw. */
    int colShift(int j) {
      return j * dw - pw;
    }

    /**
     * A 1x1 convolution with stride 1 and no padding: its im2col matrix is the image planes
     * themselves (a {@link Planes} operand), so it builds no columns.
     */
    boolean pointwise() {
      return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0;
    }

    /** Output pixels per image. */
    int pixels() {
      return oh * ow;
    }

    /** Input elements per image. */
    int image() {
      return c * h * w;
    }

    /** Rows of the im2col matrix: C*kh*kw, in (c, i, j) order. */
    int colRows() {
      return c * kh * kw;
    }

    /** Rows of one group's block of the im2col matrix: (C/G)*kh*kw. */
    int groupRows() {
      return colRows() / groups;
    }

    /** Output channels per group. */
    int groupFilters() {
      return f / groups;
    }

    /** Multiply-adds per image. */
    long work() {
      return (long) f * groupRows() * pixels();
    }

    /**
     * Images per matrix product, so that its rows (batch x OH*OW) are long enough to vectorise
     * well: at least one, at most {@code available}.
     */
    int batch(int available) {
      return Math.max(1, Math.min(available, (GEMM_NC + pixels() - 1) / pixels()));
    }

    /**
     * The threads the images are split over, each piece of images going through its own products;
     * or 1 where a piece would hold fewer images than one product takes ({@link #batch}): the
     * caller then goes through the images a product at a time, building each product's columns
     * on the threads (channel by channel, see {@link #im2col}), and the product itself runs on
     * them. On two threads, ResNet-50 at batch 8 on 64x64 images split its products to one image
     * of 2x2 pixels each, and the weight gradients' per-piece partial sums cost more than the
     * products.
     */
    int imageWorkers() {
      int workers = n >= THREADS ? workers(n, work()) : 1;
      return workers > 1 && (long) pieces(n, workers, PIECES_PER_WORKER) * batch(n) > n ? 1 : workers;
    }
  }

  /**
   * {@code body.accept(b)} for the images b of one product's batch: on the threads where the caller
   * is not itself one of them (the images then go a product at a time, see {@link
   * ConvShape#imageWorkers}), else here.
   */
  static void eachImage(int batch, long workPerImage, IntConsumer body) {
    parallel(
        batch,
        workers(batch, workPerImage),
        1,
        (piece, lo, hi) -> {
          for (int b = lo; b < hi; b++) {
            body.accept(b);
          }
        });
  }

  /**
   * out[N, F, OH, OW] = the cross-correlation of x[N, C, H, W] with w[F, C/groups, kh, kw],
   * zero-padded by pad (ph, pw), with stride (sh, sw) and dilation (dh, dw); output channel block g sees input channel
   * block g only.
   *
   * <p>A few images at a time (see {@link ConvShape#batch}): their im2col columns side by side, one
   * matrix product per group, and the product's rows copied to the images' output planes.
   */
  public static void conv2d(
      Buf out, Buf x, Buf w, int groups, int[] pad, int[] stride, int[] dilation) {
    ConvShape s = new ConvShape(x.shape, w.shape, stride, pad, dilation, groups);
    int pixels = s.pixels();
    int fg = s.groupFilters();
    int kg = s.groupRows();
    parallel(
        s.n,
        s.imageWorkers(),
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          Scratch scratch = SCRATCH.get();
          for (int n0 = lo; n0 < hi; ) {
            int batch = s.batch(hi - n0);
            int width = batch * pixels;
            // the columns in the native SGEMM's direct buffer where it has one, else in arrays
            FloatBuffer direct = s.pointwise() ? null : nativeColumns(s.colRows() * width);
            float[][] cols =
                s.pointwise() || direct != null ? null : rows(scratch, s.colRows(), width);
            if (direct != null) {
              im2col(s, x.a, x.off + n0 * s.image(), batch, direct);
            } else if (!s.pointwise()) {
              im2col(s, x.a, x.off + n0 * s.image(), batch, cols);
            }
            // one image writes its output plane directly; a batch goes through the products array
            float[] prod = out.a;
            int prodOff = out.off + n0 * s.f * pixels;
            if (batch > 1) {
              scratch.products = atLeast(scratch.products, s.f * width);
              prod = scratch.products;
              prodOff = 0;
            }
            for (int g = 0; g < groups; g++) { // out_g = W_g cols_g
              Mat weights = Mat.rows(w.a, w.off + g * fg * kg, kg);
              Right columns =
                  s.pointwise()
                      ? Planes.of(x.a, x.off + n0 * s.image() + g * kg * pixels, pixels, s.image())
                      : direct != null
                          ? new Direct(direct, width, g * kg, 0, false)
                          : new Rows(cols, g * kg, 0);
              Mat products = Mat.rows(prod, prodOff + g * fg * width, width);
              gemmParallel(fg, width, kg, weights, columns, products, false);
            }
            if (batch > 1) {
              scatterPlanes(s.f, pixels, batch, prod, out.a, out.off + n0 * s.f * pixels);
            }
            n0 += batch;
          }
        });
  }

  /**
   * out[N, C, H, W] (in_shape) = d conv2d / d x given g = d out [N, F, OH, OW] and w[F, C/groups,
   * kh, kw]: the transposed columns g_g^T W_g (one row of C*kh*kw per output pixel), a few images
   * at a time as in {@link #conv2d}, added back onto the window positions they came from ({@link
   * #rowsToImage}).
   */
  public static void conv2d_backward_data(
      Buf out, Buf g, Buf w, int groups, int[] inShape, int[] pad, int[] stride, int[] dilation) {
    ConvShape s = new ConvShape(inShape, w.shape, stride, pad, dilation, groups);
    int pixels = s.pixels();
    int fg = s.groupFilters();
    int kg = s.groupRows();
    parallel(
        s.n,
        s.imageWorkers(),
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          Scratch scratch = SCRATCH.get();
          for (int n0 = lo; n0 < hi; ) {
            int batch = s.batch(hi - n0);
            int width = batch * pixels;
            if (s.pointwise()) {
              pointwiseData(s, out, g, w, n0, batch, scratch);
              n0 += batch;
              continue;
            }
            if (Blas.gemm() != null) {
              columnData(s, out, g, w, n0, batch, scratch);
              n0 += batch;
              continue;
            }
            // the gradient planes of the batch side by side, [F, batch * OH*OW]: one image's are g's
            float[] grad = g.a;
            int gradOff = g.off + n0 * s.f * pixels;
            if (batch > 1) {
              scratch.products = atLeast(scratch.products, s.f * width);
              grad = scratch.products;
              gradOff = 0;
              gatherPlanes(s, g.a, g.off, n0, batch, grad);
            }
            scratch.cols = atLeast(scratch.cols, width * s.colRows());
            float[] rows = scratch.cols;
            for (int grp = 0; grp < groups; grp++) { // rows_g = g_g^T W_g
              Mat grads = Mat.rows(grad, gradOff + grp * fg * width, width).t();
              Mat weights = Mat.rows(w.a, w.off + grp * fg * kg, kg);
              Mat columns = Mat.rows(rows, grp * kg, s.colRows());
              gemmParallel(width, kg, fg, grads, weights, columns, false);
            }
            int first = n0;
            eachImage(
                batch,
                (long) s.colRows() * pixels,
                b -> rowsToImage(s, rows, b * pixels, out.a, out.off + (first + b) * s.image()));
            n0 += batch;
          }
        });
  }

  /**
   * {@link #conv2d_backward_data} of a pointwise convolution for images n0 .. n0 + batch - 1: their
   * gradient planes side by side, [C, batch * OH*OW], are W_g^T g_g, with g's planes read in place
   * ({@link Planes}) and one image's product written straight to its planes.
   */
  static void pointwiseData(
      ConvShape s, Buf out, Buf g, Buf w, int n0, int batch, Scratch scratch) {
    int pixels = s.pixels();
    int width = batch * pixels;
    int fg = s.groupFilters();
    int kg = s.groupRows();
    float[] prod = out.a;
    int prodOff = out.off + n0 * s.image();
    if (batch > 1) {
      scratch.products = atLeast(scratch.products, s.c * width);
      prod = scratch.products;
      prodOff = 0;
    }
    for (int grp = 0; grp < s.groups; grp++) { // dx_g = W_g^T g_g
      Mat weights = Mat.rows(w.a, w.off + grp * fg * kg, kg).t();
      Planes grads = Planes.of(g.a, g.off + (n0 * s.f + grp * fg) * pixels, pixels, s.f * pixels);
      Mat planes = Mat.rows(prod, prodOff + grp * kg * width, width);
      gemmParallel(kg, width, fg, weights, grads, planes, false);
    }
    if (batch > 1) {
      scatterPlanes(s.c, pixels, batch, prod, out.a, out.off + n0 * s.image());
    }
  }

  /**
   * {@link #conv2d_backward_data} on a native SGEMM, for images n0 .. n0 + batch - 1: the im2col
   * columns of their gradient, [C*kh*kw, batch * OH*OW] = W_g^T g_g (g's planes read in place),
   * added back onto the images by {@link #columnsToImage}. The product's long side is then C*kh*kw
   * rather than the few output pixels of the last stages (ResNet-50's 3x3 convolutions of stage 4
   * at batch 8, 64x64: 32 pixels), where OpenBLAS runs the pixel-row form at a third of its speed.
   */
  static void columnData(ConvShape s, Buf out, Buf g, Buf w, int n0, int batch, Scratch scratch) {
    int pixels = s.pixels();
    int width = batch * pixels;
    int fg = s.groupFilters();
    int kg = s.groupRows();
    scratch.cols = atLeast(scratch.cols, s.colRows() * width);
    float[] cols = scratch.cols;
    for (int grp = 0; grp < s.groups; grp++) { // cols_g = W_g^T g_g
      Mat weights = Mat.rows(w.a, w.off + grp * fg * kg, kg).t();
      Planes grads = Planes.of(g.a, g.off + (n0 * s.f + grp * fg) * pixels, pixels, s.f * pixels);
      gemmParallel(kg, width, fg, weights, grads, Mat.rows(cols, grp * kg * width, width), false);
    }
    columnsToImages(s, cols, width, batch, out.a, out.off + n0 * s.image());
  }

  /**
   * The adjoint of {@link #im2col} for the {@code batch} images at {@code dx[dxOff]}: dx[b, ch, iy,
   * ix] = the sum of the elements of the columns (rows of {@code width} in {@code cols}) that read
   * x[b, ch, iy, ix]. The channels run on the threads, each channel's planes written by one.
   */
  static void columnsToImages(
      ConvShape s, float[] cols, int width, int batch, float[] dx, int dxOff) {
    int window = s.kh * s.kw;
    int planeSize = s.h * s.w;
    parallel(
        s.c,
        workers(s.c, (long) window * batch * s.pixels()),
        1,
        (piece, lo, hi) -> {
          for (int ch = lo; ch < hi; ch++) {
            for (int b = 0; b < batch; b++) {
              int plane = dxOff + b * s.image() + ch * planeSize;
              Arrays.fill(dx, plane, plane + planeSize, 0f);
            }
            for (int row = ch * window; row < (ch + 1) * window; row++) {
              columnToImages(s, cols, row * width, batch, row, dx, dxOff + ch * planeSize);
            }
          }
        });
  }

  /**
   * Row {@code row} = (ch * kh + i) * kw + j of the columns (from {@code cols[from]}) added onto
   * the planes of channel ch of the images ({@code dx[planes]}, images apart).
   */
  static void columnToImages(
      ConvShape s, float[] cols, int from, int batch, int row, float[] dx, int planes) {
    int i = row / s.kw % s.kh;
    int j = row % s.kw;
    int oxLo = Math.min(s.ow, firstInside(s.colShift(j), s.sw));
    int oxHi = Math.max(oxLo, Math.min(s.ow, lastInside(s.colShift(j), s.sw, s.w) + 1));
    int oyLo = Math.min(s.oh, firstInside(s.rowShift(i), s.sh));
    int oyHi = Math.max(oyLo, Math.min(s.oh, lastInside(s.rowShift(i), s.sh, s.h) + 1));
    for (int b = 0; b < batch; b++, from += s.pixels()) {
      int plane = planes + b * s.image();
      for (int oy = oyLo; oy < oyHi; oy++) {
        int to = plane + (oy * s.sh + s.rowShift(i)) * s.w + s.colShift(j);
        int src = from + oy * s.ow;
        if (s.sw == 1) {
          for (int ox = oxLo; ox < oxHi; ox++) {
            dx[to + ox] += cols[src + ox];
          }
        } else {
          for (int ox = oxLo; ox < oxHi; ox++) {
            dx[to + ox * s.sw] += cols[src + ox];
          }
        }
      }
    }
  }

  /**
   * out[F, C/groups, kh, kw] (w_shape) = d conv2d / d w given x[N, C, H, W] and g = d out [N, F,
   * OH, OW]: the sum over images of g_g times the im2col columns of x, a few images per product as
   * in {@link #conv2d}. The columns are built transposed (one row per output pixel, see {@link
   * #im2colRows}), so that the product's long dimension is C*kh*kw and B is read row by row. When
   * images run in parallel, piece p of the batch sums its images into partial gradient p (piece 0's
   * is {@code out}) and the partials are added to {@code out} in piece order. A piece's first
   * product sets its partial rather than adding to zeros: at this network size the gradient of a
   * stage-4 1x1 filter (4 MB) outweighs the product's other operands, and OpenBLAS would copy it in
   * and out.
   */
  public static void conv2d_backward_filter(
      Buf out, Buf x, Buf g, int groups, int[] pad, int[] stride, int[] dilation, int[] wShape) {
    ConvShape s = new ConvShape(x.shape, wShape, stride, pad, dilation, groups);
    int pixels = s.pixels();
    int fg = s.groupFilters();
    int kg = s.groupRows();
    int size = s.f * kg;
    int workers = s.imageWorkers();
    int pieces = pieces(s.n, workers, PIECES_PER_WORKER);
    Scratch caller = SCRATCH.get();
    caller.partials = atLeast(caller.partials, (pieces - 1) * size);
    float[] partials = caller.partials;
    // no zeroing: every piece holds an image, and its first product sets its partial (the others add)
    parallel(
        s.n,
        workers,
        PIECES_PER_WORKER,
        (piece, lo, hi) -> {
          float[] dw = piece == 0 ? out.a : partials;
          int dwOff = piece == 0 ? out.off : (piece - 1) * size;
          Scratch scratch = SCRATCH.get();
          for (int n0 = lo; n0 < hi; ) {
            int batch = s.batch(hi - n0);
            int width = batch * pixels;
            // on OpenBLAS the forward im2col columns, which it reads transposed: cheaper to build
            boolean columnForm = !s.pointwise() && Blas.gemm() != null;
            FloatBuffer direct = columnForm ? nativeColumns(s.colRows() * width) : null;
            int height = columnForm ? s.colRows() : width;
            float[][] rows =
                s.pointwise() || direct != null
                    ? null
                    : rows(scratch, height, columnForm ? width : s.colRows());
            int first = n0;
            if (direct != null) {
              im2col(s, x.a, x.off + n0 * s.image(), batch, direct);
            } else if (columnForm) {
              im2col(s, x.a, x.off + n0 * s.image(), batch, rows);
            } else if (!s.pointwise()) {
              eachImage(
                  batch,
                  (long) s.colRows() * pixels,
                  b -> im2colRows(s, x.a, x.off + (first + b) * s.image(), rows, b * pixels));
            }
            float[] grad = g.a;
            int gradOff = g.off + n0 * s.f * pixels;
            if (batch > 1) {
              scratch.products = atLeast(scratch.products, s.f * width);
              grad = scratch.products;
              gradOff = 0;
              gatherPlanes(s, g.a, g.off, n0, batch, grad);
            }
            for (int grp = 0; grp < groups; grp++) { // dw_g += g_g rows_g
              Mat grads = Mat.rows(grad, gradOff + grp * fg * width, width);
              int planes = x.off + n0 * s.image() + grp * kg * pixels;
              Right columns =
                  s.pointwise()
                      ? Planes.of(x.a, planes, pixels, s.image()).t()
                      : direct != null
                          ? new Direct(direct, width, grp * kg, 0, true)
                          : columnForm
                              ? new Columns(rows, grp * kg, 0)
                              : new Rows(rows, 0, grp * kg);
              Mat filters = Mat.rows(dw, dwOff + grp * fg * kg, kg);
              gemmParallel(fg, kg, width, grads, columns, filters, n0 > lo);
            }
            n0 += batch;
          }
        });
    for (int p = 1; p < pieces; p++) {
      int from = (p - 1) * size;
      for (int i = 0; i < size; i++) {
        out.a[out.off + i] += partials[from + i];
      }
    }
  }

  /**
   * The output-gradient planes of images n0 .. n0 + batch - 1 side by side: grad[f, b * OH*OW +
   * pixel] = g[n0 + b, f, pixel], the channels on the threads.
   */
  static void gatherPlanes(
      ConvShape s, float[] g, int gOff, int n0, int batch, float[] grad) {
    int pixels = s.pixels();
    int width = batch * pixels;
    int first = gOff + n0 * s.f * pixels;
    parallel(
        s.f,
        workers(s.f, (long) width),
        1,
        (piece, lo, hi) -> {
          for (int f = lo; f < hi; f++) {
            for (int b = 0; b < batch; b++) {
              System.arraycopy(
                  g, first + (b * s.f + f) * pixels, grad, f * width + b * pixels, pixels);
            }
          }
        });
  }

  /**
   * The inverse of {@link #gatherPlanes}: the {@code channels} planes of {@code batch} images from
   * {@code to[first]} = the product's rows, prod[ch, b * pixels + p] (the images side by side), the
   * channels on the threads (one thread copying a convolution's whole output left the other idle).
   */
  static void scatterPlanes(
      int channels, int pixels, int batch, float[] prod, float[] to, int first) {
    int width = batch * pixels;
    parallel(
        channels,
        workers(channels, (long) width),
        1,
        (piece, lo, hi) -> {
          for (int ch = lo; ch < hi; ch++) {
            for (int b = 0; b < batch; b++) {
              System.arraycopy(
                  prod, ch * width + b * pixels, to, first + (b * channels + ch) * pixels, pixels);
            }
          }
        });
  }
}
