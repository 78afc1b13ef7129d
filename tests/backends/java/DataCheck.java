import deepdsl.runtime.Augment;
import deepdsl.runtime.Buf;
import deepdsl.runtime.Data;
import java.io.DataOutputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;

/**
 * The data sources and augmentation of the Java runtime for tests/data/test_java_data.py: loads
 * {@code FLAG} for the fields {@code FIELDS} ({@code name:i|l:classes:d1,d2;...}) and writes, as
 * little-endian float32 into OUT, every training sample ({@code train.f32}), every test sample
 * ({@code test.f32}) and the training batches 0..ITERS-1 of N samples augmented by {@code AUGMENT}
 * ({@code input;crop:ph:pw;flip:p;normalize:m,..:s,..} or {@code -}) as {@code batchI.f32}, and the
 * first test batch normalised ({@code testbatch.f32}). A failure prints its message and exits 1.
 *
 * <p>usage: java DataCheck FLAG FIELDS SEED AUGMENT ITERS N OUT
 */
public final class DataCheck {
  public static void main(String[] args) throws IOException {
    List<Data.Field> fields = new ArrayList<>();
    for (String f : args[1].split(";")) {
      String[] p = f.split(":", -1);
      int[] shape =
          p[3].isEmpty()
              ? new int[0]
              : java.util.Arrays.stream(p[3].split(",")).mapToInt(Integer::parseInt).toArray();
      fields.add(new Data.Field(p[0], p[1].equals("l"), Integer.parseInt(p[2]), shape));
    }
    long seed = Long.parseLong(args[2]);
    Augment augment = null;
    int augmented = -1;
    if (!args[3].equals("-")) {
      String[] steps = args[3].split(";");
      augment = new Augment(steps[0]);
      for (int k = 1; k < steps.length; k++) {
        String[] p = steps[k].split(":");
        switch (p[0]) {
          case "crop" -> augment.crop(Integer.parseInt(p[1]), Integer.parseInt(p[2]));
          case "flip" -> augment.flip(Double.parseDouble(p[1]));
          default -> augment.normalize(floats(p[1]), floats(p[2]));
        }
      }
      for (int f = 0; f < fields.size(); f++) {
        augmented = fields.get(f).name().equals(steps[0]) ? f : augmented;
      }
    }
    int iters = Integer.parseInt(args[4]);
    int n = Integer.parseInt(args[5]);
    String out = args[6];
    Data data;
    try {
      data = Data.load(Data.parseFlag(args[0]), fields, seed);
    } catch (IOException | IllegalArgumentException e) {
      System.err.println("error: " + e.getMessage());
      System.exit(1);
      return;
    }
    write(out + "/train.f32", all(data, fields, data.size(), false));
    if (data.hasTest()) {
      write(out + "/test.f32", all(data, fields, data.testSize(), true));
    }
    for (int i = 0; i < iters; i++) {
      Buf[] to = bufs(fields, n);
      data.batch(i, n, null, to);
      if (augment != null) {
        augment.apply(to[augmented], (long) i * n, seed, true);
      }
      write(out + "/batch" + i + ".f32", to);
    }
    if (augment != null && data.hasTest()) {
      Buf[] to = bufs(fields, n);
      data.testBatch(0, n, to);
      augment.apply(to[augmented], 0, seed, false);
      write(out + "/testbatch.f32", to);
    }
  }

  private static float[] floats(String text) {
    String[] p = text.split(",");
    float[] out = new float[p.length];
    for (int k = 0; k < p.length; k++) {
      out[k] = Float.parseFloat(p[k]);
    }
    return out;
  }

  private static Buf[] bufs(List<Data.Field> fields, int n) {
    Buf[] to = new Buf[fields.size()];
    for (int f = 0; f < to.length; f++) {
      int[] shape = new int[fields.get(f).shape().length + 1];
      shape[0] = n;
      System.arraycopy(fields.get(f).shape(), 0, shape, 1, shape.length - 1);
      to[f] = Buf.zeros(shape);
    }
    return to;
  }

  private static Buf[] all(Data data, List<Data.Field> fields, int m, boolean test) {
    Buf[] to = bufs(fields, m);
    if (test) {
      data.testBatch(0, m, to);
    } else {
      data.batch(0, m, null, to);
    }
    return to;
  }

  private static void write(String file, Buf[] bufs) throws IOException {
    try (DataOutputStream o = new DataOutputStream(new FileOutputStream(file))) {
      for (Buf b : bufs) {
        for (int k = 0; k < b.numel(); k++) {
          o.writeInt(Integer.reverseBytes(Float.floatToRawIntBits(b.a[b.off + k])));
        }
      }
    }
  }
}
