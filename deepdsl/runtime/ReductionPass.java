package deepdsl.runtime;

/**
 * A large reduction as a CUDA device runs it (deepdsl/ir/reductions.py): the statements of one pass (a batch
 * norm's channel mean and variance with its running statistics, dgamma with dbeta and the inverse deviation, a bias
 * gradient alone) computed by ONE launch of a generated kernel of {@code NAME.cu}. Split over a 2-D grid, each block
 * adds its piece of the range into a partial sum (in double) in the pass's scratch of the arena, then counts itself
 * done on the module's block counter (library.cu {@code dd_last_block}: a fence, then an atomicInc that the last
 * block wraps back to zero); the last block to finish adds each output's partial sums in slice order (the same bits
 * every run, whichever block is last) and writes the per-element results. Where one slice covers the range, each
 * block writes its outputs itself. The kernel and its launch shape are those of the PyCUDA runner
 * (deepdsl/backends/cuda/passes.py {@code pass_kernels}), so both CUDA devices launch what {@code deepdsl ir
 * --stats} counts: one launch a pass.
 *
 * <p>A call ({@link Device#pass}) passes its buffers in one order, the kernel's: the results (the sums', then the
 * per-element statements'), the partial sums (one scratch buffer a sum, split passes only), the inputs the sums read,
 * then the inputs of the per-element statements (the running statistics). A device without these kernels (the CPU)
 * runs the statements' own calls instead.
 */
public final class ReductionPass {
  /** The kernel of the pass. */
  public final String kernel;

  public final int[] grid;
  public final int[] block;

  /** How many buffers of each kind a call passes, in order. */
  public final int results;

  public final int partials;
  public final int inputs;
  public final int running;

  private ReductionPass(
      String kernel, int[] grid, int[] block, int results, int partials, int inputs, int running) {
    this.kernel = kernel;
    this.grid = grid;
    this.block = block;
    this.results = results;
    this.partials = partials;
    this.inputs = inputs;
    this.running = running;
  }

  /**
   * A pass split over {@code grid[1]} slices of its range: the partial sums, added up by the last block to finish,
   * in the same launch.
   */
  public static ReductionPass split(
      String kernel, int[] grid, int[] block, int results, int partials, int inputs, int running) {
    return new ReductionPass(kernel, grid, block, results, partials, inputs, running);
  }

  /** A pass one slice covers: each block writes its outputs. */
  public static ReductionPass direct(
      String kernel, int[] grid, int[] block, int results, int inputs, int running) {
    return new ReductionPass(kernel, grid, block, results, 0, inputs, running);
  }

  /** The buffers a call passes, as many as its kernel takes. */
  int buffers() {
    return results + partials + inputs + running;
  }

  @Override
  public String toString() {
    return kernel;
  }
}
