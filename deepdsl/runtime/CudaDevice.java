package deepdsl.runtime;

import static jcuda.driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
import static jcuda.driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR;
import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;
import static jcuda.driver.JCudaDriver.cuCtxSynchronize;
import static jcuda.driver.JCudaDriver.cuDeviceGet;
import static jcuda.driver.JCudaDriver.cuDeviceGetAttribute;
import static jcuda.driver.JCudaDriver.cuDeviceGetCount;
import static jcuda.driver.JCudaDriver.cuDeviceGetName;
import static jcuda.driver.JCudaDriver.cuDevicePrimaryCtxRelease;
import static jcuda.driver.JCudaDriver.cuDevicePrimaryCtxRetain;
import static jcuda.driver.JCudaDriver.cuDeviceTotalMem;
import static jcuda.driver.JCudaDriver.cuInit;
import static jcuda.driver.JCudaDriver.cuMemAlloc;
import static jcuda.driver.JCudaDriver.cuMemFree;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Random;
import java.util.Set;
import jcuda.Pointer;
import jcuda.Sizeof;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.JCudaDriver;
import jcuda.jcublas.JCublas2;
import jcuda.jcublas.cublasHandle;
import jcuda.jcublas.cublasOperation;

/**
 * The CUDA device on JCuda 12.6 (driver API and cuBLAS; no cuDNN, whose JCuda 12 bindings are not
 * on Maven Central). It starts the driver on GPU 0, allocates the plan's one arena with {@code
 * cuMemAlloc}, uploads tensors, and runs the GEMM ops (linear, matmul, batch_matmul) through
 * cuBLAS. The kernels of the other ops arrive with the CUDA-kernel issue: until then a program that
 * launches any of them is refused at start, with the list of what is missing, rather than run
 * wrongly.
 *
 * <p>Only {@link Device#open} creates it, by reflection. Running {@code java
 * deepdsl.runtime.CudaDevice} checks the GEMMs on the GPU against plain Java loops.
 */
public final class CudaDevice implements Device {
  /** The ops this device can launch today. */
  public static final List<String> LAUNCHES = List.of("linear", "matmul", "batch_matmul");

  private static final Pointer ONE = Pointer.to(new float[] {1f});
  private static final Pointer ZERO = Pointer.to(new float[] {0f});

  private final CUdevice gpu = new CUdevice();
  private final String gpuName;
  private final long gpuBytes;
  private final long workspaceLimit;
  private final CUdeviceptr arena = new CUdeviceptr();
  private final List<CUdeviceptr> uploads = new ArrayList<>();
  private final cublasHandle blas = new cublasHandle();

  /**
   * Starts the driver on GPU 0 and allocates the arena.
   *
   * @throws Device.Unavailable when there is no GPU, or the program launches an op this device
   *     cannot
   */
  public CudaDevice(String[] ops, long arenaBytes, long workspaceLimit) {
    JCudaDriver.setExceptionsEnabled(true);
    JCublas2.setExceptionsEnabled(true);
    cuInit(0);
    int[] count = {0};
    cuDeviceGetCount(count);
    if (count[0] == 0) {
      throw new Device.Unavailable("no CUDA GPU found");
    }
    cuDeviceGet(gpu, 0);
    byte[] name = new byte[256];
    cuDeviceGetName(name, name.length, gpu);
    int end = 0;
    while (end < name.length && name[end] != 0) {
      end++;
    }
    int[] major = {0};
    int[] minor = {0};
    cuDeviceGetAttribute(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, gpu);
    cuDeviceGetAttribute(minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, gpu);
    long[] total = {0};
    cuDeviceTotalMem(total, gpu);
    gpuName =
        new String(name, 0, end, StandardCharsets.UTF_8) + " (sm_" + major[0] + minor[0] + ")";
    gpuBytes = total[0];
    this.workspaceLimit = workspaceLimit;
    Set<String> missing = new LinkedHashSet<>(List.of(ops));
    missing.removeAll(LAUNCHES);
    if (!missing.isEmpty()) {
      throw new Device.Unavailable(
          "the CUDA device ("
              + gpuName
              + ") cannot launch "
              + String.join(", ", missing)
              + " yet; it runs only "
              + String.join(", ", LAUNCHES)
              + " until the CUDA kernels arrive");
    }
    CUcontext context = new CUcontext();
    cuDevicePrimaryCtxRetain(context, gpu);
    cuCtxSetCurrent(context);
    cuMemAlloc(arena, Math.max(arenaBytes, 4));
    JCublas2.cublasCreate(blas);
  }

  @Override
  public String name() {
    return "cuda";
  }

  @Override
  public String description() {
    return "cuda ("
        + gpuName
        + ", "
        + gpuBytes / (1 << 20)
        + " MiB, workspace limit "
        + workspaceLimit
        + " bytes)";
  }

  /** The arena region at {@code byteOffset}. */
  public CUdeviceptr at(long byteOffset) {
    return arena.withByteOffset(byteOffset);
  }

