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
import static jcuda.driver.JCudaDriver.cuGraphDestroy;
import static jcuda.driver.JCudaDriver.cuGraphExecDestroy;
import static jcuda.driver.JCudaDriver.cuGraphInstantiate;
import static jcuda.driver.JCudaDriver.cuGraphLaunch;
import static jcuda.driver.JCudaDriver.cuInit;
import static jcuda.driver.JCudaDriver.cuLaunchKernel;
import static jcuda.driver.JCudaDriver.cuMemAlloc;
import static jcuda.driver.JCudaDriver.cuMemFree;
import static jcuda.driver.JCudaDriver.cuMemGetInfo;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoDAsync;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;
import static jcuda.driver.JCudaDriver.cuModuleGetFunction;
import static jcuda.driver.JCudaDriver.cuModuleLoadData;
import static jcuda.driver.JCudaDriver.cuModuleUnload;
import static jcuda.driver.JCudaDriver.cuStreamBeginCapture;
import static jcuda.driver.JCudaDriver.cuStreamCreate;
import static jcuda.driver.JCudaDriver.cuStreamDestroy;
import static jcuda.driver.JCudaDriver.cuStreamEndCapture;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.BiConsumer;
import java.util.function.Consumer;
import java.util.function.Supplier;
import jcuda.Pointer;
import jcuda.Sizeof;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUfunction;
import jcuda.driver.CUgraph;
import jcuda.driver.CUgraphExec;
import jcuda.driver.CUmodule;
import jcuda.driver.CUstream;
import jcuda.driver.CUstreamCaptureMode;
import jcuda.driver.JCudaDriver;
import jcuda.nvrtc.JNvrtc;
import jcuda.nvrtc.nvrtcProgram;

/**
 * The CUDA device on JCuda 12.6's driver API: GPU 0, one arena of the plan's size allocated once,
 * one device copy of every parameter, state and input tensor. The network's steps run here call for
 * call: a generated kernel ({@link #run}) is launched by its name in {@code NAME.cu}, a library op
 * ({@link #conv2d}, ...) as the library kernel of {@code NAME.cu} that takes its sizes as arguments.
 * A tensor of the step is found on the GPU by its host array (the arena, a parameter, the batch)
 * and its offset. Parameters stay on the GPU between steps; a save brings them back, a load sends
 * them there.
 *
 * <p>The kernels come from the class path: {@code NAME.sm_XY.ptx} for the GPU's architecture (or
 * the newest older one, which the driver compiles forward), written by {@code deepdsl compile
 * --ptx}; else {@code NAME.cu}, compiled here with NVRTC (which then must be installed: {@code
 * libnvrtc.so.12}). The device says at start which it used. It needs only {@code libcuda.so.1}
 * otherwise. The matrix products go to cuBLAS through JavaCPP's CUDA presets ({@link CudaBlas}) as
 * {@code --kernels} says: {@code vendor} (an error where cuBLAS does not load), {@code own} (our
 * kernel), {@code auto} (cuBLAS where it loads); so do the convolutions, pooling, batch norm, softmax and LRN
 * to cuDNN ({@link CudaDnn}). Under {@code auto} a pooling, batch-norm, softmax or LRN call that cuDNN refuses
 * at its first use runs our kernel from then on; under {@code vendor} that is an error. Every other
 * op is one of our kernels.
 *
 * <p>Everything runs on one stream of the device's own (a blocking one, so the host transfers on
 * the default stream wait for it). From the second training step on, the step is a CUDA graph:
 * captured once from that stream (every launch and device copy of {@code trainStep}), then
 * replayed with one {@code cuGraphLaunch} a step. What is not capturable stays outside: the batch,
 * the settings, the learning rate and the step counter of the dropout masks are copied into the
 * same device buffers before the launch (the kernels read them there), the loss is read after it.
 * cuBLAS and cuDNN work on the same stream, so their calls are captured too (a cuDNN call's
 * descriptors are made at its first use, in the warm-up step, never while capturing). It is not
 * used under {@code --no-graph}, nor for a step that reads a tensor on the host (a print added to the program) or works on
 * after reading its loss: the capture is dropped before anything of it ran, and the steps run call
 * for call.
 *
 * <p>Only {@link Device#open} creates it, by reflection.
 */
public final class CudaDevice implements Device {
  private static final int[] OLDER_ARCHS = {90, 89, 87, 86, 80, 75, 70};

