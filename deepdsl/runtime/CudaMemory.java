package deepdsl.runtime;

import static jcuda.driver.JCudaDriver.cuCtxSynchronize;
import static jcuda.driver.JCudaDriver.cuLaunchKernel;
import static jcuda.driver.JCudaDriver.cuMemAlloc;
import static jcuda.driver.JCudaDriver.cuMemFree;
import static jcuda.driver.JCudaDriver.cuMemGetInfo;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoDAsync;
import static jcuda.driver.JCudaDriver.cuMemcpyDtoH;
import static jcuda.driver.JCudaDriver.cuMemcpyHtoD;
import static jcuda.driver.JCudaDriver.cuModuleGetFunction;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import jcuda.Pointer;
import jcuda.Sizeof;
import jcuda.driver.CUdevice;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUfunction;
import jcuda.driver.CUmodule;
import jcuda.driver.CUstream;

/**
 * The CUDA device's memory and launches ({@link CudaDevice} extends it with the library ops and the
 * graph capture): the GPU, its module of kernels, one device copy of every tensor found by its host
 * array, launches on the device's one stream, and the transfers of the batch, settings and
 * parameters. While the train step is being captured as a graph ({@code capturing}), what cannot
 * be part of a graph throws {@link NotCapturable}.
 */
abstract class CudaMemory implements Device {

  final Network.Settings settings;
  final CUdevice gpu = new CUdevice();
  String gpuName; // set by the device's constructor
  long gpuBytes;
  final long workspaceLimit;
  final CUmodule module = new CUmodule();
  final Map<String, CUfunction> functions = new HashMap<>();
  final List<CUdeviceptr> allocations = new ArrayList<>();
  final Map<String, CUdeviceptr> tensors = new HashMap<>();
  // the host array of a step's tensor -> where its elements are on the GPU
  final Map<float[], CUdeviceptr> places = new IdentityHashMap<>();
  final Map<int[], Buf> hostCopies = new IdentityHashMap<>();
  CUdeviceptr arena;
  // every input and label by name; a label's host array -> its int64 values and where they are on the GPU
  final Map<String, CUdeviceptr> batch = new LinkedHashMap<>();
  final Map<float[], CUdeviceptr> labels = new IdentityHashMap<>();
  final Map<String, long[]> labelValues = new HashMap<>();
  CUdeviceptr rate; // the learning rate of a schedule (the step's opt/lr input)
  // the multi-tensor launches' tables, one allocation of the bytes the class's settings give, and how much of it
  // the tables written so far take
  CUdeviceptr tables;
  long tablesUsed;
  CUdeviceptr counter; // the step counter a dropout mask is drawn for
  float[] settingValues; // the settings the kernels read (lr, ...), sent before each step
  CUdeviceptr settingsOnGpu;
  long freeBefore;
  long freeLow = Long.MAX_VALUE;
  final Stream stream = new Stream();
  long counterValue = -1; // the step counter's value on the GPU
  boolean capturing;
  CUdeviceptr capturedLoss; // where the captured step leaves its loss

  // cuDNN's one shared workspace: the most any chosen algorithm (or a batch norm's backward) needs; replaced by a
  // larger one where a later first call needs more, the smaller freed (never while capturing)
  CUdeviceptr scratch;
  long scratchBytes;
  private CUdeviceptr trial; // Find's temporary scratch, freed after each search
  private long trialBytes;

