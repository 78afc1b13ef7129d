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
import static jcuda.driver.JCudaDriver.cuLaunchKernel;
import static jcuda.driver.JCudaDriver.cuMemAlloc;
import static jcuda.driver.JCudaDriver.cuMemFree;
import static jcuda.driver.JCudaDriver.cuMemGetInfo;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoD;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;
import static jcuda.driver.JCudaDriver.cuModuleGetFunction;
import static jcuda.driver.JCudaDriver.cuModuleLoadData;
import static jcuda.driver.JCudaDriver.cuModuleUnload;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import jcuda.Pointer;
import jcuda.Sizeof;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdevice;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUfunction;
import jcuda.driver.CUmodule;
import jcuda.driver.JCudaDriver;
import jcuda.nvrtc.JNvrtc;
import jcuda.nvrtc.nvrtcProgram;

/**
 * The CUDA device on JCuda 12.6's driver API: GPU 0, one arena of the plan's size allocated once,
 * one device copy of every parameter, state and input tensor, and the network's kernels launched
 * as its {@link Kernels} tables say. Parameters stay on the GPU between steps; a save brings them
 * back, a load sends them there.
 *
 * <p>The kernels come from the class path: {@code NAME.sm_XY.ptx} for the GPU's architecture (or
 * the newest older one, which the driver compiles forward), written by {@code deepdsl compile
 * --ptx}; else {@code NAME.cu}, compiled here with NVRTC (which then must be installed: {@code
 * libnvrtc.so.12}). The device says at start which it used. It needs only {@code libcuda.so.1}
 * otherwise: no cuBLAS or cuDNN (JCublas 12.6 binds {@code libcublas.so.12}, which CUDA 13 stacks
 * lack), every op is one of our kernels.
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
  private final List<CUdeviceptr> allocations = new ArrayList<>();
  private final Map<String, CUdeviceptr> tensors = new LinkedHashMap<>();
  private CUdeviceptr arena;
  private final Map<String, CUdeviceptr> batch = new LinkedHashMap<>(); // every input and label
  private final Map<String, long[]> labelValues = new HashMap<>();
  private CUdeviceptr counter;
  private CUdeviceptr rate; // the learning rate of a schedule
  private Program train;
  private Program infer;
  private Program eval;
  private long freeBefore;
  private long freeLow = Long.MAX_VALUE;

  /** A step ready to launch: each kernel with its argument pointers resolved once. */
  private record Program(
      CUfunction[] kernels,
      int[][] shapes,
      Pointer[] params,
      List<Kernels.Copy> copies,
      CUdeviceptr result,
      Buf host) {}

  /**
   * Starts the driver on GPU 0 and loads the network's kernels.
   *
   * @throws Device.Unavailable when there is no GPU, or no kernels for it
   */
  public CudaDevice(Network.Settings settings, long workspaceLimit) {
    this.settings = settings;
    this.workspaceLimit = workspaceLimit;
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
    cuCtxSetCurrent(context);
    try {
      kernelSource = loadModule();
    } catch (RuntimeException e) {
      cuDevicePrimaryCtxRelease(gpu); // no kernels: the program runs elsewhere or not at all
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
        + "; workspace limit "
        + workspaceLimit
        + " bytes)";
  }

  private CUdeviceptr alloc(long bytes) {
    CUdeviceptr p = new CUdeviceptr();
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
    net.tensorsByName().forEach((name, b) -> tensors.put(name, alloc((long) b.numel() * 4)));
    net.batchByName()
        .forEach(
            (name, b) -> {
              boolean label = net.isLabel(name);
              batch.put(name, alloc((long) b.numel() * (label ? Sizeof.LONG : Sizeof.FLOAT)));
              if (label) {
                labelValues.put(name, new long[b.numel()]);
              }
            });
    counter = alloc(Sizeof.LONG);
    rate = alloc(Sizeof.FLOAT);
    toDevice(net);
    train = resolve(settings.trainKernels.get());
    infer = settings.inferKernels != null ? resolve(settings.inferKernels.get()) : null;
    eval = settings.evalKernels != null ? resolve(settings.evalKernels.get()) : null;
    measure();
  }

  private Program resolve(Kernels k) {
    List<Kernels.Launch> launches = k.launches();
    CUfunction[] kernels = new CUfunction[launches.size()];
    int[][] shapes = new int[launches.size()][];
    Pointer[] params = new Pointer[launches.size()];
    for (int i = 0; i < kernels.length; i++) {
      Kernels.Launch x = launches.get(i);
      kernels[i] = functions.computeIfAbsent(x.kernel(), this::function);
      int[] grid = x.grid();
      int[] block = x.block();
      shapes[i] = new int[] {grid[0], grid[1], grid[2], block[0], block[1], block[2]};
      Pointer[] args = new Pointer[x.args().length];
      for (int j = 0; j < args.length; j++) {
        args[j] = Pointer.to(pointer(x.args()[j]));
      }
      params[i] = Pointer.to(args);
    }
    Buf host = k.resultShape().length > 0 ? Buf.zeros(k.resultShape()) : Buf.zeros(1);
    return new Program(kernels, shapes, params, k.copies(), pointer(k.result()), host);
  }

  private CUfunction function(String kernel) {
    CUfunction f = new CUfunction();
    cuModuleGetFunction(f, module, kernel);
    return f;
  }

  private CUdeviceptr pointer(Kernels.Arg a) {
    return switch (a.storage()) {
      case ARENA -> arena.withByteOffset(a.offset());
      case TENSOR -> tensor(a.tensor());
      case INPUT -> batch(a.tensor());
      case STEP -> counter;
      case RATE -> rate;
    };
  }

  private CUdeviceptr batch(String name) {
    CUdeviceptr p = batch.get(name);
    if (p == null) {
      throw new IllegalStateException(
          "the kernels use an input '" + name + "' that the network does not have");
    }
    return p;
  }

  /** Uploads every input (floats) and label (as int64 class ids). */
  private void uploadBatch(Network net) {
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

  private CUdeviceptr tensor(String name) {
    CUdeviceptr p = tensors.get(name);
    if (p == null) {
      throw new IllegalStateException(
          "the kernels use a tensor '" + name + "' that the network does not have");
    }
    return p;
  }

  private void run(Program p) {
    for (int i = 0; i < p.kernels.length; i++) {
      int[] s = p.shapes[i];
      cuLaunchKernel(p.kernels[i], s[0], s[1], s[2], s[3], s[4], s[5], 0, null, p.params[i], null);
    }
    for (Kernels.Copy c : p.copies) {
      cuMemcpyDtoD(tensor(c.tensor()), pointer(c.from()), c.bytes());
    }
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

  @Override
  public float trainStep(Network net) {
    uploadBatch(net);
    if (net.rateBuffer() != null) {
      upload(rate, net.rateBuffer());
    }
    cuMemcpyHtoD(counter, Pointer.to(new long[] {net.iteration}), Sizeof.LONG);
    run(train);
    download(train.result, train.host);
    return train.host.a[0];
  }

  @Override
  public float evalStep(Network net) {
    uploadBatch(net);
    run(eval);
    download(eval.result, eval.host);
    return eval.host.a[0];
  }

  @Override
  public Buf inferStep(Network net) {
    if (infer == null) {
      return null;
    }
    uploadBatch(net);
    run(infer);
    download(infer.result, infer.host);
    return infer.host;
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
    for (CUdeviceptr p : allocations) {
      cuMemFree(p);
    }
    allocations.clear();
    cuModuleUnload(module);
    cuDevicePrimaryCtxRelease(gpu);
  }
}
