package deepdsl.runtime;

import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import jcuda.Pointer;
import jcuda.driver.CUdeviceptr;

/**
 * The convolutions of the CUDA device ({@link CudaLibrary} extends it with the other library ops):
 * forward, backward data and backward filter, each through cuDNN where {@code --kernels} lets it
 * take them, else our tiled kernel of {@code NAME.cu} (the filter gradient split over the reduction
 * within {@code --workspace-limit}). A convolution's algorithm (cuDNN Find, or the deterministic
 * heuristic choice) and workspace are chosen at its first use, in the warm-up step, never while a
 * step is captured; {@code --json} reports them.
 */
abstract class CudaConvolution extends CudaMemory {
  CudaDnn dnn; // null: the convolutions, pooling, batch norm, softmax and LRN are our kernels
  final Map<String, CudaDnn.Conv> convs = new HashMap<>(); // each convolution's, by its sizes

  CudaConvolution(Network.Settings settings, long workspaceLimit) {
    super(settings, workspaceLimit);
  }

  /** The convolution's sizes as library.cu takes them: N C H W F KH KW OH OW SH SW PH PW G DH DW. */
  static Pointer[] conv(
      int[] x, int[] w, int[] y, int[] pad, int[] stride, int[] dilation, int groups, Pointer... and) {
    int[] v = {
      x[0], x[1], x[2], x[3], w[0], w[2], w[3], y[2], y[3], stride[0], stride[1], pad[0], pad[1],
      groups, dilation[0], dilation[1]
    };
    Pointer[] out = new Pointer[v.length + and.length]; // the sizes, then the pointers `and`
    System.arraycopy(and, 0, out, v.length, and.length);
    for (int k = 0; k < v.length; k++) {
      out[k] = i(v[k]);
    }
    return out;
  }

  /**
   * The convolution {@code kind} through cuDNN: its descriptors and algorithm made at its first call
   * (the first step, never captured): found by timing on the call's own buffers (its output is
   * written right after), unless the settings ask for cuDNN's deterministic heuristic choice; the
   * shared workspace grown to what the algorithm needs.
   */
  void cudnn(
      int kind, Buf result, Buf a, Buf b, int[] x, int[] w, int[] y, int[] pad, int[] stride,
      int[] dilation, int groups) {
    boolean bf16 = result.bf16; // --precision bf16: x, w and y all bf16 (conv2d's callers check)
    String key =
        (bf16 ? "bf16 " : "") + kind + Arrays.toString(x) + Arrays.toString(w) + Arrays.toString(y) + Arrays.toString(pad)
            + Arrays.toString(stride) + Arrays.toString(dilation) + groups;
    CudaDnn.Conv c = convs.get(key);
    if (c == null) {
      if (capturing) {
        throw new NotCapturable("a convolution is met for the first time");
      }
      if (settings.deterministic) {
        c = dnn.prepare(kind, x, w, y, pad, stride, dilation, groups, workspaceLimit, bf16);
      } else {
        try {
          c =
              dnn.find(
                  kind, x, w, y, pad, stride, dilation, groups, workspaceLimit, address(result),
                  address(a), address(b), this::trialOf, bf16);
        } finally {
          freeTrial();
        }
      }
      convs.put(key, c);
      scratchOf(c.workspace);
    }
    long at = scratch == null ? 0 : ((DevicePointer) scratch).address();
    dnn.run(c, address(result), address(a), address(b), at);
  }

  /**
   * Whether a convolution's output and operands are stored alike: all float32, or all bf16
   * (--precision bf16: cuDNN's bf16 tensors and filter, float32 compute); a mix runs our kernel.
   */
  static boolean alike(Buf out, Buf a, Buf b) {
    return out.bf16 == a.bf16 && a.bf16 == b.bf16;
  }

  @Override
  public void conv2d(
      Buf out, Buf x, Buf w, int groups, int[] pad, int[] stride, int[] dilation) {
    if (dnn != null && alike(out, x, w)) {
      cudnn(CudaDnn.FORWARD, out, x, w, x.shape, w.shape, out.shape, pad, stride, dilation, groups);
      return;
    }
    int[] y = out.shape;
    int[] grid = {
      tiles((long) y[0] * y[2] * y[3], TILE_N), tiles(w.shape[0] / groups, TILE_M), groups
    };
    launch(
        "dd_k_conv2d", grid, TILE_BLOCK, new Buf[] {out, x, w},
        conv(x.shape, w.shape, y, pad, stride, dilation, groups));
  }

