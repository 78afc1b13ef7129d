package deepdsl.runtime;

import java.util.ArrayList;
import java.util.List;

/**
 * One step of a network on the CUDA device, as data: the kernels of {@code NAME.cu} (compiled to
 * {@code NAME.sm_XY.ptx}) in plan order, each with its launch shape and where each pointer argument
 * lives; then the updates to copy into their tensors and where the step's result is. The generated
 * class writes one of these per step; {@link CudaDevice} runs it. Plain Java: building one needs no
 * JCuda class.
 */
public final class Kernels {
  /** Where a pointer argument lives. */
  public enum Storage {
    /** At a byte offset of the arena. */
    ARENA,
    /** A parameter, model state or optimizer state tensor, by name. */
    TENSOR,
    /** An input or label of the batch, by name (inputs float, labels 64-bit integers on the GPU). */
    INPUT,
    /** The step counter (one 64-bit integer). */
    STEP,
    /** The learning rate of a schedule (one float), set every step. */
    RATE
  }

  /** A pointer argument: {@code offset} for the arena, {@code tensor} the tensor's or input's name. */
  public record Arg(Storage storage, long offset, String tensor) {}

  /** One kernel launch: {@code grid} blocks of {@code block} threads. */
  public record Launch(String kernel, int[] grid, int[] block, Arg[] args) {}

  /** An update computed in the arena, copied into its tensor after the launches. */
  public record Copy(Arg from, String tensor, long bytes) {}

  private final List<Launch> launches = new ArrayList<>();
  private final List<Copy> copies = new ArrayList<>();
  private Arg result;
  private int[] resultShape;

  public static Arg arena(long byteOffset) {
    return new Arg(Storage.ARENA, byteOffset, null);
  }

  public static Arg tensor(String name) {
    return new Arg(Storage.TENSOR, 0, name);
  }

  /**
   * The network's input or label {@code name}, as the runtime feeds it every step (an input as
   * float32, a label as int64 class ids).
   */
  public static Arg fed(String name) {
    return new Arg(Storage.INPUT, 0, name);
  }

  public static Arg rate() {
    return new Arg(Storage.RATE, 0, null);
  }

  public static Arg counter() {
    return new Arg(Storage.STEP, 0, null);
  }

  /** A launch shape: {@code x} (one-dimensional) or {@code x, y, z}. */
  public static int[] dim(int... xyz) {
    int[] d = {1, 1, 1};
    System.arraycopy(xyz, 0, d, 0, xyz.length);
    return d;
  }

  public Kernels launch(String kernel, int[] grid, int[] block, Arg... args) {
    launches.add(new Launch(kernel, grid, block, args));
    return this;
  }

  public Kernels copy(Arg from, String tensor, long bytes) {
    copies.add(new Copy(from, tensor, bytes));
    return this;
  }

  /** Where the step's result (the loss, or the prediction) is, and its shape. */
  public Kernels result(Arg where, int... shape) {
    result = where;
    resultShape = shape;
    return this;
  }

  public List<Launch> launches() {
    return launches;
  }

  public List<Copy> copies() {
    return copies;
  }

  public Arg result() {
    return result;
  }

  public int[] resultShape() {
    return resultShape;
  }
}