  private final Network.Settings settings;
  private final CUdevice gpu = new CUdevice();
  private final String gpuName;
  private final int arch;
  private final long gpuBytes;
  private final long workspaceLimit;
  private final CUmodule module = new CUmodule();
  private final String kernelSource;
  private final Map<String, CUfunction> functions = new HashMap<>();
  private final CudaBlas blas; // null: the GEMMs are our kernel
  private final String gemms; // who computes the GEMMs, for the device line
  private final CudaDnn dnn; // null: the convolutions, pooling, batch norm, softmax and LRN are our kernels
  private final String convolutions; // who computes them, for the device line
  private final boolean strict; // --kernels vendor: a call cuDNN refuses is an error, not our kernel
  private final Map<String, CudaDnn.Conv> convs = new HashMap<>(); // each convolution's, by its sizes
  // the descriptors of each pooling, batch norm, softmax and LRN, by the op and its sizes (forward and backward
  // share them); and of each call (an op's forward or backward), whether cuDNN took it at its first
  // use (false: refused under --kernels auto, our kernel runs it)
  private final Map<String, CudaDnnOps.Op> ops = new HashMap<>();
  private final Map<String, Boolean> taken = new HashMap<>();
  private CUdeviceptr scratch; // cuDNN's workspace: the most any chosen algorithm needs
  private long scratchBytes;
  private final List<CUdeviceptr> allocations = new ArrayList<>();
  private final Map<String, CUdeviceptr> tensors = new HashMap<>();
  // the host array of a step's tensor -> where its elements are on the GPU
  private final Map<float[], CUdeviceptr> places = new IdentityHashMap<>();
  private final Map<int[], Buf> hostCopies = new IdentityHashMap<>();
  private CUdeviceptr arena;
  // every input and label by name; a label's host array -> its int64 values and where they are on the GPU
  private final Map<String, CUdeviceptr> batch = new LinkedHashMap<>();
  private final Map<float[], CUdeviceptr> labels = new IdentityHashMap<>();
  private final Map<String, long[]> labelValues = new HashMap<>();
  private CUdeviceptr rate; // the learning rate of a schedule (the step's opt/lr input)
  private CUdeviceptr counter; // the step counter a dropout mask is drawn for
  private float[] settingValues; // the settings the kernels read (lr, ...), sent before each step
  private CUdeviceptr settingsOnGpu;
  private long freeBefore;
  private long freeLow = Long.MAX_VALUE;
  private final Stream stream = new Stream();
  private String graphChoice; // "on", or "off (why)", for the device line
  private int trainSteps; // the steps trained so far: the first is the warm-up, never captured
  private long counterValue = -1; // the step counter's value on the GPU
  private boolean capturing;
  private CUdeviceptr capturedLoss; // where the captured step leaves its loss
  private CUgraph graph;
  private CUgraphExec replay;

  /**
   * Starts the driver on GPU 0, loads the network's kernels and, as {@code kernels} ({@code vendor},
   * {@code own} or {@code auto}) says, cuBLAS; {@code graphs}: replay the train step as a CUDA graph.
   *
   * @throws Device.Unavailable when there is no GPU, no kernels for it, or under {@code vendor} no
   *     cuBLAS
   */
  public CudaDevice(
      Network.Settings settings, long workspaceLimit, String kernels, boolean graphs) {
    this.settings = settings;
    this.workspaceLimit = workspaceLimit;
    this.strict = kernels.equals("vendor");
    JCudaDriver.setExceptionsEnabled(true);
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
    arch = major[0] * 10 + minor[0];
    long[] total = {0};
    cuDeviceTotalMem(total, gpu);
    gpuName = new String(name, 0, end, StandardCharsets.UTF_8) + " (sm_" + arch + ")";
    gpuBytes = total[0];
    CUcontext context = new CUcontext();
    cuDevicePrimaryCtxRetain(context, gpu);
    cuCtxSetCurrent(context); // the primary context: the one cuBLAS (the runtime API) works in
    try {
      kernelSource = loadModule();
      cuStreamCreate(stream, 0); // blocking: the default stream's synchronous copies wait for it
      CudaBlas vendor = null;
      String why = "own kernel (--kernels own)";
      if (!kernels.equals("own")) {
        try {
          vendor = CudaBlas.open(stream.address());
          why = vendor.description();
        } catch (Device.Unavailable e) {
          if (kernels.equals("vendor")) {
            throw new Device.Unavailable("--kernels vendor: " + e.getMessage());
          }
          why = "own kernel (" + e.getMessage().replaceFirst(": it needs .*|: add .*", "") + ")";
        }
      }
      blas = vendor;
      gemms = why;
      CudaDnn library = null;
      why = "own kernels (--kernels own)";
      if (!kernels.equals("own")) {
        try {
          library = CudaDnn.open(stream.address());
          why = library.description();
        } catch (Device.Unavailable e) {
          if (kernels.equals("vendor")) {
            if (blas != null) {
              blas.close();
            }
            throw new Device.Unavailable("--kernels vendor: " + e.getMessage());
          }
          why = "own kernels (" + e.getMessage().replaceFirst(": it needs .*|: add .*", "") + ")";
        }
      }
      dnn = library;
      convolutions = why;
      graphChoice = graphs ? "on" : "off (--no-graph)";
    } catch (RuntimeException e) {
      cuDevicePrimaryCtxRelease(gpu); // the program runs elsewhere or not at all
      throw e;
    }
  }

  /** Loads the PTX for this GPU, or compiles NAME.cu; returns what was loaded, for the user. */
  private String loadModule() {
    String name = settings.name;
    for (int a : candidates()) {
      byte[] ptx = resource(name + ".sm_" + a + ".ptx");
      if (ptx != null) {
        cuModuleLoadData(module, terminated(ptx));
        return name + ".sm_" + a + ".ptx";
      }
    }
    byte[] source = resource(name + ".cu");
    if (source == null) {
      throw new Device.Unavailable(
          "neither "
              + name
              + ".sm_"
              + arch
              + ".ptx nor "
              + name
              + ".cu is on the class path (deepdsl compile writes them beside "
              + name
              + ".java: put that folder on the class path)");
    }
    cuModuleLoadData(module, terminated(nvrtc(new String(source, StandardCharsets.UTF_8))));
    return name + ".cu, compiled at start with NVRTC (no " + name + ".sm_" + arch + ".ptx)";
  }

  private int[] candidates() {
    List<Integer> out = new ArrayList<>(List.of(arch));
    for (int a : OLDER_ARCHS) {
      if (a < arch) {
        out.add(a);
      }
    }
    return out.stream().mapToInt(Integer::intValue).toArray();
  }