  CudaMemory(Network.Settings settings, long workspaceLimit) {
    this.settings = settings;
    this.workspaceLimit = workspaceLimit;
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

  CUdeviceptr alloc(long bytes) {
    CUdeviceptr p = new DevicePointer();
    cuMemAlloc(p, Math.max(bytes, 4));
    allocations.add(p);
    sizes.put(p, Math.max(bytes, 4));
    allocatedBytes += Math.max(bytes, 4);
    return p;
  }

  // what each allocation took, and all of them now
  private final Map<CUdeviceptr, Long> sizes = new IdentityHashMap<>();
  long allocatedBytes;
  // what the start allocated: the plan's arena, every tensor, the batch, the step counter and settings the
  // kernels read, the multi-tensor launches' tables (and, with micro-batches, the buckets' accumulators, at the
  // first step); all the device takes but cuDNN's shared scratch
  long plannedBytes;

  @Override
  public void attach(Network net) {
    long[] free = {0};
    long[] total = {0};
    cuMemGetInfo(free, total);
    freeBefore = free[0];
    long need = settings.arenaBytes + Sizeof.LONG + settings.tableBytes;
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
    if (settings.tableBytes > 0) { // written at each launch's first run (CudaDevice.runMulti)
      tables = alloc(settings.tableBytes);
    }
    settingValues = net.settingValues();
    settingsOnGpu = alloc((long) settingValues.length * Sizeof.FLOAT);
    places.put(settingValues, settingsOnGpu);
    toDevice(net);
    plannedBytes = allocatedBytes;
    measure();
  }

  CUfunction function(String kernel) {
    return functions.computeIfAbsent(
        kernel,
        k -> {
          CUfunction f = new CUfunction();
          cuModuleGetFunction(f, module, k);
          return f;
        });
  }

  /** Where the elements of {@code b} are on the GPU. */
  CUdeviceptr pointer(Buf b) {
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
  static final class NotCapturable extends RuntimeException {
    NotCapturable(String why) {
      super(why, null, false, false);
    }
  }

  void notAfterTheLoss() {
    if (capturing && capturedLoss != null) {
      throw new NotCapturable("it launches work after reading its loss");
    }
  }

  static Pointer i(int v) {
    return Pointer.to(new int[] {v});
  }

  /** Launches {@code kernel} as grid x block, its arguments the tensors then the sizes. */
  void launch(String kernel, int[] grid, int[] block, Buf[] bufs, Pointer... sizes) {
    notAfterTheLoss();
    if (kernel.startsWith("dd_k_")) {
      kernel = typedEntry(kernel, bufs);
    }
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

  /**
   * A library entry of NAME.cu as a launch with {@code bufs} finds it: the entry itself where no
   * tensor is bf16, else its typed form (deepdsl/backends/java/bf16.py), named after each tensor's
   * storage in order, {@code h} bf16 and {@code f} otherwise: {@code dd_k_max_pool2d_hh}.
   */
  static String typedEntry(String kernel, Buf[] bufs) {
    StringBuilder codes = new StringBuilder();
    boolean any = false;
    for (Buf b : bufs) {
      codes.append(b.bf16 ? 'h' : 'f');
      any |= b.bf16;
    }
    return any ? kernel + "_" + codes : kernel;
  }

  static final int BLOCK = 256;
  static final int TILE = 16;
  static final int MAX_GRID = 1 << 16;

  /** One thread an element of {@code n}, in a grid-stride loop. */
  static int[] elements(long n) {
    return new int[] {(int) Math.max(1, Math.min(MAX_GRID, (n + BLOCK - 1) / BLOCK)), 1, 1};
  }

  /** One block a row of {@code rows}, in a block-stride loop. */
  static int[] rows(long rows) {
    return new int[] {(int) Math.max(1, Math.min(MAX_GRID, rows)), 1, 1};
  }

  static final int[] THREADS = {BLOCK, 1, 1};
  static final int[] TILE_BLOCK = {TILE, TILE, 1};
  static final int[] ONE = {1, 1, 1};

  // the block tile of our register-tiled GEMMs and convolutions (library.cu dd_tiled: DD_BM x DD_BN)
  static final int TILE_M = 64;
  static final int TILE_N = 128;

  /** The tiles of {@code size} that cover {@code n}. */
  static int tiles(long n, int size) {
    return (int) ((n + size - 1) / size);
  }

  /**
   * The slices our filter gradient splits its reduction over N*OH*OW into: enough blocks of 64x128
   * weights to fill a GPU ({@code SPLIT_BLOCKS}), each slice at least {@code SPLIT_MIN} long (as
   * deepdsl/ops/conv.py's filter_gradient_splits, which sizes the Python runner's planned scratch).
   */
  static int splits(int filters, int cols, int groups, long reduction) {
    long tiles = (long) tiles(filters, TILE_M) * tiles(cols, TILE_N) * groups;
    long wanted = (SPLIT_BLOCKS + tiles - 1) / tiles;
    return (int) Math.max(1, Math.min(wanted, reduction / SPLIT_MIN));
  }

  static final int SPLIT_BLOCKS = 528;
  static final int SPLIT_MIN = 256;

  // ---- the step's operations ----

  @Override
  public void run(Kernel k, Buf... args) {
    int n = args[0].numel();
    int[] block = {k.block, 1, 1};
    if (k.launch == Kernel.Launch.ELEMENTS) { // a thread an element, or four where the kernel takes float4s
      launch(k.name, elements(k.float4 && fourAtATime(n, args) ? n / 4 : n), block, args, i(n));
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

  /**
   * Whether a kernel with a float4 loop takes it for these tensors, as the kernel decides: {@code n}
   * a multiple of 4 and every tensor of {@code n} elements 16-byte aligned on the GPU (a scalar
   * input's one value needs none). Only the grid depends on it: either loop strides over the rest.
   */
  boolean fourAtATime(int n, Buf[] args) {
    if (n % 4 != 0) {
      return false;
    }
    for (Buf b : args) {
      if (b.numel() == n && (labels.containsKey(b.a) || address(b) % 16 != 0)) {
        return false;
      }
    }
    return true;
  }

  /** Data parallelism: the bucket packed on the GPU (entries.cu's dd_k_dp_pack), a launch a tensor. */
  @Override
  public void pack(Buf out, Buf scale, Buf... parts) {
    int at = 0;
    for (Buf p : parts) {
      Buf into = new Buf(out.a, out.off + at, p.numel());
      launch("dd_k_dp_pack", elements(p.numel()), THREADS, new Buf[] {into, p, scale}, i(p.numel()));
      at += p.numel();
    }
  }

  /**
   * Micro-batches: micro-batch 0's bucket copied into its accumulator, each later one added (entries.cu's
   * dd_k_dp_accumulate: {@code sum[e] = sum[e] + x[e]}, one float32 add in micro-batch order, as the CPU device,
   * the PyCUDA runner and the NumPy runner do); at the wait the sum is copied back into the bucket.
   */
  @Override
  public void accumulate(Buf sum, Buf x, boolean first) {
    if (first) {
      copy(x, sum);
      return;
    }
    launch("dd_k_dp_accumulate", elements(x.numel()), THREADS, new Buf[] {sum, x}, i(x.numel()));
  }

  /**
   * A bucket's accumulator on the GPU, allocated at the first step's pack of the bucket (never while capturing:
   * a run of micro-batches is not captured) and counted with what the start allocated ({@code plannedBytes}, the
   * --json's gpu_planned_bytes) as in the measured gpu_memory_bytes. Its host array is only the key of where it is.
   */
  @Override
  public Buf accumulator(int numel) {
    if (capturing) {
      throw new NotCapturable("it allocates a micro-batch accumulator");
    }
    CUdeviceptr p = alloc((long) numel * Sizeof.FLOAT);
    plannedBytes += (long) numel * Sizeof.FLOAT;
    Buf b = new Buf(new float[0], 0, numel);
    places.put(b.a, p);
    return b;
  }

  /**
   * The tables of the multi-tensor launches, written to the GPU once each, by their contents: each in the one
   * allocation the class's settings size ({@code tables}: what the generated class's launches need), so that the
   * device allocates nothing the plan does not count.
   */
  private final Map<List<Long>, CUdeviceptr> multiTables = new HashMap<>();

  @Override
  public void runMulti(MultiKernel m, int[] kinds, Buf[][] segments) {
    long[] t = m.table(kinds, segments, this::address);
    List<Long> key = new ArrayList<>(t.length + 1);
    key.add((long) m.name.hashCode());
    for (long v : t) {
      key.add(v);
    }
    CUdeviceptr table = multiTables.get(key);
    if (table == null) {
      if (capturing) { // written in the warm-up step; a capture cannot copy from the host
        throw new NotCapturable("a multi-tensor launch's table is not on the GPU yet");
      }
      long bytes = (long) t.length * Sizeof.LONG;
      if (tables == null || tablesUsed + bytes > settings.tableBytes) {
        throw new IllegalStateException(
            "a multi-tensor launch's table of " + bytes + " bytes beyond the " + settings.tableBytes
                + " the class's settings give the tables (" + tablesUsed + " taken)");
      }
      table = tables.withByteOffset(tablesUsed);
      tablesUsed += bytes;
      cuMemcpyHtoD(table, Pointer.to(t), bytes);
      multiTables.put(key, table);
    }
    notAfterTheLoss();
    Pointer[] args = {Pointer.to(table)};
    cuLaunchKernel(
        function(m.name),
        MultiKernel.grid(segments),
        1,
        1,
        MultiKernel.BLOCK,
        1,
        1,
        0,
        stream,
        Pointer.to(args),
        null);
  }

  /**
   * A reduction pass: one launch, its partial sums on a 2-D grid into the pass's scratch of the arena and the last
   * block to finish adding them in slice order (or each block its outputs, where one slice covers the range), the
   * kernel and launch shape the PyCUDA runner uses; the buffers in the kernel's order.
   */
  @Override
  public boolean pass(ReductionPass p, Buf... args) {
    if (args.length != p.buffers()) {
      throw new IllegalArgumentException(p + " takes " + p.buffers() + " buffers, not " + args.length);
    }
    launch(p.kernel, p.grid, p.block, args);
    return true;
  }

  @Override
  public void copy(Buf from, Buf to) {
    notAfterTheLoss();
    cuMemcpyDtoDAsync(pointer(to), pointer(from), (long) to.numel() * to.elementBytes(), stream);
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

  static float scalar(CUdeviceptr p) {
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
    if (b.bf16) { // a bf16 output (--precision bf16) comes back widened to float32
      short[] bits = new short[b.numel()];
      cuMemcpyDtoH(Pointer.to(bits), pointer(b), (long) bits.length * 2);
      for (int k = 0; k < bits.length; k++) {
        host.a[k] = Float.intBitsToFloat((bits[k] & 0xFFFF) << 16);
      }
      return host;
    }
    download(pointer(b), host);
    return host;
  }

  /** The device address of a float tensor of the step, for cuBLAS. */
  long address(Buf b) {
    pointer(b); // a tensor on the host only is reported as for a kernel
    return ((DevicePointer) places.get(b.a)).address() + (long) b.off * Sizeof.FLOAT;
  }

  void sendCounter(long step) {
    cuMemcpyHtoD(counter, Pointer.to(new long[] {step}), Sizeof.LONG);
    counterValue = step;
  }

  void upload(CUdeviceptr to, Buf b) {
    cuMemcpyHtoD(
        to,
        Pointer.to(b.a).withByteOffset((long) b.off * Sizeof.FLOAT),
        (long) b.numel() * Sizeof.FLOAT);
  }

  void download(CUdeviceptr from, Buf b) {
    cuMemcpyDtoH(
        Pointer.to(b.a).withByteOffset((long) b.off * Sizeof.FLOAT),
        from,
        (long) b.numel() * Sizeof.FLOAT);
  }

  void measure() {
    long[] free = {0};
    long[] total = {0};
    cuMemGetInfo(free, total);
    freeLow = Math.min(freeLow, free[0]);
  }

  /** Sends the batch (every input, every label as int64 class ids), the settings and the rate. */
  void sendBatch(Network net) {
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

  /**
   * The one shared scratch grown to at least {@code bytes} (at a call's first use: never captured):
   * the smaller one freed once the stream's work that may use it is done, a larger one allocated.
   */
  void scratchOf(long bytes) {
    if (bytes > scratchBytes) {
      if (scratch != null) {
        release(scratch);
      }
      scratch = alloc(bytes);
      scratchBytes = bytes;
    }
  }

  /** Find's temporary scratch of at least {@code bytes}: its address. */
  long trialOf(long bytes) {
    if (bytes > trialBytes) {
      freeTrial();
      trial = alloc(bytes);
      trialBytes = bytes;
    }
    return ((DevicePointer) trial).address();
  }

  void freeTrial() {
    if (trial != null) {
      release(trial);
      trial = null;
      trialBytes = 0;
    }
  }

  /** Frees {@code p} after the work queued on the GPU, which may still use it, is done. */
  private void release(CUdeviceptr p) {
    cuCtxSynchronize();
    cuMemFree(p);
    allocations.remove(p);
    allocatedBytes -= sizes.remove(p);
  }
}
