package deepdsl.runtime;

import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;

/** The program's {@code --predict}: {@link Network#predict}, as {@code deepdsl predict} writes it. */
final class Predictions {
  private Predictions() {}

  /**
   * {@code predict} for every sample of one split of {@code flag}'s data, written to {@code out}
   * as the npz array {@code predict}; returns the number of samples and the split.
   */
  static Object[] write(Network net, String flag, String out, String split, boolean replaceReadOnly)
      throws IOException {
    List<Data.Field> wanted = new ArrayList<>();
    List<Buf> to = new ArrayList<>();
    for (int f = 0; f < net.fields.size(); f++) {
      if (net.settings.predictInputs.contains(net.fields.get(f).name())) {
        wanted.add(net.fields.get(f));
        to.add(net.batch.get(f));
      }
    }
    Data samples = Data.load(Data.parseFlag(flag), wanted, net.settings.seed, true);
    String which = split != null ? split : samples.hasTest() ? "test" : "train";
    if (which.equals("test") && !samples.hasTest()) {
      throw new IOException(
          "the "
              + Data.parseFlag(flag).kind()
              + " data has no test split to predict (--split train predicts its training samples)");
    }
    boolean test = which.equals("test");
    int n = net.batchSize();
    int m = test ? samples.testSize() : samples.size();
    Buf[] bufs = to.toArray(new Buf[0]);
    int augmented = -1;
    for (int f = 0; f < wanted.size(); f++) {
      boolean named = net.settings.augment != null && wanted.get(f).name().equals(net.settings.augment.input);
      augmented = named ? f : augmented;
    }
    float[] values = null;
    int[] shape = null;
    for (int b = 0; (long) b * n < m; b++) {
      if (test) {
        samples.testBatch(b, n, bufs);
      } else {
        samples.batch(b, n, null, bufs);
      }
      if (augmented >= 0) { // the normalisation only
        net.settings.augment.apply(bufs[augmented], 0, net.settings.seed, false);
      }
      Buf scores = net.device().inferStep(net);
      int row = scores.numel() / n;
      if (values == null) {
        values = new float[Math.toIntExact((long) m * row)];
        shape = scores.shape.clone();
        shape[0] = m;
      }
      int rows = Math.min(n, m - b * n);
      System.arraycopy(scores.a, scores.off, values, b * n * row, rows * row);
    }
    LinkedHashMap<String, Npz.Array> file = new LinkedHashMap<>();
    if (net.settings.predictIntegers) {
      long[] ints = new long[values.length];
      for (int k = 0; k < ints.length; k++) {
        ints[k] = (long) values[k];
      }
      file.put("predict", Npz.Array.ofLongs(ints, shape));
    } else {
      file.put("predict", Npz.Array.ofFloats(values, shape));
    }
    Npz.write(Path.of(out), file, replaceReadOnly);
    return new Object[] {m, which};
    }
}
