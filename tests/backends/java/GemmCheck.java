package deepdsl.runtime;

import deepdsl.runtime.GemmOperands.Direct;
import deepdsl.runtime.GemmOperands.Mat;
import deepdsl.runtime.GemmOperands.Right;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.FloatBuffer;
import java.util.Random;

/**
 * Checks {@link CpuGemm#gemm} with its right operand in a direct buffer ({@link Direct}, the
 * convolutions' im2col columns where OpenBLAS reads them in place), as stored and transposed, from
 * an inner (row0, col0) and with rows wider than the matrix, against naive float64 loops (run by
 * tests/backends/test_java_cpuops.py). {@code java GemmCheck [openblas|java]} runs the products on
 * that SGEMM ({@link Blas#use}); the sizes exceed one block of the Java SGEMM each way, so that it
 * copies the operand a block at a time ({@link Direct#from}, {@link Direct#copy}). Prints the
 * SGEMM's description and "ok", or the first failure and exits 1.
 */
public final class GemmCheck {
  private GemmCheck() {}

  public static void main(String[] args) {
    System.out.println(Blas.use(args.length > 0 ? args[0] : "java"));
    Random random = new Random(7);
    int[][] sizes = {{3, 5, 4}, {37, 600, 300}, {70, 41, 530}};
    for (int[] mnk : sizes) {
      for (boolean transposed : new boolean[] {false, true}) {
        for (boolean accumulate : new boolean[] {false, true}) {
          check(random, mnk[0], mnk[1], mnk[2], transposed, accumulate);
        }
      }
    }
    System.out.println("ok");
  }

  /** C (+)= A B, B (k x n) in a direct buffer from (2, 3), rows n + 5 (transposed: k + 5) wide. */
  static void check(Random random, int m, int n, int k, boolean transposed, boolean accumulate) {
    int rows = (transposed ? n : k) + 2;
    int ld = (transposed ? k : n) + 5;
    FloatBuffer buf =
        ByteBuffer.allocateDirect(4 * rows * ld).order(ByteOrder.nativeOrder()).asFloatBuffer();
    for (int i = 0; i < rows * ld; i++) {
      buf.put(i, random.nextFloat() - 0.5f);
    }
    float[] a = new float[m * k + 1];
    for (int i = 0; i < a.length; i++) {
      a[i] = random.nextFloat() - 0.5f;
    }
    float[] c = new float[m * n + 2];
    for (int i = 0; i < c.length; i++) {
      c[i] = random.nextFloat() - 0.5f;
    }
    double[] want = new double[m * n];
    for (int i = 0; i < m; i++) {
      for (int j = 0; j < n; j++) {
        double sum = accumulate ? c[2 + i * n + j] : 0;
        for (int p = 0; p < k; p++) {
          int at = transposed ? (2 + j) * ld + 3 + p : (2 + p) * ld + 3 + j;
          sum += (double) a[1 + i * k + p] * buf.get(at);
        }
        want[i * n + j] = sum;
      }
    }
    Right b = new Direct(buf, ld, 2, 3, false);
    if (transposed) {
      b = new Direct(buf, ld, 2, 3, true);
    }
    CpuGemm.gemm(m, n, k, Mat.rows(a, 1, k), b, Mat.rows(c, 2, n), accumulate);
    for (int i = 0; i < m * n; i++) {
      if (Math.abs(c[2 + i] - want[i]) > 1e-4 * (1 + Math.abs(want[i]))) {
        System.out.printf(
            "m=%d n=%d k=%d transposed=%b accumulate=%b: C[%d] = %g, want %g%n",
            m, n, k, transposed, accumulate, i, c[2 + i], want[i]);
        System.exit(1);
      }
    }
  }
}
