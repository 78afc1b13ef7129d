package deepdsl.runtime;

/**
 * A generated kernel as a value: its name (the {@code extern "C"} kernel of {@code NAME.cu} the
 * CUDA device launches), its Java body (what the CPU device runs) and its launch shape. The
 * generated class holds one constant per kernel and its steps run them with {@code dev.run(K,
 * out, in...)}, so both devices execute the same list of calls.
 */
public final class Kernel {
  /** The CPU device's code of a kernel: the outputs, then the inputs. */
  @FunctionalInterface
  public interface Body {
    void run(Buf[] args);
  }

  /** The kernel's name in {@code NAME.cu}. */
  public final String name;

  /** The kernel's Java code. */
  public final Body body;

  /** Blocks of the launch; 0: enough blocks of {@link #block} threads for one thread an element. */
  public final int grid;

  /** Threads per block. */
  public final int block;

  /**
   * Whether the CUDA kernel takes the number of elements of its first output as a last argument
   * (an element-wise kernel, which serves every shape).
   */
  public final boolean sized;

  private Kernel(String name, Body body, int grid, int block, boolean sized) {
    this.name = name;
    this.body = body;
    this.grid = grid;
    this.block = block;
    this.sized = sized;
  }

  /** An element-wise kernel: one thread an element of its first output, of any shape. */
  public static Kernel elementwise(String name, Body body) {
    return new Kernel(name, body, 0, 256, true);
  }

  /** A kernel of one shape, launched as {@code grid} blocks of {@code block} threads. */
  public static Kernel fixed(String name, int grid, int block, Body body) {
    return new Kernel(name, body, grid, block, false);
  }

  @Override
  public String toString() {
    return name;
  }
}
