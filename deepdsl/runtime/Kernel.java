package deepdsl.runtime;

import java.util.Arrays;

/**
 * A generated kernel as a value: its name (the {@code extern "C"} kernel of {@code NAME.cu} the
 * CUDA device launches), its Java body (what the CPU device runs) and its launch shape. The
 * generated class holds one constant per kernel and its steps run them with {@code dev.run(K,
 * out, in...)}, so both devices execute the same list of calls.
 *
 * <p>The Java body computes a range {@code [lo, hi)} of its output: elements of an element-wise
 * kernel, indices of one axis of the others (the first; the second for a kernel made by {@link
 * #shapedOn}, whose first axis has size 1 where it is generated). {@link #run} splits the output
 * over the threads of {@link Parallel} by the kernel's work (the output's elements times the
 * kernel's cost per element) and runs the body once a piece; the loops over the elements are the
 * body's own. The pieces of a sum down columns ({@link #columns}) are at least {@link
 * #COLUMN_GRAIN} columns wide: each piece reads its run of every row, and narrower runs cost more
 * in memory traffic than a second thread saves.
 */
public final class Kernel {
  /** The CPU device's code of a kernel over {@code [lo, hi)} of its output, from its inputs. */
  @FunctionalInterface
  public interface Body {
    void run(Buf out, Buf[] in, int lo, int hi);
  }

  /** The CPU device's code of a kernel of several outputs (a group), over their elements. */
  @FunctionalInterface
  public interface GroupBody {
    void run(Buf[] out, Buf[] in, int lo, int hi);
  }

  /** The operations per output element of a kernel that reduces, from its inputs' dims. */
  @FunctionalInterface
  public interface Cost {
    long of(Buf[] in);
  }

  /** The kernel's name in {@code NAME.cu}. */
  public final String name;

  /** How the CUDA device sizes a launch: the kernel's arguments after its tensors, its grid. */
  public enum Launch {
    /** One thread an element of the first output; the element count is the last argument. */
    ELEMENTS,
    /** One thread an element of the output; every dim of the output, then of each input, follow. */
    SHAPED,
    /** One block an element of the output, its threads sharing a reduction; the dims follow. */
    ROWS
  }

  /** How the kernel is launched. */
  public final Launch launch;

  /**
   * Whether the CUDA kernel (an element-wise one) has a float4 loop beside its scalar one: it takes
   * it where the element count is a multiple of 4 and the tensors it reads or writes four at a time
   * are 16-byte aligned (it tests both itself), and the CUDA device sizes the grid for it then.
   */
  public final boolean float4;

  /** Threads per block. */
  public final int block;

  /** The fewest columns a piece of a sum down columns covers: a 256-byte run of each row. */
  public static final int COLUMN_GRAIN = 64;

  private final int outputs;
  private final Cost cost;
  private final GroupBody body;
  private final int axis; // the output axis a shaped or rows kernel's pieces cover
  private final int grain; // the fewest indices of that axis a piece covers

  private Kernel(
      String name,
      Launch launch,
      int block,
      int outputs,
      Cost cost,
      GroupBody body,
      int axis,
      int grain,
      boolean float4) {
    this.name = name;
    this.launch = launch;
    this.float4 = float4;
    this.block = block;
    this.outputs = outputs;
    this.cost = cost;
    this.body = body;
    this.axis = axis;
    this.grain = grain;
  }

  private Kernel(
      String name, Launch launch, int block, int outputs, Cost cost, GroupBody body, int axis, int grain) {
    this(name, launch, block, outputs, cost, body, axis, grain, false);
  }

  private Kernel(String name, Launch launch, int block, int outputs, Cost cost, GroupBody body) {
    this(name, launch, block, outputs, cost, body, 0, 1);
  }

  private static GroupBody one(Body body) {
    return (out, in, lo, hi) -> body.run(out[0], in, lo, hi);
  }

  /** An element-wise kernel of {@code cost} operations an element: it serves every shape. */
  public static Kernel elementwise(String name, long cost, Body body) {
    return new Kernel(name, Launch.ELEMENTS, 256, 1, in -> cost, one(body));
  }

  /**
   * An element-wise kernel whose CUDA kernel also has a float4 loop, four elements a thread each
   * step, which it takes where the size and the alignment allow ({@link #float4}).
   */
  public static Kernel vectorised(String name, long cost, Body body) {
    return new Kernel(name, Launch.ELEMENTS, 256, 1, in -> cost, one(body), 0, 1, true);
  }

  /**
   * This kernel (its Java body, its launch) under another kernel of {@code NAME.cu}: the same loop
   * with other pointers {@code __restrict__}, for the statements whose output is (or is not) the
   * memory of an input.
   */
  public Kernel variant(String cudaName) {
    return new Kernel(cudaName, launch, block, outputs, cost, body, axis, grain, float4);
  }

