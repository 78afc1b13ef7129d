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

  public Buf(float[] a, int off, int... shape) {
    this.a = a;
    this.off = off;
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

  public int dim(int axis) {
    return shape[axis];
  }

  static long count(int[] shape) {
    long n = 1;
    for (int d : shape) n *= d;
    return n;
  }
}
