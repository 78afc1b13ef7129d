package deepdsl.runtime;

import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicIntegerArray;

/**
 * Checks {@link Parallel}'s team (run by tests/backends/test_java_parallel.py, with more processors
 * than the machine may have): every piece runs once with the bounds its number gives, several
 * threads take part, a failing piece's exception (checked ones too) reaches the caller and leaves
 * the team usable, a piece's interrupt does not reach later pieces, a loop inside a loop stays on
 * its thread (also when the loop ran inline because another thread held the team), and two threads
 * running loops at once both get right answers. Prints "ok", or the first failure and exits 1.
 */
public final class ParallelCheck {
  private ParallelCheck() {}

  public static void main(String[] args) throws Exception {
    pieces();
    threads();
    failure();
    checkedFailure();
    threads();
    interrupts();
    nested();
    nestedInline();
    concurrent();
    System.out.println("ok");
  }

  private static void check(boolean ok, String what) {
    if (!ok) {
      System.err.println("FAILED: " + what);
      System.exit(1);
    }
  }

  /** Each piece once, covering [items * p / pieces, items * (p + 1) / pieces). */
  private static void pieces() {
    for (int items : new int[] {0, 1, 7, 100, 1000}) {
      for (int pieces : new int[] {1, 2, 3, 8, 16}) {
        for (int threads : new int[] {1, 2, 4}) {
          AtomicIntegerArray runs = new AtomicIntegerArray(Math.max(1, pieces));
          AtomicIntegerArray covered = new AtomicIntegerArray(items);
          Parallel.run(
              items,
              threads,
              pieces,
              (p, lo, hi) -> {
                runs.incrementAndGet(p);
                int count = Math.max(1, pieces);
                check(
                    pieces <= 1
                        ? lo == 0 && hi == items
                        : lo == (int) ((long) items * p / count)
                            && hi == (int) ((long) items * (p + 1) / count),
                    "bounds of piece " + p + " of " + pieces + " over " + items);
                for (int i = lo; i < hi; i++) {
                  covered.incrementAndGet(i);
                }
              });
          for (int p = 0; p < runs.length(); p++) {
            check(runs.get(p) == 1, "piece " + p + " of " + pieces + " ran " + runs.get(p) + "x");
          }
          for (int i = 0; i < items; i++) {
            check(covered.get(i) == 1, "item " + i + " covered " + covered.get(i) + " times");
          }
        }
      }
    }
    AtomicIntegerArray covered = new AtomicIntegerArray(5000);
    Parallel.range(
        5000,
        1L << 24,
        (lo, hi) -> {
          for (int i = lo; i < hi; i++) {
            covered.incrementAndGet(i);
          }
        });
    for (int i = 0; i < 5000; i++) {
      check(covered.get(i) == 1, "range item " + i + " covered " + covered.get(i) + " times");
    }
  }

  /** A loop of slow pieces is shared: more than one thread runs its pieces. */
  private static void threads() throws InterruptedException {
    Thread.sleep(20); // the workers have gone to sleep: the loop must wake them
    Set<String> names =
        threadsRunning(
            () -> {
              try {
                Thread.sleep(1);
              } catch (InterruptedException e) {
                throw new IllegalStateException(e);
              }
            });
    check(Parallel.THREADS >= 2, "the check runs with at least two processors");
    check(names.size() >= 2, "pieces ran on " + names);
  }

  /** The names of the threads that ran a loop of 64 pieces, each of which runs {@code piece}. */
  private static Set<String> threadsRunning(Runnable piece) {
    Set<String> names = ConcurrentHashMap.newKeySet();
    Parallel.run(
        64,
        Parallel.THREADS,
        64,
        (p, lo, hi) -> {
          piece.run();
          names.add(Thread.currentThread().getName());
        });
    return names;
  }

  /** A piece's exception reaches the caller; the next loop runs in full. */
  private static void failure() {
    for (int round = 0; round < 20; round++) {
      int bad = round % 8;
      try {
        Parallel.run(
            32,
            Parallel.THREADS,
            8,
            (p, lo, hi) -> {
              if (p == bad) {
                throw new IllegalStateException("piece " + p);
              }
            });
        check(false, "a failing piece did not fail the loop");
      } catch (IllegalStateException e) {
        check(e.getMessage().equals("piece " + bad), "the loop threw " + e);
      }
      AtomicIntegerArray runs = new AtomicIntegerArray(8);
      Parallel.run(32, Parallel.THREADS, 8, (p, lo, hi) -> runs.incrementAndGet(p));
      for (int p = 0; p < 8; p++) {
        check(runs.get(p) == 1, "after a failure, piece " + p + " ran " + runs.get(p) + " times");
      }
    }
  }

