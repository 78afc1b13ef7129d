import deepdsl.runtime.Blas;
import deepdsl.runtime.Buf;
import deepdsl.runtime.CpuAttention;
import deepdsl.runtime.CpuConvolution;
import deepdsl.runtime.CpuGemm;
import deepdsl.runtime.CpuLosses;
import deepdsl.runtime.CpuNormalisation;
import deepdsl.runtime.CpuPooling;
import deepdsl.runtime.CpuShapes;
import deepdsl.runtime.Rng;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Runs the op cases of tests/backends/test_java_cpuops.py through the CPU family classes (CpuGemm, CpuPooling, ...), all in one JVM.
 *
 * <p>{@code java OpCheck DIR} reads {@code DIR/manifest.txt}, one case a line: {@code name op
 * key=value ...}, where {@code out} is the output shape, {@code in} the input shapes separated by
 * {@code ;}, shapes are dimensions joined by {@code x} (empty for a scalar) and the other keys are
 * the op's attributes (tuples joined by {@code ,}). Input i is read from {@code DIR/name.i.bin} and
 * the output is written to {@code DIR/name.out.bin} (float32, little-endian). Every tensor sits at
 * an offset inside a larger array filled with NaN, so a kernel that ignores {@code Buf.off}, leaves
 * an output element unwritten or writes past its output is caught. A case that fails is reported on
 * stderr and writes nothing.
 *
 * <p>With {@code -Ddeepdsl.blas=CHOICE} the products run on that SGEMM ({@link Blas#use}, which
 * fails when it does not load), stderr's first line says which, and the outputs are {@code
 * DIR/name.CHOICE.out.bin}.
 */
public final class OpCheck {
  private OpCheck() {}

  public static void main(String[] args) throws IOException {
    Path dir = Path.of(args[0]);
    String blas = System.getProperty(Blas.PROPERTY);
    if (blas != null) {
      System.err.println("gemm: " + Blas.use(blas));
    }
    String suffix = blas == null ? ".out.bin" : "." + blas + ".out.bin";
    for (String line : Files.readAllLines(dir.resolve("manifest.txt"))) {
      if (line.isBlank()) {
        continue;
      }
      String[] words = line.trim().split(" ");
      Map<String, String> attrs = new HashMap<>();
      for (int i = 2; i < words.length; i++) {
        int eq = words[i].indexOf('=');
        attrs.put(words[i].substring(0, eq), words[i].substring(eq + 1));
      }
      String name = words[0];
      try {
        Buf out = guarded(shape(attrs.get("out")));
        List<Buf> ins = new ArrayList<>();
        String[] inShapes = attrs.get("in").split(";", -1);
        for (int i = 0; i < inShapes.length; i++) {
          ins.add(read(dir.resolve(name + "." + i + ".bin"), shape(inShapes[i])));
        }
        call(words[1], out, ins, new Attrs(attrs));
        int end = out.off + out.numel();
        for (int i = 0; i < out.a.length; i++) {
          if ((i < out.off || i >= end) && !Float.isNaN(out.a[i])) {
            throw new IllegalStateException("wrote outside its output, at " + (i - out.off));
          }
        }
        write(dir.resolve(name + suffix), out);
      } catch (RuntimeException e) {
        System.err.println(name + " (" + words[1] + "): " + e);
        e.printStackTrace();
      }
    }
  }

  /** The attributes of one case, typed as the family classes' methods take them. */
  private record Attrs(Map<String, String> values) {
    String text(String key) {
      String v = values.get(key);
      if (v == null) {
        throw new IllegalArgumentException("missing attribute " + key);
      }
      return v;
    }

    int[] ints(String key) {
      return shapeOf(text(key), ",");
    }

    /** The convolution's dilation: {1, 1} where the case has none (as a statement without it). */
    int[] dilation() {
      return values.containsKey("dilation") ? ints("dilation") : new int[] {1, 1};
    }

    int i(String key) {
      return Integer.parseInt(text(key));
    }

    long l(String key) {
      return Long.parseLong(text(key));
    }

    float f(String key) {
      return Float.parseFloat(text(key));
    }

    boolean b(String key) {
      return Boolean.parseBoolean(values.getOrDefault(key, "false"));
    }
  }

