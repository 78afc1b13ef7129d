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

  /** Threads per block. */
  public final int block;

  private Kernel(String name, Body body, Launch launch, int block) {
    this.name = name;
    this.body = body;
    this.launch = launch;
    this.block = block;
  }

  /** An element-wise kernel: it serves every shape. */
  public static Kernel elementwise(String name, Body body) {
    return new Kernel(name, body, Launch.ELEMENTS, 256);
  }

  /** A kernel over its output's elements that takes its tensors' dims as arguments. */
  public static Kernel shaped(String name, Body body) {
    return new Kernel(name, body, Launch.SHAPED, 256);
  }

  /** A kernel of one block of {@code block} threads per output element, its dims as arguments. */
  public static Kernel rows(String name, int block, Body body) {
    return new Kernel(name, body, Launch.ROWS, block);
  }

  @Override
  public String toString() {
    return name;
  }
}