  /** The element-wise statements of a group in one loop: {@code outputs} outputs, then the inputs. */
  public static Kernel group(String name, int outputs, long cost, GroupBody body) {
    return new Kernel(name, Launch.ELEMENTS, 256, outputs, in -> cost, body);
  }

  /** A kernel over its output's elements that takes its tensors' dims as arguments. */
  public static Kernel shaped(String name, Body body) {
    return new Kernel(name, Launch.SHAPED, 256, 1, in -> 1, one(body));
  }

  /** A shaped kernel whose elements each take {@code cost} operations (a reduction). */
  public static Kernel shaped(String name, Cost cost, Body body) {
    return new Kernel(name, Launch.SHAPED, 256, 1, cost, one(body));
  }

  /**
   * A shaped kernel whose body covers indices {@code [lo, hi)} of its output's axis {@code axis} (1:
   * the first axis has size 1, so that a split by it would leave the kernel on one thread).
   */
  public static Kernel shapedOn(String name, int axis, Body body) {
    return new Kernel(name, Launch.SHAPED, 256, 1, in -> 1, one(body), axis, 1);
  }

  /** A {@link #shapedOn} kernel whose elements each take {@code cost} operations. */
  public static Kernel shapedOn(String name, int axis, Cost cost, Body body) {
    return new Kernel(name, Launch.SHAPED, 256, 1, cost, one(body), axis, 1);
  }

  /**
   * A rows kernel that sums down the columns of its output's one axis: its pieces are runs of at
   * least {@link #COLUMN_GRAIN} columns.
   */
  public static Kernel columns(String name, int block, Body body) {
    return new Kernel(name, Launch.ROWS, block, 1, in -> 1, one(body), 0, COLUMN_GRAIN);
  }

  /** A {@link #columns} kernel whose elements each take {@code cost} operations (its sum). */
  public static Kernel columns(String name, int block, Cost cost, Body body) {
    return new Kernel(name, Launch.ROWS, block, 1, cost, one(body), 0, COLUMN_GRAIN);
  }

  /** A kernel of one block of {@code block} threads per output element, its dims as arguments. */
  public static Kernel rows(String name, int block, Body body) {
    return new Kernel(name, Launch.ROWS, block, 1, in -> 1, one(body));
  }

  /** A rows kernel whose elements each take {@code cost} operations (its reduction). */
  public static Kernel rows(String name, int block, Cost cost, Body body) {
    return new Kernel(name, Launch.ROWS, block, 1, cost, one(body));
  }

  // ---- GELU ----
  //
  // GELU and its gradient on the CPU, over a range of flat arrays: what the generated element-wise
  // kernels of gelu and g * gelu' compute (their index form, deepdsl/ops/elementwise.py:
  // Phi by Abramowitz and Stegun 7.1.26), written so that HotSpot's C2 vectorises it.
  //
  // The kernel as one loop runs at 11 to 12 ns an element on JDK 17: C2 vectorises only loop
  // bodies it unrolls, those under LoopUnrollLimit (60 nodes), and Math.exp and the
  // sign's select each keep it scalar. Here each block of GELU_BLOCK elements goes through small
  // loops over local arrays (which C2 can tell apart, where the kernel's buffers may alias): |x| /
  // sqrt 2; exp(-u^2) by a rational function of u^2 (degree 8 over 9, fitted to e^-y on [0, 88] by
  // least squares, within 1e-7 absolute; e^-88 is below float's normal range); the polynomial and the
  // result. About 4 ns an element in the same test, and within 5e-7 of the one-loop kernel.

  private static final int GELU_BLOCK = 256;

  private static final ThreadLocal<float[][]> GELU_SCRATCH =
      ThreadLocal.withInitial(() -> new float[4][GELU_BLOCK]);

  /**
   * The body of an element-wise GELU kernel: o[po + e] = gelu(x[px + e]) for e in [lo, hi), in
   * loops the JIT vectorises.
   */
  public static void gelu(float[] o, int po, float[] x, int px, int lo, int hi) {
    float[][] s = GELU_SCRATCH.get();
    float[] v = s[0];
    float[] u = s[1];
    float[] ex = s[2];
    for (int b = lo; b < hi; b += GELU_BLOCK) {
      int m = Math.min(GELU_BLOCK, hi - b);
      System.arraycopy(x, px + b, v, 0, m);
      erfParts(v, u, ex, s[3], m);
      for (int j = 0; j < m; j++) { // x Phi(x) = x/2 + |x|/2 erf(|x| / sqrt 2)
        u[j] = 0.5f * v[j] + 0.5f * Math.abs(v[j]) * u[j];
      }
      System.arraycopy(u, 0, o, po + b, m);
    }
  }