  /** A checked exception thrown undeclared by a piece reaches the caller, wrapped. */
  private static void checkedFailure() {
    for (int round = 0; round < 20; round++) {
      try {
        Parallel.run(
            32,
            Parallel.THREADS,
            8,
            (p, lo, hi) -> {
              if (p == 3) {
                ParallelCheck.<RuntimeException>sneaky(new java.io.IOException("piece 3"));
              }
            });
        check(false, "a piece's checked exception did not fail the loop");
      } catch (IllegalStateException e) {
        check(e.getCause() instanceof java.io.IOException, "the loop threw " + e);
      }
    }
  }

  @SuppressWarnings("unchecked")
  private static <T extends Throwable> void sneaky(Throwable e) throws T {
    throw (T) e;
  }

  /** A piece that interrupts its thread does not make a later piece's sleep fail. */
  private static void interrupts() {
    Set<String> names =
        threadsRunning(
            () -> {
              long until = System.nanoTime() + 1_000_000; // slow enough that the workers take some
              while (System.nanoTime() < until) {
                Thread.onSpinWait();
              }
              Thread.currentThread().interrupt();
            });
    check(names.size() >= 2, "interrupting pieces ran on " + names);
    Thread.interrupted(); // the caller's own pieces interrupted the caller
    AtomicBoolean interrupted = new AtomicBoolean();
    Parallel.run(
        64,
        Parallel.THREADS,
        64,
        (p, lo, hi) -> {
          try {
            Thread.sleep(1);
          } catch (InterruptedException e) {
            interrupted.set(true);
          }
        });
    check(!interrupted.get(), "an earlier piece's interrupt reached a later piece");
  }

  /** A loop started inside a piece runs all its pieces on that piece's thread. */
  private static void nested() {
    AtomicIntegerArray wrong = new AtomicIntegerArray(1);
    AtomicIntegerArray inner = new AtomicIntegerArray(16 * 4);
    Parallel.run(
        16,
        Parallel.THREADS,
        16,
        (p, lo, hi) -> {
          Thread outer = Thread.currentThread();
          check(Parallel.inLoop(), "a piece runs inside a loop");
          Parallel.run(
              4,
              Parallel.THREADS,
              4,
              (q, a, b) -> {
                if (Thread.currentThread() != outer) {
                  wrong.incrementAndGet(0);
                }
                inner.incrementAndGet(p * 4 + q);
              });
        });
    check(wrong.get(0) == 0, "nested pieces ran on another thread");
    for (int i = 0; i < inner.length(); i++) {
      check(inner.get(i) == 1, "nested piece " + i + " ran " + inner.get(i) + " times");
    }
    check(!Parallel.inLoop(), "the caller is outside any loop afterwards");
  }

  /**
   * While another thread's loop holds the team, a loop runs inline, and a loop inside one of its
   * pieces stays on the caller too.
   */
  private static void nestedInline() throws InterruptedException {
    CountDownLatch holding = new CountDownLatch(1);
    CountDownLatch done = new CountDownLatch(1);
    Thread other =
        new Thread(
            () ->
                Parallel.run(
                    2,
                    2,
                    2,
                    (p, lo, hi) -> {
                      holding.countDown();
                      try {
                        done.await();
                      } catch (InterruptedException e) {
                        throw new IllegalStateException(e);
                      }
                    }));
    other.start();
    holding.await();
    Thread me = Thread.currentThread();
    AtomicBoolean away = new AtomicBoolean();
    Parallel.run(
        8,
        Parallel.THREADS,
        8,
        (p, lo, hi) -> {
          check(Parallel.inLoop(), "a piece of an inline loop runs inside a loop");
          Parallel.run(
              4,
              Parallel.THREADS,
              4,
              (q, a, b) -> {
                if (Thread.currentThread() != me) {
                  away.set(true);
                }
              });
        });
    done.countDown();
    other.join();
    check(!away.get(), "a loop nested in an inline loop left its thread");
    check(!Parallel.inLoop(), "the caller is outside any loop after an inline loop");
  }

  /** Two threads running loops at the same time each get every piece of their own loops. */
  private static void concurrent() throws InterruptedException {
    long[] sums = new long[2];
    Thread[] callers = new Thread[2];
    for (int t = 0; t < 2; t++) {
      int me = t;
      callers[t] =
          new Thread(
              () -> {
                for (int round = 0; round < 300; round++) {
                  long[] parts = new long[12];
                  Parallel.run(
                      1200,
                      Parallel.THREADS,
                      12,
                      (p, lo, hi) -> {
                        long s = 0;
                        for (int i = lo; i < hi; i++) {
                          s += i;
                        }
                        parts[p] = s;
                      });
                  for (long part : parts) {
                    sums[me] += part;
                  }
                }
              });
      callers[t].start();
    }
    for (Thread t : callers) {
      t.join();
    }
    long expected = 300L * 1199 * 1200 / 2;
    check(
        sums[0] == expected && sums[1] == expected, "concurrent sums " + sums[0] + ", " + sums[1]);
  }
}
