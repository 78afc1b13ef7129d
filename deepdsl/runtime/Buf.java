package deepdsl.runtime;

/**
 * A float32 tensor in host memory: {@code shape} elements stored row-major from {@code off} in {@code a}.
 *
 * <p>Temporaries are views into the one arena the plan sized; parameters, state and inputs have arrays of
 * their own. Integer tensors (labels, argmax) hold their values as exact floats (class indices stay below
 * 2^24).
 */
public final class Buf {
  public final float[] a;
  public final int off;
  public final int[] shape;

  /**
   * Whether the CUDA device stores the elements in bf16, two bytes each (a program compiled with
   * --precision bf16: the values its plan stores in bf16); {@code off} still counts four bytes. On the
   * CPU device every tensor is float32 and this is false.
   */
  public final boolean bf16;

  public Buf(float[] a, int off, int... shape) {
    this(a, off, false, shape);
  }

  public Buf(float[] a, int off, boolean bf16, int... shape) {
    this.a = a;
    this.off = off;
    this.bf16 = bf16;
    this.shape = shape;
  }

  /** A fresh zeroed tensor of its own. */
  public static Buf zeros(int... shape) {
    return new Buf(new float[Math.toIntExact(count(shape))], 0, shape);
  }

  public int numel() {
    return Math.toIntExact(count(shape));
  }

  /** The Euclidean norm of the elements (on the host: read a step's tensor with {@code dev.read}). */
  public double norm() {
    double s = 0;
    for (int i = 0; i < numel(); i++) {
      s += (double) a[off + i] * a[off + i];
    }
    return Math.sqrt(s);
  }

  /** The bytes an element takes on the device: 2 for a bf16 tensor, else 4. */
  public int elementBytes() {
    return bf16 ? 2 : 4;
  }

  public int dim(int axis) {
    return shape[axis];
  }

  static long count(int[] shape) {
    long n = 1;
    for (int d : shape) n *= d;
    return n;
  }
}
