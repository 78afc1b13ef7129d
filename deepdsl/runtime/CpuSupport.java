package deepdsl.runtime;

import static deepdsl.runtime.CpuGemm.*;
import static deepdsl.runtime.CpuConvolution.*;

import java.util.Arrays;

/** The CPU kernels' threads and scratch arrays (see {@link CpuDevice}). */
final class CpuSupport {
  private CpuSupport() {}

  // ---- threads ----

  static final int THREADS = Parallel.THREADS;

  /** Below this many element operations a kernel does not hand work to other threads. */
  static final long PARALLEL_WORK = 1 << 15;

  /**
   * Pieces per thread of a loop over images or planes, so that a thread slowed down elsewhere
   * delays little.
   */
  static final int PIECES_PER_WORKER = 4;

  /** How many threads to run {@code items} items costing {@code workPerItem} operations each on. */
  static int workers(int items, long workPerItem) {
    if (THREADS == 1 || Parallel.inLoop() || items < 2 || items * workPerItem < PARALLEL_WORK) {
      return 1;
    }
    return Math.min(THREADS, items);
  }

  /**
   * The number of pieces {@link #parallel} cuts {@code items} items into for {@code workers}
   * threads.
   */
  static int pieces(int items, int workers, int piecesPerWorker) {
    return workers <= 1 ? 1 : Math.min(items, workers * piecesPerWorker);
  }

  /**
   * Runs {@code body} over {@code [0, items)} on {@code workers} threads (see {@link
   * Parallel#run}), cut into {@link #pieces}{@code (items, workers, piecesPerWorker)} contiguous
   * pieces. The pieces depend on the sizes and the thread count only, not on which thread takes
   * which, so a kernel that keeps a partial result per piece and adds them in piece order gives the
   * same bits on every run.
   */
  static void parallel(int items, int workers, int piecesPerWorker, Parallel.Piece body) {
    Parallel.run(items, workers, pieces(items, workers, piecesPerWorker), body);
  }

  // ---- scratch ----

  /** One thread's reusable work arrays (see the class comment for their sizes). */
  static final class Scratch {
    final float[][] panel = new float[GEMM_KC][GEMM_NC];
    float[] cols = new float[0];
    float[][] rows = new float[0][0];
    float[] products = new float[0];
    float[] partials = new float[0];
    /** One im2col row on its way into a direct buffer ({@link CpuConvolution#im2col}). */
    float[] line = new float[0];
  }

  static final ThreadLocal<Scratch> SCRATCH = ThreadLocal.withInitial(Scratch::new);

  static float[] atLeast(float[] have, int size) {
    return have.length >= size ? have : new float[size];
  }

  /**
   * The thread's row arrays, grown to at least {@code count} rows of at least {@code length}. Each
   * row grows on its own, so that many short rows (a large image's pixels) and a few long ones (a
   * deep layer's windows) do not make a rectangle of the most rows by the longest.
   */
  static float[][] rows(Scratch scratch, int count, int length) {
    float[][] have = scratch.rows;
    if (have.length < count) {
      have = scratch.rows = Arrays.copyOf(have, count);
    }
    for (int i = 0; i < count; i++) {
      if (have[i] == null || have[i].length < length) {
        have[i] = new float[length];
      }
    }
    return have;
  }

}
