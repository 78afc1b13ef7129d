package deepdsl.runtime;

import java.util.concurrent.RecursiveAction;

/**
 * Splits a loop's outermost range over the common fork-join pool when it has enough work; the
 * calling thread takes a share too.
 *
 * <p>The generated kernels split only loops over output elements, each element computed whole by
 * one thread (a reduction runs inside it), so their results do not depend on where the range is
 * split or which thread runs which part.
 */
public final class Parallel {
  /** Below this many inner operations a loop runs on the calling thread. */
  public static final long MIN_WORK = 1 << 15;

  private Parallel() {}

  /** The body of a loop over {@code [lo, hi)}. */
  @FunctionalInterface
  public interface Range {
    void run(int lo, int hi);
  }

  /**
   * Runs {@code body} over {@code [0, n)}: in one piece when {@code work} (the loop's total inner
   * operations) is small or there is one thread, else in about four pieces per thread.
   */
  public static void range(int n, long work, Range body) {
    int threads = Runtime.getRuntime().availableProcessors();
    if (n <= 1 || work < MIN_WORK || threads <= 1) {
      body.run(0, n);
      return;
    }
    int pieces = (int) Math.min(n, Math.min(4L * threads, work / (MIN_WORK / 4)));
    new Split(body, 0, n, Math.max(1, (n + pieces - 1) / pieces)).invoke();
  }

  private static final class Split extends RecursiveAction {
    private static final long serialVersionUID = 1L;

    private final Range body;
    private final int lo;
    private final int hi;
    private final int grain;

    Split(Range body, int lo, int hi, int grain) {
      this.body = body;
      this.lo = lo;
      this.hi = hi;
      this.grain = grain;
    }

    @Override
    protected void compute() {
      if (hi - lo <= grain) {
        body.run(lo, hi);
        return;
      }
      int mid = (lo + hi) >>> 1;
      invokeAll(new Split(body, lo, mid, grain), new Split(body, mid, hi, grain));
    }
  }
}
