package deepdsl.runtime;

/**
 * The optimiser's updates of every parameter as one launch (deepdsl/ir/launches.py): each segment
 * is one parameter's group of element-wise updates, computed by one of {@link #kinds} (a {@link
 * Kernel#group} kernel; segments of one kind differ only in their tensors). The CPU device runs
 * each segment's kind in turn ({@link Device#runMulti}), so that it computes what it computed one
 * kernel at a time; the CUDA device launches the one kernel {@link #name} of {@code NAME.cu} over
 * a table of every segment's size and device pointers ({@link #table}), written to the GPU once, into
 * the one block the class's settings size for the tables ({@code .tables(bytes)}: what the emitter
 * counts for its launches), so that the device allocates nothing beside its plan.
 */
public final class MultiKernel {
  /** The kernel's name in {@code NAME.cu}. */
  public final String name;

  /** The 64-bit numbers of one segment's row of the table: 4, then its tensors' pointers. */
  public final int width;

  /** The group kernel of each kind. */
  final Kernel[] kinds;

  /** Threads per block of the CUDA kernel (its segments' loops stride by blocks of them). */
  static final int BLOCK = 256;

  /** The most blocks one segment gets (its loop covers the rest). */
  static final int SEGMENT_BLOCKS = 1024;

  /** A multi-tensor kernel {@code name} whose table rows are {@code width} numbers wide. */
  public MultiKernel(String name, int width, Kernel... kinds) {
    this.name = name;
    this.width = width;
    this.kinds = kinds.clone();
  }

  /** The group kernel of kind {@code k}. */
  public Kernel kind(int k) {
    return kinds[k];
  }

  /** The blocks a segment of {@code n} elements gets. */
  static int blocks(long n) {
    return (int) Math.max(1, Math.min(SEGMENT_BLOCKS, (n + BLOCK - 1) / BLOCK));
  }

  /**
   * The table the CUDA kernel reads: the segment count, then per segment its first block, its
   * blocks, its elements, its kind and the device addresses of its tensors ({@code address}); the
   * grid is the sum of the segments' blocks ({@link #grid}).
   */
  long[] table(int[] kinds, Buf[][] segments, java.util.function.ToLongFunction<Buf> address) {
    long[] t = new long[1 + segments.length * width];
    t[0] = segments.length;
    long first = 0;
    for (int k = 0; k < segments.length; k++) {
      Buf[] s = segments[k];
      int row = 1 + k * width;
      int n = s[0].numel();
      int blocks = blocks(n);
      t[row] = first;
      t[row + 1] = blocks;
      t[row + 2] = n;
      t[row + 3] = kinds[k];
      for (int j = 0; j < s.length; j++) {
        t[row + 4 + j] = address.applyAsLong(s[j]);
      }
      first += blocks;
    }
    return t;
  }

  /** The blocks of the launch over {@code segments}: each segment's, summed. */
  static int grid(Buf[][] segments) {
    long sum = 0;
    for (Buf[] s : segments) {
      sum += blocks(s[0].numel());
    }
    return (int) sum;
  }

  @Override
  public String toString() {
    return name;
  }
}
