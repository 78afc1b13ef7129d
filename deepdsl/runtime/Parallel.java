package deepdsl.runtime;

import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.locks.LockSupport;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The runtime's threads: the calling thread and a team of {@code THREADS - 1} daemon workers that
 * run the pieces of one parallel loop at a time, for the kernels of {@link CpuDevice} and the
 * generated loops alike.
 *
 * <p>Between loops a worker spins for {@link #SPIN_NANOS} before it sleeps, as OpenMP runtimes do:
 * a training step is a few dozen parallel loops in a row, and a worker that is still awake takes
 * its first piece within a microsecond, where waking a sleeping thread costs tens of microseconds
 * and leaves the loop's last pieces unevenly shared.
 *
 * <p>The pieces of a loop are cut from its sizes alone and taken in order by whichever thread comes
 * free, so a kernel that keeps a partial result per piece and adds them in piece order gives the
 * same bits on every run. The generated kernels split only loops over output elements, each
 * element computed whole by one thread, so their results do not depend on the split at all. A loop
 * started while another thread's loop holds the team runs its pieces on its calling thread, in
 * order; a loop started inside a piece runs on that piece's thread alone.
 */
public final class Parallel {
  /** The system property that sets {@link #THREADS}; the program's {@code --threads N} sets it. */
  public static final String THREADS_PROPERTY = "deepdsl.threads";

  /** The most threads a team has (more cost seconds to start and gain nothing); --threads's bound. */
  public static final int MAX_THREADS = 1024;

  /**
   * Threads a loop may run on: the caller and the team. It is {@code deepdsl.threads} when that is
   * set (read once, when the runtime first runs a loop), else every core; within [1, MAX_THREADS]
   * either way (a -D property is not range-checked as the flag is, so it is bounded here).
   */
  public static final int THREADS =
      Math.min(
          MAX_THREADS,
          Math.max(
              1,
              Integer.getInteger(THREADS_PROPERTY, Runtime.getRuntime().availableProcessors())));

  /** Below this many inner operations a generated loop runs on the calling thread. */
  public static final long MIN_WORK = 1 << 15;

  /** How long a worker waits for the next loop, spinning, before it sleeps. */
  static final long SPIN_NANOS = 1_000_000;

  private Parallel() {}

  /** The body of a loop over {@code [lo, hi)}. */
  @FunctionalInterface
  public interface Range {
    void run(int lo, int hi);
  }

  /**
   * The body of a loop cut into pieces: items {@code lo} (inclusive) to {@code hi} (exclusive),
   * which make up piece number {@code piece}.
   */
  @FunctionalInterface
  interface Piece {
    void run(int piece, int lo, int hi);
  }

  /**
   * Runs {@code body} over {@code [0, n)}: in one piece when {@code work} (the loop's total inner
   * operations) is small or there is one thread, else in about four pieces per thread.
   */
  public static void range(int n, long work, Range body) {
    range(n, work, 1, body);
  }

  /** {@link #range(int, long, Range)} in pieces of at least {@code grain} items. */
  public static void range(int n, long work, int grain, Range body) {
    int most = n / Math.max(1, grain); // the most pieces of at least grain items
    if (most <= 1 || work < MIN_WORK || THREADS == 1 || inLoop()) {
      body.run(0, n);
      return;
    }
    int pieces = (int) Math.min(most, Math.min(4L * THREADS, work / (MIN_WORK / 4)));
    run(n, THREADS, pieces, (piece, lo, hi) -> body.run(lo, hi));
  }

  /** True on a thread that is running a piece of a loop: a loop it starts stays on it. */
  static boolean inLoop() {
    return IN_LOOP.get();
  }

  /**
   * Runs {@code body} over {@code [0, items)} cut into {@code pieces} contiguous pieces (piece p
   * covers {@code [items * p / pieces, items * (p + 1) / pieces)}), on the calling thread and up to
   * {@code threads - 1} workers, each taking the next untaken piece until none is left. Returns
   * when every piece has run; the first exception a piece throws is rethrown here.
   */
  static void run(int items, int threads, int pieces, Piece body) {
    int helpers = Math.min(threads, THREADS) - 1;
    if (pieces <= 1 || helpers <= 0 || inLoop() || !LOCK.tryLock()) {
      runAll(body, items, pieces);
      return;
    }
    Job job = new Job(body, items, pieces, Math.min(helpers, pieces - 1));
    try {
      current = job;
      int asleep = job.helpers;
      for (int i = 0; i < TEAM.length && asleep > 0; i++) {
        if (TEAM[i].sleeping) {
          LockSupport.unpark(TEAM[i]);
          asleep--;
        }
      }
      try {
        job.work();
      } finally {
        job.await();
      }
    } finally {
      current = null;
      LOCK.unlock();
    }
    job.rethrow();
  }

  /**
   * Every piece in order on the calling thread; a loop inside one of several pieces stays on it, as
   * it would in the team (a single piece is the caller's own code, free to use the team).
   */
  private static void runAll(Piece body, int items, int pieces) {
    if (pieces <= 1) {
      body.run(0, 0, items);
      return;
    }
    boolean outer = IN_LOOP.get();
    IN_LOOP.set(true);
    try {
      for (int p = 0; p < pieces; p++) {
        body.run(p, (int) ((long) items * p / pieces), (int) ((long) items * (p + 1) / pieces));
      }
    } finally {
      IN_LOOP.set(outer);
    }
  }

  private static final ThreadLocal<Boolean> IN_LOOP = ThreadLocal.withInitial(() -> false);

  /** Held by the thread whose loop the team is running. */
  private static final ReentrantLock LOCK = new ReentrantLock();

  /** The loop the team is running, or null. */
  private static volatile Job current;

  /** Numbers the loops, so that a worker remembers the last one it saw without holding on to it. */
  private static final AtomicLong LOOPS = new AtomicLong();

  private static final Worker[] TEAM = new Worker[THREADS - 1];

  static {
    for (int i = 0; i < TEAM.length; i++) {
      TEAM[i] = new Worker(i + 1);
      TEAM[i].start();
    }
  }

  /** One parallel loop: its pieces, the next untaken one, and the workers still inside it. */
  private static final class Job {
    final long number = LOOPS.incrementAndGet();
    final Piece body;
    final int items;
    final int pieces;
    final int helpers;
    final AtomicInteger next = new AtomicInteger();
    final AtomicInteger joined = new AtomicInteger();
    final AtomicInteger busy = new AtomicInteger();
    final AtomicReference<Throwable> failure = new AtomicReference<>();

    Job(Piece body, int items, int pieces, int helpers) {
      this.body = body;
      this.items = items;
      this.pieces = pieces;
      this.helpers = helpers;
    }

    /** A worker's part: pieces, when the loop still wants helpers. */
    void help() {
      busy.incrementAndGet(); // before any piece is taken, so that the caller waits for it
      try {
        if (joined.incrementAndGet() <= helpers) {
          work();
        }
      } finally {
        busy.decrementAndGet();
      }
    }

    /** The next untaken piece, until none is left; the first failure is kept for the caller. */
    void work() {
      try {
        IN_LOOP.set(true);
        for (int p = next.getAndIncrement(); p < pieces; p = next.getAndIncrement()) {
          body.run(p, (int) ((long) items * p / pieces), (int) ((long) items * (p + 1) / pieces));
        }
      } catch (Throwable e) {
        next.set(pieces); // the remaining pieces are not started
        if (!failure.compareAndSet(null, e)) {
          failure.get().addSuppressed(e);
        }
      } finally {
        IN_LOOP.set(false); // the caller and the workers enter here only from outside any loop
      }
    }

    /**
     * Returns once the workers that took pieces have finished them: spinning at first, then giving
     * the processor to others (a worker that was descheduled mid-piece needs it back).
     */
    void await() {
      for (int spins = 0; busy.get() > 0; spins++) {
        if (spins < 4096) {
          Thread.onSpinWait();
        } else {
          Thread.yield();
        }
      }
    }

    void rethrow() {
      Throwable e = failure.get();
      if (e instanceof RuntimeException r) {
        throw r;
      } else if (e instanceof Error err) {
        throw err;
      } else if (e != null) {
        throw new IllegalStateException(e);
      }
    }
  }

  /** A team thread: it helps with each new loop, spinning between loops, then sleeping. */
  private static final class Worker extends Thread {
    volatile boolean sleeping;

    Worker(int number) {
      super("deepdsl-cpu-" + number);
      setDaemon(true);
    }

    @Override
    public void run() {
      long seen = 0;
      for (; ; ) {
        Job job = next(seen);
        seen = job.number;
        job.help();
        // a piece's interrupt must neither reach later pieces nor keep park from sleeping
        Thread.interrupted();
      }
    }

    /** The first loop after number {@code seen}: spins for SPIN_NANOS, then sleeps until woken. */
    private Job next(long seen) {
      long until = System.nanoTime() + SPIN_NANOS;
      for (int spins = 1; ; spins++) {
        Job job = current;
        if (job != null && job.number != seen) {
          return job;
        }
        if ((spins & 255) != 0 || System.nanoTime() < until) {
          Thread.onSpinWait();
          continue;
        }
        sleeping = true;
        job = current; // a loop posted before `sleeping` was seen would not wake this thread
        if (job == null || job.number == seen) {
          Thread.interrupted();
          LockSupport.park(this);
        }
        sleeping = false;
        until = System.nanoTime() + SPIN_NANOS;
      }
    }
  }
}
