package deepdsl.runtime;

/**
 * A large reduction as a CUDA device runs it (deepdsl/ir/reductions.py): the statements of one pass (a batch
 * norm's channel mean and variance with its running statistics, dgamma with dbeta and the inverse deviation, a bias
 * gradient alone) computed by one generated kernel of {@code NAME.cu} on a 2-D grid, each block adding its piece of
 * the range into a partial sum (in double) in the pass's scratch of the arena, then a finishing kernel adding each
 * output's partial sums in slice order (the same bits every run) and writing the per-element results; or, where one
 * slice covers the range, the first kernel alone, writing the results itself. The kernels and their launch shapes
 * are those of the PyCUDA runner (deepdsl/backends/cuda/kernels.py {@code pass_kernels}), so both CUDA devices
 * launch what {@code deepdsl ir --stats} counts.
 *
 * <p>A call ({@link Device#pass}) passes its buffers in one order: the results (the sums', then the per-element
 * statements'), the partial sums (one scratch buffer a sum, split passes only), the inputs the sums read, then the
 * inputs of the per-element statements (the running statistics). A device without these kernels (the CPU) runs
 * the statements' own calls instead.
 */
public final class ReductionPass {
  /** The kernel adding the pieces (or, without a finishing kernel, computing the results). */
  public final String kernel;

  public final int[] grid;
  public final int[] block;

  /** The finishing kernel, or null where one slice covers the range. */
  public final String finish;

  public final int[] finishGrid;
  public final int[] finishBlock;

  /** How many buffers of each kind a call passes, in order. */
  public final int results;

  public final int partials;
  public final int inputs;
  public final int running;

  private ReductionPass(
      String kernel,
      int[] grid,
      int[] block,
      String finish,
      int[] finishGrid,
      int[] finishBlock,
      int results,
      int partials,
      int inputs,
      int running) {
    this.kernel = kernel;
    this.grid = grid;
    this.block = block;
    this.finish = finish;
    this.finishGrid = finishGrid;
    this.finishBlock = finishBlock;
    this.results = results;
    this.partials = partials;
    this.inputs = inputs;
    this.running = running;
  }

  /** A pass split over {@code grid[1]} slices of its range: the partial sums, then the finishing launch. */
  public static ReductionPass split(
      String kernel,
      int[] grid,
      int[] block,
      String finish,
      int[] finishGrid,
      int[] finishBlock,
      int results,
      int partials,
      int inputs,
      int running) {
    return new ReductionPass(
        kernel, grid, block, finish, finishGrid, finishBlock, results, partials, inputs, running);
  }

  /** A pass one slice covers: one launch that writes every result. */
  public static ReductionPass direct(
      String kernel, int[] grid, int[] block, int results, int inputs, int running) {
    return new ReductionPass(kernel, grid, block, null, null, null, results, 0, inputs, running);
  }

  /** The buffers {@code from} of a call's {@code args}, {@code count} of them. */
  static Buf[] part(Buf[] args, int from, int count) {
    Buf[] out = new Buf[count];
    System.arraycopy(args, from, out, 0, count);
    return out;
  }

  /** Buffers one after another. */
  static Buf[] join(Buf[]... lists) {
    int n = 0;
    for (Buf[] l : lists) {
      n += l.length;
    }
    Buf[] out = new Buf[n];
    int at = 0;
    for (Buf[] l : lists) {
      System.arraycopy(l, 0, out, at, l.length);
      at += l.length;
    }
    return out;
  }

  @Override
  public String toString() {
    return finish == null ? kernel : kernel + " + " + finish;
  }
}
