package deepdsl.runtime;

/**
 * The workspace limit: DeepDSL's one switch between a fast and a lean program. A convolution runs
 * as im2col + GEMM ({@link CpuConvolution#conv2d}) when that method's scratch fits the limit, and as a
 * direct loop, which needs no scratch, when it does not.
 */
public final class Workspace {
  private Workspace() {}

  /**
   * An upper bound of the scratch bytes of {@link CpuConvolution#conv2d}: per thread, the im2col columns of
   * up to {@code ceil(512 / (OH*OW))} images taken together (none for a 1x1 kernel with stride 1
   * and no padding) and their products.
   */
  public static long conv2dScratch(
      int[] xShape, int[] wShape, int[] outShape, int[] pad, int[] stride) {
    boolean pointwise =
        wShape[2] == 1
            && wShape[3] == 1
            && stride[0] == 1
            && stride[1] == 1
            && pad[0] == 0
            && pad[1] == 0;
    int pixels = outShape[2] * outShape[3];
    int images = Math.max(1, Math.min((pixels + 511) / pixels, xShape[0]));
    long columns = pointwise ? 0 : (long) xShape[1] * wShape[2] * wShape[3] * images * pixels;
    long products = images > 1 ? (long) wShape[0] * images * pixels : 0;
    int threads = Math.max(1, Math.min(xShape[0], Runtime.getRuntime().availableProcessors()));
    return 4L * threads * (columns + products);
  }

  /** conv2d by im2col + GEMM when its scratch fits {@code limit} bytes, else by direct loops. */
  public static void conv2d(
      Buf out, Buf x, Buf w, int groups, int[] pad, int[] stride, int[] dilation, long limit) {
    if (conv2dScratch(x.shape, w.shape, out.shape, pad, stride) <= limit) {
      CpuConvolution.conv2d(out, x, w, groups, pad, stride, dilation);
    } else {
      direct(out, x, w, groups, pad, stride, dilation);
    }
  }

  /**
   * out[n, f, oh, ow] = the sum over the filter's (dilated) window of x times w, reading zero
   * outside x.
   */
  static void direct(Buf out, Buf x, Buf w, int groups, int[] pad, int[] stride, int[] dilation) {
    int n = x.shape[0];
    int c = x.shape[1];
    int h = x.shape[2];
    int wd = x.shape[3];
    int f = w.shape[0];
    int cg = w.shape[1];
    int kh = w.shape[2];
    int kw = w.shape[3];
    int oh = out.shape[2];
    int ow = out.shape[3];
    int fg = f / groups;
    long work = (long) n * f * oh * ow * cg * kh * kw;
    Parallel.range(
        n * f,
        work,
        (lo, hi) -> {
          for (int nf = lo; nf < hi; nf++) {
            int image = nf / f;
            int filter = nf % f;
            int c0 = filter / fg * cg;
            int o = out.off + nf * oh * ow;
            for (int y = 0; y < oh; y++) {
              for (int z = 0; z < ow; z++) {
                float s = 0f;
                for (int ci = 0; ci < cg; ci++) {
                  int xc = x.off + (image * c + c0 + ci) * h * wd;
                  int wc = w.off + (filter * cg + ci) * kh * kw;
                  for (int i = 0; i < kh; i++) {
                    int row = y * stride[0] - pad[0] + i * dilation[0];
                    if (row < 0 || row >= h) {
                      continue;
                    }
                    for (int j = 0; j < kw; j++) {
                      int col = z * stride[1] - pad[1] + j * dilation[1];
                      if (col >= 0 && col < wd) {
                        s += x.a[xc + row * wd + col] * w.a[wc + i * kw + j];
                      }
                    }
                  }
                }
                out.a[o + y * ow + z] = s;
              }
            }
          }
        });
  }
}
