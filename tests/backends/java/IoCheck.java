import deepdsl.runtime.Buf;
import deepdsl.runtime.Data;
import deepdsl.runtime.Init;
import deepdsl.runtime.Npz;
import deepdsl.runtime.Rng;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;

/**
 * Test driver for tests/backends/test_java_runtime_io.py: runs every case of a command file in one
 * JVM.
 *
 * <p>Each line of the file is one case, fields separated by tabs: the command, its output path OUT,
 * then the command's arguments (see {@link #run}). Results are raw little-endian arrays (or text)
 * at OUT; a case that throws writes {@code ExceptionClass: message} to OUT plus {@code .err}
 * instead. Lists are comma separated; an empty field is an empty list; seeds are unsigned 64-bit
 * decimals.
 */
public final class IoCheck {
  public static void main(String[] args) throws IOException {
    List<String> lines = Files.readAllLines(Path.of(args[0]), StandardCharsets.UTF_8);
    for (String line : lines) {
      if (line.isEmpty()) {
        continue;
      }
      String[] f = line.split("\t", -1);
      Path out = Path.of(f[1]);
      try {
        run(f, out);
      } catch (Exception e) {
        String text = e.getClass().getSimpleName() + ": " + e.getMessage();
        Files.writeString(Path.of(f[1] + ".err"), text, StandardCharsets.UTF_8);
      }
    }
  }

  /**
   * One case. Commands and their arguments after OUT:
   *
   * <ul>
   *   <li>{@code fnv TEXT}: the hash, unsigned hex
   *   <li>{@code stream SEED COUNT}: raw int64s, uniform and normal float64s of fresh streams, then
   *       the first output of {@code Rng.at(SEED, k)} for each k
   *   <li>{@code init NAME SHAPE KIND ARGS FAN_IN FAN_OUT SEED}: float32s
   *   <li>{@code mask SHAPE STEP P SEED SITE}: float32s, written through a Buf with an offset
   *   <li>{@code npzcopy IN COPY}: IN read and written to COPY
   *   <li>{@code npzmake ARCHIVE}: the archive of {@link #makeArchive} written to ARCHIVE
   *   <li>{@code flag TEXT}: {@code kind|path|seed} ({@code null} where absent, the seed unsigned)
   *   <li>{@code data FLAG XSHAPE CLASSES SEED N SHUFFLE ITERS TESTBATCHES}: see {@link #data}
   * </ul>
   */
  private static void run(String[] f, Path out) throws IOException {
    switch (f[0]) {
      case "fnv" -> Files.writeString(out, Long.toHexString(Rng.fnv1a64(f[2])));
      case "stream" -> stream(out, seed(f[2]), Integer.parseInt(f[3]));
      case "init" ->
          writeFloats(
              out,
              Init.array(
                  f[2],
                  ints(f[3]),
                  f[4],
                  doubles(f[5]),
                  Integer.parseInt(f[6]),
                  Integer.parseInt(f[7]),
                  seed(f[8])));
      case "mask" -> {
        Buf buf = new Buf(new float[Math.toIntExact(count(ints(f[2]))) + 3], 3, ints(f[2]));
        Rng.dropout_mask(buf, Long.parseLong(f[3]), Float.parseFloat(f[4]), seed(f[5]), f[6]);
        writeFloats(out, Arrays.copyOfRange(buf.a, buf.off, buf.off + buf.numel()));
      }
      case "npzcopy" -> Npz.write(Path.of(f[3]), Npz.read(Path.of(f[2])));
      case "npzmake" -> Npz.write(Path.of(f[2]), makeArchive());
      case "flag" -> {
        Data.Spec s = Data.parseFlag(f[2]);
        String seedText = s.seed() == null ? "null" : Long.toUnsignedString(s.seed());
        Files.writeString(out, s.kind() + "|" + s.path() + "|" + seedText, StandardCharsets.UTF_8);
      }
      case "data" -> data(out, f);
      default -> throw new IllegalArgumentException("unknown command " + f[0]);
    }
  }

  private static void stream(Path out, long seed, int count) throws IOException {
    ByteBuffer b = ByteBuffer.allocate(count * 32).order(ByteOrder.LITTLE_ENDIAN);
    Rng raw = new Rng(seed);
    Rng uniform = new Rng(seed);
    Rng normal = new Rng(seed);
    for (int k = 0; k < count; k++) {
      b.putLong(raw.next());
    }
    for (int k = 0; k < count; k++) {
      b.putDouble(uniform.uniform());
    }
    for (int k = 0; k < count; k++) {
      b.putDouble(normal.normal());
    }
    for (int k = 0; k < count; k++) {
      b.putLong(Rng.at(seed, k).next());
    }
    Files.write(out, b.array());
  }