  @Override
  public void conv2dBackwardData(
      Buf out, Buf g, Buf w, int groups, int[] inShape, int[] pad, int[] stride, int[] dilation) {
    if (dnn != null && alike(out, g, w)) {
      cudnn(CudaDnn.DATA, out, g, w, inShape, w.shape, g.shape, pad, stride, dilation, groups);
      return;
    }
    int[] grid = { // with a stride, a block z for each group and phase of the input pixels
      tiles((long) inShape[0] * tiles(inShape[2], stride[0]) * tiles(inShape[3], stride[1]), TILE_N),
      tiles(inShape[1] / groups, TILE_M),
      groups * stride[0] * stride[1]
    };
    launch(
        "dd_k_conv2d_backward_data", grid, TILE_BLOCK, new Buf[] {out, g, w},
        conv(inShape, w.shape, g.shape, pad, stride, dilation, groups));
  }

  /**
   * The filter gradient: cuDNN's, or our tiled kernel, which splits its reduction over N*OH*OW into slices where
   * their partial sums fit the statement's planned {@code workspace} (in the arena, as the PyCUDA runner's: nothing
   * allocated beside the plan), then adds them up in slice order (the same bits every run); unsplit without one.
   */
  @Override
  public void conv2dBackwardFilter(
      Buf out, Buf x, Buf g, int groups, int[] pad, int[] stride, int[] dilation, int[] wShape,
      Buf workspace) {
    if (dnn != null && alike(out, x, g)) {
      cudnn(CudaDnn.FILTER, out, x, g, x.shape, wShape, g.shape, pad, stride, dilation, groups);
      return;
    }
    int cols = wShape[1] * wShape[2] * wShape[3];
    int splits = splits(wShape[0] / groups, cols, groups, (long) g.shape[0] * g.shape[2] * g.shape[3]);
    if (workspace == null || (long) splits * out.numel() > workspace.numel()) {
      splits = 1; // the partial sums within the plan's workspace (deepdsl/backends/cuda/ops.py's rule)
    }
    Pointer ws = splits > 1 ? pointer(workspace) : new CUdeviceptr();
    int[] grid = {tiles(cols, TILE_N), tiles(wShape[0] / groups, TILE_M), groups * splits};
    launch(
        "dd_k_conv2d_backward_filter", grid, TILE_BLOCK, new Buf[] {out, x, g},
        conv(x.shape, wShape, g.shape, pad, stride, dilation, groups, Pointer.to(ws), i(splits)));
    if (splits > 1) { // the partial sums added up in slice order: the same bits every run
      launch(
          "dd_k_conv2d_backward_filter_finish", elements(out.numel()), THREADS, new Buf[] {out},
          Pointer.to(ws), i(out.numel()), i(splits));
    }
  }

  /**
   * The --json fields of the library ops: cuDNN's shared scratch, whether its convolutions are the
   * heuristic's deterministic ones, and each convolution's algorithm and scratch.
   */
  @Override
  public String jsonFields() {
    // what the device allocates by the plan (the start's allocations, and cuDNN's shared scratch), of it the
    // multi-tensor launches' tables: on the stand-in driver exactly gpu_memory_bytes (tested)
    StringBuilder s =
        new StringBuilder(", \"gpu_planned_bytes\": ")
            .append(plannedBytes + (dnn == null ? 0 : scratchBytes))
            .append(", \"gpu_table_bytes\": ")
            .append(settings.tableBytes);
    if (dnn == null) {
      return s.toString();
    }
    s.append(", \"gpu_vendor_scratch_bytes\": ").append(scratchBytes);
    s.append(", \"gpu_deterministic\": ").append(settings.deterministic);
    s.append(", \"gpu_convolutions\": [");
    String sep = "";
    for (CudaDnn.Conv c : new java.util.TreeMap<>(convs).values()) {
      s.append(sep).append(c.json());
      sep = ", ";
    }
    return s.append("]").toString();
  }
}