  private byte[] nvrtc(String source) {
    try {
      nvrtcProgram program = new nvrtcProgram();
      JNvrtc.nvrtcCreateProgram(program, source, settings.name + ".cu", 0, null, null);
      String[] options = {"--gpu-architecture=compute_" + arch, "--std=c++17", "--fmad=true"};
      int status = JNvrtc.nvrtcCompileProgram(program, options.length, options);
      String[] log = {""};
      JNvrtc.nvrtcGetProgramLog(program, log);
      if (status != 0) {
        throw new Device.Unavailable(
            "NVRTC could not compile " + settings.name + ".cu for sm_" + arch + ":\n" + log[0]);
      }
      String[] ptx = {null};
      JNvrtc.nvrtcGetPTX(program, ptx);
      JNvrtc.nvrtcDestroyProgram(program);
      return ptx[0].getBytes(StandardCharsets.UTF_8);
    } catch (UnsatisfiedLinkError e) {
      throw new Device.Unavailable(
          "no PTX for sm_"
              + arch
              + " on the class path, and NVRTC (libnvrtc.so.12) cannot be loaded to compile "
              + settings.name
              + ".cu: compile with deepdsl compile --ptx --arch sm_"
              + arch);
    }
  }

  private static byte[] resource(String file) {
    ClassLoader loader = Thread.currentThread().getContextClassLoader();
    if (loader == null) {
      loader = ClassLoader.getSystemClassLoader();
    }
    try (InputStream in = loader.getResourceAsStream(file)) {
      return in == null ? null : in.readAllBytes();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static byte[] terminated(byte[] text) {
    byte[] out = new byte[text.length + 1];
    System.arraycopy(text, 0, out, 0, text.length);
    return out;
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
        + " MiB; kernels from "
        + kernelSource
        + "; GEMMs: "
        + gemms
        + "; convolutions, pooling, batch norm, softmax and LRN: "
        + convolutions
        + "; workspace limit "
        + workspaceLimit
        + " bytes; graph: "
        + graphChoice
        + ")";
  }

  /** The device's stream, whose address cuBLAS can be given (JCuda keeps it protected). */
  static final class Stream extends CUstream {
    long address() {
      return getNativePointer();
    }
  }

  /** A device allocation whose address cuBLAS can be given (JCuda keeps it protected). */
  static final class DevicePointer extends CUdeviceptr {
    long address() {
      return getNativePointer() + getByteOffset();
    }
  }

  private CUdeviceptr alloc(long bytes) {
    CUdeviceptr p = new DevicePointer();
    cuMemAlloc(p, Math.max(bytes, 4));
    allocations.add(p);
    return p;
  }

  @Override
  public void attach(Network net) {
    long[] free = {0};
    long[] total = {0};
    cuMemGetInfo(free, total);
    freeBefore = free[0];
    long need = settings.arenaBytes + Sizeof.LONG;
    for (Map.Entry<String, Buf> e : net.batchByName().entrySet()) {
      need += (long) e.getValue().numel() * (net.isLabel(e.getKey()) ? Sizeof.LONG : Sizeof.FLOAT);
    }
    for (Buf b : net.tensorsByName().values()) {
      need += (long) b.numel() * Sizeof.FLOAT;
    }
    if (need > freeBefore) {
      throw new Device.Unavailable(
          settings.name
              + " needs "
              + need
              + " bytes on the GPU (arena "
              + settings.arenaBytes
              + " and the tensors), but "
              + gpuName
              + " has "
              + freeBefore
              + " free; compile it with --remat cheap or full, or a smaller batch");
    }
    arena = alloc(settings.arenaBytes);
    places.put(net.useDeviceArena(), arena);
    net.tensorsByName()
        .forEach(
            (name, b) -> {
              CUdeviceptr p = alloc((long) b.numel() * 4);
              tensors.put(name, p);
              places.put(b.a, p); // a tensor's array holds it alone, from 0
            });
    net.batchByName()
        .forEach(
            (name, b) -> {
              boolean label = net.isLabel(name);
              CUdeviceptr p = alloc((long) b.numel() * (label ? Sizeof.LONG : Sizeof.FLOAT));
              batch.put(name, p);
              if (label) {
                labelValues.put(name, new long[b.numel()]);
                labels.put(b.a, p);
              } else {
                places.put(b.a, p);
              }
            });
    if (net.rateBuffer() != null) {
      rate = alloc(Sizeof.FLOAT);
      places.put(net.rateBuffer().a, rate);
    }
    counter = alloc(Sizeof.LONG);
    settingValues = net.settingValues();
    settingsOnGpu = alloc((long) settingValues.length * Sizeof.FLOAT);
    places.put(settingValues, settingsOnGpu);
    toDevice(net);
    measure();
  }

  private CUfunction function(String kernel) {
    return functions.computeIfAbsent(
        kernel,
        k -> {
          CUfunction f = new CUfunction();
          cuModuleGetFunction(f, module, k);
          return f;
        });
  }

  /** Where the elements of {@code b} are on the GPU. */
  private CUdeviceptr pointer(Buf b) {
    CUdeviceptr label = labels.get(b.a);
    if (label != null) {
      return label.withByteOffset((long) b.off * Sizeof.LONG); // the labels are int64 there
    }
    CUdeviceptr base = places.get(b.a);
    if (base == null) {
      throw new IllegalStateException(
          "a step passed the CUDA device a tensor that lives on the host only (shape "
              + java.util.Arrays.toString(b.shape)
              + ")");
    }
    return base.withByteOffset((long) b.off * Sizeof.FLOAT);
  }

  /** A step that cannot be a graph: it reads a tensor on the host, or works on after its loss. */
  private static final class NotCapturable extends RuntimeException {
    NotCapturable(String why) {
      super(why, null, false, false);
    }
  }

  private void notAfterTheLoss() {
    if (capturing && capturedLoss != null) {
      throw new NotCapturable("it launches work after reading its loss");
    }
  }

  private static Pointer i(int v) {
    return Pointer.to(new int[] {v});
  }

  /** Launches {@code kernel} as grid x block, its arguments the tensors then the sizes. */
  private void launch(String kernel, int[] grid, int[] block, Buf[] bufs, Pointer... sizes) {
    notAfterTheLoss();
    Pointer[] args = new Pointer[bufs.length + sizes.length];
    for (int k = 0; k < bufs.length; k++) {
      args[k] = Pointer.to(pointer(bufs[k]));
    }
    System.arraycopy(sizes, 0, args, bufs.length, sizes.length);
    cuLaunchKernel(
        function(kernel),
        grid[0],
        grid[1],
        grid[2],
        block[0],
        block[1],
        block[2],
        0,
        stream,
        Pointer.to(args),
        null);
  }

  private static final int BLOCK = 256;
  private static final int TILE = 16;
  private static final int MAX_GRID = 1 << 16;

  /** One thread an element of {@code n}, in a grid-stride loop. */
  private static int[] elements(long n) {
    return new int[] {(int) Math.max(1, Math.min(MAX_GRID, (n + BLOCK - 1) / BLOCK)), 1, 1};
  }

  /** One block a row of {@code rows}, in a block-stride loop. */
  private static int[] rows(long rows) {
    return new int[] {(int) Math.max(1, Math.min(MAX_GRID, rows)), 1, 1};
  }

  private static final int[] THREADS = {BLOCK, 1, 1};
  private static final int[] TILE_BLOCK = {TILE, TILE, 1};
  private static final int[] ONE = {1, 1, 1};

  private static int tiles(long n) {
    return (int) ((n + TILE - 1) / TILE);
  }

  // ---- the step's operations ----

  @Override
  public void run(Kernel k, Buf... args) {
    int n = args[0].numel();
    int[] block = {k.block, 1, 1};
    if (k.launch == Kernel.Launch.ELEMENTS) {
      launch(k.name, elements(n), block, args, i(n));
      return;
    }
    List<Pointer> dims = new ArrayList<>();
    for (Buf b : args) {
      for (int d : b.shape) {
        dims.add(i(d));
      }
    }
    int[] grid = k.launch == Kernel.Launch.ROWS ? rows(n) : elements(n);
    launch(k.name, grid, block, args, dims.toArray(new Pointer[0]));
  }

  @Override
  public void copy(Buf from, Buf to) {
    notAfterTheLoss();
    cuMemcpyDtoDAsync(pointer(to), pointer(from), (long) to.numel() * Sizeof.FLOAT, stream);
  }

  @Override
  public float scalar(Buf b) {
    if (capturing) { // the captured step's loss: read after each replay
      if (capturedLoss != null) {
        throw new NotCapturable("it reads more than its loss on the host");
      }
      capturedLoss = pointer(b);
      return Float.NaN;
    }
    return scalar(pointer(b));
  }

  private static float scalar(CUdeviceptr p) {
    float[] v = {0f};
    cuMemcpyDtoH(Pointer.to(v), p, Sizeof.FLOAT);
    return v[0];
  }

  @Override
  public Buf read(Buf b) {
    if (capturing) {
      throw new NotCapturable("it reads a tensor on the host");
    }
    Buf host = hostCopies.computeIfAbsent(b.shape, s -> Buf.zeros(s));
    download(pointer(b), host);
    return host;
  }

  /** The device address of a float tensor of the step, for cuBLAS. */
  private long address(Buf b) {
    pointer(b); // a tensor on the host only is reported as for a kernel
    return ((DevicePointer) places.get(b.a)).address() + (long) b.off * Sizeof.FLOAT;
  }

  private void gemm(Buf out, Buf a, Buf b, int batch, int m, int n, int k, boolean ta, boolean tb) {
    if (blas != null) {
      blas.gemm(address(out), address(a), address(b), batch, m, n, k, ta, tb);
      return;
    }
    launch(
        "dd_k_gemm",
        new int[] {tiles(n), tiles(m), batch},
        TILE_BLOCK,
        new Buf[] {out, a, b},
        i(m),
        i(n),
        i(k),
        i(ta ? 1 : 0),
        i(tb ? 1 : 0));
  }

  @Override
  public void linear(Buf out, Buf x, Buf w) {
    int k = x.shape[x.shape.length - 1];
    gemm(out, x, w, 1, out.numel() / w.shape[0], w.shape[0], k, false, true);
  }

  @Override
  public void matmul(Buf out, Buf a, Buf b, boolean transposeA, boolean transposeB) {
    int r = out.shape.length;
    int k = transposeA ? a.shape[a.shape.length - 2] : a.shape[a.shape.length - 1];
    gemm(out, a, b, 1, out.shape[r - 2], out.shape[r - 1], k, transposeA, transposeB);
  }

  @Override
  public void batchMatmul(Buf out, Buf a, Buf b, boolean transposeA, boolean transposeB) {
    int r = out.shape.length;
    int k = transposeA ? a.shape[a.shape.length - 2] : a.shape[a.shape.length - 1];
    gemm(out, a, b, out.shape[0], out.shape[r - 2], out.shape[r - 1], k, transposeA, transposeB);
  }

  /** The convolution's sizes as library.cu takes them: N C H W F KH KW OH OW SH SW PH PW G. */
  private static Pointer[] conv(int[] x, int[] w, int[] y, int[] pad, int[] stride, int groups) {
    int[] v = {
      x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], stride[0], stride[1], pad[0], pad[1], groups
    };
    Pointer[] out = new Pointer[v.length];
    for (int k = 0; k < v.length; k++) {
      out[k] = i(v[k]);
    }
    return out;
  }

  /**
   * The convolution {@code kind} through cuDNN: its descriptors and algorithm made at its first call
   * (the first step, never captured), the workspace grown to what the algorithm needs.
   */
  private void cudnn(
      int kind, Buf result, Buf a, Buf b, int[] x, int[] w, int[] y, int[] pad, int[] stride,
      int groups) {
    String key =
        kind + Arrays.toString(x) + Arrays.toString(w) + Arrays.toString(y) + Arrays.toString(pad)
            + Arrays.toString(stride) + groups;
    CudaDnn.Conv c = convs.get(key);
    if (c == null) {
      if (capturing) {
        throw new NotCapturable("a convolution is met for the first time");
      }
      c = dnn.prepare(kind, x, w, y, pad, stride, groups, workspaceLimit);
      convs.put(key, c);
      scratchOf(c.workspace);
    }
    long at = scratch == null ? 0 : ((DevicePointer) scratch).address();
    dnn.run(c, address(result), address(a), address(b), at);
  }

  @Override
  public void conv2d(Buf out, Buf x, Buf w, int groups, int[] pad, int[] stride) {
    if (dnn != null) {
      cudnn(CudaDnn.FORWARD, out, x, w, x.shape, w.shape, out.shape, pad, stride, groups);
      return;
    }
    int[] y = out.shape;
    int[] grid = {tiles((long) y[0] * y[2] * y[3]), tiles(w.shape[0] / groups), groups};
    launch(
        "dd_k_conv2d", grid, TILE_BLOCK, new Buf[] {out, x, w},
        conv(x.shape, w.shape, y, pad, stride, groups));
  }

  @Override
  public void conv2dBackwardData(
      Buf out, Buf g, Buf w, int groups, int[] inShape, int[] pad, int[] stride) {
    if (dnn != null) {
      cudnn(CudaDnn.DATA, out, g, w, inShape, w.shape, g.shape, pad, stride, groups);
      return;
    }
    int[] grid = {
      tiles((long) inShape[0] * inShape[2] * inShape[3]), tiles(inShape[1] / groups), groups
    };
    launch(
        "dd_k_conv2d_backward_data", grid, TILE_BLOCK, new Buf[] {out, g, w},
        conv(inShape, w.shape, g.shape, pad, stride, groups));
  }

  @Override
  public void conv2dBackwardFilter(
      Buf out, Buf x, Buf g, int groups, int[] pad, int[] stride, int[] wShape) {
    if (dnn != null) {
      cudnn(CudaDnn.FILTER, out, x, g, x.shape, wShape, g.shape, pad, stride, groups);
      return;
    }
    launch(
        "dd_k_conv2d_backward_filter", rows(out.numel()), THREADS, new Buf[] {out, x, g},
        conv(x.shape, wShape, g.shape, pad, stride, groups));
  }

  /** The pooling's sizes as library.cu takes them: NC H W OH OW KH KW SH SW PH PW. */
  private static Pointer[] pool(int[] x, int[] y, int[] kernel, int[] pad, int[] stride) {
    int[] v = {
      x[0] * x[1], x[2], x[3], y[2], y[3], kernel[0], kernel[1], stride[0], stride[1], pad[0], pad[1]
    };
    Pointer[] out = new Pointer[v.length];
    for (int k = 0; k < v.length; k++) {
      out[k] = i(v[k]);
    }
    return out;
  }

  /**
   * Runs a pooling, batch-norm, softmax or LRN call through cuDNN: the op's descriptors ({@code prepare}) made at
   * its first use (never captured), keyed by {@code key}, which forward and backward share. Returns
   * false where our kernel is to run instead: no cuDNN, or (under {@code auto}) a call cuDNN refused
   * at its first use; under {@code vendor} that refusal is an error.
   */
  private boolean dnn(
      String key, boolean backward, Supplier<CudaDnnOps.Op> prepare, Consumer<CudaDnnOps.Op> call) {
    if (dnn == null) {
      return false;
    }
    notAfterTheLoss();
    String which = key + (backward ? " backward" : " forward");
    Boolean took = taken.get(which);
    if (took != null) {
      if (took) {
        call.accept(ops.get(key));
      }
      return took;
    }
    if (capturing) {
      throw new NotCapturable("a cuDNN call is met for the first time");
    }
    try {
      CudaDnnOps.Op o = ops.get(key);
      if (o == null) {
        o = prepare.get();
        ops.put(key, o);
      }
      call.accept(o);
      taken.put(which, true);
      return true;
    } catch (IllegalStateException e) {
      if (strict) {
        throw new Device.Unavailable(
            "--kernels vendor: cuDNN refuses a call ("
                + e.getMessage()
                + "); --kernels auto runs our kernel there");
      }
      taken.put(which, false);
      // the device line, printed at start, could not know: say it once, where it happens
      System.err.println("note: cuDNN refuses " + which + " (" + e.getMessage() + "): our kernel runs it");
      return false;
    }
  }

  private static String key(String call, int[]... sizes) {
    StringBuilder b = new StringBuilder(call);
    for (int[] s : sizes) {
      b.append(Arrays.toString(s));
    }
    return b.toString();
  }

  @Override
  public void maxPool2d(Buf out, Buf x, int[] kernel, int[] pad, int[] stride) {
    int[] y = out.shape;
    if (dnn(
        key("maxPool", x.shape, y, kernel, pad, stride),
        false,
        () -> dnn.ops.pooling(CudaDnnOps.MAX_POOL, x.shape, y, kernel, pad, stride),
        o -> dnn.ops.forward(o, address(out), address(x)))) {
      return;
    }
    launch(
        "dd_k_max_pool2d", elements(out.numel()), THREADS, new Buf[] {out, x},
        pool(x.shape, out.shape, kernel, pad, stride));
  }

  @Override
  public void maxPool2dBackward(
      Buf out, Buf x, Buf y, Buf g, int[] kernel, int[] pad, int[] stride) {
    if (dnn(
        key("maxPool", x.shape, g.shape, kernel, pad, stride),
        true,
        () -> dnn.ops.pooling(CudaDnnOps.MAX_POOL, x.shape, g.shape, kernel, pad, stride),
        o -> dnn.ops.backward(o, address(out), address(x), address(y), address(g)))) {
      return;
    }
    launch(
        "dd_k_max_pool2d_backward", elements(out.numel()), THREADS, new Buf[] {out, x, y, g},
        pool(x.shape, g.shape, kernel, pad, stride));
  }

  @Override
  public void avgPool2d(Buf out, Buf x, int[] kernel, int[] pad, int[] stride) {
    int[] y = out.shape;
    if (dnn(
        key("avgPool", x.shape, y, kernel, pad, stride),
        false,
        () -> dnn.ops.pooling(CudaDnnOps.AVG_POOL, x.shape, y, kernel, pad, stride),
        o -> dnn.ops.forward(o, address(out), address(x)))) {
      return;
    }
    launch(
        "dd_k_avg_pool2d", elements(out.numel()), THREADS, new Buf[] {out, x},
        pool(x.shape, out.shape, kernel, pad, stride));
  }

  @Override
  public void avgPool2dBackward(
      Buf out, Buf g, int[] inShape, int[] kernel, int[] pad, int[] stride) {
    // cuDNN reads neither x nor y here: dx and dy stand for them (their sizes)
    if (dnn(
        key("avgPool", inShape, g.shape, kernel, pad, stride),
        true,
        () -> dnn.ops.pooling(CudaDnnOps.AVG_POOL, inShape, g.shape, kernel, pad, stride),
        o -> dnn.ops.backward(o, address(out), address(out), address(g), address(g)))) {
      return;
    }
    launch(
        "dd_k_avg_pool2d_backward", elements(out.numel()), THREADS, new Buf[] {out, g},
        pool(inShape, g.shape, kernel, pad, stride));
  }

  /** Softmax over axis 1 of [A, D, B]. */
  private void softmaxFamily(String kernel, Buf[] bufs, int[] shape, boolean logarithm) {
    int a = shape[0];
    int d = shape[1];
    int b = 1;
    for (int k = 2; k < shape.length; k++) {
      b *= shape[k];
    }
    launch(kernel, rows((long) a * b), THREADS, bufs, i(a), i(d), i(b), i(logarithm ? 1 : 0));
  }

  @Override
  public void maskedSoftmax(Buf out, Buf x, float scale, boolean causal, int period) {
    launch(
        "dd_k_masked_softmax", rows(x.shape[0]), THREADS, new Buf[] {out, x}, i(x.shape[0]),
        i(x.shape[1]), i(period), i(causal ? 1 : 0), Pointer.to(new float[] {scale}));
  }

  /** Softmax or log-softmax over axis 1 (forward: {@code g} null) through cuDNN, if it takes it. */
  private boolean dnnSoftmax(boolean log, Buf out, Buf x, Buf g) {
    int[] shape = x.shape;
    String key = key(log ? "logSoftmax" : "softmax", shape);
    if (g == null) {
      return dnn(
          key, false, () -> dnn.ops.softmax(log, shape), o -> dnn.ops.forward(o, address(out), address(x)));
    }
    return dnn(
        key,
        true,
        () -> dnn.ops.softmax(log, shape),
        o -> dnn.ops.backward(o, address(out), address(out), address(x), address(g)));
  }

  @Override
  public void softmax(Buf out, Buf x) {
    if (!dnnSoftmax(false, out, x, null)) {
      softmaxFamily("dd_k_softmax", new Buf[] {out, x}, x.shape, false);
    }
  }

  @Override
  public void logSoftmax(Buf out, Buf x) {
    if (!dnnSoftmax(true, out, x, null)) {
      softmaxFamily("dd_k_softmax", new Buf[] {out, x}, x.shape, true);
    }
  }

  @Override
  public void softmaxBackward(Buf out, Buf y, Buf g) {
    if (!dnnSoftmax(false, out, y, g)) {
      softmaxFamily("dd_k_softmax_backward", new Buf[] {out, y, g}, y.shape, false);
    }
  }

  @Override
  public void logSoftmaxBackward(Buf out, Buf y, Buf g) {
    if (!dnnSoftmax(true, out, y, g)) {
      softmaxFamily("dd_k_softmax_backward", new Buf[] {out, y, g}, y.shape, true);
    }
  }

  @Override
  public void softmaxCrossEntropy(Buf out, Buf x, Buf labels) {
    launch(
        "dd_k_softmax_cross_entropy", ONE, THREADS, new Buf[] {out, x, labels},
        i(x.shape[0]), i(x.shape[1]));
  }

  @Override
  public void softmaxCrossEntropyBackward(Buf out, Buf x, Buf labels, Buf g) {
    launch(
        "dd_k_softmax_cross_entropy_backward", rows(x.shape[0]), THREADS,
        new Buf[] {out, x, labels, g}, i(x.shape[0]), i(x.shape[1]));
  }

  @Override
  public void crossEntropy(Buf out, Buf p, Buf labels) {
    launch(
        "dd_k_cross_entropy", ONE, THREADS, new Buf[] {out, p, labels},
        i(p.shape[0]), i(p.shape[1]));
  }

  @Override
  public void crossEntropyBackward(Buf out, Buf p, Buf labels, Buf g) {
    launch(
        "dd_k_cross_entropy_backward", elements(p.numel()), THREADS,
        new Buf[] {out, p, labels, g}, i(p.shape[0]), i(p.shape[1]));
  }

  @Override
  public void argmax(Buf out, Buf x) {
    launch(
        "dd_k_argmax", elements(x.shape[0]), THREADS, new Buf[] {out, x},
        i(x.shape[0]), i(x.shape[1]));
  }

  @Override
  public void accuracy(Buf out, Buf x, Buf labels) {
    launch(
        "dd_k_accuracy", ONE, THREADS, new Buf[] {out, x, labels},
        i(x.shape[0]), i(x.shape[1]));
  }

  private static Pointer[] lrnSizes(int[] x, float alpha, float beta, float k, int size) {
    int hw = x[2] * x[3];
    return new Pointer[] {
      i(x[0]), i(x[1]), i(hw), i(size), Pointer.to(new float[] {k}),
      Pointer.to(new float[] {alpha}), Pointer.to(new float[] {beta})
    };
  }

  /**
   * The LRN (forward: {@code g} null) through cuDNN, if it takes it: an odd window alone, where
   * cuDNN's (which looks (size - 1) / 2 channels behind, size / 2 ahead) is ours; within cuDNN's
   * limits (window 1..16, k at least 1e-5, beta at least 0.01), as the registry's vendor rule
   * (deepdsl/ops/norm.py), so that {@code vendor} runs our kernel outside them too.
   */
  private boolean dnnLrn(Buf out, Buf x, Buf y, Buf g, float alpha, float beta, float k, int size) {
    if (size % 2 == 0 || size < 1 || size > 16 || k < 1e-5f || beta < 0.01f) {
      return false;
    }
    String key =
        key("lrn", x.shape, new int[] {size, Float.floatToIntBits(alpha), Float.floatToIntBits(beta),
            Float.floatToIntBits(k)});
    if (g == null) {
      return dnn(
          key,
          false,
          () -> dnn.ops.lrn(x.shape, size, alpha, beta, k),
          o -> dnn.ops.forward(o, address(out), address(x)));
    }
    return dnn(
        key,
        true,
        () -> dnn.ops.lrn(x.shape, size, alpha, beta, k),
        o -> dnn.ops.backward(o, address(out), address(x), address(y), address(g)));
  }

  @Override
  public void lrn(Buf out, Buf x, float alpha, float beta, float k, int size) {
    if (dnnLrn(out, x, null, null, alpha, beta, k, size)) {
      return;
    }
    launch(
        "dd_k_lrn", elements(out.numel()), THREADS, new Buf[] {out, x},
        lrnSizes(x.shape, alpha, beta, k, size));
  }

  @Override
  public void lrnBackward(
      Buf out, Buf x, Buf y, Buf g, float alpha, float beta, float k, int size) {
    if (dnnLrn(out, x, y, g, alpha, beta, k, size)) {
      return;
    }
    launch(
        "dd_k_lrn_backward", elements(out.numel()), THREADS, new Buf[] {out, x, y, g},
        lrnSizes(x.shape, alpha, beta, k, size));
  }

  @Override
  public void layerNormRows(Buf out, Buf x, float eps) {
    launch(
        "dd_k_layer_norm_rows", rows(x.shape[0]), THREADS, new Buf[] {out, x}, i(x.shape[0]),
        i(x.shape[1]), Pointer.to(new float[] {eps}));
  }

  @Override
  public void layerNormRowsBackward(Buf out, Buf x, Buf g, float eps) {
    launch(
        "dd_k_layer_norm_rows_backward", rows(x.shape[0]), THREADS, new Buf[] {out, x, g},
        i(x.shape[0]), i(x.shape[1]), Pointer.to(new float[] {eps}));
  }

  /**
   * The scratch grown to at least {@code bytes} (at a call's first use: never captured); the
   * smaller one stays allocated until close.
   */
  private void scratchOf(long bytes) {
    if (bytes > scratchBytes) {
      scratch = alloc(bytes);
      scratchBytes = bytes;
    }
  }

  /** Below this eps (an older cuDNN's CUDNN_BN_MIN_EPSILON) batch norm is our kernel. */
  private static final float BN_MIN_EPSILON = 1e-5f;

  /**
   * A batch-norm call through cuDNN where it takes it: eps passed as the double its shortest
   * decimal names (1e-5f widened is 0.0000099999997, under cuDNN's minimum), as the Python runner's
   * attribute.
   */
  private boolean dnnBatchNorm(
      Buf x, boolean backward, float eps, BiConsumer<CudaDnnOps.Op, Double> call) {
    if (eps < BN_MIN_EPSILON) {
      return false;
    }
    double e = Rng.shortestDecimal(eps);
    String key = key("batch_norm", x.shape);
    return dnn(key, backward, () -> dnn.ops.batchNorm(x.shape), o -> call.accept(o, e));
  }

  /** Our per-channel batch-norm kernel over x [N, C, ...] (the second of {@code bufs}). */
  private void perChannel(String kernel, Buf[] bufs, float eps) {
    int[] x = bufs[1].shape;
    int n = bufs[0].numel();
    launch(
        kernel, elements(n), THREADS, bufs, i(n), i(x[1]), i(n / (x[0] * x[1])),
        Pointer.to(new float[] {eps}));
  }

  @Override
  public void bnApply(Buf out, Buf x, Buf mean, Buf var, Buf gamma, Buf beta, float eps) {
    if (!dnnBatchNorm(
        x,
        false,
        eps,
        (o, e) ->
            dnn.ops.batchNormForward(
                o, address(out), address(x), address(mean), address(var), address(gamma),
                address(beta), e))) {
      perChannel("dd_k_bn_apply", new Buf[] {out, x, mean, var, gamma, beta}, eps);
    }
  }

  @Override
  public void bnTrainBackward(
      Buf out, Buf x, Buf g, Buf mean, Buf var, Buf gamma, Buf gammaGrad, Buf betaGrad, float eps) {
    int channels = x.shape[1];
    if (!dnnBatchNorm(
        x,
        true,
        eps,
        (o, e) -> {
          // the scale's and shift's gradients, which cuDNN makes too: grown at the call's first use,
          // which is never captured
          scratchOf(8L * channels);
          dnn.ops.batchNormBackward(
              o, address(out), address(x), address(g), address(gamma),
              ((DevicePointer) scratch).address(), channels, e);
        })) {
      perChannel(
          "dd_k_bn_train_backward", new Buf[] {out, x, g, mean, var, gamma, gammaGrad, betaGrad}, eps);
    }
  }

  @Override
  public void dropoutMask(Buf out, long step, float p, long seed, String site) {
    double threshold = Rng.shortestDecimal(p);
    float keep = (float) (1.0 / (1.0 - threshold));
    int n = out.numel();
    if (step != counterValue) { // a train step's counter is sent before it (a graph's too)
      if (capturing) {
        throw new NotCapturable("it draws dropout masks for another step than its own");
      }
      sendCounter(step);
    }
    launch(
        "dd_k_dropout_mask", elements(n), THREADS, new Buf[] {out},
        Pointer.to(counter), i(n),
        Pointer.to(new long[] {Rng.streamSeed(site + "#dropout", seed)}),
        Pointer.to(new double[] {threshold}), Pointer.to(new float[] {keep}));
  }

  private void sendCounter(long step) {
    cuMemcpyHtoD(counter, Pointer.to(new long[] {step}), Sizeof.LONG);
    counterValue = step;
  }

  private void upload(CUdeviceptr to, Buf b) {
    cuMemcpyHtoD(
        to,
        Pointer.to(b.a).withByteOffset((long) b.off * Sizeof.FLOAT),
        (long) b.numel() * Sizeof.FLOAT);
  }

  private void download(CUdeviceptr from, Buf b) {
    cuMemcpyDtoH(
        Pointer.to(b.a).withByteOffset((long) b.off * Sizeof.FLOAT),
        from,
        (long) b.numel() * Sizeof.FLOAT);
  }

  private void measure() {
    long[] free = {0};
    long[] total = {0};
    cuMemGetInfo(free, total);
    freeLow = Math.min(freeLow, free[0]);
  }

  /** Sends the batch (every input, every label as int64 class ids), the settings and the rate. */
  private void sendBatch(Network net) {
    cuMemcpyHtoD(settingsOnGpu, Pointer.to(settingValues), (long) settingValues.length * Sizeof.FLOAT);
    if (rate != null) {
      upload(rate, net.rateBuffer());
    }
    net.batchByName()
        .forEach(
            (name, b) -> {
              long[] values = labelValues.get(name);
              if (values == null) {
                upload(batch.get(name), b);
                return;
              }
              for (int i = 0; i < values.length; i++) {
                values[i] = (long) b.a[b.off + i];
              }
              cuMemcpyHtoD(batch.get(name), Pointer.to(values), (long) values.length * Sizeof.LONG);
            });
  }

  @Override
  public float trainStep(Network net) {
    sendBatch(net);
    sendCounter(net.iteration); // the step the dropout masks are drawn for
    boolean warmUp = trainSteps++ == 0;
    if (warmUp || !graphChoice.equals("on")) {
      return net.trainStep();
    }
    if (replay == null) {
      String why = capture(net);
      if (why != null) { // nothing of the step ran: it runs now, and from now on, call for call
        graphChoice = "off (" + why + ")";
        return net.trainStep();
      }
    }
    cuGraphLaunch(replay, stream);
    return scalar(capturedLoss); // on the default stream: after the replay
  }

  /**
   * Captures one train step from the device's stream as a graph, instantiated for replay; returns
   * null, or why the step cannot be a graph (then nothing of it has run).
   */
  private String capture(Network net) {
    graph = new CUgraph();
    cuStreamBeginCapture(stream, CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    capturing = true;
    String why = null;
    try {
      net.trainStep();
      if (capturedLoss == null) {
        why = "the step reads no loss";
      }
    } catch (NotCapturable e) {
      why = "the step " + e.getMessage();
    } finally {
      capturing = false;
      cuStreamEndCapture(stream, graph);
    }
    if (why != null) {
      cuGraphDestroy(graph);
      graph = null;
      capturedLoss = null;
      return why;
    }
    replay = new CUgraphExec();
    cuGraphInstantiate(replay, graph, 0);
    return null;
  }

  @Override
  public float evalStep(Network net) {
    sendBatch(net);
    return net.evalStep();
  }

  @Override
  public Buf inferStep(Network net) {
    sendBatch(net);
    return net.inferStep();
  }

  @Override
  public void toHost(Network net) {
    cuCtxSynchronize();
    net.tensorsByName().forEach((name, b) -> download(tensors.get(name), b));
  }

  @Override
  public void toDevice(Network net) {
    net.tensorsByName().forEach((name, b) -> upload(tensors.get(name), b));
  }

  @Override
  public long measuredBytes() {
    measure();
    return freeBefore - freeLow;
  }

  @Override
  public void close() {
    if (replay != null) {
      cuGraphExecDestroy(replay);
      cuGraphDestroy(graph);
    }
    for (CUdeviceptr p : allocations) {
      cuMemFree(p);
    }
    allocations.clear();
    if (blas != null) {
      blas.close();
    }
    if (dnn != null) {
      dnn.close();
    }
    cuStreamDestroy(stream);
    cuModuleUnload(module);
    cuDevicePrimaryCtxRelease(gpu);
  }
}