  private static void call(String op, Buf out, List<Buf> in, Attrs a) {
    Buf x = in.get(0);
    Buf y = in.size() > 1 ? in.get(1) : null;
    Buf z = in.size() > 2 ? in.get(2) : null;
    switch (op) {
      case "accuracy" -> CpuLosses.accuracy(out, x, y);
      case "argmax" -> CpuLosses.argmax(out, x);
      case "avg_pool2d" ->
          CpuPooling.avg_pool2d(out, x, a.ints("kernel"), a.ints("pad"), a.ints("stride"));
      case "avg_pool2d_backward" ->
          CpuPooling.avg_pool2d_backward(
              out, x, a.ints("in_shape"), a.ints("kernel"), a.ints("pad"), a.ints("stride"));
      case "bn_train_apply" ->
          CpuNormalisation.bn_train_apply(out, x, y, z, in.get(3), in.get(4), a.f("eps"));
      case "bn_train_backward" ->
          CpuNormalisation.bn_train_backward(
              out, x, y, z, in.get(3), in.get(4), in.get(5), in.get(6), a.f("eps"));
      case "batch_matmul" -> CpuGemm.batch_matmul(out, x, y, a.b("transpose_a"), a.b("transpose_b"));
      case "concat" -> CpuShapes.concat(out, in.toArray(new Buf[0]), a.i("axis"));
      case "conv2d" ->
          CpuConvolution.conv2d(
              out, x, y, a.i("groups"), a.ints("pad"), a.ints("stride"), a.dilation());
      case "conv2d_backward_data" ->
          CpuConvolution.conv2d_backward_data(
              out, x, y, a.i("groups"), a.ints("in_shape"), a.ints("pad"), a.ints("stride"),
              a.dilation());
      case "conv2d_backward_filter" ->
          CpuConvolution.conv2d_backward_filter(
              out, x, y, a.i("groups"), a.ints("pad"), a.ints("stride"), a.dilation(),
              a.ints("w_shape"));
      case "cross_entropy" -> CpuLosses.cross_entropy(out, x, y);
      case "cross_entropy_backward" -> CpuLosses.cross_entropy_backward(out, x, y, z);
      case "dropout_mask" ->
          Rng.dropout_mask(out, (long) x.a[x.off], a.f("p"), a.l("seed"), a.text("site"));
      case "random_normal" -> Rng.random_normal(out, (long) x.a[x.off], a.l("seed"), a.text("site"));
      case "dropout_mask_at" ->
          Rng.dropout_mask_at(
              out, (long) x.a[x.off], (long) y.a[y.off], a.f("p"), a.l("seed"), a.text("site"));
      case "random_normal_at" ->
          Rng.random_normal_at(out, (long) x.a[x.off], (long) y.a[y.off], a.l("seed"), a.text("site"));
      case "random_uniform_at" ->
          Rng.random_uniform_at(
              out, (long) x.a[x.off], (long) y.a[y.off], a.f("low"), a.f("high"), a.l("seed"),
              a.text("site"));
      case "random_uniform" ->
          Rng.random_uniform(
              out, (long) x.a[x.off], a.f("low"), a.f("high"), a.l("seed"), a.text("site"));
      case "global_avg_pool" -> CpuPooling.global_avg_pool(out, x);
      case "global_avg_pool_backward" ->
          CpuPooling.global_avg_pool_backward(out, x, a.ints("in_shape"));
      case "layer_norm_rows" -> CpuNormalisation.layer_norm_rows(out, x, a.f("eps"));
      case "layer_norm_rows_backward" -> CpuNormalisation.layer_norm_rows_backward(out, x, y, a.f("eps"));
      case "linear" -> CpuGemm.linear(out, x, y);
      case "log_softmax" -> CpuLosses.log_softmax(out, x);
      case "log_softmax_backward" -> CpuLosses.log_softmax_backward(out, x, y);
      case "lrn" -> CpuNormalisation.lrn(out, x, a.f("alpha"), a.f("beta"), a.f("k"), a.i("size"));
      case "lrn_backward" ->
          CpuNormalisation.lrn_backward(out, x, y, z, a.f("alpha"), a.f("beta"), a.f("k"), a.i("size"));
      case "masked_softmax" ->
          CpuAttention.masked_softmax(out, x, a.f("scale"), a.b("causal"), a.i("period"));
      case "matmul" -> CpuGemm.matmul(out, x, y, a.b("transpose_a"), a.b("transpose_b"));
      case "max_pool2d" ->
          CpuPooling.max_pool2d(out, x, a.ints("kernel"), a.ints("pad"), a.ints("stride"));
      case "max_pool2d_backward" ->
          CpuPooling.max_pool2d_backward(
              out, x, y, z, a.ints("kernel"), a.ints("pad"), a.ints("stride"));
      case "mse" -> CpuLosses.mse(out, x, y);
      case "pad_axis" -> CpuShapes.pad_axis(out, x, a.i("axis"), a.i("size"), a.i("start"));
      case "slice" -> CpuShapes.slice(out, x, a.i("axis"), a.i("start"), a.i("stop"));
      case "softmax" -> CpuLosses.softmax(out, x);
      case "softmax_backward" -> CpuLosses.softmax_backward(out, x, y);
      case "softmax_cross_entropy" -> CpuLosses.softmax_cross_entropy(out, x, y);
      case "softmax_cross_entropy_backward" -> CpuLosses.softmax_cross_entropy_backward(out, x, y, z);
      case "sum_axes" -> CpuShapes.sum_axes(out, x, a.ints("axes"));
      case "transpose" -> CpuShapes.transpose(out, x, a.ints("perm"));
      default -> throw new IllegalArgumentException("no CPU kernel call for op " + op);
    }
  }

  private static int[] shape(String text) {
    return shapeOf(text, "x");
  }

  private static int[] shapeOf(String text, String sep) {
    return text.isEmpty()
        ? new int[0]
        : Arrays.stream(text.split(sep)).mapToInt(Integer::parseInt).toArray();
  }

  /**
   * A tensor at offset 3 of an array with 3 spare elements on each side, all NaN (as an arena's
   * view).
   */
  private static Buf guarded(int[] shape) {
    int n = Math.toIntExact(Arrays.stream(shape).asLongStream().reduce(1, (p, q) -> p * q));
    float[] a = new float[n + 6];
    Arrays.fill(a, Float.NaN);
    return new Buf(a, 3, shape);
  }

  private static Buf read(Path file, int[] shape) throws IOException {
    Buf b = guarded(shape);
    ByteBuffer.wrap(Files.readAllBytes(file))
        .order(ByteOrder.LITTLE_ENDIAN)
        .asFloatBuffer()
        .get(b.a, b.off, b.numel());
    return b;
  }

  private static void write(Path file, Buf b) throws IOException {
    ByteBuffer bytes = ByteBuffer.allocate(4 * b.numel()).order(ByteOrder.LITTLE_ENDIAN);
    bytes.asFloatBuffer().put(b.a, b.off, b.numel());
    Files.write(file, bytes.array());
  }
}