  /** A device copy of {@code b}, freed when the device closes. */
  public CUdeviceptr upload(Buf b) {
    CUdeviceptr p = new CUdeviceptr();
    cuMemAlloc(p, (long) Math.max(b.numel(), 1) * Sizeof.FLOAT);
    cuMemcpyHtoD(
        p,
        Pointer.to(b.a).withByteOffset((long) b.off * Sizeof.FLOAT),
        (long) b.numel() * Sizeof.FLOAT);
    uploads.add(p);
    return p;
  }

  /** Copies {@code b.numel()} floats from the device into {@code b}. */
  public void download(CUdeviceptr from, Buf b) {
    cuCtxSynchronize();
    cuMemcpyDtoH(
        Pointer.to(b.a).withByteOffset((long) b.off * Sizeof.FLOAT),
        from,
        (long) b.numel() * Sizeof.FLOAT);
  }

  /**
   * Row-major {@code c[m, n] = op(a) · op(b)} for {@code batch} matrices {@code strideA}, {@code
   * strideB}, {@code m·n} floats apart; {@code op} transposes when asked. cuBLAS is column-major,
   * so it computes {@code cᵀ = op(b)ᵀ · op(a)ᵀ}, which is the same memory.
   */
  public void gemm(
      Pointer c, Pointer a, Pointer b, int batch, int m, int n, int k, boolean ta, boolean tb) {
    int opA = ta ? cublasOperation.CUBLAS_OP_T : cublasOperation.CUBLAS_OP_N;
    int opB = tb ? cublasOperation.CUBLAS_OP_T : cublasOperation.CUBLAS_OP_N;
    int lda = ta ? m : k;
    int ldb = tb ? k : n;
    JCublas2.cublasSgemmStridedBatched(
        blas,
        opB,
        opA,
        n,
        m,
        k,
        ONE,
        b,
        ldb,
        (long) k * n,
        a,
        lda,
        (long) m * k,
        ZERO,
        c,
        n,
        (long) m * n,
        batch);
  }

  /** {@code out[N, O] = x[N, I] · w[O, I]ᵀ}: the linear op (its bias is an epilogue). */
  public void linear(Pointer out, Pointer x, Pointer w, int rows, int in, int outFeatures) {
    gemm(out, x, w, 1, rows, outFeatures, in, false, true);
  }

  @Override
  public void close() {
    for (CUdeviceptr p : uploads) {
      cuMemFree(p);
    }
    cuMemFree(arena);
    JCublas2.cublasDestroy(blas);
    cuDevicePrimaryCtxRelease(gpu);
  }

  /** Checks matmul, its transposed forms and a batched matmul on the GPU against Java loops. */
  public static void main(String[] args) {
    int batch = 3;
    int m = 37;
    int n = 29;
    int k = 41;
    Random random = new Random(1);
    Buf a = Buf.zeros(batch, m, k);
    Buf b = Buf.zeros(batch, k, n);
    for (Buf t : new Buf[] {a, b}) {
      for (int i = 0; i < t.a.length; i++) {
        t.a[i] = (float) random.nextGaussian();
      }
    }
    try (CudaDevice cuda =
        new CudaDevice(new String[] {"matmul", "batch_matmul"}, (long) batch * m * n * 4, 0)) {
      System.out.println("device: " + cuda.description());
      double worst = 0;
      for (boolean ta : new boolean[] {false, true}) {
        for (boolean tb : new boolean[] {false, true}) {
          Buf at = ta ? transposed(a, batch, m, k) : a;
          Buf bt = tb ? transposed(b, batch, k, n) : b;
          cuda.gemm(cuda.at(0), cuda.upload(at), cuda.upload(bt), batch, m, n, k, ta, tb);
          Buf c = Buf.zeros(batch, m, n);
          cuda.download(cuda.at(0), c);
          for (int q = 0; q < batch; q++) {
            for (int i = 0; i < m; i++) {
              for (int j = 0; j < n; j++) {
                double s = 0;
                for (int p = 0; p < k; p++) {
                  s += a.a[(q * m + i) * k + p] * b.a[(q * k + p) * n + j];
                }
                worst = Math.max(worst, Math.abs(s - c.a[(q * m + i) * n + j]));
              }
            }
          }
        }
      }
      System.out.println("largest difference from Java loops: " + worst);
      if (worst > 1e-3) {
        throw new AssertionError("cuBLAS GEMM disagrees with the Java loops by " + worst);
      }
    }
  }

  private static Buf transposed(Buf t, int batch, int rows, int cols) {
    Buf out = Buf.zeros(batch, cols, rows);
    for (int q = 0; q < batch; q++) {
      for (int i = 0; i < rows; i++) {
        for (int j = 0; j < cols; j++) {
          out.a[(q * cols + j) * rows + i] = t.a[(q * rows + i) * cols + j];
        }
      }
    }
    return out;
  }
}
