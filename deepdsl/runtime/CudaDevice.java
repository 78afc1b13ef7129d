package deepdsl.runtime;

import static jcuda.driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
import static jcuda.driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR;
import static jcuda.driver.JCudaDriver.cuCtxSetCurrent;
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
import static jcuda.driver.JCudaDriver.cuMemFree;
import static jcuda.driver.JCudaDriver.cuModuleUnload;
import static jcuda.driver.JCudaDriver.cuStreamBeginCapture;
import static jcuda.driver.JCudaDriver.cuStreamCreate;
import static jcuda.driver.JCudaDriver.cuStreamDestroy;
import static jcuda.driver.JCudaDriver.cuStreamEndCapture;

import java.nio.charset.StandardCharsets;
import jcuda.driver.CUcontext;
import jcuda.driver.CUdeviceptr;
import jcuda.driver.CUgraph;
import jcuda.driver.CUgraphExec;
import jcuda.driver.CUstreamCaptureMode;
import jcuda.driver.JCudaDriver;

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
 * <p>The device is three classes by family: {@link CudaMemory} (the GPU's memory, where each tensor
 * lives there, launches and transfers), {@link CudaLibrary} (the library ops: cuBLAS, cuDNN or our
 * kernels) and this one (starting the driver and the libraries, the device line, the train step's
 * graph capture and replay); {@link CudaModule} loads the kernels.
 *
 * <p>Only {@link Device#open} creates it, by reflection.
 */
public final class CudaDevice extends CudaLibrary {
  private final int arch;
  private final String kernelSource;
  private final String gemms; // who computes the GEMMs, for the device line
  private final String convolutions; // who computes them, for the device line
  private String graphChoice; // "on", or "off (why)", for the device line
  private int trainSteps; // the steps trained so far: the first is the warm-up, never captured
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
    super(settings, workspaceLimit, kernels.equals("vendor"));
    JCudaDriver.setExceptionsEnabled(true);
    cuInit(0);
    int[] count = {0};
    cuDeviceGetCount(count);
    if (count[0] == 0) {
      throw new Device.Unavailable("no CUDA GPU found");
    }
    int ordinal = Integer.getInteger(DataParallel.GPU_PROPERTY, 0); // a data-parallel rank's: its local rank's
    if (ordinal < 0 || ordinal >= count[0]) {
      throw new Device.Unavailable(
          "GPU " + ordinal + " (" + DataParallel.GPU_PROPERTY + ", a rank's local rank) is not among this machine's "
              + count[0] + " GPU" + (count[0] == 1 ? "" : "s"));
    }
    cuDeviceGet(gpu, ordinal);
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
    if (settings.precision.equals("bf16") && arch < 80) { // as the PyCUDA runner's check
      throw new Device.Unavailable(
          "--precision bf16 needs bf16 tensor cores (compute capability 8.0 or newer); GPU "
              + ordinal + " has compute capability " + major[0] + "." + minor[0]
              + ": compile the network with --precision fp32 or tf32 to run it there");
    }
    long[] total = {0};
    cuDeviceTotalMem(total, gpu);
    gpuName = new String(name, 0, end, StandardCharsets.UTF_8) + " (sm_" + arch + ")";
    gpuBytes = total[0];
    CUcontext context = new CUcontext();
    cuDevicePrimaryCtxRetain(context, gpu);
    cuCtxSetCurrent(context); // the primary context: the one cuBLAS (the runtime API) works in
    try {
      kernelSource = CudaModule.load(module, settings.name, arch);
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
      if (vendor != null && settings.precision.equals("tf32")) {
        vendor.setTf32();
        why += ", TF32";
      } else if (vendor != null && settings.precision.equals("bf16")) {
        vendor.setTf32(); // a bf16 program's float32 GEMMs in TF32 too, as the PyCUDA runner's
        why += ", GemmEx on bf16 operands, TF32";
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
      if (library != null && settings.precision.equals("tf32")) {
        library.setTf32();
        why += ", TF32";
      } else if (library != null && settings.precision.equals("bf16")) {
        library.setTf32(); // the float32 convolutions of a bf16 program in TF32 too, as the PyCUDA runner's
        why += ", bf16 convolutions, TF32";
      }
      dnn = library;
      convolutions = why;
      graphChoice = graphs ? "on" : "off (--no-graph)";
    } catch (RuntimeException e) {
      cuDevicePrimaryCtxRelease(gpu); // the program runs elsewhere or not at all
      throw e;
    }
  }

  @Override
  public String name() {
    return "cuda";
  }

  @Override
  public String precision(String asked) {
    // tf32: cuBLAS and cuDNN in TF32 tensor-op math (set at start), our kernels fp32; bf16: the plan's
    // bf16 values in bf16 (our kernels' dd_bf16, cublasGemmEx, cuDNN's bf16 convolutions)
    return asked;
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
        + " bytes"
        + (dnn == null
            ? ""
            : settings.deterministic
                ? "; convolution algorithms: cuDNN's heuristic, deterministic (--deterministic)"
                : "; convolution algorithms: the fastest cuDNN finds at their first call")
        + "; graph: "
        + graphChoice
        + ")";
  }

  /**
   * The --json fields: the library ops' (cuDNN's scratch, its algorithms), then {@code gpu_graph}: "on",
   * or "off (why)" (--no-graph, or the capture that failed), as the device line says at the end.
   */
  @Override
  public String jsonFields() {
    String quoted =
        graphChoice
            .replace("\\", "\\\\")
            .replace("\"", "\\\"")
            .replaceAll("[\\x00-\\x1f]", " ");
    return super.jsonFields() + ", \"gpu_graph\": \"" + quoted + "\"";
  }

  /**
   * Gradient accumulation runs call for call: the step's statements before the reductions once per micro-batch,
   * each after its shard's upload, then the rest once (DataParallel). The graph is off for it: each micro-batch's
   * own inputs (its shard, its first sample for the draws) are sent before it, micro-batch 0 copies the buckets
   * into their accumulators where the others add to them and the last starts the reductions, so one captured
   * {@code pre} would not serve every micro-batch (the PyCUDA runner decides the same). Graphs of each kind (the
   * first, a middle and the last micro-batch, then post) would need the offset of the draws read from the GPU, and
   * NCCL's start captured in one graph with its wait in another (an event recorded in one graph and waited for in
   * another: external event nodes), which nothing here can check without a GPU. The cost is each launch's host
   * overhead, M times a step; not measured on a GPU.
   */
  @Override
  public void accumulates(int micro) {
    if (graphChoice.equals("on")) {
      graphChoice = "off (--micro-batches " + micro + ")";
    }
  }

  @Override
  public void microBatchPre(Network net) {
    sendBatch(net);
    sendCounter(net.iteration); // the step the dropout masks are drawn for
    net.microBatchPre();
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