  /**
   * The body of a kernel over rows [R, C] that is gelu(x + bias) (a linear layer's epilogue):
   * o[po + r*cols + j] = gelu(x[px + r*cols + j] + bias[pb + j]) for the rows r in [lo, hi): each
   * row's sums into a local array, then {@link #gelu} over it.
   */
  public static void geluBias(
      float[] o, int po, float[] x, int px, float[] bias, int pb, int cols, int lo, int hi) {
    float[] row = GELU_ROW.get();
    if (row.length < cols) {
      row = new float[cols];
      GELU_ROW.set(row);
    }
    for (int r = lo; r < hi; r++) {
      int at = px + r * cols;
      for (int j = 0; j < cols; j++) {
        row[j] = x[at + j] + bias[pb + j];
      }
      gelu(o, po + r * cols, row, 0, 0, cols);
    }
  }

  private static final ThreadLocal<float[]> GELU_ROW = ThreadLocal.withInitial(() -> new float[GELU_BLOCK]);

  /**
   * The body of an element-wise {@code g * gelu'(x)} kernel (GELU's gradient), as {@link #gelu}:
   * o[po + e] = g[pg + e] * gelu'(x[px + e]) for e in [lo, hi): Phi(x) + x phi(x).
   */
  public static void geluGrad(float[] o, int po, float[] g, int pg, float[] x, int px, int lo, int hi) {
    float[][] s = GELU_SCRATCH.get();
    float[] v = s[0];
    float[] u = s[1];
    float[] ex = s[2];
    float[] gs = s[3];
    for (int b = lo; b < hi; b += GELU_BLOCK) {
      int m = Math.min(GELU_BLOCK, hi - b);
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

  /**
   * o[po + j] = the sum over r of a[pa + r * cols + j], for the columns j in [lo, hi) of a
   * rows x cols matrix: the body of a generated sum down columns (a bias's gradient), four rows at a
   * time into a local array of columns, so that each pass is a loop the JIT vectorises and reads
   * four rows where one row at a time added into the output read and wrote it once a row.
   */
  public static void columnSums(float[] o, int po, float[] a, int pa, int rows, int cols, int lo, int hi) {
    float[] acc = COLUMNS.get();
    for (int c = lo; c < hi; c += COLUMN_BLOCK) {
      int w = Math.min(COLUMN_BLOCK, hi - c);
      for (int j = 0; j < w; j++) {
        acc[j] = 0f;
      }
      int r = 0;
      for (; r + 4 <= rows; r += 4) {
        int b0 = pa + r * cols + c;
        int b1 = b0 + cols;
        int b2 = b1 + cols;
        int b3 = b2 + cols;
        for (int j = 0; j < w; j++) {
          acc[j] += (a[b0 + j] + a[b1 + j]) + (a[b2 + j] + a[b3 + j]);
        }
      }
      for (; r < rows; r++) {
        int b = pa + r * cols + c;
        for (int j = 0; j < w; j++) {
          acc[j] += a[b + j];
        }
      }
      System.arraycopy(acc, 0, o, po + c, w);
    }
  }

  private static final int COLUMN_BLOCK = 256;

  private static final ThreadLocal<float[]> COLUMNS =
      ThreadLocal.withInitial(() -> new float[COLUMN_BLOCK]);

  /**
   * {@code y > 0 ? g : 0} without a branch, for a relu's gradient (y its output): y is positive for
   * about half the activations, in no order a branch predictor learns, and a float select is a
   * branch on x86 (ResNet-50 at batch 8 spent 28 ms a step in its relu gradients, some 5 ns an
   * element). The mask is all ones exactly where y's bits, as an int, lie in (0, +infinity], so
   * zeros, negatives and NaN give +0 as the comparison does, and g passes bit for bit.
   */
  public static float whenPositive(float y, float g) {
    int b = Float.floatToRawIntBits(y);
    return Float.intBitsToFloat(Float.floatToRawIntBits(g) & ((-b & (b - 0x7f800001)) >> 31));
  }

  /**
   * Runs the Java body over the whole output (the first of {@code args}, the outputs before the
   * inputs): its elements or rows split over the threads, a kernel of little work on the caller.
   */
  public void run(Buf... args) {
    Buf[] out = Arrays.copyOfRange(args, 0, outputs);
    Buf[] in = Arrays.copyOfRange(args, outputs, args.length);
    Buf first = out[0];
    int n =
        launch == Launch.ELEMENTS
            ? first.numel()
            : first.shape.length <= axis ? 1 : first.shape[axis];
    Parallel.range(n, cost.of(in) * first.numel(), grain, (lo, hi) -> body.run(out, in, lo, hi));
  }

  @Override
  public String toString() {
    return name;
  }
}