  /**
   * {@code data FLAG XSHAPE CLASSES SEED N SHUFFLE ITERS TESTBATCHES}: the training batches of size
   * N of each iteration in ITERS (SHUFFLE empty: file order), then test batches 0 .. TESTBATCHES-1,
   * each as x then y float32s; plus OUT.meta holding "size testSize".
   */
  private static void data(Path out, String[] f) throws IOException {
    int[] xShape = ints(f[3]);
    Data d = Data.load(Data.parseFlag(f[2]), xShape, Integer.parseInt(f[4]), seed(f[5]));
    int n = Integer.parseInt(f[6]);
    Long shuffle = f[7].isEmpty() ? null : seed(f[7]);
    int[] batchShape = new int[xShape.length + 1];
    batchShape[0] = n;
    System.arraycopy(xShape, 0, batchShape, 1, xShape.length);
    Buf x = Buf.zeros(batchShape);
    Buf y = new Buf(new float[n + 1], 1, n);
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    for (long i : longs(f[8])) {
      d.batch(i, n, shuffle, x, y);
      append(bytes, x, y);
    }
    for (int t = 0; t < Integer.parseInt(f[9]); t++) {
      d.testBatch(t, n, x, y);
      append(bytes, x, y);
    }
    Files.write(out, bytes.toByteArray());
    Files.writeString(Path.of(out + ".meta"), d.size() + " " + d.testSize());
  }

  private static void append(ByteArrayOutputStream bytes, Buf x, Buf y) {
    ByteBuffer b = ByteBuffer.allocate(4 * (x.numel() + y.numel())).order(ByteOrder.LITTLE_ENDIAN);
    for (int k = 0; k < x.numel(); k++) {
      b.putFloat(x.a[x.off + k]);
    }
    for (int k = 0; k < y.numel(); k++) {
      b.putFloat(y.a[y.off + k]);
    }
    bytes.writeBytes(b.array());
  }

  /**
   * Parameters, state and optimizer state as a trainer saves them, with int64 extremes and a
   * scalar.
   */
  private static LinkedHashMap<String, Npz.Array> makeArchive() {
    LinkedHashMap<String, Npz.Array> a = new LinkedHashMap<>();
    float[] w = new float[2 * 3 * 4];
    for (int k = 0; k < w.length; k++) {
      w[k] = k * 0.25f - 1.5f;
    }
    a.put("cv1.W", Npz.Array.ofFloats(w, 2, 3, 4));
    a.put("cv1.b", Npz.Array.ofFloats(new float[] {Float.MIN_VALUE, -0.0f, Float.MAX_VALUE}, 3));
    a.put("opt/cv1.W/momentum", Npz.Array.ofFloats(new float[24], 2, 3, 4));
    a.put("empty", Npz.Array.ofFloats(new float[0], 0, 5));
    a.put("labels", Npz.Array.ofLongs(new long[] {Long.MIN_VALUE, -1, 0, 1, Long.MAX_VALUE}, 5));
    a.put("opt/step", Npz.Array.ofLongs(new long[] {42}));
    a.put("opt/lr", Npz.Array.ofFloats(new float[] {0.01f}));
    return a;
  }

  private static void writeFloats(Path out, float[] values) throws IOException {
    ByteBuffer b = ByteBuffer.allocate(4 * values.length).order(ByteOrder.LITTLE_ENDIAN);
    b.asFloatBuffer().put(values);
    Files.write(out, b.array());
  }

  private static long seed(String text) {
    return Long.parseUnsignedLong(text);
  }

  private static int[] ints(String text) {
    return text.isEmpty()
        ? new int[0]
        : Arrays.stream(text.split(",")).mapToInt(Integer::parseInt).toArray();
  }

  private static long[] longs(String text) {
    return text.isEmpty()
        ? new long[0]
        : Arrays.stream(text.split(",")).mapToLong(Long::parseLong).toArray();
  }

  private static double[] doubles(String text) {
    return text.isEmpty()
        ? new double[0]
        : Arrays.stream(text.split(",")).mapToDouble(Double::parseDouble).toArray();
  }

  private static long count(int[] shape) {
    long n = 1;
    for (int d : shape) {
      n *= d;
    }
    return n;
  }
}
