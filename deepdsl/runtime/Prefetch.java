package deepdsl.runtime;

import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

/**
 * Training batches loaded one ahead on a background thread (double buffering): while step i runs
 * on the network's input buffers, the thread gathers batch i + 1 (and augments it) into a staging
 * set; {@link #fill} then copies it in. The batches are those of loading each in turn, since a
 * batch depends only on its iteration number, the shuffle seed and the augmentation seed.
 */
final class Prefetch implements AutoCloseable {
  private final Data data;
  private final int n;
  private final Long shuffle;
  private final Augment augment;
  private final int augmented; // the field the augmentation applies to (-1: none)
  private final long seed;
  private final Buf[] staging;
  private final ExecutorService pool;
  private Future<?> pending;
  private long pendingIteration = -1;

  Prefetch(Data data, int n, Long shuffle, Augment augment, int augmented, long seed, Buf[] like) {
    this.data = data;
    this.n = n;
    this.shuffle = shuffle;
    this.augment = augmented < 0 ? null : augment;
    this.augmented = augmented;
    this.seed = seed;
    this.staging = new Buf[like.length];
    for (int f = 0; f < like.length; f++) {
      staging[f] = Buf.zeros(like[f].shape);
    }
    this.pool =
        Executors.newSingleThreadExecutor(
            r -> {
              Thread t = new Thread(r, "deepdsl-data");
              t.setDaemon(true);
              return t;
            });
  }

  /** Whether this prefetcher serves batches of that shuffle seed. */
  boolean serves(Long shuffleSeed) {
    return shuffle == null ? shuffleSeed == null : shuffle.equals(shuffleSeed);
  }

  /** Batch {@code i} (as loaded, augmented) into {@code to}. */
  void load(long i, Buf[] to) {
    data.batch(i, n, shuffle, to);
    if (augment != null) {
      augment.apply(to[augmented], i * n, seed, true);
    }
  }

  /** Fills {@code to} with batch {@code i}, then starts loading batch {@code i + 1}. */
  void fill(long i, Buf[] to) {
    boolean ready = false;
    if (pending != null) {
      await(pending);
      ready = pendingIteration == i;
      pending = null;
    }
    if (ready) {
      for (int f = 0; f < to.length; f++) {
        System.arraycopy(staging[f].a, staging[f].off, to[f].a, to[f].off, to[f].numel());
      }
    } else {
      load(i, to);
    }
    pendingIteration = i + 1;
    pending = pool.submit(() -> load(i + 1, staging));
  }

  private static void await(Future<?> f) {
    try {
      f.get();
    } catch (ExecutionException e) {
      if (e.getCause() instanceof RuntimeException r) {
        throw r;
      }
      if (e.getCause() instanceof Error err) {
        throw err;
      }
      throw new IllegalStateException(e.getCause());
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted while loading a batch", e);
    }
  }

  /**
   * Waits for the batch being loaded (unused now), so that no other thread reads the data source
   * once this returns (its shuffle permutations are not shared between threads), and stops the
   * thread.
   */
  @Override
  public void close() {
    try {
      if (pending != null) {
        pending.get();
      }
    } catch (ExecutionException e) {
      // the batch after the last one is not used: its failure does not matter
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    } finally {
      pending = null;
      pool.shutdown();
    }
  }
}
